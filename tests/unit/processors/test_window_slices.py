"""Time windows (sliced sliding windows above all) against the independent window model.

Hypothesis draws the window (tumbling, or sliding with any size/slide/offset: slides that
divide the size, that do not, that are longer than it), the allowed lateness, the
aggregation (mergeable ones are sliced, the others keep one entry per window) and an
input with bounded disorder plus records beyond the bound (late data). The operator
under the TestDriver must emit, per record, exactly what ``tests/support/window_model.py``
(no lockgate window code) says, send the same records to the late topic, survive crashes
with the output of a run without them, and leave no state or timer behind. A separate test
restores state written with one entry per window (what earlier versions wrote) into a
sliced operator and checks the output is still the model's.
"""

from __future__ import annotations

import math
from collections import Counter
from functools import reduce
from typing import Any

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from processors import App, Sliding, Tumbling, Watermarks, WindowResult
from processors.testing import Emitted, TestDriver
from tests.support.window_model import (
    Rec,
    SlidingSpec,
    TumblingSpec,
    freeze,
    run,
)

PARTITIONS = 2
DELAY = 20
FLUSH = 10**9
KEYS = ["a", "b", "c", "d"]


class Sum:
    """Mergeable: sliced."""

    def create_accumulator(self) -> int:
        return 0

    def add(self, value: dict[str, int], acc: int) -> int:
        return acc + value["v"]

    def get_result(self, acc: int) -> int:
        return acc

    def merge(self, a: int, b: int) -> int:
        return a + b


class SumNoMerge(Sum):
    """Not mergeable: one entry per window."""

    merge = None  # type: ignore[assignment]


class Ids:
    """Mergeable, with a ``merge`` that changes its first argument in place and returns
    its second one when the first is empty: slices must not be aliased or changed."""

    def create_accumulator(self) -> list[int]:
        return []

    def add(self, value: dict[str, int], acc: list[int]) -> list[int]:
        acc.append(value["id"])
        return acc

    def get_result(self, acc: list[int]) -> list[int]:
        return sorted(acc)

    def merge(self, a: list[int], b: list[int]) -> list[int]:
        if not a:
            return b
        a.extend(b)
        return a


def _ordered(a: dict[str, Any], b: dict[str, Any]) -> dict[str, Any]:
    return {"v": a["v"] * 3 + b["v"], "id": a["id"]}


def _ids_in_order(key: str, w: WindowResult[list[dict[str, int]]]) -> list[WindowResult[Any]]:
    """process(): the window's ids as they were handed over (arrival order expected)."""
    return [WindowResult(w.start, w.end, [v["id"] for v in w.value])]


AGGS: dict[str, tuple[Any, Any]] = {
    # name -> (WindowedStream -> Stream, the model's fold over a window's values)
    "count": (lambda ws: ws.count(), len),
    "sum": (lambda ws: ws.aggregate(Sum()), lambda vs: sum(v["v"] for v in vs)),
    "sum-no-merge": (lambda ws: ws.aggregate(SumNoMerge()), lambda vs: sum(v["v"] for v in vs)),
    "ids": (lambda ws: ws.aggregate(Ids()), lambda vs: sorted(v["id"] for v in vs)),
    "reduce": (lambda ws: ws.reduce(_ordered), lambda vs: reduce(_ordered, vs)),
    "process": (lambda ws: ws.process(_ids_in_order), lambda vs: [v["id"] for v in vs]),
}


def _as_dict(w: WindowResult[Any]) -> dict[str, Any]:
    return w.as_dict()


def make_app(spec: TumblingSpec | SlidingSpec, agg: str, lateness: int, *, name: str = "w") -> App:
    app = App(name)
    assigner = (
        Tumbling(spec.size, spec.offset)
        if isinstance(spec, TumblingSpec)
        else Sliding(spec.size, spec.slide, spec.offset)
    )
    ws = app.stream("in", watermarks=Watermarks.bounded(DELAY)).window(
        assigner, allowed_lateness_ms=lateness, late_topic="late"
    )
    AGGS[agg][0](ws).map(_as_dict).to("out")
    return app


@st.composite
def specs(draw: st.DrawFn) -> TumblingSpec | SlidingSpec:
    size = draw(st.integers(1, 60))
    offset = draw(st.integers(0, 70))
    if draw(st.booleans()):
        return TumblingSpec(size, offset)
    slide = draw(st.integers(1, 80))
    return SlidingSpec(size, slide, offset)


@st.composite
def inputs(draw: st.DrawFn) -> list[Rec]:
    n = draw(st.integers(1, 70))
    t = 1_000
    out = []
    for i in range(n):
        t += draw(st.sampled_from([0, 0, 1, 3, 7, 15, 40]))
        back = draw(
            st.one_of(st.integers(0, DELAY), st.integers(DELAY + 1, DELAY + 120))
            if draw(st.integers(0, 9)) == 0
            else st.integers(0, DELAY)
        )
        out.append(Rec(draw(st.sampled_from(KEYS)), max(0, t - back), {"v": i % 7, "id": i}))
    return out


def row(e: Emitted) -> tuple[Any, ...]:
    return (e.key, e.value["start"], e.value["end"], freeze(e.value["value"]))


def timers_left(d: TestDriver) -> int:
    n = 0
    for g in range(PARTITIONS):
        for k, _raw in d.key_group_store(g).items("lockgate.time"):
            n += k.startswith(b"t")
    return n


def send(d: TestDriver, i: int, rec: Rec) -> list[Emitted]:
    return d.send(rec.key, rec.value, timestamp=rec.ts)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    spec=specs(),
    lateness=st.sampled_from([0, 0, 5, 30, 90]),
    agg=st.sampled_from(list(AGGS)),
    records=inputs(),
    crashes=st.lists(st.integers(0, 69), max_size=3),
)
def test_time_windows_match_the_model(
    spec: TumblingSpec | SlidingSpec,
    lateness: int,
    agg: str,
    records: list[Rec],
    crashes: list[int],
) -> None:
    model = run(
        records,
        PARTITIONS,
        spec,
        max_delay_ms=DELAY,
        allowed_lateness_ms=lateness,
        fold=AGGS[agg][1],
        flush_to=FLUSH,
    )
    d = TestDriver(make_app(spec, agg, lateness), partitions=PARTITIONS)
    late = {x.index: x for x in model.late}
    crash_at = set(crashes)
    committed = 0
    i = 0
    while i < len(records):
        rec = records[i]
        emitted = send(d, i, rec)
        want = Counter((r.key, r.start, r.end, freeze(r.value)) for r in model.results if r.at == i)
        assert Counter(row(e) for e in emitted if e.topic == "out") == want, (i, rec)
        got_late = [e for e in emitted if e.topic == "late"]
        if i in late:
            x = late[i]
            assert [e.value for e in got_late] == [orjson.dumps(rec.value)]
            assert got_late[0].headers[:2] == [
                ("lockgate-late-window", ",".join(f"{s}-{e}" for s, e in x.windows)),
                ("lockgate-late-watermark", str(x.watermark)),
            ]
        else:
            assert got_late == []
        i += 1
        if i in crash_at:
            crash_at.discard(i)
            d.crash()  # lose what came after the last commit, resend it
            i = committed
        elif i % 5 == 0:
            d.commit()
            committed = i
    flushed = d.advance_watermark(FLUSH)
    assert Counter(row(e) for e in flushed) == Counter(
        (r.key, r.start, r.end, freeze(r.value)) for r in model.results if r.at == -1
    )
    d.commit()
    # the whole output, per key in the model's order
    per_key: dict[str, list[Any]] = {}
    for e in d.emitted:
        if e.topic == "out":
            per_key.setdefault(e.key, []).append(row(e)[1:])
    want_per_key: dict[str, list[Any]] = {}
    for r in model.results:
        want_per_key.setdefault(r.key, []).append((r.start, r.end, freeze(r.value)))
    assert per_key == want_per_key
    # everything fired and purged
    for g in range(PARTITIONS):
        assert list(d.key_group_store(g).items("window-1")) == []
    assert timers_left(d) == 0


def test_sliced_windows_are_sliced_and_the_others_are_not() -> None:
    d = TestDriver(make_app(SlidingSpec(60, 20), "count", 0), partitions=1)
    d.send("k", {"v": 1, "id": 0}, timestamp=1005)
    d.send("k", {"v": 1, "id": 1}, timestamp=1010)
    assert d.state("window-1", "k") == {"s1000": [1020, 2]}  # one slice, not three windows
    d = TestDriver(make_app(SlidingSpec(50, 15), "sum", 0), partitions=1)
    d.send("k", {"v": 4, "id": 0}, timestamp=1003)
    assert d.state("window-1", "k") == {f"s{1003 - 1003 % 5}": [1005, 4]}  # gcd(50, 15) = 5
    d = TestDriver(make_app(SlidingSpec(60, 20), "process", 0), partitions=1)
    d.send("k", {"v": 1, "id": 0}, timestamp=1005)
    d.send("k", {"v": 2, "id": 1}, timestamp=1001)
    d.send("k", {"v": 3, "id": 2}, timestamp=985)
    assert d.state("window-1", "k") == {
        "n": [0, 3],  # the key's next arrival number
        "s1000": [1020, [0, {"v": 1, "id": 0}, 1, {"v": 2, "id": 1}]],
        "s980": [1000, [2, {"v": 3, "id": 2}]],
    }
    fired = [(e.value["start"], e.value["value"]) for e in d.advance_watermark(FLUSH)]
    assert fired == [(940, [2]), (960, [0, 1, 2]), (980, [0, 1, 2]), (1000, [0, 1])]
    assert d.state("window-1", "k") is None
    for agg in ("sum-no-merge", "reduce"):
        d = TestDriver(make_app(SlidingSpec(60, 20), agg, 0), partitions=1)
        d.send("k", {"v": 1, "id": 0}, timestamp=1005)
        assert sorted(d.state("window-1", "k")) == ["1000", "960", "980"]
    d = TestDriver(make_app(TumblingSpec(60), "count", 0), partitions=1)
    d.send("k", {"v": 1, "id": 0}, timestamp=1005)
    assert d.state("window-1", "k") == {"960": [1020, 1]}


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    size_slides=st.sampled_from([(60, 20), (50, 15), (40, 30), (30, 7)]),
    lateness=st.sampled_from([0, 25]),
    records=inputs(),
    cut=st.integers(0, 70),
    agg=st.sampled_from(["sum", "count", "process", "ids"]),
)
def test_state_with_one_entry_per_window_restores_into_slices(
    size_slides: tuple[int, int], lateness: int, records: list[Rec], cut: int, agg: str
) -> None:
    """An upgrade: the first records run with one entry per window (as earlier versions
    stored sliding windows), the rest with slices on the same committed state; the output
    is the model's, where the old entries and the new slices of a window meet too."""
    size, slide = size_slides
    spec = SlidingSpec(size, slide)
    cut = min(cut, len(records))
    model = run(
        records,
        PARTITIONS,
        spec,
        max_delay_ms=DELAY,
        allowed_lateness_ms=lateness,
        fold=AGGS[agg][1],
        flush_to=FLUSH,
    )
    before = TestDriver(per_window(make_app(spec, agg, lateness)), partitions=PARTITIONS)
    for i, rec in enumerate(records[:cut]):
        send(before, i, rec)
    before.commit()
    out = [row(e) for e in before.emitted if e.topic == "out"]
    after = TestDriver(make_app(spec, agg, lateness), partitions=PARTITIONS)
    after._backend = before._backend  # noqa: SLF001 - the committed state, as after a restart
    for i, rec in enumerate(records[cut:], cut):
        send(after, i, rec)
    after.advance_watermark(FLUSH)
    after.commit()
    out += [row(e) for e in after.emitted if e.topic == "out"]
    assert Counter(out) == model.rows()  # process(): its values in arrival order, too
    for g in range(PARTITIONS):
        assert list(after.key_group_store(g).items("window-1")) == []
    assert timers_left(after) == 0


def per_window(app: App) -> App:
    """The app's window operator as earlier versions ran it: one entry per window."""
    (op,) = app._def.windows  # noqa: SLF001 - the operator behind the chain
    op.slice_ms = None
    op.on_record = op._on_sliding_record  # noqa: SLF001
    return app


def test_an_upgrade_meets_old_entries_and_slices_in_one_window() -> None:
    """The case the property test may miss: one window with both kinds of entries."""
    spec = SlidingSpec(60, 20)
    before = TestDriver(make_app(spec, "sum-no-merge", 0), partitions=1)
    before.send("k", {"v": 1, "id": 0}, timestamp=1001)
    before.commit()
    assert sorted(before.state("window-1", "k")) == ["1000", "960", "980"]
    after = TestDriver(make_app(spec, "sum", 0), partitions=1)
    after._backend = before._backend  # noqa: SLF001 - the committed state, as after a restart
    after.send("k", {"v": 10, "id": 1}, timestamp=1019)
    after.send("k", {"v": 100, "id": 2}, timestamp=1025)
    state = after.state("window-1", "k")
    assert sorted(state) == ["1000", "960", "980", "s1000", "s1020"]
    fired = after.advance_watermark(FLUSH)
    got = [(e.value["start"], e.value["end"], e.value["value"]) for e in fired]
    assert got == [(960, 1020, 11), (980, 1040, 111), (1000, 1060, 111), (1020, 1080, 100)]
    assert after.state("window-1", "k") is None


def test_slice_length_is_the_gcd() -> None:
    app = make_app(SlidingSpec(84, 36), "count", 0)
    (op,) = app._def.windows  # noqa: SLF001 - the operator behind the chain
    assert op.slice_ms == math.gcd(84, 36) == 12


@pytest.mark.parametrize("agg", ["count", "process"])
def test_an_operator_with_one_entry_per_window_purges_the_slices_it_finds(agg: str) -> None:
    """The app went from a sliced sliding window to a tumbling one (state kept, as a
    new window size keeps it): the slices' records count in no new window, the old
    timers fire without effect, and the slices (and process()'s counter) are purged."""
    before = TestDriver(make_app(SlidingSpec(60, 20), agg, 0), partitions=1)
    for i, ts in enumerate([1001, 1019, 1025, 1041]):
        before.send("k", {"v": 1, "id": i}, timestamp=ts)
    before.commit()
    assert any(k.startswith("s") for k in before.state("window-1", "k"))
    after = TestDriver(make_app(TumblingSpec(50), agg, 0), partitions=1)
    after._backend = before._backend  # noqa: SLF001 - the committed state, as after a restart
    after.send("k", {"v": 1, "id": 10}, timestamp=1060)
    after.send("k", {"v": 1, "id": 11}, timestamp=1070)
    fired = [(e.value["start"], e.value["value"]) for e in after.advance_watermark(FLUSH)]
    assert fired == [(1050, 2 if agg == "count" else [10, 11])]
    after.commit()
    assert after.state("window-1", "k") is None
    assert timers_left(after) == 0
