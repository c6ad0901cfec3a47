"""examples/dag_pipeline.py: two pipelines joined in one app take one savepoint.

``balances`` reads the internal topics of two upstream apps and aligns on the barriers of
every writer of both, so ``savepoint trigger --pipeline order-totals --stop`` covers all
three apps with one consistent cut. The test triggers it under load, stops everything,
restores all three apps from it into fresh state dirs, and checks every committed output
against the independent model of tests/chaos/_dag.py (exact prefix sums per customer on
both internal topics; per customer one exact balance step per internal record).

Before multi-input alignment, ``balances`` ignored the barriers: the trigger timed out
after 120 s (with ``--stop`` both upstream apps stayed halted meanwhile).
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from tests.chaos._dag import (
    BALANCES_SPEC,
    ORDERS_SPEC,
    PAYMENTS_SPEC,
    DagFeeder,
    DagTopics,
    check_dag,
    dag_env,
    read_events,
)
from tests.chaos._pipeline import PipelineFleet, count_committed_data, read_topic
from tests.support.kafka import create_topic
from tests.support.procs import lockgate_cli

PARTITIONS = 4


def _fleets(bootstrap: str, topics: DagTopics, root: Path, **common: str) -> list[PipelineFleet]:
    return [
        PipelineFleet(
            spec, dag_env(bootstrap, topics, name, **common), root, [f"{prefix}1"], ports=True
        )
        for spec, name, prefix in (
            (ORDERS_SPEC, topics.orders_app, "o"),
            (PAYMENTS_SPEC, topics.payments_app, "p"),
        )
    ] + [
        PipelineFleet(
            BALANCES_SPEC,
            dag_env(bootstrap, topics, topics.balances_app, **common),
            root,
            ["b1", "b2"],
            ports=True,
        )
    ]


@pytest.mark.parametrize("alignment", ["aligned", "none"])
def test_dag_stop_with_savepoint_and_restore_is_exact(
    kafka_bootstrap: str, tmp_path: Path, alignment: str
) -> None:
    topics = DagTopics.fresh("dag")
    for topic in (topics.orders, topics.payments, topics.order_totals, topics.payment_totals):
        create_topic(kafka_bootstrap, topic, PARTITIONS)
    sp_dir = tmp_path / "savepoints"
    common = {
        "LOCKGATE_CHECKPOINT_INTERVAL_MS": "300",
        "LOCKGATE_SAVEPOINT_DIR": str(sp_dir),
        "LOCKGATE_ALIGNMENT": alignment,
    }
    feeder = DagFeeder(kafka_bootstrap, topics, 10**6, rate=600, customers=30, seed=7)
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    first = _fleets(kafka_bootstrap, topics, tmp_path / "a", **common)
    second: list[PipelineFleet] = []
    codes: dict[str, int] = {}
    try:
        for fleet in first:
            fleet.start_all()
        feeder.start()
        read_topic(kafka_bootstrap, topics.balances, expected=1500, timeout=120, idle=0)
        env = {"LOCKGATE_BOOTSTRAP_SERVERS": kafka_bootstrap, "LOCKGATE_SAVEPOINT_DIR": str(sp_dir)}
        started = time.monotonic()
        trig = lockgate_cli(env, "savepoint", "trigger", "--pipeline", topics.orders_app, "--stop")
        took = time.monotonic() - started
        logs = "\n".join(f.logs() for f in first)
        assert trig.returncode == 0, trig.stderr[-3000:] + logs
        sp_id = trig.stdout.strip().splitlines()[-1]
        described = lockgate_cli(env, "savepoint", "describe", sp_id, "--json")
        assert described.returncode == 0, described.stderr
        apps = set(json.loads(described.stdout)["apps"])
        assert apps == {topics.orders_app, topics.payments_app, topics.balances_app}, apps
        for fleet in first:
            codes.update(fleet.stop_all())
        assert set(codes.values()) == {0}, (codes, logs)
        halted = count_committed_data(kafka_bootstrap, topics.balances)
        assert halted > 0

        restore = {**common, "LOCKGATE_FROM_SAVEPOINT": sp_id}
        second = _fleets(kafka_bootstrap, topics, tmp_path / "b", **restore)
        for fleet in second:
            fleet.start_all()
        time.sleep(4)
        feeder.stop()
        feeder.join(60)
        assert feeder.error is None
        n_orders, n_payments = len(feeder.orders), len(feeder.payments)
        total = n_orders + n_payments
        assert halted < total, (halted, total)
        balances = read_topic(kafka_bootstrap, topics.balances, expected=total, timeout=180, idle=2)
        o_tot = read_topic(kafka_bootstrap, topics.order_totals, expected=n_orders, idle=1)
        p_tot = read_topic(kafka_bootstrap, topics.payment_totals, expected=n_payments, idle=1)
    finally:
        feeder.stop()
        for fleet in (*first, *second):
            for proc in fleet.procs.values():
                if proc.alive:
                    proc.terminate()
    logs = "\n".join(f.logs() for f in (*first, *second))
    orders = read_events(kafka_bootstrap, topics.orders, n_orders)
    payments = read_events(kafka_bootstrap, topics.payments, n_payments)
    assert sorted(orders) == sorted(feeder.orders) and sorted(payments) == sorted(feeder.payments)
    problems = check_dag(orders, payments, o_tot, p_tot, balances)
    assert problems == [], "\n".join(problems[:20]) + "\n" + logs[-20000:]
    print(f"{alignment}: savepoint {sp_id} in {took:.1f}s; {total} events, {halted} before it")
