"""Inputs, processes and the independent checker of the three-app DAG (examples/dag_pipeline.py).

``order-totals`` and ``payment-totals`` turn orders and payments (key = customer, value
``{"amount", "seq"}``) into one running ``{"total", "count"}`` record per event on their
internal topics; ``balances`` reads both and emits one ``{"orders", "payments", "balance"}``
record per internal record it reads.

The model comes from the stored inputs alone (partition order is each customer's order):
per customer, order-totals must be exactly the prefix sums ``(total_k, k)`` for
``k = 1..n`` in order (payments alike). The order in which ``balances`` meets the two
internal topics is not fixed (it interleaves them by timestamp), so its check is exact up to
that order: per customer, the ``(orders, payments)`` counts of its records, in order, start
at one of ``(1, 0)``/``(0, 1)``, each record adds exactly one to one of them (a duplicate
repeats or goes back, a loss jumps), they end at the customer's ``(orders, payments)``, and
every balance is ``order_total[orders] - payment_total[payments]`` from the model's prefix
sums. Records with a ``lockgate-type`` header (barriers) are skipped. The apps declare their
topic variables themselves (``App(..., env=["LOCKGATE_ORDERS_TOPIC", "LOCKGATE_PAYMENTS_TOPIC",
"LOCKGATE_ORDER_TOTALS_TOPIC", "LOCKGATE_PAYMENT_TOTALS_TOPIC"])``); the tests build their
environment here only.
"""

from __future__ import annotations

import random
import threading
import time
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import orjson
from confluent_kafka import Producer

from tests.chaos._pipeline import data_records, read_topic
from tests.support.kafka import unique

ORDERS_SPEC = "examples.dag_pipeline:orders_app"
PAYMENTS_SPEC = "examples.dag_pipeline:payments_app"
BALANCES_SPEC = "examples.dag_pipeline:balance_app"

#: One event as produced and stored: (customer, amount, seq).
Event = tuple[str, int, int]


@dataclass(frozen=True)
class DagTopics:
    """Unique topic and app names of one DAG run."""

    orders: str
    payments: str
    order_totals: str
    payment_totals: str
    balances: str
    orders_app: str
    payments_app: str
    balances_app: str

    @classmethod
    def fresh(cls, prefix: str) -> DagTopics:
        return cls(
            orders=unique(f"{prefix}-orders"),
            payments=unique(f"{prefix}-payments"),
            order_totals=unique(f"{prefix}-order-totals"),
            payment_totals=unique(f"{prefix}-payment-totals"),
            balances=unique(f"{prefix}-balances"),
            orders_app=unique(f"{prefix}-order-totals"),
            payments_app=unique(f"{prefix}-payment-totals"),
            balances_app=unique(f"{prefix}-balances"),
        )


def dag_env(bootstrap: str, topics: DagTopics, app_name: str, **extra: str) -> dict[str, str]:
    """The environment of one app of the DAG (every app accepts every topic variable)."""
    env = {
        "LOCKGATE_BOOTSTRAP_SERVERS": bootstrap,
        "LOCKGATE_APP_NAME": app_name,
        "LOCKGATE_ORDERS_TOPIC": topics.orders,
        "LOCKGATE_PAYMENTS_TOPIC": topics.payments,
        "LOCKGATE_ORDER_TOTALS_TOPIC": topics.order_totals,
        "LOCKGATE_PAYMENT_TOTALS_TOPIC": topics.payment_totals,
        "LOCKGATE_OUTPUT_TOPIC": topics.balances,
    }
    env.update(extra)
    return env


class DagFeeder(threading.Thread):
    """Produces orders and payments at a steady rate (two payments per three orders).

    ``orders`` and ``payments`` are what it sent, in order. ``total`` is an upper bound:
    :meth:`stop` ends the input earlier.
    """

    def __init__(
        self, bootstrap: str, topics: DagTopics, total: int, rate: float, customers: int, seed: int
    ) -> None:
        super().__init__(daemon=True)
        self.bootstrap, self.topics = bootstrap, topics
        self.total, self.rate, self.customers = total, rate, customers
        self.rng = random.Random(seed)
        self.orders: list[Event] = []
        self.payments: list[Event] = []
        self.error: BaseException | None = None
        self._halt = threading.Event()

    def stop(self) -> None:
        """Produce nothing more (what was produced is flushed); then ``join()``."""
        self._halt.set()

    def run(self) -> None:
        try:
            p = Producer(
                {
                    "bootstrap.servers": self.bootstrap,
                    "partitioner": "murmur2_random",
                    "enable.idempotence": True,
                    "linger.ms": 5,
                }
            )
            started = time.monotonic()
            for seq in range(self.total):
                if self._halt.is_set():
                    break
                customer = f"customer-{self.rng.randrange(self.customers)}"
                amount = self.rng.randint(1, 100)
                is_order = seq % 5 < 3
                topic = self.topics.orders if is_order else self.topics.payments
                value = orjson.dumps({"amount": amount, "seq": seq})
                while True:
                    try:
                        p.produce(topic, value, customer.encode())
                        break
                    except BufferError:
                        p.poll(0.1)
                (self.orders if is_order else self.payments).append((customer, amount, seq))
                ahead = seq / self.rate - (time.monotonic() - started)
                if ahead > 0:
                    self._halt.wait(ahead)
                p.poll(0)
            assert p.flush(60) == 0
        except BaseException as exc:  # noqa: BLE001 - reported by the test
            self.error = exc


def read_events(bootstrap: str, topic: str, expected: int) -> list[Event]:
    """The events of ``topic`` as stored, in (partition, offset) order."""
    return [
        (m.key().decode(), int(v["amount"]), int(v["seq"]))
        for m in read_topic(bootstrap, topic, expected, idle=0.5)
        for v in [orjson.loads(m.value())]
    ]


def prefix_sums(events: Iterable[Event]) -> dict[str, list[int]]:
    """Per customer, ``[0, a1, a1 + a2, ...]`` in stored order."""
    sums: dict[str, list[int]] = defaultdict(lambda: [0])
    for customer, amount, _ in events:
        sums[customer].append(sums[customer][-1] + amount)
    return dict(sums)


def check_totals(name: str, sums: dict[str, list[int]], msgs: list[Any]) -> list[str]:
    """An internal topic: per customer exactly ``(total_k, k)`` for ``k = 1..n``, in order."""
    got: dict[str, list[tuple[int, int]]] = defaultdict(list)
    for key, value in data_records(msgs):
        got[key].append((int(value["total"]), int(value["count"])))
    problems = []
    for customer in sorted(set(sums) | set(got)):
        want = [(t, k) for k, t in enumerate(sums.get(customer, [0]))][1:]
        have = got.get(customer, [])
        if have != want:
            pairs = enumerate(zip(want, have, strict=False))
            at = next((i for i, (a, b) in pairs if a != b), min(len(want), len(have)))
            problems.append(
                f"{name} {customer}: expected {len(want)} records, got {len(have)}; first "
                f"difference at #{at}: expected {want[at] if at < len(want) else None}, "
                f"got {have[at] if at < len(have) else None}"
            )
    return problems


def check_balances(
    orders: dict[str, list[int]], payments: dict[str, list[int]], msgs: list[Any]
) -> list[str]:
    """``balances``: per customer one step per internal record, balances from the model."""
    got: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for key, value in data_records(msgs):
        got[key].append(value)
    problems = []
    for customer in sorted(set(orders) | set(payments) | set(got)):
        o_sums, p_sums = orders.get(customer, [0]), payments.get(customer, [0])
        want_end = (len(o_sums) - 1, len(p_sums) - 1)
        prev = (0, 0)
        for i, value in enumerate(got.get(customer, [])):
            step = (int(value["orders"]), int(value["payments"]))
            if step not in ((prev[0] + 1, prev[1]), (prev[0], prev[1] + 1)):
                problems.append(f"balances {customer} #{i}: {prev} -> {step} (not one step)")
                break
            if step[0] >= len(o_sums) or step[1] >= len(p_sums):
                problems.append(f"balances {customer} #{i}: {step} beyond the inputs {want_end}")
                break
            want = o_sums[step[0]] - p_sums[step[1]]
            if int(value["balance"]) != want:
                problems.append(f"balances {customer} #{i}: balance {value} != {want}")
                break
            prev = step
        else:
            if prev != want_end:
                problems.append(f"balances {customer}: ended at {prev}, expected {want_end}")
    return problems


def check_dag(
    orders: list[Event],
    payments: list[Event],
    order_totals: list[Any],
    payment_totals: list[Any],
    balances: list[Any],
) -> list[str]:
    """Every committed output of the DAG against the model; the problems found."""
    o_sums, p_sums = prefix_sums(orders), prefix_sums(payments)
    return [
        *check_totals("order-totals", o_sums, order_totals),
        *check_totals("payment-totals", p_sums, payment_totals),
        *check_balances(o_sums, p_sums, balances),
    ]
