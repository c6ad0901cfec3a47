"""Independent model, inputs and checker of examples/enrich_orders.py (a left as-of join).

The model is computed from the two input topics as stored, independently of lockgate. For
every order (key = customer id, partition ``p``, offset ``o``, timestamp ``t``) the app must
write exactly one record keyed by the customer id, value ``{"order_id", "amount",
"customer"}``, where ``customer`` is the value of the customer record of that id with the
greatest ``(timestamp, offset)`` among those with ``timestamp <= t`` (ties with the order
count; among equal timestamps the later offset wins), or null when there is none or that
record is a tombstone. Per key the outputs must come in the order of the orders' offsets.
Arrival order of customer records does not matter, only their timestamps: a record with an
older timestamp produced after a newer one is what orders between the two see, and is not
what orders after the newer one see.

Inputs are generated in *rounds* with disjoint event-time windows (round ``r`` covers
``[base + r * window, base + (r + 1) * window)``): first the round's customer records, then
its orders. The generator keeps the join result independent of fetch timing:

* every partition's customer records are in timestamp order except for deliberate
  *late arrivals* (a record with an older timestamp right after a newer one of its key);
* every partition's orders are in timestamp order, and a round's orders come after all
  customer records of the round (later rounds' customers have later timestamps than any
  order of an earlier round);
* an order of a key whose late arrival's interval ``[older, newer)`` contains the order's
  timestamp (a *between* order) is only generated when the caller asks for it, and then the
  caller must make sure the app applied the round's customers before producing the orders
  (:func:`wait_committed`): read as a backlog, a runtime that interleaves the two inputs by
  timestamp legitimately processes such an order before the late record it should see.

The app declares the topic variables it reads: ``App("enrich-orders",
env=["LOCKGATE_ORDERS_TOPIC", "LOCKGATE_CUSTOMERS_TOPIC"])``.
"""

from __future__ import annotations

import random
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import orjson
from confluent_kafka import Consumer, KafkaError, Producer, TopicPartition

from tests.support.kafka import read_all, unique

CONTROL_HEADER = "lockgate-type"


@dataclass(frozen=True)
class Rec:
    """One input record as stored: decoded value (None = tombstone), timestamp, position."""

    key: str
    value: Any
    timestamp: int
    partition: int
    offset: int


# ----------------------------------------------------------------------------- the model


def _canon(value: Any) -> bytes:
    return orjson.dumps(value, option=orjson.OPT_SORT_KEYS)


def customers_by_key(customers: Iterable[Rec]) -> dict[str, list[Rec]]:
    """Each key's customer records sorted by ``(timestamp, offset)``.

    Raises ValueError when a key's records are in more than one partition (then offsets do not
    order them, and the inputs were not produced co-partitioned).
    """
    by_key: dict[str, list[Rec]] = defaultdict(list)
    for c in customers:
        by_key[c.key].append(c)
    for key, recs in by_key.items():
        parts = {c.partition for c in recs}
        if len(parts) > 1:
            raise ValueError(f"customer {key} is in partitions {sorted(parts)}")
        recs.sort(key=lambda c: (c.timestamp, c.offset))
    return dict(by_key)


def as_of(history: Sequence[Rec], ts: int) -> Rec | None:
    """The record of ``history`` (sorted by ``(timestamp, offset)``) an order at ``ts`` sees."""
    seen = None
    for c in history:  # short histories: a linear scan is the obviously right version
        if c.timestamp > ts:
            break
        seen = c
    return seen


def expected_outputs(
    customers: Iterable[Rec], orders: Iterable[Rec]
) -> dict[str, list[dict[str, Any]]]:
    """Per key (customer id), the output values of its orders in the orders' offset order."""
    history = customers_by_key(customers)
    out: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for o in sorted(orders, key=lambda o: (o.partition, o.offset)):
        hist = history.get(o.key, [])
        if hist and hist[0].partition != o.partition:
            raise ValueError(
                f"order {o.value.get('order_id')} of {o.key} is in partition {o.partition}, "
                f"its customer records in {hist[0].partition}: the topics are not co-partitioned"
            )
        seen = as_of(hist, o.timestamp)
        out[o.key].append(
            {
                "order_id": o.value["order_id"],
                "amount": o.value["amount"],
                "customer": None if seen is None else seen.value,
            }
        )
    return dict(out)


def classify(customers: Iterable[Rec], orders: Iterable[Rec]) -> Counter[str]:
    """How many orders exercise each case of the join (to show a scenario covers them all).

    ``no-customer``: nothing at or before the order; ``deleted``: the latest is a tombstone;
    ``recreated``: a value after an earlier tombstone; ``tie``: the record seen has the order's
    timestamp; ``equal-ts``: it won over another record with its timestamp by its offset;
    ``late-arrival-seen``: it arrived after a record with a newer timestamp (a between order);
    ``late-arrival-ignored``: a record with an older timestamp arrived after it and must not
    shadow it; ``newer-ignored``: the key has a record with a newer timestamp than the order's
    (not visible to it, even when the app applied it before the order).
    """
    history = customers_by_key(customers)
    n: Counter[str] = Counter()
    for o in orders:
        hist = history.get(o.key, [])
        seen = as_of(hist, o.timestamp)
        if seen is None:
            n["no-customer"] += 1
        elif seen.value is None:
            n["deleted"] += 1
        elif any(c.value is None and (c.timestamp, c.offset) < (seen.timestamp, seen.offset)
                 for c in hist):  # fmt: skip
            n["recreated"] += 1
        if seen is None:
            if hist:
                n["newer-ignored"] += 1
            continue
        if seen.timestamp == o.timestamp:
            n["tie"] += 1
        if any(c.timestamp == seen.timestamp and c.offset < seen.offset for c in hist):
            n["equal-ts"] += 1
        if any(c.timestamp > seen.timestamp and c.offset < seen.offset for c in hist):
            n["late-arrival-seen"] += 1
        if any(c.timestamp < seen.timestamp and c.offset > seen.offset for c in hist):
            n["late-arrival-ignored"] += 1
        if any(c.timestamp > o.timestamp for c in hist):
            n["newer-ignored"] += 1
    return n


# ----------------------------------------------------------------------------- checking


def is_control(m: Any) -> bool:
    return any(k == CONTROL_HEADER for k, _ in (m.headers() or []))


def check(expected: dict[str, list[dict[str, Any]]], messages: Iterable[Any]) -> list[str]:
    """Compare committed output messages with the model; return the problems (compact lines).

    Exactly one output per order with exactly the model's value and key, nothing else, and
    per key in the orders' offset order. Records with a ``lockgate-type`` header are skipped.
    """
    msgs = [m for m in messages if not is_control(m)]
    msgs.sort(key=lambda m: (m.partition(), m.offset()))
    want: dict[str, tuple[str, dict[str, Any]]] = {}
    for key, values in expected.items():
        for v in values:
            want[v["order_id"]] = (key, v)
    got: dict[str, list[dict[str, Any]]] = defaultdict(list)
    by_id: dict[Any, list[tuple[str, Any]]] = defaultdict(list)
    undecodable: list[str] = []
    for m in msgs:
        key = m.key().decode() if m.key() is not None else "<null key>"
        try:
            value = orjson.loads(m.value()) if m.value() is not None else None
        except orjson.JSONDecodeError:
            undecodable.append(f"{m.partition()}@{m.offset()}")
            continue
        got[key].append(value)
        oid = value.get("order_id") if isinstance(value, dict) else repr(value)
        by_id[oid].append((key, value))
    problems: list[str] = []
    if undecodable:
        problems.append(f"{len(undecodable)} undecodable outputs, e.g. {undecodable[:5]}")
    missing = sorted(set(want) - set(by_id))
    unknown = sorted(map(str, set(by_id) - set(want)))
    dups = sorted(oid for oid, seen in by_id.items() if oid in want and len(seen) > 1)
    wrong = sorted(
        oid
        for oid, seen in by_id.items()
        if oid in want and any(_canon(s) != _canon(want[oid]) for s in seen)
    )
    total = sum(len(v) for v in expected.values())
    if missing or unknown or dups or wrong or len(msgs) != total:
        problems.append(
            f"{total} orders, {len(msgs)} outputs: missing {len(missing)} {missing[:5]}, "
            f"duplicated {len(dups)} {dups[:5]}, unknown {len(unknown)} {unknown[:5]}, "
            f"wrong key or value {len(wrong)}"
        )
    for oid in wrong[:8]:
        key, value = want[oid]
        for got_key, got_value in by_id[oid]:
            if _canon((got_key, got_value)) != _canon((key, value)):
                problems.append(
                    f"order {oid}: expected key {key} customer {_short(value['customer'])}, "
                    f"got key {got_key} value {_short(got_value)}"
                )
                break
    out_of_order = []
    if not (missing or dups or unknown):  # same orders per key: compare their order
        out_of_order = [
            key
            for key in sorted(expected)
            if [v["order_id"] for v in got.get(key, [])] != [v["order_id"] for v in expected[key]]
        ]
    for key in out_of_order[:5]:
        e = [v["order_id"] for v in expected[key]]
        g = [v["order_id"] for v in got.get(key, [])]
        at = next((i for i, (a, b) in enumerate(zip(e, g, strict=False)) if a != b), 0)
        problems.append(
            f"key {key}: outputs not in the orders' offset order from #{at}: "
            f"expected {e[at : at + 4]}, got {g[at : at + 4]}"
        )
    if len(out_of_order) > 5:
        problems.append(f"... {len(out_of_order)} keys out of order in all")
    return problems


def _short(value: Any, limit: int = 120) -> str:
    text = orjson.dumps(value).decode()
    return text if len(text) <= limit else text[: limit - 3] + "..."


# ----------------------------------------------------------------------------- inputs


@dataclass
class Round:
    """One round: its customer records and orders, each in production order."""

    customers: list[tuple[str, Any, int]]
    orders: list[tuple[str, Any, int]]


def make_round(
    rng: random.Random,
    number: int,
    keys: Sequence[str],
    orders: int,
    *,
    base: int,
    window: int = 10_000,
    between: bool = False,
    versions: dict[str, int] | None = None,
    updates: Sequence[int] = (0, 1, 1, 2, 3),
) -> Round:
    """Customer records and orders of round ``number`` (see the module docstring).

    ``versions`` counts the versions written per key across rounds (customer values name
    their version, so every version is distinguishable); a key gets ``rng.choice(updates)``
    customer updates in the round, keys ending in ``-ghost`` none ever. With ``between`` some
    orders fall into late arrivals' intervals; the caller must then let the app apply the
    round's customers before producing its orders.
    """
    versions = versions if versions is not None else {}
    lo = base + number * window
    cust_hi = lo + window * 8 // 10
    placed: list[tuple[tuple[int, int, int], tuple[str, Any, int]]] = []  # (sort key, record)
    forbidden: dict[str, list[tuple[int, int]]] = defaultdict(list)  # late-arrival intervals
    interesting: dict[str, list[int]] = defaultdict(list)  # timestamps orders should hit
    seq = 0

    def value(key: str) -> dict[str, Any]:
        versions[key] = versions.get(key, 0) + 1
        n = versions[key]
        return {"id": key, "name": f"{key} v{n}", "version": n, "tier": ["a", "b", "c"][n % 3]}

    for key in keys:
        if key.endswith("-ghost"):  # never has customer records
            continue
        for _ in range(rng.choice(updates)):
            ts = rng.randrange(lo, cust_hi)
            kind = rng.random()
            if kind < 0.15:
                placed.append(((ts, 0, seq), (key, None, ts)))  # tombstone
                interesting[key].append(ts)
            elif kind < 0.25:  # two records with one timestamp: the later offset wins
                placed.append(((ts, 0, seq), (key, value(key), ts)))
                seq += 1
                placed.append(((ts, 0, seq), (key, value(key), ts)))
                interesting[key].append(ts)
            elif kind < 0.40 and ts - lo > 200:  # late arrival: older timestamp, after newer
                older = rng.randrange(lo, ts - 100)
                placed.append(((ts, 0, seq), (key, value(key), ts)))
                placed.append(((ts, 1, seq), (key, value(key), older)))
                forbidden[key].append((older, ts))
                interesting[key] += [older, ts]
            else:
                placed.append(((ts, 0, seq), (key, value(key), ts)))
                interesting[key].append(ts)
            seq += 1
    placed.sort(key=lambda p: p[0])
    customers = [rec for _, rec in placed]

    out: list[tuple[int, int, tuple[str, Any, int]]] = []
    for i in range(orders):
        key = rng.choice(keys)
        r = rng.random()
        if r < 0.15 and interesting[key]:
            ts = rng.choice(interesting[key])  # a tie with a customer record
        elif r < 0.30 and between and forbidden[key]:
            older, newer = rng.choice(forbidden[key])
            ts = rng.randrange(older, newer)
        else:
            ts = rng.randrange(lo, lo + window)
        while not between and any(a <= ts < b for a, b in forbidden[key]):
            ts = max(b for a, b in forbidden[key] if a <= ts < b)  # the newer one: a tie
        order = {"order_id": f"o{number}-{i}", "amount": rng.randrange(1, 10_000)}
        out.append((ts, i, (key, order, ts)))
    out.sort(key=lambda o: (o[0], o[1]))
    return Round(customers, [rec for _, _, rec in out])


def event_time_base() -> int:
    """Round 0's start: three hours ago, whole seconds (in the past, within retention)."""
    return (int(time.time()) - 3 * 3600) * 1000


def producer(bootstrap: str) -> Producer:
    return Producer(
        {
            "bootstrap.servers": bootstrap,
            "partitioner": "murmur2_random",  # Java-compatible: the app's key groups
            "enable.idempotence": True,  # no reordering on retries
            "linger.ms": 5,
        }
    )


def produce(
    p: Producer, topic: str, records: Sequence[tuple[str, Any, int]], seconds: float = 0.0
) -> int:
    """Produce ``(key, value, timestamp)`` records (value None = tombstone); flush.

    With ``seconds``, spread evenly over that much wall time.
    """
    n = 0
    started = time.monotonic()
    for key, value, ts in records:
        ahead = n * seconds / max(len(records), 1) - (time.monotonic() - started)
        if ahead > 0:
            time.sleep(ahead)
            p.poll(0)
        payload = None if value is None else orjson.dumps(value)
        while True:
            try:
                p.produce(topic, payload, key.encode(), timestamp=ts)
                break
            except BufferError:
                p.poll(0.1)
        n += 1
        if n % 1000 == 0:
            p.poll(0)
    assert p.flush(30) == 0
    return n


def read_records(bootstrap: str, topic: str, expected: int) -> list[Rec]:
    """Every record of ``topic`` as stored, in (partition, offset) order."""
    msgs = read_all(bootstrap, topic, expected=expected, idle=0.5)
    msgs.sort(key=lambda m: (m.partition(), m.offset()))
    return [
        Rec(
            key=m.key().decode(),
            value=None if m.value() is None else orjson.loads(m.value()),
            timestamp=m.timestamp()[1],
            partition=m.partition(),
            offset=m.offset(),
        )
        for m in msgs
    ]


class OutputReader:
    """Reads a topic read_committed from the start, keeping what it read across calls."""

    def __init__(self, bootstrap: str, topic: str) -> None:
        self.topic = topic
        self.messages: list[Any] = []
        self._consumer = Consumer(
            {
                "bootstrap.servers": bootstrap,
                "group.id": unique("enrich-reader"),
                "enable.auto.commit": False,
                "auto.offset.reset": "earliest",
                "isolation.level": "read_committed",
            }
        )
        self._assigned = False

    def _assign(self) -> bool:
        md = self._consumer.list_topics(self.topic, timeout=10).topics[self.topic]
        if md.error is not None or not md.partitions:
            return False  # the app creates its output topic: not yet
        self._consumer.assign([TopicPartition(self.topic, p, 0) for p in md.partitions])
        self._assigned = True
        return True

    def data(self) -> list[Any]:
        """The records read so far without a ``lockgate-type`` header."""
        return [m for m in self.messages if not is_control(m)]

    def read_until(
        self,
        expected: int,
        timeout: float,
        idle: float = 0.0,
        alive: Callable[[], bool] | None = None,
    ) -> list[Any]:
        """Read until ``expected`` data records arrived and then nothing for ``idle`` seconds.

        Returns early at ``timeout`` or as soon as ``alive()`` is false (a crashed app); the
        caller compares what it got.
        """
        deadline = time.monotonic() + timeout
        last = time.monotonic()
        while time.monotonic() < deadline:
            if alive is not None and not alive():
                break
            if not self._assigned and not self._assign():
                time.sleep(0.2)
                continue
            for m in self._consumer.consume(1000, 0.3):
                err = m.error()
                if err is None:
                    self.messages.append(m)
                    last = time.monotonic()
                elif err.code() != KafkaError._PARTITION_EOF:
                    raise RuntimeError(err)
            if len(self.data()) >= expected and time.monotonic() - last >= idle:
                break
        return self.data()

    def close(self) -> None:
        self._consumer.close()


def lag(bootstrap: str, group: str, topic: str) -> dict[int, int]:
    """Per partition of ``topic``: records after ``group``'s committed offset."""
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": group, "enable.auto.commit": False})
    try:
        parts = sorted(c.list_topics(topic, timeout=10).topics[topic].partitions)
        committed = c.committed([TopicPartition(topic, p) for p in parts], timeout=10)
        return {
            tp.partition: c.get_watermark_offsets(tp, timeout=10)[1] - max(tp.offset, 0)
            for tp in committed
        }
    finally:
        c.close()


def wait_committed(bootstrap: str, group: str, topic: str, timeout: float) -> None:
    """Wait until ``group`` committed offsets at the end of every partition of ``topic``.

    Used to know the app applied (and committed) every customer record before orders that
    must see them are produced. Raises TimeoutError with the committed and end offsets.
    """
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": group, "enable.auto.commit": False})
    try:
        parts = sorted(c.list_topics(topic, timeout=10).topics[topic].partitions)
        ends = {p: c.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1] for p in parts}
        deadline = time.monotonic() + timeout
        while True:
            committed = {
                tp.partition: tp.offset
                for tp in c.committed([TopicPartition(topic, p) for p in parts], timeout=10)
            }
            if all(committed[p] >= ends[p] for p in parts):
                return
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f"group {group} committed {committed} on {topic} after {timeout}s, "
                    f"end offsets {ends}"
                )
            time.sleep(0.2)
    finally:
        c.close()


def fresh_names(prefix: str) -> dict[str, str]:
    """Unique topic and app names of one run, as the app's environment variables."""
    return {
        "LOCKGATE_APP_NAME": unique(f"{prefix}-app"),
        "LOCKGATE_ORDERS_TOPIC": unique(f"{prefix}-orders"),
        "LOCKGATE_CUSTOMERS_TOPIC": unique(f"{prefix}-customers"),
        "LOCKGATE_OUTPUT_TOPIC": unique(f"{prefix}-enriched"),
    }
