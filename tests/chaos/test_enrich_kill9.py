"""Exactly-once of a two-input app (left as-of join) under kill -9 at random moments.

examples/enrich_orders.py: two instances read a 4-partition orders topic and a 4-partition
customers topic (co-partitioned, keyed by customer id, explicit event timestamps). The first
rounds of inputs are a backlog when the instances start; the rest arrive live, round by
round: a round's customer records (new versions, tombstones, equal timestamps, late arrivals
with older timestamps) and, at least ``GAP`` seconds later, its orders, whose timestamps are
all later than those of earlier rounds (tests/support/enrich_model.py keeps the join result
independent of fetch timing). A random instance is killed with SIGKILL at random moments
(sometimes again right after its restart, into start-up and restore; sometimes its state dir
is wiped) and restarted with the same instance id. At the end the committed output
(read_committed) must hold exactly one record per order with exactly the model's customer.

``LOCKGATE_CHAOS_KILLS`` (default 6) sets the number of kills and ``LOCKGATE_CHAOS_SEED``
repeats a run (the seed is printed and in every assertion message).

The app declares the topic variables it reads: ``App("enrich-orders",
env=["LOCKGATE_ORDERS_TOPIC", "LOCKGATE_CUSTOMERS_TOPIC"])``.
"""

from __future__ import annotations

import os
import random
import threading
import time
from pathlib import Path

import pytest

from tests.chaos._harness import Fleet, chaos_env, chaos_seed, describe_group, kill_at_random
from tests.support.enrich_model import (
    Round,
    check,
    classify,
    event_time_base,
    expected_outputs,
    fresh_names,
    make_round,
    produce,
    producer,
    read_records,
)
from tests.support.kafka import create_topic, read_all

pytestmark = pytest.mark.chaos

SPEC = "examples.enrich_orders:app"
KILLS = int(os.environ.get("LOCKGATE_CHAOS_KILLS", "6"))
PARTITIONS = 4
KEYS = [f"cust-{i}" for i in range(200)] + [f"cust-{i}-ghost" for i in range(200, 205)]
BACKLOG_ROUNDS = 4
GAP = 1.0  # seconds between a round's customers and its orders


def _rounds(seed: int, live_seconds: float) -> list[Round]:
    """All rounds of one run, from the seed alone (~1.1 s of feeding per live round)."""
    rng = random.Random(seed * 2 + 1)
    count = BACKLOG_ROUNDS + max(8, int(live_seconds / (GAP + 0.1)))
    orders = max(4000, KILLS * 400) // count
    base = event_time_base()
    versions: dict[str, int] = {}
    return [
        make_round(
            rng, n, KEYS, orders, base=base, versions=versions, updates=(0, 0, 0, 0, 1, 1, 2)
        )
        for n in range(count)
    ]


class RoundFeeder(threading.Thread):
    """Produces rounds live: customers, then ``GAP`` seconds later the round's orders."""

    def __init__(self, bootstrap: str, names: dict[str, str], rounds: list[Round]) -> None:
        super().__init__(daemon=True)
        self.bootstrap = bootstrap
        self.customers_topic = names["LOCKGATE_CUSTOMERS_TOPIC"]
        self.orders_topic = names["LOCKGATE_ORDERS_TOPIC"]
        self.rounds = rounds
        self.customers = 0
        self.orders = 0
        self.error: BaseException | None = None

    def produce_now(self, rounds: list[Round]) -> None:
        p = producer(self.bootstrap)
        for rnd in rounds:
            self.customers += produce(p, self.customers_topic, rnd.customers)
            self.orders += produce(p, self.orders_topic, rnd.orders)

    def run(self) -> None:
        try:
            p = producer(self.bootstrap)
            for rnd in self.rounds:
                self.customers += produce(p, self.customers_topic, rnd.customers)
                time.sleep(GAP)
                self.orders += produce(p, self.orders_topic, rnd.orders)
        except BaseException as exc:  # noqa: BLE001 - reported by the test
            self.error = exc


def test_enrich_kill9_exactly_once(kafka_bootstrap: str, tmp_path: Path) -> None:
    seed = chaos_seed()
    rng = random.Random(seed)
    names = fresh_names("chaos-enrich")
    create_topic(kafka_bootstrap, names["LOCKGATE_ORDERS_TOPIC"], PARTITIONS)
    create_topic(kafka_bootstrap, names["LOCKGATE_CUSTOMERS_TOPIC"], PARTITIONS)
    env = chaos_env(kafka_bootstrap, names["LOCKGATE_APP_NAME"], "", "")
    del env["LOCKGATE_INPUT_TOPIC"]  # the app names its two inputs itself
    env.update(names)
    rounds = _rounds(seed, live_seconds=KILLS * 2.5 + 5)
    feeder = RoundFeeder(kafka_bootstrap, names, rounds[BACKLOG_ROUNDS:])
    feeder.produce_now(rounds[:BACKLOG_ROUNDS])
    fleet = Fleet(SPEC, env, tmp_path, ["k1", "k2"])
    history: list[str] = []
    started = time.monotonic()

    def about() -> str:
        return f"seed {seed}; kills: {', '.join(history) or 'none'}"

    def diagnose() -> str:
        """Group, then stacks and log tails of the instances (compact: CI cuts long output)."""
        fleet.dump_stacks()
        time.sleep(1.0)
        return describe_group(kafka_bootstrap, names["LOCKGATE_APP_NAME"]) + "\n" + fleet.tails(40)

    fleet.start_all()
    feeder.start()
    try:
        kill_at_random(rng, lambda: (fleet, rng.choice(fleet.ids)), KILLS, history, started)
        feeder.join(300)
        assert not feeder.is_alive() and feeder.error is None, f"{about()}: {feeder.error}"
        customers = read_records(
            kafka_bootstrap, names["LOCKGATE_CUSTOMERS_TOPIC"], feeder.customers
        )
        orders = read_records(kafka_bootstrap, names["LOCKGATE_ORDERS_TOPIC"], feeder.orders)
        assert (len(customers), len(orders)) == (feeder.customers, feeder.orders), about()
        expected = expected_outputs(customers, orders)
        outputs = read_all(
            kafka_bootstrap, names["LOCKGATE_OUTPUT_TOPIC"], expected=len(orders), timeout=120,
            idle=3,
        )  # fmt: skip
        problems = check(expected, outputs)
        report = diagnose() if problems else ""
        codes = fleet.stop_all()
    except BaseException:
        print(about())
        print(diagnose())
        raise
    print(
        f"enrich chaos {about()}: {len(orders)} orders, {len(customers)} customer records, "
        f"{len(outputs)} outputs, {fleet.starts} starts, {time.monotonic() - started:.0f}s; "
        f"cases {dict(classify(customers, orders))}"
    )
    assert problems == [], about() + "\n" + "\n".join(problems[:20]) + "\n" + report
    assert codes == {"k1": 0, "k2": 0}, about() + "\n" + fleet.tails(40)
