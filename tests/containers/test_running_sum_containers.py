"""running_sum in containers, started exactly as the Helm chart's StatefulSet starts them.

The Kafka image and the processor image are built from docker/ (first run builds, later runs
reuse them); the broker is the shipped pytest plugin's session broker (``lockgate_kafka``).
Each processor container gets the env and args of the rendered StatefulSet, resolved for its
pod name (``<release>-lockgate-<ordinal>``), its own named volume at the
state mount path, and one deviation forced by host networking on one machine: a distinct
``LOCKGATE_HTTP_PORT`` per container. We then do a rolling restart (SIGTERM, exit 0, start
again on the same volume), kill -9 one container, and check the committed output with the
independent exactly-once checker; at the end every container stops on SIGTERM with exit 0
and leaves no open transaction behind.
"""

from __future__ import annotations

import subprocess
import time
import urllib.request
from typing import Any

import pytest
from confluent_kafka import IsolationLevel, TopicPartition
from confluent_kafka.admin import AdminClient, OffsetSpec

from processors.pytest_plugin import LockgateKafka
from tests.support import docker as dk
from tests.support.checker import check, model
from tests.support.helm import container_env, render, statefulset_container_spec
from tests.support.kafka import create_topic, produce_numbers, read_all, read_inputs, unique
from tests.support.procs import wait_until

pytestmark = pytest.mark.containers
RELEASE = "sums"
REPLICAS = 2
#: The chart's default kafka.sessionTimeoutMs, in seconds: the restart budget of a pod.
SESSION_TIMEOUT_S = 45


@pytest.fixture(scope="module")
def images() -> tuple[str, str]:
    return dk.ensure_images()


@pytest.fixture(scope="module")
def broker(lockgate_kafka: LockgateKafka) -> LockgateKafka:
    """The session broker of the shipped pytest plugin (processors/pytest_plugin.py)."""
    return lockgate_kafka


def _pod_env(
    bootstrap: str, app: str, inp: str, out: str, ordinal: int
) -> tuple[list[str], dict[str, str]]:
    docs = render(
        set_values={
            "app": "examples.running_sum:app",
            "appName": app,
            "replicaCount": REPLICAS,
            "kafka.bootstrapServers": bootstrap,
            "processing.checkpointIntervalMs": 500,
            "env": {"LOCKGATE_INPUT_TOPIC": inp, "LOCKGATE_OUTPUT_TOPIC": out},
        },
        release=RELEASE,
    )
    spec = statefulset_container_spec(docs)
    env = container_env(spec, pod_name=f"{RELEASE}-lockgate-{ordinal}")
    env["LOCKGATE_HTTP_PORT"] = str(dk.free_port())  # host network: one port per container
    return list(spec.get("args") or []), env


def _ready(port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=2) as r:  # noqa: S310
            return int(r.status) == 200
    except OSError:
        return False


def _open_transactions(bootstrap: str, topics: list[str]) -> list[str]:
    """Partitions whose last stable offset lags the high watermark (an open transaction)."""
    admin = AdminClient({"bootstrap.servers": bootstrap})
    md = admin.list_topics(timeout=10)
    tps = [TopicPartition(t, p) for t in topics for p in md.topics[t].partitions]
    latest = OffsetSpec.latest()
    hw = admin.list_offsets({tp: latest for tp in tps})
    lso = admin.list_offsets(
        {tp: latest for tp in tps}, isolation_level=IsolationLevel.READ_COMMITTED
    )
    out = []
    for tp in tps:
        h = hw[tp].result().offset
        s = lso[tp].result().offset
        if h != s:
            out.append(f"{tp.topic}[{tp.partition}] hw={h} lso={s}")
    return out


def test_rolling_restart_and_kill9_in_containers(
    broker: LockgateKafka, images: tuple[str, str]
) -> None:
    bs = broker.bootstrap
    app, inp, out = unique("c-sum"), unique("c-in"), unique("c-out")
    create_topic(bs, inp, 4)
    volumes = [unique("lockgate-state") for _ in range(REPLICAS)]
    inputs: list[tuple[str, int, int]] = []

    def feed(n: int) -> None:
        batch = [
            (f"key-{(len(inputs) + i) % 37}", (len(inputs) + i) % 23, len(inputs) + i)
            for i in range(n)
        ]
        produce_numbers(bs, inp, batch)
        inputs.extend(batch)

    def start(ordinal: int) -> dk.Processor:
        args, env = _pod_env(bs, app, inp, out, ordinal)
        return dk.start_processor(
            args, env, image=images[0], state_volume=volumes[ordinal], wait_for_log="assigned"
        )

    def outputs() -> list[Any]:
        return read_all(bs, out, expected=len(inputs), timeout=120, idle=2)

    procs: dict[int, dk.Processor] = {}
    started = time.monotonic()
    try:
        feed(2000)
        for i in range(REPLICAS):
            procs[i] = start(i)
        assert check(model(read_inputs(bs, inp, len(inputs))), outputs()) == []

        # rolling restart as `kubectl rollout restart` does it: highest ordinal first.
        # Restart time = SIGTERM until the new container's /readyz is 200 (its key groups
        # restored): with static membership it must stay inside the session timeout
        # (45 s, the chart's kafka.sessionTimeoutMs), or the group rebalances twice.
        restart_s = []
        for i in reversed(range(REPLICAS)):
            feed(500)
            t0 = time.monotonic()
            code = procs[i].stop(timeout=60)
            assert code == 0, procs[i].logs()[-3000:]
            stopped = time.monotonic() - t0
            procs[i] = start(i)
            port = procs[i].http_port
            wait_until(lambda port=port: _ready(port), 60, what=f"replica {i} ready again")
            restart_s.append((round(stopped, 1), round(time.monotonic() - t0, 1)))
        print(f"\nrolling restart (stop s, stop-to-ready s) per replica: {restart_s}")
        assert all(total < SESSION_TIMEOUT_S for _, total in restart_s), restart_s
        assert check(model(read_inputs(bs, inp, len(inputs))), outputs()) == []

        # kill -9 one container mid-stream, restart it on its volume
        feed(1500)
        procs[0].signal("SIGKILL")
        assert procs[0].wait(30) == 137
        procs[0].remove()
        feed(1000)
        procs[0] = start(0)
        assert check(model(read_inputs(bs, inp, len(inputs))), outputs()) == []

        # SIGTERM: exit 0 and no transaction left open on outputs or changelogs
        for i in list(procs):
            assert procs[i].stop(timeout=60) == 0, procs[i].logs()[-3000:]
            del procs[i]
        wait_until(
            lambda: not _open_transactions(bs, [out, f"{app}.totals.changelog"]),
            15,
            what="no open transactions",
        )
    finally:
        for p in procs.values():
            print(p.logs()[-3000:])
            p.remove()
        for v in volumes:
            dk.remove_volume(v)
    print(f"container test: {len(inputs)} inputs, {time.monotonic() - started:.1f}s")


def test_processor_image_basics(images: tuple[str, str]) -> None:
    run = dk.run_processor(["--help"], image=images[0])
    assert run.exit_code == 0 and "lockgate" in run.output.lower()
    user = subprocess.run(
        ["docker", "run", "--rm", "--network", "host", "--entrypoint", "id", images[0], "-u"],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    assert user.stdout.strip() != "0"
