"""examples/enrich_orders.py end to end: a left as-of join of two co-partitioned inputs.

Two instances of the app read a 4-partition orders topic and a 4-partition customers topic
(both keyed by customer id, produced with the Java-compatible murmur2 partitioner and explicit
event timestamps). The committed output (read_committed) must equal the independent model of
tests/support/enrich_model.py computed from the input topics as stored: one record per order
with the customer's latest value at or before the order's timestamp (null when none or
deleted), per key in the orders' offset order.

The first rounds of inputs are produced before the apps start (both inputs are a backlog the
runtime interleaves by timestamp); later rounds are produced live, customers first, and their
orders only once the app committed every customer record (so orders between a late-arriving
customer record and the newer one before it see the late one, whatever the fetch timing).

The app declares the topic variables it reads: ``App("enrich-orders",
env=["LOCKGATE_ORDERS_TOPIC", "LOCKGATE_CUSTOMERS_TOPIC"])``.
"""

from __future__ import annotations

import random
import threading
import time
from pathlib import Path
from typing import Any

from tests.chaos._harness import Fleet
from tests.support.enrich_model import (
    OutputReader,
    check,
    classify,
    event_time_base,
    expected_outputs,
    fresh_names,
    lag,
    make_round,
    produce,
    producer,
    read_records,
    wait_committed,
)
from tests.support.kafka import create_topic
from tests.support.procs import wait_until

SPEC = "examples.enrich_orders:app"
PARTITIONS = 4
KEYS = [f"cust-{i}" for i in range(40)] + ["cust-40-ghost", "cust-41-ghost"]
CASES = {
    "no-customer",
    "deleted",
    "recreated",
    "tie",
    "equal-ts",
    "late-arrival-seen",
    "late-arrival-ignored",
    "newer-ignored",
}


class Run:
    """Topics, inputs, the app fleet and the output reader of one test."""

    def __init__(self, bootstrap: str, tmp_path: Path, seed: int) -> None:
        self.bootstrap = bootstrap
        self.names = fresh_names("enrich")
        self.app = self.names["LOCKGATE_APP_NAME"]
        self.orders_topic = self.names["LOCKGATE_ORDERS_TOPIC"]
        self.customers_topic = self.names["LOCKGATE_CUSTOMERS_TOPIC"]
        create_topic(bootstrap, self.orders_topic, PARTITIONS)
        create_topic(bootstrap, self.customers_topic, PARTITIONS)
        env = {
            "LOCKGATE_BOOTSTRAP_SERVERS": bootstrap,
            **self.names,
            "LOCKGATE_CHECKPOINT_INTERVAL_MS": "300",
            # instances are static members: a stopped one keeps its partitions this long
            "LOCKGATE_KAFKA__SESSION_TIMEOUT_MS": "6000",
            "LOCKGATE_KAFKA__HEARTBEAT_INTERVAL_MS": "1000",
        }
        self.fleet = Fleet(SPEC, env, tmp_path, ["e1", "e2"])
        self.rng = random.Random(seed)
        self.base = event_time_base()
        self.versions: dict[str, int] = {}
        self.producer = producer(bootstrap)
        self.rounds = 0
        self.orders = 0
        self.customers = 0
        self.reader = OutputReader(bootstrap, self.names["LOCKGATE_OUTPUT_TOPIC"])

    def alive(self) -> bool:
        return all(p.alive for p in self.fleet.procs.values())

    def produce_round(self, orders: int, live: bool) -> None:
        """Produce one round (see :meth:`start_round`)."""
        self.produce_orders(self.start_round(orders, live))

    def start_round(self, orders: int, live: bool) -> list[tuple[str, Any, int]]:
        """Produce a round's customer records; return its orders, to produce next.

        ``live``: the app runs; some orders fall between a late arrival and the newer record
        before it, so they are only to be produced once the app committed every customer
        record (waited for here).
        """
        rnd = make_round(
            self.rng, self.rounds, KEYS, orders, base=self.base, between=live,
            versions=self.versions,
        )  # fmt: skip
        self.rounds += 1
        self.customers += produce(self.producer, self.customers_topic, rnd.customers)
        if live:
            wait_committed(self.bootstrap, self.app, self.customers_topic, timeout=60)
        return rnd.orders

    def produce_orders(self, orders: list[tuple[str, Any, int]], seconds: float = 0.0) -> None:
        self.orders += produce(self.producer, self.orders_topic, orders, seconds)

    def outputs(self, expected: int, idle: float = 0.0, timeout: float = 60) -> list[Any]:
        return self.reader.read_until(expected, timeout, idle=idle, alive=self.alive)

    def verify(self, outputs: list[Any]) -> None:
        customers = read_records(self.bootstrap, self.customers_topic, self.customers)
        orders = read_records(self.bootstrap, self.orders_topic, self.orders)
        assert (len(customers), len(orders)) == (self.customers, self.orders)
        problems = check(expected_outputs(customers, orders), outputs)
        assert problems == [], "\n".join(problems[:20]) + "\n" + self.fleet.tails(40)
        cases = classify(customers, orders)
        assert CASES <= set(cases), cases  # the inputs exercise every case of the join
        print(f"{self.orders} orders, {self.customers} customer records; cases {dict(cases)}")


def test_enrich_orders_exact_output(kafka_bootstrap: str, tmp_path: Path) -> None:
    run = Run(kafka_bootstrap, tmp_path, seed=21)
    started = time.monotonic()
    for _ in range(3):
        run.produce_round(600, live=False)
    backlog = run.orders
    run.fleet.start_all()
    codes: dict[str, int] = {}
    try:
        got = run.outputs(backlog, timeout=60)
        assert len(got) >= backlog, f"{len(got)}/{backlog} outputs\n" + run.fleet.tails(40)
        run.produce_round(400, live=True)
        outputs = run.outputs(run.orders, idle=2)
    finally:
        codes = run.fleet.stop_all()
        run.reader.close()
    run.verify(outputs)
    assert codes == {"e1": 0, "e2": 0}, run.fleet.tails(40)
    assert all("stopped" in p.log_text() for p in run.fleet.procs.values())
    print(f"exact output in {time.monotonic() - started:.1f}s")


def test_enrich_orders_exactly_once_across_a_restart(kafka_bootstrap: str, tmp_path: Path) -> None:
    run = Run(kafka_bootstrap, tmp_path, seed=22)
    started = time.monotonic()
    run.produce_round(500, live=False)
    run.fleet.start_all()
    codes: dict[str, int] = {}
    try:
        # Once both instances have their key groups, orders keep coming for 3 s; e2 is
        # stopped (SIGTERM) in the middle. The next live round is processed by e1 alone
        # (after the session timeout), then e2 comes back (rebalance, restore from its local
        # state) for the last round.
        e2 = run.fleet.procs["e2"]
        wait_until(lambda: "key group restored" in e2.log_text(), 60, what="e2 restored")
        orders = run.start_round(3000, live=True)
        feeding = threading.Thread(target=run.produce_orders, args=(orders, 3.0), daemon=True)
        feeding.start()
        time.sleep(1.5)
        assert e2.terminate() == 0, run.fleet.tails(40)
        left = lag(kafka_bootstrap, run.app, run.orders_topic)  # e2's partitions: as it left
        feeding.join(60)
        assert run.orders == 3500, "the feeding thread failed"
        run.produce_round(400, live=True)
        mark = len(e2.log_text())
        e2 = run.fleet.start("e2")
        wait_until(lambda: "assigned" in e2.log_text()[mark:], 60, what="e2 assigned again")
        run.produce_round(400, live=True)
        outputs = run.outputs(run.orders, idle=2)
    finally:
        codes = run.fleet.stop_all()
        run.reader.close()
    run.verify(outputs)
    assert codes == {"e1": 0, "e2": 0}, run.fleet.tails(40)
    print(
        f"orders not committed per partition when e2 stopped: {left}; "
        f"exactly once across the restart in {time.monotonic() - started:.1f}s"
    )
