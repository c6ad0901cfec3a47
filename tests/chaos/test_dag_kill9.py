"""Exactly-once through a DAG of three apps (two pipelines joined in one) under kill -9.

examples/dag_pipeline.py: one ``order-totals`` and one ``payment-totals`` instance read
4-partition topics that keep receiving orders and payments and write their internal
topics; two ``balances`` instances read both internal topics, aligning on the barriers of
every writer of both. A random instance of any of the three apps is killed with SIGKILL at
random moments (sometimes again right after its restart; sometimes its state dir is wiped)
and restarted with the same instance id. After the input ends and everything drained, every
committed output (read_committed) must match the independent model of tests/chaos/_dag.py.

``LOCKGATE_CHAOS_KILLS`` (default 6; ``make chaos`` uses 40) sets the number of kills and
``LOCKGATE_CHAOS_SEED`` repeats a run (the seed is printed and in every assertion message).
"""

from __future__ import annotations

import os
import random
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
from tests.chaos._harness import (
    chaos_env,
    chaos_seed,
    describe_group,
    kill_at_random,
    stop_feeding_soon,
)
from tests.chaos._pipeline import PipelineFleet, data_records, read_topic
from tests.support.kafka import create_topic

pytestmark = pytest.mark.chaos

KILLS = int(os.environ.get("LOCKGATE_CHAOS_KILLS", "6"))
PARTITIONS = 4


def _env(bootstrap: str, topics: DagTopics, app_name: str, alignment: str) -> dict[str, str]:
    env = chaos_env(bootstrap, app_name, topics.orders, topics.balances)
    del env["LOCKGATE_INPUT_TOPIC"]  # the DAG's apps name their topics themselves
    return dag_env(bootstrap, topics, app_name, **env, LOCKGATE_ALIGNMENT=alignment)


@pytest.mark.parametrize("alignment", ["aligned", "none"])
def test_dag_kill9_exactly_once(kafka_bootstrap: str, tmp_path: Path, alignment: str) -> None:
    seed = chaos_seed()
    rng = random.Random(seed)
    topics = DagTopics.fresh("chaos-dag")
    for topic in (topics.orders, topics.payments, topics.order_totals, topics.payment_totals):
        create_topic(kafka_bootstrap, topic, PARTITIONS)
    total = max(4000, KILLS * 500)
    feeder = DagFeeder(
        kafka_bootstrap,
        topics,
        total=total,
        rate=total / (KILLS * 2.5 + 10),
        customers=30,
        seed=seed,
    )
    fleets = {
        "orders": PipelineFleet(
            ORDERS_SPEC,
            _env(kafka_bootstrap, topics, topics.orders_app, alignment),
            tmp_path,
            ["o1"],
        ),
        "payments": PipelineFleet(
            PAYMENTS_SPEC,
            _env(kafka_bootstrap, topics, topics.payments_app, alignment),
            tmp_path,
            ["p1"],
        ),
        "balances": PipelineFleet(
            BALANCES_SPEC,
            _env(kafka_bootstrap, topics, topics.balances_app, alignment),
            tmp_path,
            ["b1", "b2"],
        ),
    }
    instances = [(name, iid) for name, fleet in fleets.items() for iid in fleet.ids]
    history: list[str] = []
    started = time.monotonic()
    apps = (topics.orders_app, topics.payments_app, topics.balances_app)

    def logs() -> str:
        return "\n".join(fleet.logs() for fleet in fleets.values())

    def diagnose() -> str:
        for fleet in fleets.values():
            fleet.dump_stacks()
        time.sleep(1.0)
        groups = [describe_group(kafka_bootstrap, a) for a in apps]
        return "\n".join(groups + [fleet.tails(40) for fleet in fleets.values()])

    def about() -> str:
        return f"seed {seed} ({alignment}); kills: {', '.join(history)}"

    for fleet in fleets.values():
        fleet.start_all()
    feeder.start()
    try:

        def pick() -> tuple[PipelineFleet, str]:
            name, victim = rng.choice(instances)
            return fleets[name], victim

        kill_at_random(rng, pick, KILLS, history, started)
        stop_feeding_soon(feeder)
        feeder.join(300)
        assert feeder.error is None, feeder.error
        n_o, n_p = len(feeder.orders), len(feeder.payments)
        orders = read_events(kafka_bootstrap, topics.orders, n_o)
        payments = read_events(kafka_bootstrap, topics.payments, n_p)
        assert sorted(orders) == sorted(feeder.orders), about()
        assert sorted(payments) == sorted(feeder.payments), about()
        o_tot = read_topic(kafka_bootstrap, topics.order_totals, expected=n_o, timeout=180, idle=3)
        p_tot = read_topic(
            kafka_bootstrap, topics.payment_totals, expected=n_p, timeout=120, idle=3
        )
        balances = read_topic(
            kafka_bootstrap, topics.balances, expected=n_o + n_p, timeout=180, idle=3
        )
        problems = check_dag(orders, payments, o_tot, p_tot, balances)
        report = diagnose() if problems else ""
        codes: dict[str, int] = {}
        for fleet in fleets.values():
            codes.update(fleet.stop_all())
    except BaseException:
        print(about())
        print(logs())
        print(diagnose())
        raise
    starts = sum(fleet.starts for fleet in fleets.values())
    print(
        f"DAG chaos {about()}: {n_o} orders, {n_p} payments, "
        f"{len(data_records(balances))} balances, {starts} starts, "
        f"{time.monotonic() - started:.0f}s"
    )
    assert problems == [], about() + "\n" + "\n".join(problems[:20]) + "\n" + report
    assert codes == {"o1": 0, "p1": 0, "b1": 0, "b2": 0}, about() + "\n" + logs()
