"""The as-of join model of tests/support/enrich_model.py on hand-made cases (no broker)."""

from __future__ import annotations

import random
from collections import Counter
from dataclasses import dataclass
from typing import Any

import orjson
import pytest

from tests.support.enrich_model import (
    Rec,
    as_of,
    check,
    classify,
    customers_by_key,
    expected_outputs,
    make_round,
)


def cust(key: str, value: Any, ts: int, offset: int, partition: int = 0) -> Rec:
    return Rec(key, value, ts, partition, offset)


def order(key: str, oid: str, ts: int, offset: int, partition: int = 0, amount: int = 1) -> Rec:
    return Rec(key, {"order_id": oid, "amount": amount}, ts, partition, offset)


def customers_seen(customers: list[Rec], orders: list[Rec]) -> dict[str, Any]:
    """order_id -> the customer value the model joins it with."""
    return {
        v["order_id"]: v["customer"]
        for values in expected_outputs(customers, orders).values()
        for v in values
    }


def test_no_customer_record_means_null() -> None:
    assert customers_seen([], [order("a", "o1", 100, 0)]) == {"o1": None}


def test_order_sees_latest_at_or_before_its_timestamp_ties_included() -> None:
    cs = [cust("a", {"v": 1}, 100, 0), cust("a", {"v": 2}, 200, 1), cust("a", {"v": 3}, 300, 2)]
    os = [
        order("a", "before", 99, 0),
        order("a", "tie-first", 100, 1),
        order("a", "between", 250, 2),
        order("a", "tie-last", 300, 3),
        order("a", "after", 10_000, 4),
    ]
    assert customers_seen(cs, os) == {
        "before": None,
        "tie-first": {"v": 1},
        "between": {"v": 2},
        "tie-last": {"v": 3},
        "after": {"v": 3},
    }


def test_tombstone_deletes_and_a_later_record_recreates() -> None:
    cs = [cust("a", {"v": 1}, 100, 0), cust("a", None, 200, 1), cust("a", {"v": 2}, 300, 2)]
    os = [order("a", "o1", 150, 0), order("a", "o2", 200, 1), order("a", "o3", 299, 2)]
    os.append(order("a", "o4", 300, 3))
    assert customers_seen(cs, os) == {"o1": {"v": 1}, "o2": None, "o3": None, "o4": {"v": 2}}


def test_equal_timestamps_later_offset_wins() -> None:
    cs = [cust("a", {"v": "second"}, 100, 7), cust("a", {"v": "first"}, 100, 3)]  # any input order
    assert customers_seen(cs, [order("a", "o", 100, 0)]) == {"o": {"v": "second"}}


def test_late_arrival_counts_by_timestamp_not_arrival() -> None:
    # {"v": "new"} at ts 200 is stored first; {"v": "old"} with ts 100 arrives after it.
    cs = [cust("a", {"v": "new"}, 200, 0), cust("a", {"v": "old"}, 100, 1)]
    os = [order("a", "o50", 50, 0), order("a", "o150", 150, 1), order("a", "o250", 250, 2)]
    assert customers_seen(cs, os) == {"o50": None, "o150": {"v": "old"}, "o250": {"v": "new"}}
    counts = classify(cs, os)
    assert counts["late-arrival-seen"] == 1  # o150
    assert counts["late-arrival-ignored"] == 1  # o250
    assert counts["no-customer"] == 1 and counts["newer-ignored"] == 2  # o50; o50 and o150


def test_keys_are_independent_and_outputs_follow_order_offsets() -> None:
    cs = [cust("a", {"n": "a"}, 100, 0, partition=1), cust("b", {"n": "b"}, 500, 0, partition=2)]
    os = [
        order("b", "b2", 600, 5, partition=2),
        order("a", "a1", 50, 0, partition=1),
        order("b", "b1", 400, 3, partition=2),  # offset order, not timestamp or list order
        order("a", "a2", 700, 1, partition=1),
    ]
    assert expected_outputs(cs, os) == {
        "a": [
            {"order_id": "a1", "amount": 1, "customer": None},
            {"order_id": "a2", "amount": 1, "customer": {"n": "a"}},
        ],
        "b": [
            {"order_id": "b1", "amount": 1, "customer": None},
            {"order_id": "b2", "amount": 1, "customer": {"n": "b"}},
        ],
    }


def test_inputs_that_are_not_co_partitioned_are_refused() -> None:
    with pytest.raises(ValueError, match="partitions"):
        customers_by_key([cust("a", {}, 1, 0, partition=0), cust("a", {}, 2, 0, partition=1)])
    with pytest.raises(ValueError, match="co-partitioned"):
        expected_outputs([cust("a", {}, 1, 0, partition=0)], [order("a", "o", 5, 0, partition=3)])


def test_as_of_on_an_empty_history() -> None:
    assert as_of([], 10) is None


# ----------------------------------------------------------------------------- check()


@dataclass
class Msg:
    """The parts of a confluent_kafka Message that check() reads."""

    _key: bytes | None
    _value: bytes | None
    _partition: int
    _offset: int
    _headers: list[tuple[str, bytes]] | None = None

    def key(self) -> bytes | None:
        return self._key

    def value(self) -> bytes | None:
        return self._value

    def partition(self) -> int:
        return self._partition

    def offset(self) -> int:
        return self._offset

    def headers(self) -> list[tuple[str, bytes]] | None:
        return self._headers


def as_messages(expected: dict[str, list[dict[str, Any]]]) -> list[Msg]:
    out, offset = [], 0
    for key, values in expected.items():
        for v in values:
            out.append(Msg(key.encode(), orjson.dumps(v), 0, offset))
            offset += 1
    return out


CS = [cust("a", {"v": 1}, 100, 0), cust("b", {"v": 2}, 100, 1), cust("a", None, 300, 2)]
OS = [order("a", f"a{i}", 50 + 100 * i, i) for i in range(4)] + [
    order("b", f"b{i}", 50 + 100 * i, 4 + i) for i in range(3)
]


def test_check_accepts_the_exact_output_and_skips_control_records() -> None:
    expected = expected_outputs(CS, OS)
    msgs = as_messages(expected)
    msgs.append(Msg(b"a", b"", 0, 99, [("lockgate-type", b"barrier")]))
    random.Random(1).shuffle(msgs)  # check() orders by (partition, offset) itself
    assert check(expected, msgs) == []


def test_check_reports_duplicates_missing_and_unknown() -> None:
    expected = expected_outputs(CS, OS)
    msgs = as_messages(expected)
    dup = Msg(msgs[1].key(), msgs[1].value(), 0, 100)
    extra = Msg(b"a", orjson.dumps({"order_id": "zz", "amount": 1, "customer": None}), 0, 101)
    problems = check(expected, [*msgs[1:], dup, extra])  # a0 lost, a1 twice
    assert len(problems) == 1, problems
    assert "missing 1 ['a0']" in problems[0]
    assert "duplicated 1 ['a1']" in problems[0]
    assert "unknown 1 ['zz']" in problems[0]


def test_check_reports_a_wrong_customer_and_a_wrong_key() -> None:
    expected = expected_outputs(CS, OS)
    msgs = as_messages(expected)
    wrong = {"order_id": "a3", "amount": 1, "customer": {"v": 1}}  # should be deleted: None
    msgs[3] = Msg(b"a", orjson.dumps(wrong), 0, msgs[3].offset())
    msgs[4] = Msg(b"a", msgs[4].value(), 0, msgs[4].offset())  # b0 under key a
    problems = check(expected, msgs)
    assert "wrong key or value 2" in problems[0], problems
    assert any("order a3: expected key a customer null" in p for p in problems), problems
    assert any("order b0: expected key b" in p and "got key a" in p for p in problems), problems


def test_check_reports_outputs_out_of_order() -> None:
    expected = expected_outputs(CS, OS)
    msgs = as_messages(expected)
    msgs[0], msgs[1] = (
        Msg(msgs[1].key(), msgs[1].value(), 0, 0),
        Msg(msgs[0].key(), msgs[0].value(), 0, 1),
    )
    problems = check(expected, msgs)
    assert problems == [
        "key a: outputs not in the orders' offset order from #0: "
        "expected ['a0', 'a1', 'a2', 'a3'], got ['a1', 'a0', 'a2', 'a3']"
    ]


# ----------------------------------------------------------------------------- generator


def stored(records: list[tuple[str, Any, int]], partitions: int = 3) -> list[Rec]:
    """Place generated records like a keyed producer would (one partition per key)."""
    offsets: Counter[int] = Counter()
    out = []
    for key, value, ts in records:
        p = sum(key.encode()) % partitions
        out.append(Rec(key, value, ts, p, offsets[p]))
        offsets[p] += 1
    return out


@pytest.mark.parametrize("between", [False, True])
def test_generated_rounds_cover_every_case_and_keep_the_timing_rules(between: bool) -> None:
    rng = random.Random(7)
    keys = [f"c{i}" for i in range(30)] + ["c-ghost"]
    versions: dict[str, int] = {}
    customers: list[tuple[str, Any, int]] = []
    orders: list[tuple[str, Any, int]] = []
    for number in range(4):
        rnd = make_round(rng, number, keys, 300, base=1_000_000, between=between, versions=versions)
        window = (1_000_000 + number * 10_000, 1_000_000 + (number + 1) * 10_000)
        assert all(window[0] <= ts < window[1] for _, _, ts in rnd.customers + rnd.orders)
        assert [ts for _, _, ts in rnd.orders] == sorted(ts for _, _, ts in rnd.orders)
        customers += rnd.customers
        orders += rnd.orders
    cs, os = stored(customers), stored(orders)
    counts = classify(cs, os)
    cases = {"no-customer", "deleted", "recreated", "tie", "equal-ts", "late-arrival-ignored"}
    cases.add("newer-ignored")
    assert cases <= set(counts), counts
    assert ("late-arrival-seen" in counts) == between, counts
    # per partition, customer timestamps only go back at a late arrival: right after a record
    # of its key with a newer timestamp (or after others with that same timestamp)
    by_part: dict[int, list[Rec]] = {}
    for c in cs:
        by_part.setdefault(c.partition, []).append(c)
    for recs in by_part.values():
        for i, cur in enumerate(recs[1:], 1):
            if cur.timestamp < recs[i - 1].timestamp:
                newest = recs[i - 1].timestamp
                back = [r for r in recs[:i] if r.timestamp == newest]
                assert any(r.key == cur.key for r in back), (recs[i - 1], cur)
    outputs = expected_outputs(cs, os)
    assert sum(map(len, outputs.values())) == len(os)
    versions_seen = [
        v["customer"]["version"] for vs in outputs.values() for v in vs if v["customer"]
    ]
    assert len(set(versions_seen)) > 3
