"""Scale-down hand-over time with static vs dynamic group membership.

A static member (``group.instance.id``, the default) does not leave the group on SIGTERM:
a restart within ``session.timeout.ms`` gets its key groups back without a rebalance. The
cost would show on a *permanent* scale-down: the stopped instance's key groups idle until
its session times out. A dynamic member leaves on close: the survivor takes over at once.
With ``LOCKGATE_LEAVE_GROUP_ON_STOP=scale-down`` (the default) a static member asks the
Kubernetes API at SIGTERM whether its StatefulSet was scaled below its ordinal and, if so,
leaves explicitly: here the API is a local HTTPS stand-in (tests/support/k8s_api.py), the
broker is real.

Measured: SIGTERM to one of two instances -> the other owns every key group
(``lockgate_key_groups_assigned``). See docs/helm.md, "Scale-down and static membership".
``SCALE_DOWN_SESSION_MS`` sets the session timeout of the static run (default
10000 here to keep the test short; librdkafka's default is 45000).
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from tests.integration._util import http_get, metric
from tests.support.k8s_api import FakeStatefulSetAPI
from tests.support.kafka import create_topic, produce_numbers
from tests.support.ports import free_port
from tests.support.procs import AppProcess, wait_until

P = 4
SESSION_MS = int(os.environ.get("SCALE_DOWN_SESSION_MS", "10000"))


def _assigned(port: int) -> float | None:
    return metric(http_get(port, "/metrics", timeout=1)[1], "lockgate_key_groups_assigned")


def _hand_over_seconds(  # type: ignore[no-untyped-def]
    bootstrap: str, names, tmp_path: Path, static: bool, k8s: dict[str, str] | None = None
) -> tuple[float, str]:
    """SIGTERM to lg-1 of {lg-0, lg-1} -> (seconds until lg-0 owns every key group, lg-1's log).

    ``k8s``: the Kubernetes environment of the stand-in API; without it the instances
    see no Kubernetes (an explicitly empty KUBERNETES_SERVICE_HOST).
    """
    tmp_path.mkdir(parents=True, exist_ok=True)
    inp = names("scale-in")
    create_topic(bootstrap, inp, P)
    produce_numbers(bootstrap, inp, [(f"k{i}", 1, i) for i in range(200)])
    base = {
        "LOCKGATE_BOOTSTRAP_SERVERS": bootstrap,
        "LOCKGATE_APP_NAME": names("scale"),
        "LOCKGATE_INPUT_TOPIC": inp,
        "LOCKGATE_OUTPUT_TOPIC": names("scale-out"),
        "LOCKGATE_CHECKPOINT_INTERVAL_MS": "300",
        "LOCKGATE_STATIC_MEMBERSHIP": "true" if static else "false",
        "LOCKGATE_KAFKA__SESSION_TIMEOUT_MS": str(SESSION_MS),
        "LOCKGATE_KAFKA__HEARTBEAT_INTERVAL_MS": "1000",
        "LOCKGATE_HTTP_HOST": "127.0.0.1",
        "KUBERNETES_SERVICE_HOST": "",
        **(k8s or {}),
    }
    ports = {iid: free_port() for iid in ("lg-0", "lg-1")}
    procs = {
        iid: AppProcess(
            "examples.running_sum:app",
            {
                **base,
                "LOCKGATE_INSTANCE_ID": iid,
                "LOCKGATE_STATE_DIR": str(tmp_path / iid),
                "LOCKGATE_HTTP_PORT": str(port),
            },
            tmp_path / f"{iid}.log",
        ).start()
        for iid, port in ports.items()
    }
    try:
        wait_until(
            lambda: (
                all((_assigned(p) or 0) >= 1 for p in ports.values())
                and sum(_assigned(p) or 0 for p in ports.values()) == P
            ),
            90,
            what="both instances own key groups",
        )
        started = time.monotonic()
        assert procs["lg-1"].terminate(60) == 0, procs["lg-1"].log_text()[-3000:]
        wait_until(lambda: _assigned(ports["lg-0"]) == P, SESSION_MS / 1000 + 60, interval=0.1)
        took = time.monotonic() - started
        stopped_log = procs["lg-1"].log_text()
    finally:
        for proc in procs.values():
            if proc.alive:
                proc.terminate(60)
    return took, stopped_log


def test_scale_down_hand_over_static_vs_dynamic(
    kafka_bootstrap: str, names, tmp_path: Path
) -> None:  # type: ignore[no-untyped-def]
    dynamic, _ = _hand_over_seconds(kafka_bootstrap, names, tmp_path / "d", static=False)
    with FakeStatefulSetAPI(tmp_path / "api") as api:
        api.set_replicas("lg", 2)  # a rolling restart: the StatefulSet still wants lg-1
        static, log = _hand_over_seconds(kafka_bootstrap, names, tmp_path / "s", True, api.env())
        assert "keeping the static group membership: StatefulSet lg keeps 2" in log, log[-3000:]
        api.set_replicas("lg", 1)  # kubectl scale --replicas=1: lg-1 goes
        left, log = _hand_over_seconds(kafka_bootstrap, names, tmp_path / "k", True, api.env())
    assert "leaving the consumer group: StatefulSet lg scaled to 1" in log, log[-3000:]
    assert "left the consumer group" in log, log[-3000:]
    print(
        f"scale-down hand-over: dynamic {dynamic:.1f}s, static (replicas unchanged) "
        f"{static:.1f}s, static scaled down (explicit leave) {left:.1f}s "
        f"(session.timeout.ms={SESSION_MS})"
    )
    assert dynamic < 5.0, dynamic
    # The static member's key groups wait for its session to expire ...
    assert static >= 0.7 * SESSION_MS / 1000, static
    assert static > dynamic + 3, (static, dynamic)
    # ... unless the StatefulSet was scaled below its ordinal: then it leaves at SIGTERM.
    assert left < 5.0, left


if __name__ == "__main__":  # pragma: no cover - manual measurement
    pytest.main([__file__, "-q", "-s", "-p", "no:cacheprovider"])
