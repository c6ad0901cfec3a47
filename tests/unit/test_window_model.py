"""The window model of tests/support/window_model.py on hand-computed cases."""

from __future__ import annotations

import random
from collections import Counter
from functools import reduce

from processors import key_group
from tests.support.window_model import (
    NO_WATERMARK,
    CountSpec,
    GlobalSpec,
    Rec,
    SessionSpec,
    SlidingSpec,
    TumblingSpec,
    group_by,
    partition_of,
    run,
    windows_of,
)


def rows(outcome) -> list[tuple[str, int, int, object]]:
    return [(r.key, r.start, r.end, r.value) for r in outcome.results]


def keys_in_partitions(partitions: int) -> dict[int, list[str]]:
    out: dict[int, list[str]] = {p: [] for p in range(partitions)}
    for i in range(200):
        k = f"k{i}"
        out[partition_of(k, partitions)].append(k)
    return out


def test_windows_of_against_brute_force() -> None:
    for spec in (
        TumblingSpec(10),
        TumblingSpec(10, offset=3),
        SlidingSpec(10, 4),
        SlidingSpec(10, 5, offset=2),
        SlidingSpec(3, 7),  # gaps between windows: some times are in none
    ):
        size = spec.size
        step = spec.size if isinstance(spec, TumblingSpec) else spec.slide
        for ts in range(0, 60):
            brute = [
                (s, s + size)
                for s in range(-100, 100)
                if (s - spec.offset) % step == 0 and s <= ts < s + size
            ]
            assert windows_of(spec, ts) == brute, (spec, ts)
    assert windows_of(TumblingSpec(100), 0) == [(0, 100)]
    assert windows_of(TumblingSpec(100), 99) == [(0, 100)]
    assert windows_of(SlidingSpec(60, 20), 45) == [(0, 60), (20, 80), (40, 100)]
    assert windows_of(SlidingSpec(3, 7), 5) == []


def test_partition_of_is_the_kafka_partitioner() -> None:
    for k in ("a", "b", "key-1", "ü"):
        assert partition_of(k, 5) == key_group(k.encode(), 5)


def test_watermark_progression_never_goes_back() -> None:
    out = run(
        [("a", 5, 1), ("a", 50, 1), ("a", 30, 1), ("a", 61, 1)],
        1,
        TumblingSpec(1000),
        max_delay_ms=10,
    )
    assert out.wm_before == [NO_WATERMARK, -6, 39, 39]
    assert out.wm_after == [-6, 39, 39, 50]


def test_watermarks_are_per_partition() -> None:
    by_p = keys_in_partitions(2)
    a, b = by_p[0][0], by_p[1][0]
    out = run([(a, 100, 1), (b, 5, 1), (a, 300, 1)], 2, TumblingSpec(100))
    # a's partition reaches 299 and fires a's window; b's partition is still at 4
    assert rows(out) == [(a, 100, 200, 1)]
    assert out.final_watermarks == {0: 299, 1: 4}
    out = run([(a, 100, 1), (b, 5, 1), (a, 300, 1)], 2, TumblingSpec(100), flush_to=1000)
    assert rows(out) == [(a, 100, 200, 1), (a, 300, 400, 1), (b, 0, 100, 1)]
    assert [r.at for r in out.results] == [2, -1, -1]


def test_tumbling_on_time_and_late() -> None:
    # one partition, delay 10: windows [0,100) fires once the watermark reaches 99
    recs = [("a", 5, 1), ("a", 50, 1), ("b", 120, 1), ("a", 130, 1), ("a", 99, 1), ("a", 300, 1)]
    out = run(recs, 1, TumblingSpec(100), max_delay_ms=10)
    assert out.wm_after == [-6, 39, 109, 119, 119, 289]
    # b@120 moves the watermark to 109 >= 99: [0,100) of a fires with 2 records
    assert [(r.key, r.start, r.end, r.value, r.at) for r in out.results] == [
        ("a", 0, 100, 2, 2),
        ("a", 100, 200, 1, 5),  # timers in time order, then key order
        ("b", 100, 200, 1, 5),
    ]
    assert [(x.index, x.windows, x.watermark) for x in out.late] == [(4, ((0, 100),), 119)]
    assert out.open_windows == {"a": [(300, 400)]}


def test_tumbling_allowed_lateness_updates_then_late() -> None:
    recs = [("a", 10, 1), ("a", 120, 1), ("a", 30, 1), ("a", 160, 1), ("a", 40, 1)]
    out = run(recs, 1, TumblingSpec(100), allowed_lateness_ms=50)
    assert [(r.start, r.end, r.value, r.at, r.timer) for r in out.results] == [
        (0, 100, 1, 1, True),  # watermark 119 fires [0,100)
        (0, 100, 2, 2, False),  # a@30: within lateness (99 + 50 > 119): updated at once
    ]
    # a@160: watermark 159 >= 149: [0,100) is gone, a@40 is late
    assert [(x.ts, x.windows, x.watermark) for x in out.late] == [(40, ((0, 100),), 159)]
    assert out.open_windows == {"a": [(100, 200)]}


def test_first_record_of_a_fired_window_within_lateness_emits_at_once() -> None:
    out = run(
        [("a", 250, 1), ("a", 50, 7)], 1, TumblingSpec(100), allowed_lateness_ms=200, fold=sum
    )
    assert [(r.start, r.end, r.value, r.timer) for r in out.results] == [(0, 100, 7, False)]
    assert out.late == []


def test_sliding_partly_late_record_goes_to_its_live_windows() -> None:
    spec = SlidingSpec(60, 20)
    out = run([("a", 100, 1), ("a", 65, 2)], 1, spec, fold=sum)
    # watermark 99: of a@65's windows [20,80) [40,100) [60,120) only [60,120) is open
    assert out.late == []
    assert out.open_windows == {"a": [(60, 120), (80, 140), (100, 160)]}
    out = run([("a", 100, 1), ("a", 65, 2)], 1, spec, fold=sum, flush_to=10**6)
    assert rows(out) == [("a", 60, 120, 3), ("a", 80, 140, 1), ("a", 100, 160, 1)]
    out = run([("a", 100, 1), ("a", 45, 2)], 1, spec)
    assert [(x.windows, x.watermark) for x in out.late] == [(((0, 60), (20, 80), (40, 100)), 99)]


def test_sessions_merge_and_fire() -> None:
    spec = SessionSpec(10)
    recs = [("b", 0, 1), ("b", 18, 1), ("b", 9, 1), ("b", 40, 1)]
    out = run(recs, 1, spec, max_delay_ms=100, flush_to=10**6)
    # b@9 bridges [0,10) and [18,28): one session [0,28)
    assert rows(out) == [("b", 0, 28, 3), ("b", 40, 50, 1)]
    out = run([("a", 0, 1), ("a", 5, 1), ("a", 30, 1), ("a", 12, 1)], 1, spec)
    assert rows(out) == [("a", 0, 15, 2)]  # the watermark 29 fired [0,15)
    assert [(x.windows, x.watermark) for x in out.late] == [(((12, 22),), 29)]
    # touching sessions ([0,10) and [10,20)) do not merge
    out = run([("c", 0, 1), ("c", 10, 1)], 1, spec, max_delay_ms=50, flush_to=10**6)
    assert rows(out) == [("c", 0, 10, 1), ("c", 10, 20, 1)]


def test_session_record_behind_the_watermark_may_join_an_open_session() -> None:
    spec = SessionSpec(10)
    # lateness 20: [0,10) fires at 9 and stays until 29; a@3 re-emits it updated
    recs = [("a", 0, 1), ("a", 25, 1), ("a", 3, 1)]
    out = run(recs, 1, spec, allowed_lateness_ms=20)
    assert [(r.start, r.end, r.value, r.timer) for r in out.results] == [
        (0, 10, 1, True),
        (0, 13, 2, False),
    ]
    # the session [0,13) was extended: its lateness ends at 12 + 20
    assert out.open_windows == {"a": [(0, 13), (25, 35)]}
    # a@11's own session [11,21) is past the watermark 27, but it overlaps the open
    # [20,38): merged, not late
    recs = [("a", 0, 1), ("a", 20, 1), ("a", 28, 1), ("a", 11, 1)]
    out = run(recs, 1, spec)
    assert rows(out) == [("a", 0, 10, 1)]
    assert out.late == []
    assert out.open_windows == {"a": [(11, 38)]}
    out = run(recs, 1, spec, flush_to=100)
    assert rows(out) == [("a", 0, 10, 1), ("a", 11, 38, 3)]


def test_count_and_global() -> None:
    recs = [("a", 5, 1), ("b", 1, 10), ("a", 3, 2), ("a", 9, 3), ("a", 1, 4), ("b", 2, 20)]
    out = run(recs, 2, CountSpec(2), fold=sum)
    assert Counter(rows(out)) == Counter([("a", 3, 6, 3), ("a", 1, 10, 7), ("b", 1, 3, 30)])
    assert out.pending == {}
    out = run(recs, 2, GlobalSpec(every=2), fold=sum)
    assert Counter(rows(out)) == Counter([("a", 3, 6, 3), ("a", 1, 10, 10), ("b", 1, 3, 30)])
    assert out.pending == {"a": 4, "b": 2}
    out = run(recs, 2, CountSpec(3), fold=list)
    assert rows(out) == [("a", 3, 10, [1, 2, 3])]
    assert out.pending == {"a": 1, "b": 2}


def test_on_time_data_is_a_plain_group_by() -> None:
    rng = random.Random(7)
    fold = lambda vs: reduce(lambda a, b: a * 31 + b, vs)  # noqa: E731 - order-sensitive
    for spec in (TumblingSpec(50), TumblingSpec(40, 7), SlidingSpec(60, 25), SessionSpec(30)):
        for _ in range(5):
            t = 1000
            recs = []
            for i in range(200):
                t += rng.choice([0, 1, 5, 12, 30])
                recs.append(Rec(rng.choice("abcdef"), t - rng.randint(0, 40), i))
            out = run(recs, 3, spec, max_delay_ms=40, fold=fold, flush_to=10**9)
            assert out.late == []
            assert all(r.timer for r in out.results)
            assert out.rows() == group_by(recs, spec, fold)
            assert out.open_windows == {}
            assert Counter((r.key, r.start, r.end) for r in out.results).most_common(1)[0][1] == 1


def test_late_records_leave_the_group_by() -> None:
    # with late data and lateness 0 the results are the group-by of the accepted records
    rng = random.Random(11)
    spec = TumblingSpec(50)
    t = 1000
    recs = []
    for i in range(300):
        t += rng.choice([0, 2, 9, 20])
        delay = rng.randint(0, 20) if rng.random() < 0.85 else rng.randint(21, 200)
        recs.append(Rec(rng.choice("abc"), t - delay, i))
    out = run(recs, 2, spec, max_delay_ms=20, fold=sorted, flush_to=10**9)
    assert out.late
    late = {x.index for x in out.late}
    kept = [r for i, r in enumerate(recs) if i not in late]
    assert out.rows() == group_by(kept, spec, sorted)
