"""The dashboard's and the alerts' series exist on a live instance, and each lockgate alert's
expression is true when the instance is driven into its condition and false when healthy.

There is no Prometheus here: the chart's rendered PrometheusRule expressions are evaluated by
tests/support/promql.py (a documented PromQL subset) over the instance's /metrics, scraped
every 0.5 s with a ``pod`` target label added (as the Prometheus operator adds it). Each
alert's expression is asserted itself; ``for:`` is evaluated too, as Prometheus' rule manager
does, after every scrape (:class:`AlertEvaluator`): the test copy of the rules renders
LockgateKeyGroupsHalted with ``for: 3s`` (the chart's default is 10m), which must be pending
once its expression holds and firing no sooner than 3 s later, while LockgateConsumerLag
keeps the chart's 15m and stays pending. LockgateCrashLooping uses kube-state-metrics'
series and is only render-tested (tests/deploy).

The per-key-group watermark series (``lockgate_key_group_watermark_timestamp_seconds``) is
checked against the same instance: one key group an hour behind, the other current.

LockgateRestoreStuck is driven by its own test: the broker is SIGSTOPped while an instance
restores (see its docstring for how its 5 minute window is treated).
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

import orjson
import pytest
from confluent_kafka import Producer

from tests.deploy.test_dashboard_alerts import dashboard_queries
from tests.integration._util import http_get, metric
from tests.support.helm import CHART_DIR, one_manifest, render
from tests.support.kafka import create_topic, produce_numbers, read_all
from tests.support.ports import free_port
from tests.support.procs import AppProcess, lockgate_cli, wait_until
from tests.support.promql import AlertEvaluator, AlertRule, Store, evaluate, metric_names

#: Series from outside lockgate (kube-state-metrics), never on an instance's /metrics.
EXTERNAL = {"kube_pod_container_status_restarts_total"}
POD = "alerting-lockgate-0"
INTERVAL_MS = 300
#: LockgateKeyGroupsHalted's ``for:`` in the test copy of the rules (the chart's: 10m).
HALTED_FOR = "3s"


class _Scraper(threading.Thread):
    """Scrapes /metrics every 0.5 s into a :class:`Store` (pod label added)."""

    def __init__(self, port: int, rules: list[AlertRule] | None = None) -> None:
        super().__init__(daemon=True)
        self.port = port
        self.store = Store()
        self.lock = threading.Lock()
        self.stopped = threading.Event()
        #: The rules' pending/firing states, evaluated after every scrape.
        self.alerts = AlertEvaluator(rules or [])

    def run(self) -> None:
        while not self.stopped.is_set():
            code, text = http_get(self.port, "/metrics")
            if code == 200:
                with self.lock:
                    self.store.ingest(text, pod=POD)
                    self.alerts.evaluate(self.store)
            self.stopped.wait(0.5)

    def states(self, rule: str) -> list[str]:
        with self.lock:
            return [s.state for s in self.alerts.states(rule)]

    def transitions(self, rule: str) -> list[tuple[float, str]]:
        with self.lock:
            return [(t, what) for t, name, _, what in self.alerts.transitions if name == rule]

    def firing(self, expr: str) -> dict[Any, float]:
        with self.lock:
            value = evaluate(expr, self.store)
        assert isinstance(value, dict), expr
        return value


def _produce(bootstrap: str, topic: str, partition: int, values: list[bytes]) -> None:
    p = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True})
    for i, v in enumerate(values):
        p.produce(topic, v, f"k{i}".encode(), partition=partition)
    assert p.flush(30) == 0


def _records(n: int, ts_ms: int, start: int = 0) -> list[bytes]:
    return [orjson.dumps({"ts": ts_ms + i, "seq": start + i}) for i in range(n)]


def _rules(app: str) -> dict[str, str]:
    return {r["alert"]: r["expr"] for r in _rule_specs(app)}


def _rule_specs(app: str) -> list[dict[str, Any]]:
    """The chart's rendered alert rules for ``app`` (LockgateKeyGroupsHalted's ``for:``
    shortened to :data:`HALTED_FOR`)."""
    docs = render(
        values_files=[CHART_DIR.parents[2] / "tests" / "deploy" / "values" / "minimal.yaml"],
        set_values={
            "appName": app,
            "processing.checkpointIntervalMs": INTERVAL_MS,
            "metrics.prometheusRule.enabled": True,
            "metrics.prometheusRule.consumerLagRecords": 100,
            "metrics.prometheusRule.abortedEpochsPer10m": 0,
            "metrics.prometheusRule.dlqRecordsPer10m": 0,
            "metrics.prometheusRule.noCheckpointIntervals": 20,  # 6 s
            "metrics.prometheusRule.watermarkLagSeconds": 600,
            "metrics.prometheusRule.haltedFor": HALTED_FOR,
        },
    )
    [group] = one_manifest(docs, "PrometheusRule")["spec"]["groups"]
    return list(group["rules"])


def test_dashboard_and_alert_series_exist_and_each_alert_fires(  # type: ignore[no-untyped-def]
    kafka_bootstrap: str, names, tmp_path: Path
) -> None:
    app, inp, out = names("alerting"), names("alerting-in"), names("alerting-out")
    create_topic(kafka_bootstrap, inp, 2)
    specs = _rule_specs(app)
    rules = {r["alert"]: r["expr"] for r in specs}
    assert {"LockgateNoCheckpoint", "LockgateWatermarkLag", "LockgateCrashLooping"} <= set(rules)
    lockgate_rules = {n: e for n, e in rules.items() if not (metric_names(e) & EXTERNAL)}
    timed = [AlertRule.from_rule(r) for r in specs if r["alert"] in lockgate_rules]
    for_s = {r.name: r.for_s for r in timed}
    assert for_s["LockgateKeyGroupsHalted"] == 3 and for_s["LockgateConsumerLag"] == 900
    assert set(rules) - set(lockgate_rules) == {"LockgateCrashLooping"}
    port = free_port()
    base = {
        "LOCKGATE_BOOTSTRAP_SERVERS": kafka_bootstrap,
        "LOCKGATE_APP_NAME": app,
        "LOCKGATE_INPUT_TOPIC": inp,
        "LOCKGATE_OUTPUT_TOPIC": out,
        "LOCKGATE_CHECKPOINT_INTERVAL_MS": str(INTERVAL_MS),
        "LOCKGATE_SAVEPOINT_DIR": str(tmp_path / "savepoints"),
    }
    env = {
        **base,
        "LOCKGATE_INSTANCE_ID": POD,
        "LOCKGATE_STATE_DIR": str(tmp_path / "state"),
        "LOCKGATE_HTTP_PORT": str(port),
        "LOCKGATE_HTTP_HOST": "127.0.0.1",
        "LOCKGATE_TRANSACTION_TIMEOUT_MS": "4000",
    }
    proc = AppProcess("tests.integration.apps.alerting:app", env, tmp_path / "app.log").start()
    scraper = _Scraper(port, timed)
    scraper.start()

    def fired() -> set[str]:
        return {n for n, e in lockgate_rules.items() if scraper.firing(e)}

    def wait_fired(name: str, timeout: float = 60) -> None:
        try:
            wait_until(lambda: name in fired(), timeout, interval=0.5, what=f"{name} fires")
        except TimeoutError as exc:
            raise AssertionError(f"{exc}; log: {proc.log_text()[-4000:]}") from None

    def committed() -> float:
        return metric(http_get(port, "/metrics")[1], "lockgate_records_in_total") or 0

    try:
        wait_until(lambda: http_get(port, "/readyz")[0] == 200, 90, what="/readyz")
        now_ms = int(time.time() * 1000)
        _produce(kafka_bootstrap, inp, 0, _records(50, now_ms))
        read_all(kafka_bootstrap, out, expected=50, timeout=60, idle=0)
        wait_until(lambda: committed() == 50, 30, what="50 records committed")
        time.sleep(3)  # a few scrapes of the healthy state

        # Healthy: nothing fires (every expression evaluates to an empty vector).
        assert fired() == set(), proc.log_text()[-3000:]

        # Every series the dashboard and the alerts name is exported (the watermark
        # series exists once a key group has a watermark: it has, from the records above).
        dashboard = json.loads((CHART_DIR / "dashboards" / "lockgate.json").read_text())
        used = set().union(*(metric_names(q) for q in dashboard_queries(dashboard)))
        used |= set().union(*(metric_names(e) for e in rules.values()))
        with scraper.lock:
            exported = scraper.store.names()
        assert used - EXTERNAL, used
        assert used - EXTERNAL <= exported, sorted(used - EXTERNAL - exported)
        assert EXTERNAL.isdisjoint(exported)

        # Dead letters: a record that is not JSON.
        _produce(kafka_bootstrap, inp, 0, [b"not json"])
        wait_fired("LockgateDeadLetters")
        assert metric(http_get(port, "/metrics")[1], "lockgate_dlq_records_total") == 1

        # Watermark lag: partition 1 (no watermark so far: left out) gets a record an hour
        # old; the key groups' lowest watermark is now an hour behind.
        assert "LockgateWatermarkLag" not in fired()
        _produce(kafka_bootstrap, inp, 1, _records(1, now_ms - 3_600_000, start=50))
        wait_fired("LockgateWatermarkLag")
        lag = scraper.firing(lockgate_rules["LockgateWatermarkLag"])
        assert 3500 < next(iter(lag.values())) < 3800, lag
        # Each key group's watermark: key group 1 an hour behind, key group 0 current.
        per_group = scraper.firing(
            f'time() - lockgate_key_group_watermark_timestamp_seconds{{app="{app}"}}'
        )
        behind = {dict(k)["key_group"]: v for k, v in per_group.items()}
        assert set(behind) == {"0", "1"}, per_group
        assert 3500 < behind["1"] < 3800 and behind["0"] < 600, behind

        # No checkpoint, then aborts: a record keeps user code busy 10 s (more than the 6 s
        # of 20 intervals, and more than the epoch budget of half the 4 s transaction
        # timeout): nothing commits meanwhile; then the epoch aborts and the replay
        # dead-letters the record.
        assert not ({"LockgateNoCheckpoint", "LockgateEpochsAborting"} & fired())
        # Records before it in the same batch open the transaction the coordinator aborts
        # (an epoch that wrote nothing yet has none).
        slow = orjson.dumps({"ts": now_ms + 100, "seq": 51, "sleep_ms": 10_000})
        _produce(kafka_bootstrap, inp, 0, [*_records(20, now_ms + 50, start=200), slow])
        wait_fired("LockgateNoCheckpoint", 30)
        wait_fired("LockgateEpochsAborting", 60)
        # Checkpoints resume: LockgateNoCheckpoint stops firing.
        wait_until(
            lambda: "LockgateNoCheckpoint" not in fired(),
            60,
            interval=0.5,
            what="checkpoints again",
        )

        # Halted key groups and lag: a stop-with-savepoint halts every key group; input
        # keeps coming and nothing of it is processed.
        assert not ({"LockgateKeyGroupsHalted", "LockgateConsumerLag"} & fired())
        trigger = lockgate_cli(
            base, "savepoint", "trigger", "--app", app, "--stop", "--timeout", "90"
        )
        assert trigger.returncode == 0, trigger.stderr[-3000:] + proc.log_text()[-3000:]
        wait_fired("LockgateKeyGroupsHalted")
        # for: 3s: pending first, firing once the expression held that long.
        wait_until(
            lambda: scraper.states("LockgateKeyGroupsHalted") == ["firing"],
            30,
            interval=0.25,
            what="LockgateKeyGroupsHalted firing after its for:",
        )
        halted = scraper.transitions("LockgateKeyGroupsHalted")
        assert [w for _, w in halted] == ["pending", "firing"], halted
        assert halted[1][0] - halted[0][0] >= 3, halted
        _produce(kafka_bootstrap, inp, 0, _records(300, int(time.time() * 1000), start=100))
        wait_fired("LockgateConsumerLag", 60)
        # The chart's for: 15m is far off: the lag alert is pending, not firing.
        assert scraper.states("LockgateConsumerLag") == ["pending"]
        # The dashboard's per-partition lag: all of it on partition 0.
        by_partition = scraper.firing(
            f'max by (partition) (lockgate_partition_lag_records{{app="{app}"}})'
        )
        assert by_partition[(("partition", "0"),)] >= 300, by_partition
        assert by_partition[(("partition", "1"),)] == 0, by_partition
        # A halted instance ends idle epochs: it is not reported as missing checkpoints.
        assert "LockgateNoCheckpoint" not in fired()
        assert "LockgateRestoreStuck" not in fired()
    finally:
        scraper.stopped.set()
        proc.terminate()


def _listener_pid(port: int) -> int | None:
    """The pid of the process listening on 127.0.0.1:``port`` (``ss``), or None."""
    try:
        out = subprocess.run(
            ["ss", "-ltnpH", f"sport = :{port}"], capture_output=True, text=True, check=False
        ).stdout
    except OSError:
        return None
    m = re.search(r"pid=(\d+)", out)
    return int(m.group(1)) if m else None


def test_restore_stuck_fires_while_the_broker_stops_answering_mid_restore(  # type: ignore[no-untyped-def]
    kafka_bootstrap: str, names, tmp_path: Path
) -> None:
    """LockgateRestoreStuck: an instance restores a large changelog and the broker is
    SIGSTOPped mid-restore. Its expression uses ``increase(...[5m]) == 0``: the evaluator is
    given only the scrapes taken after the stop, standing in for a stall longer than the
    window (waiting 5 minutes is not worth it here). Once the broker answers again the
    restore completes and the expression is false."""
    if os.environ.get("LOCKGATE_TEST_BOOTSTRAP"):
        pytest.skip("the broker is not ours to stop")
    broker = _listener_pid(int(kafka_bootstrap.rsplit(":", 1)[1]))
    if broker is None:
        pytest.skip("cannot find the broker's pid (ss)")
    app, inp, out = names("rstuck"), names("rstuck-in"), names("rstuck-out")
    create_topic(kafka_bootstrap, inp, 2)
    n = 60_000
    produce_numbers(kafka_bootstrap, inp, [(f"key-{i}", 1, i) for i in range(n)])
    expr = _rules(app)["LockgateRestoreStuck"]
    port = free_port()

    def env(state: str) -> dict[str, str]:
        return {
            "LOCKGATE_BOOTSTRAP_SERVERS": kafka_bootstrap,
            "LOCKGATE_APP_NAME": app,
            "LOCKGATE_INPUT_TOPIC": inp,
            "LOCKGATE_OUTPUT_TOPIC": out,
            "LOCKGATE_INSTANCE_ID": "i1",
            "LOCKGATE_STATE_DIR": str(tmp_path / state),
            "LOCKGATE_HTTP_PORT": str(port),
            "LOCKGATE_HTTP_HOST": "127.0.0.1",
        }

    first = AppProcess("examples.running_sum:app", env("a"), tmp_path / "a.log").start()
    try:
        wait_until(
            lambda: (metric(http_get(port, "/metrics")[1], "lockgate_records_in_total") or 0) == n,
            180,
            what="every record committed",
        )
    finally:
        assert first.terminate() == 0
    # A new state dir: every key group restores its 60000-key changelog.
    second = AppProcess("examples.running_sum:app", env("b"), tmp_path / "b.log").start()
    scraper = _Scraper(port)
    stopped = False
    try:
        wait_until(
            lambda: (
                (
                    metric(
                        http_get(port, "/metrics", timeout=1)[1], "lockgate_key_groups_restoring"
                    )
                    or 0
                )
                > 0
            ),
            90,
            interval=0.02,
            what="a restore under way",
        )
        os.kill(broker, signal.SIGSTOP)
        stopped = True
        # The consumer still applies what it had fetched before the stop (seconds of it on a
        # loaded machine): the stall starts once the applied count stops moving.
        applied: list[float] = []

        def stalled() -> bool:
            text = http_get(port, "/metrics", timeout=2)[1]
            applied.append(metric(text, "lockgate_restore_records_total") or 0)
            return len(applied) >= 5 and len(set(applied[-5:])) == 1

        wait_until(stalled, 60, interval=0.5, what="the restore to stall")
        scraper.start()
        time.sleep(4)
        restoring = scraper.firing(f'lockgate_key_groups_restoring{{app="{app}"}} > 0')
        assert restoring, "the restore ended before the broker stopped"
        assert scraper.firing(expr), expr  # restoring, no changelog record applied since
        os.kill(broker, signal.SIGCONT)
        stopped = False
        wait_until(lambda: http_get(port, "/readyz")[0] == 200, 120, what="restored")
        time.sleep(1.5)
        assert not scraper.firing(expr)
    finally:
        if stopped:
            os.kill(broker, signal.SIGCONT)
        scraper.stopped.set()
        second.terminate()
