"""Versioned tables, interval joins and global tables (processors/joins.py), without Kafka."""

from __future__ import annotations

import copy
from typing import Any

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from processors.joins import GlobalTable, IntervalJoin, insert_version, version_at
from state.codecs import JSON, STR

# ----------------------------------------------------------------------------- versions


def model_at(inserted: list[tuple[int, Any]], t: int) -> Any:
    """The value of the latest-inserted version with the greatest timestamp <= t."""
    best: tuple[int, int] | None = None
    value = None
    for seq, (ts, v) in enumerate(inserted):
        if ts <= t and (best is None or (ts, seq) > best):
            best, value = (ts, seq), v
    return value


def apply_all(ops: list[tuple[int, Any]], retention: int) -> list[list[Any]]:
    versions: list[list[Any]] = []
    for ts, v in ops:
        versions = insert_version(versions, ts, v, retention)
    return versions


def check_contract(ops: list[tuple[int, Any]], retention: int) -> None:
    """After every insert: sorted, unique, bounded, and as-of answers equal the model's."""
    versions: list[list[Any]] = []
    for n, (ts, v) in enumerate(ops, 1):
        versions = insert_version(versions, ts, v, retention)
        stamps = [e[0] for e in versions]
        assert stamps == sorted(set(stamps)), versions
        newest = max(t for t, _ in ops[:n])
        if versions:
            assert versions[-1][0] <= newest
            # At most one version at or before the cutoff is kept.
            assert sum(s <= versions[-1][0] - retention for s in stamps) <= 1
        for t in range(newest - retention, newest + 3):
            assert version_at(versions, t) == model_at(ops[:n], t), (ops[:n], versions, t)


_VALUES = st.one_of(st.none(), st.integers(0, 9))


def test_version_at_basics() -> None:
    versions = [[10, "a"], [20, None], [30, "c"]]
    assert [version_at(versions, t) for t in (9, 10, 19, 20, 29, 30, 10**9)] == [
        None,
        "a",
        "a",
        None,
        None,
        "c",
        "c",
    ]
    assert version_at([], 5) is None


def test_insert_version_keeps_order_and_replaces_equal_timestamps() -> None:
    versions: list[list[Any]] = []
    for ts, v in [(20, "b"), (10, "a"), (30, "c"), (20, "B")]:
        versions = insert_version(versions, ts, v, 1000)
    assert versions == [[10, "a"], [20, "B"], [30, "c"]]


def test_retention_keeps_the_newest_version_at_or_before_the_cutoff() -> None:
    versions: list[list[Any]] = []
    for ts in (0, 10, 20, 30, 40):
        versions = insert_version(versions, ts, ts, 15)
    # cutoff 25: 20 still answers lookups in [25, 30).
    assert versions == [[20, 20], [30, 30], [40, 40]]
    assert version_at(versions, 25) == 20
    versions = insert_version(versions, 100, 100, 0)
    assert versions == [[100, 100]]


def test_a_history_of_only_deletions_is_kept() -> None:
    # Retention 20: "a" still answers lookups in [30, 50).
    assert insert_version([[10, "a"]], 50, None, 20) == [[10, "a"], [50, None]]
    # Pruned to the deletion alone: kept, so an older late record cannot revive the key.
    assert insert_version([[10, "a"]], 50, None, 0) == [[50, None]]
    assert insert_version([], 5, None, 100) == [[5, None]]
    assert insert_version([[5, None]], 9, None, 100) == [[5, None], [9, None]]


@settings(max_examples=300, deadline=None, database=None)
@given(
    ops=st.lists(st.tuples(st.integers(0, 40), st.integers(0, 9)), max_size=25),
    retention=st.integers(0, 30),
)
def test_versions_match_the_model_in_any_order_without_deletions(
    ops: list[tuple[int, Any]], retention: int
) -> None:
    check_contract(ops, retention)


@settings(max_examples=300, deadline=None, database=None)
@given(
    ops=st.lists(st.tuples(st.integers(0, 40), _VALUES), max_size=25).map(
        lambda ops: sorted(ops, key=lambda o: o[0])  # stable: equal timestamps keep order
    ),
    retention=st.integers(0, 30),
)
def test_versions_match_the_model_with_deletions_in_timestamp_order(
    ops: list[tuple[int, Any]], retention: int
) -> None:
    check_contract(ops, retention)


@settings(max_examples=300, deadline=None, database=None)
@given(
    ops=st.lists(st.tuples(st.integers(0, 40), _VALUES), max_size=25),
    retention=st.integers(0, 30),
)
def test_versions_match_the_model_with_deletions_when_no_history_is_only_a_deletion(
    ops: list[tuple[int, Any]], retention: int
) -> None:
    """Out-of-order inserts with deletions, up to the first time a history collapses."""
    versions: list[list[Any]] = []
    for n, (ts, v) in enumerate(ops, 1):
        versions = insert_version(versions, ts, v, retention)
        if not versions:
            ops = ops[:n]
            break
    check_contract(ops, retention)


@pytest.mark.parametrize("retention", [0, 1000])
def test_a_deletion_then_an_older_version_stays_deleted(retention: int) -> None:
    versions = apply_all([(100, None), (50, "x")], retention)
    assert version_at(versions, 150) is None


def test_a_pruned_deletion_then_an_older_version_stays_deleted() -> None:
    # "a" at 0, deleted at 200 with retention 0: the history collapses to the deletion.
    versions = apply_all([(0, "a"), (200, None), (150, "late")], 0)
    assert version_at(versions, 250) is None  # got 'late'


@example(ops=[(100, None), (50, 0)], retention=0)
@settings(max_examples=200, deadline=None, database=None)
@given(
    ops=st.lists(st.tuples(st.integers(0, 40), _VALUES), max_size=25),
    retention=st.integers(0, 30),
)
def test_versions_match_the_model_in_any_order_with_deletions(
    ops: list[tuple[int, Any]], retention: int
) -> None:
    check_contract(ops, retention)


# ----------------------------------------------------------------------------- interval join


class FakeState:
    """The part of ValueState IntervalJoin uses (one key)."""

    def __init__(self) -> None:
        self.stored: Any = None
        self.writes = 0

    def value(self) -> Any:
        # A copy, as a real store decodes one: the join must write back what it changes.
        return copy.deepcopy(self.stored)

    def update(self, value: Any) -> None:
        self.stored = copy.deepcopy(value)
        self.writes += 1

    def clear(self) -> None:
        self.stored = None


def make_join(lower: int, upper: int, grace: int = 0, cap: int = 1000) -> IntervalJoin:
    return IntervalJoin(FakeState(), FakeState(), lower, upper, grace, cap)  # type: ignore[arg-type]


def stored(j: IntervalJoin) -> tuple[list[Any], list[Any]]:
    left = j._left.stored  # type: ignore[attr-defined]  # [key time, left records]
    return (left[1] if left else [], j._right.stored or [])  # type: ignore[attr-defined]


def test_interval_join_bounds_are_inclusive_in_both_arrival_orders() -> None:
    j = make_join(-5, 10)
    # Left at 100 matches rights in [95, 110].
    assert j.on_left("L", 100) == []
    got = [j.on_right(r, r) for r in (94, 95, 100, 110, 111)]
    assert got == [[], [("L", 95)], [("L", 100)], [("L", 110)], []]
    j = make_join(-5, 10, grace=20)  # the left record comes 11 ms late
    for r in (94, 95, 100, 110, 111):
        j.on_right(r, r)
    assert j.on_left("L", 100) == [("L", 95), ("L", 100), ("L", 110)]


def test_interval_join_rejects_an_empty_interval() -> None:
    with pytest.raises(ValueError, match="lower_ms 5 > upper_ms 4"):
        make_join(5, 4)
    make_join(4, 4)  # a single instant is fine


def test_interval_join_purges_what_can_no_longer_match() -> None:
    j = make_join(0, 10, grace=5)
    j.on_left("a", 0)
    j.on_right("r0", 0)
    j.on_left("b", 20)  # time 20, horizon 15: left 0 (0 + 10 < 15) and right 0 go
    assert stored(j) == ([[20, "b"]], [])
    # Late but within grace: matches lefts in [4, 14], and no later left (>= 15) can.
    assert j.on_right("r1", 14) == []
    assert stored(j) == ([[20, "b"]], [])
    assert j.on_right("r2", 16) == []  # lefts in [6, 16]; a left at 15 or 16 could come
    assert stored(j) == ([[20, "b"]], [[16, "r2"]])
    j.on_left("c", 30)  # horizon 25: left 20 + 10 >= 25 stays; right 16 - 0 < 25 goes
    assert stored(j) == ([[20, "b"], [30, "c"]], [])


def test_interval_join_clears_empty_sides() -> None:
    j = make_join(0, 0)
    j.on_left("a", 0)
    j.on_left("b", 100)
    assert stored(j) == ([[100, "b"]], [])
    assert j._right.stored is None  # type: ignore[attr-defined]


def test_interval_join_keeps_at_most_max_per_key_per_side() -> None:
    j = make_join(-1000, 1000, cap=2)
    for ts in (0, 1, 2):
        j.on_left(f"l{ts}", ts)
    assert stored(j)[0] == [[1, "l1"], [2, "l2"]]  # the oldest went
    assert j.on_right("r5", 5) == [("l1", "r5"), ("l2", "r5")]
    for ts in (6, 7):
        j.on_right(f"r{ts}", ts)
    assert stored(j)[1] == [[6, "r6"], [7, "r7"]]
    assert j.on_left("x", 8) == [("x", "r6"), ("x", "r7")]
    assert stored(j)[0] == [[2, "l2"], [8, "x"]]


@st.composite
def interval_cases(draw: st.DrawFn) -> tuple[int, int, int, list[tuple[str, int]], bool]:
    lower = draw(st.integers(-15, 15))
    upper = lower + draw(st.integers(0, 20))
    grace = draw(st.integers(0, 10))
    in_order = draw(st.booleans())
    records: list[tuple[str, int]] = []
    newest: int | None = None
    for _ in range(draw(st.integers(0, 30))):
        side = draw(st.sampled_from("LR"))
        base = 0 if newest is None else newest
        ts = base + draw(st.integers(0, 8))
        if not in_order and newest is not None:
            ts -= draw(st.integers(0, grace))  # late, but within grace of the key's newest
        newest = ts if newest is None else max(newest, ts)
        records.append((side, ts))
    return lower, upper, grace, records, in_order


@settings(max_examples=300, deadline=None, database=None)
@given(case=interval_cases())
def test_interval_join_matches_exactly_the_brute_force_pairs(
    case: tuple[int, int, int, list[tuple[str, int]], bool],
) -> None:
    lower, upper, grace, records, in_order = case
    j = make_join(lower, upper, grace)
    got: list[tuple[int, int]] = []
    newest = None
    for i, (side, ts) in enumerate(records):
        if side == "L":
            got += j.on_left(i, ts)
        else:
            got += j.on_right(i, ts)
        newest = ts if newest is None else max(newest, ts)
        lefts, rights = stored(j)
        if in_order:
            # Nothing kept that no later record could match, everything else kept.
            seen = records[: i + 1]
            assert [e[1] for e in lefts] == [
                k for k, (s, t) in enumerate(seen) if s == "L" and t + upper >= newest - grace
            ]
            assert [e[1] for e in rights] == [
                k for k, (s, t) in enumerate(seen) if s == "R" and t - lower >= newest - grace
            ]
    expected = [
        (li, ri)
        for li, (ls, lt) in enumerate(records)
        for ri, (rs, rt) in enumerate(records)
        if ls == "L" and rs == "R" and lt + lower <= rt <= lt + upper
    ]
    assert len(got) == len(set(got))  # each pair once
    assert sorted(got) == sorted(expected)


def test_a_late_left_record_does_not_move_the_keys_time_back() -> None:
    j = make_join(-1, -1, grace=1)
    j.on_left("a", 0)
    j.on_left("b", -1)  # 1 ms late: within grace; can only match rights at -2 (< -1)
    assert stored(j)[0] == [[0, "a"]]


def test_a_late_right_record_does_not_move_the_keys_time_back() -> None:
    j = make_join(1, 1, grace=1)
    j.on_right("r10", 10)
    j.on_right("r9", 9)  # 1 ms late; matches lefts at 8 only, and no left before 9 may come
    assert stored(j)[1] == [[10, "r10"]]


@settings(max_examples=200, deadline=None, database=None)
@given(case=interval_cases())
def test_interval_join_buffers_stay_within_the_window_of_the_newest_record(
    case: tuple[int, int, int, list[tuple[str, int]], bool],
) -> None:
    """Bounded however late (within grace) the records are: at most window + grace behind."""
    lower, upper, grace, records, _ = case
    j = make_join(lower, upper, grace)
    newest = None
    for i, (side, ts) in enumerate(records):
        (j.on_left if side == "L" else j.on_right)(i, ts)
        newest = ts if newest is None else max(newest, ts)
        lefts, rights = stored(j)
        # The key's time never goes back: nothing older than the horizon stays (a late
        # record within grace may itself be below it only if both sides had emptied).
        assert all(lt + upper >= newest - 2 * grace for lt, _ in lefts)
        assert all(rt - lower >= newest - 2 * grace for rt, _ in rights)


# ----------------------------------------------------------------------------- global table


def test_global_table_applies_records_and_deletions() -> None:
    g = GlobalTable("rules")
    assert g.key_codec is STR and g.value_codec is JSON and len(g) == 0
    g.apply(b"a", b'{"x": 1}')
    g.apply(b"b", b"[2]")
    g.apply(b"a", b'{"x": 3}')
    assert g.get("a") == {"x": 3} and g.get("b") == [2] and "a" in g and len(g) == 2
    g.apply(b"b", None)
    g.apply(b"never", None)  # deleting an absent key is fine
    assert g.get("b") is None and g.get("b", "dflt") == "dflt" and "b" not in g
    assert g.items() == [("a", {"x": 3})]
    snapshot = g.items()
    g.apply(b"c", b"1")
    assert snapshot == [("a", {"x": 3})]  # a copy
    g.apply(None, b"0")
    assert g.get(None) == 0
    g.clear()
    assert len(g) == 0 and g.items() == []


def test_global_table_codec_errors_propagate_and_change_nothing() -> None:
    g = GlobalTable("rules")
    g.apply(b"a", b"1")
    with pytest.raises(Exception):  # noqa: B017 - whatever the codec raises
        g.apply(b"a", b"{not json")
    assert g.get("a") == 1
