"""Window operators under the TestDriver against the independent model of window_model.py.

Seeded random inputs with bounded disorder (and some records beyond the bound, so there
is late data) go through every window kind; the driver's output must be what the model
computes: the fired results (as a multiset and per key in order), the late topic's
records (the input's bytes and headers plus the late headers), each key group's
watermark after each record, the window state and the timers left, and the same output
after crashes and replays.
"""

from __future__ import annotations

import math
import random
import struct
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import reduce
from typing import Any

import orjson
import pytest

from processors import (
    App,
    ConfigError,
    Count,
    Global,
    Session,
    Sliding,
    Tumbling,
    Watermarks,
    WindowResult,
)
from processors.testing import Emitted, TestDriver
from tests.support.window_model import (
    NO_WATERMARK,
    CountSpec,
    GlobalSpec,
    Outcome,
    Rec,
    SessionSpec,
    SlidingSpec,
    Spec,
    TumblingSpec,
    freeze,
    partition_of,
    run,
)

PARTITIONS = 3
DELAY = 30
FLUSH = 10**9
KEYS = ["a", "b", "c", "d", "e", "f", "g"]
ORIGIN = [("origin", b"gen")]


# -- inputs -----------------------------------------------------------------------------------


def gen(seed: int, n: int = 260, *, late_share: float = 0.1, far: int = 250) -> list[Rec]:
    """Records with event times at most ``DELAY`` behind the newest so far, except a
    ``late_share`` of them that are up to ``DELAY + far`` behind."""
    rng = random.Random(seed)
    t = 10_000 + rng.randrange(100)
    out = []
    for i in range(n):
        t += rng.choice([0, 0, 1, 2, 5, 9, 17, 33])
        if rng.random() < late_share:
            ts = t - rng.randint(DELAY + 1, DELAY + far)
        else:
            ts = t - rng.randint(0, DELAY)
        out.append(Rec(rng.choice(KEYS), ts, {"v": rng.randint(-3, 20), "id": i}))
    return out


def headers_of(i: int) -> list[tuple[str, bytes]] | None:
    return ORIGIN if i % 4 == 0 else None


# -- aggregations: how the app folds, and what the model folds ----------------------------------


class SumAgg:
    def create_accumulator(self) -> int:
        return 0

    def add(self, value: dict[str, int], acc: int) -> int:
        return acc + value["v"]

    def get_result(self, acc: int) -> dict[str, int]:
        return {"sum": acc}

    def merge(self, a: int, b: int) -> int:
        return a + b


class SumAggNoMerge:
    def create_accumulator(self) -> int:
        return 0

    def add(self, value: dict[str, int], acc: int) -> int:
        return acc + value["v"]

    def get_result(self, acc: int) -> int:
        return acc


def reduce_ordered(a: dict[str, Any], b: dict[str, Any]) -> dict[str, Any]:
    """Not commutative: the result keeps the first value's id (arrival order matters)."""
    return {"v": a["v"] * 3 + b["v"], "id": a["id"]}


def reduce_commutative(a: dict[str, Any], b: dict[str, Any]) -> dict[str, Any]:
    return {"v": max(a["v"], b["v"]), "id": min(a["id"], b["id"])}


def process_fn(key: str, w: WindowResult[list[dict[str, int]]]) -> list[dict[str, Any]] | None:
    """Two outputs per window, none for a window of one record."""
    if len(w.value) == 1:
        return None
    ids = sorted(v["id"] for v in w.value)
    return [
        {"start": w.start, "end": w.end, "value": ids},
        {"start": w.start, "end": w.end, "value": {"n": len(ids), "key": key}},
    ]


@dataclass(frozen=True)
class Agg:
    name: str
    build: Callable[[Any], Any]  # WindowedStream -> Stream of dicts
    fold: Callable[[list[Any]], Any]  # the model's window value
    expand: Callable[[str, Any], list[Any]]  # model value -> output values


def _as_dict(w: WindowResult[Any]) -> dict[str, Any]:
    return w.as_dict()


AGGS = {
    "count": Agg("count", lambda ws: ws.count().map(_as_dict), len, lambda k, v: [v]),
    "sum": Agg(
        "sum",
        lambda ws: ws.aggregate(SumAgg()).map(_as_dict),
        lambda vs: {"sum": sum(v["v"] for v in vs)},
        lambda k, v: [v],
    ),
    "reduce": Agg(
        "reduce",
        lambda ws: ws.reduce(reduce_ordered).map(_as_dict),
        lambda vs: reduce(reduce_ordered, vs),
        lambda k, v: [v],
    ),
    "reduce-commutative": Agg(
        "reduce-commutative",
        lambda ws: ws.reduce(reduce_commutative).map(_as_dict),
        lambda vs: reduce(reduce_commutative, vs),
        lambda k, v: [v],
    ),
    "process": Agg(
        "process",
        lambda ws: ws.process(process_fn),
        lambda vs: sorted(v["id"] for v in vs),
        lambda k, ids: [] if len(ids) == 1 else [ids, {"n": len(ids), "key": k}],
    ),
}


def assigner_of(spec: Spec) -> Any:
    if isinstance(spec, TumblingSpec):
        return Tumbling(spec.size, spec.offset)
    if isinstance(spec, SlidingSpec):
        return Sliding(spec.size, spec.slide, spec.offset)
    if isinstance(spec, SessionSpec):
        return Session(spec.gap)
    if isinstance(spec, CountSpec):
        return Count(spec.size)
    return Global(spec.every)


def make_app(
    spec: Spec,
    agg: Agg,
    *,
    lateness: int = 0,
    late_topic: str | None = "late",
    event_time: bool = True,
    map_fn: Callable[[Any], Any] | None = None,
) -> App:
    app = App("win")
    stream = app.stream("in", watermarks=Watermarks.bounded(DELAY) if event_time else None)
    if map_fn is not None:
        stream = stream.map(map_fn)
    ws = stream.window(assigner_of(spec), allowed_lateness_ms=lateness, late_topic=late_topic)
    agg.build(ws).to("out")
    return app


# -- running and comparing ---------------------------------------------------------------------


def out_row(e: Emitted) -> tuple[str, int, int, Any]:
    return (e.key, e.value["start"], e.value["end"], freeze(e.value["value"]))


def expected_rows(
    outcome: Outcome, agg: Agg, at: int | None = None
) -> list[tuple[str, int, int, Any]]:
    return [
        (r.key, r.start, r.end, freeze(v))
        for r in outcome.results
        if at is None or r.at == at
        for v in agg.expand(r.key, r.value)
    ]


def late_record(rec: Rec, i: int, windows: Sequence[tuple[int, int]], wm: int) -> tuple[Any, ...]:
    headers: list[tuple[str, Any]] = [
        ("lockgate-late-window", ",".join(f"{s}-{e}" for s, e in windows)),
        ("lockgate-late-watermark", str(wm)),
        ("lockgate-late-event-time", str(rec.ts)),
    ]
    headers += headers_of(i) or []
    return ("late", rec.key.encode(), orjson.dumps(rec.value), headers)


def as_tuple(e: Emitted) -> tuple[Any, ...]:
    return (e.topic, e.key, freeze(e.value), e.headers)


def send(d: TestDriver, i: int, rec: Rec) -> list[Emitted]:
    return d.send(rec.key, rec.value, timestamp=rec.ts, headers=headers_of(i))


def open_windows_in_state(
    d: TestDriver, key: str, spec: Spec, lateness: int = 0
) -> list[tuple[int, int]]:
    """The windows the key's state holds: its ``"<start>"`` entries, and for a sliced
    sliding window each live window (not purged yet) containing one of its slices."""
    state = d.state("window-1", key)
    if state is None:
        return []
    if isinstance(spec, SessionSpec):
        return sorted((s, e) for s, e, _ in state)
    state = {k: v for k, v in state.items() if k != "n"}  # process()'s arrival counter
    windows = {(int(s), e) for s, (e, _) in state.items() if not s.startswith("s")}
    slices = [(int(s[1:]), e) for s, (e, _) in state.items() if s.startswith("s")]
    if slices:
        assert isinstance(spec, SlidingSpec)
        wm = d.watermark(partition_of(key, PARTITIONS))
        for p, pe in slices:
            assert pe - p == math.gcd(spec.size, spec.slide)
            for s, e in Sliding(spec.size, spec.slide, spec.offset).assign(p):
                if e - 1 + lateness > wm:
                    windows.add((s, e))
    return sorted(windows)


def committed_timers(d: TestDriver) -> Counter[tuple[str, int]]:
    """(key, time) of every committed event-time timer (one per timer name)."""
    out: Counter[tuple[str, int]] = Counter()
    for g in range(PARTITIONS):
        for k, raw in d.key_group_store(g).items("lockgate.time"):
            if not k.startswith(b"te"):
                continue
            t = struct.unpack(">Q", k[2:10])[0] - 2**63
            for _ in orjson.loads(raw):
                out[(k[10:].decode(), t)] += 1
    return out


def expected_timers(outcome: Outcome, lateness: int) -> Counter[tuple[str, int]]:
    out: Counter[tuple[str, int]] = Counter()
    for key, wins in outcome.open_windows.items():
        wm = outcome.final_watermarks[partition_of(key, PARTITIONS)]
        for _, e in wins:
            if e - 1 > wm:
                out[(key, e - 1)] += 1  # the window fires then
            if lateness:
                out[(key, e - 1 + lateness)] += 1  # and is forgotten then
    return out


def sliced(spec: Spec, agg_name: str) -> bool:
    """Whether the operator keeps slices (sliding windows, count/merging/process)."""
    sliceable = ("count", "sum", "process")
    return isinstance(spec, SlidingSpec) and spec.slide < spec.size and agg_name in sliceable


def check_sliced_timers(d: TestDriver, outcome: Outcome, lateness: int, spec: Spec) -> None:
    """The committed timers of a sliced sliding window (its ``:f`` timers chain).

    Per key: every ``:f`` timer is at the end of an open window that has not fired, the
    earliest such window has one (its firing sets the next), and with allowed lateness
    each slice has its ``:c`` timer where its last window is purged.
    """
    assert isinstance(spec, SlidingSpec)
    names: Counter[tuple[str, int, str]] = Counter()
    for g in range(PARTITIONS):
        for k, raw in d.key_group_store(g).items("lockgate.time"):
            if k.startswith(b"te"):
                t = struct.unpack(">Q", k[2:10])[0] - 2**63
                for name in orjson.loads(raw):
                    names[(k[10:].decode(), t, name)] += 1
    assert set(names.values()) <= {1}
    for key in KEYS:
        wm = outcome.final_watermarks[partition_of(key, PARTITIONS)]
        unfired = sorted(e - 1 for _, e in outcome.open_windows.get(key, []) if e - 1 > wm)
        fires = {t for k, t, n in names if k == key and n == "w1:f"}
        assert fires <= set(unfired), key
        assert (min(fires) if fires else None) == (unfired[0] if unfired else None), key
        cleans = {t for k, t, n in names if k == key and n == "w1:c"}
        state = d.state("window-1", key) or {}
        want = set()
        if lateness:
            for sk in state:
                if sk == "n":
                    continue  # process()'s arrival counter
                p = int(sk[1:])
                want.add(p - (p - spec.offset) % spec.slide + spec.size - 1 + lateness)
        assert cleans == want, key


TIME_SPECS = {
    "tumbling": TumblingSpec(50),
    "tumbling-offset": TumblingSpec(40, offset=13),
    "sliding": SlidingSpec(60, 20),
    "sliding-uneven": SlidingSpec(50, 15, offset=4),
    "session": SessionSpec(25),
}

TIME_CASES = [
    (kind, agg, lateness, seed)
    for kind in TIME_SPECS
    for agg, lateness, seed in [
        ("count", 0, 1),
        ("sum", 0, 2),
        ("count", 60, 3),
        ("sum", 35, 4),
        ("reduce" if not kind.startswith("session") else "reduce-commutative", 40, 5),
        ("process", 0, 6),
        ("process", 45, 7),
    ]
]


@pytest.mark.parametrize(("kind", "agg_name", "lateness", "seed"), TIME_CASES)
def test_time_windows_match_the_model(kind: str, agg_name: str, lateness: int, seed: int) -> None:
    spec = TIME_SPECS[kind]
    agg = AGGS[agg_name]
    records = gen(seed * 100 + len(kind))
    model = run(
        records,
        PARTITIONS,
        spec,
        max_delay_ms=DELAY,
        allowed_lateness_ms=lateness,
        fold=agg.fold,
        flush_to=FLUSH,
    )
    # the input has what the test is about
    assert model.late, "no late record: pick another seed"
    if lateness:
        assert any(not r.timer for r in model.results), "no updated result"
    check_at = len(records) * 2 // 3
    prefix = run(
        records[: check_at + 1],
        PARTITIONS,
        spec,
        max_delay_ms=DELAY,
        allowed_lateness_ms=lateness,
        fold=agg.fold,
    )

    d = TestDriver(make_app(spec, agg, lateness=lateness), partitions=PARTITIONS)
    late_by_index = {x.index: x for x in model.late}
    for i, rec in enumerate(records):
        p = partition_of(rec.key, PARTITIONS)
        assert d.watermark(p) == model.wm_before[i]
        emitted = send(d, i, rec)
        # the record's own output first (its late record, its updated results), then what
        # the watermark it moved fired: per record exactly what the model says
        assert Counter(out_row(e) for e in emitted if e.topic == "out") == Counter(
            expected_rows(model, agg, at=i)
        ), f"record {i} {rec}"
        late = [(e.topic, e.key, e.value, e.headers) for e in emitted if e.topic == "late"]
        x = late_by_index.get(i)
        assert late == ([] if x is None else [late_record(rec, i, x.windows, x.watermark)])
        assert d.watermark(p) == model.wm_after[i]
        if i == check_at:
            # state holds exactly the open windows; the committed timers are theirs
            for key in KEYS:
                assert open_windows_in_state(d, key, spec, lateness) == prefix.open_windows.get(
                    key, []
                )
            d.commit()
            if sliced(spec, agg_name):
                check_sliced_timers(d, prefix, lateness, spec)
            else:
                assert committed_timers(d) == expected_timers(prefix, lateness)

    flushed = d.advance_watermark(FLUSH)
    assert Counter(out_row(e) for e in flushed) == Counter(expected_rows(model, agg, at=-1))
    d.commit()

    got = [out_row(e) for e in d.emitted if e.topic == "out"]
    assert Counter(got) == Counter(expected_rows(model, agg))
    # per key, results come in the model's order (time order, updates where they happen)
    per_key: dict[str, list[Any]] = {}
    for row in got:
        per_key.setdefault(row[0], []).append(row[1:])
    want: dict[str, list[Any]] = {}
    for row in expected_rows(model, agg):
        want.setdefault(row[0], []).append(row[1:])
    assert per_key == want
    if lateness == 0:
        # exactly one result per fired window
        windows = Counter(
            (e.key, e.value["start"], e.value["end"]) for e in d.emitted if e.topic == "out"
        )
        per_window = 2 if agg_name == "process" else 1
        assert set(windows.values()) <= {per_window}
    # everything fired and forgotten: no window state, no timer
    for g in range(PARTITIONS):
        assert list(d.key_group_store(g).items("window-1")) == []
        assert d.watermark(g) == FLUSH
    assert committed_timers(d) == Counter()
    assert all(open_windows_in_state(d, k, spec) == [] for k in KEYS)


def test_updated_results_with_lateness_are_emitted_at_once() -> None:
    app = make_app(TumblingSpec(100), AGGS["count"], lateness=50)
    d = TestDriver(app, partitions=1)
    assert d.send("a", {"v": 1, "id": 0}, timestamp=10) == []
    fired = d.send("a", {"v": 1, "id": 1}, timestamp=120)  # watermark 89
    assert fired == []
    fired = d.send("a", {"v": 1, "id": 2}, timestamp=140)  # watermark 109: [0,100) fires
    assert [e.value for e in fired] == [{"start": 0, "end": 100, "value": 1}]
    assert [e.value for e in d.send("a", {"v": 1, "id": 3}, timestamp=60)] == [
        {"start": 0, "end": 100, "value": 2}
    ]
    assert [e.value for e in d.send("a", {"v": 1, "id": 4}, timestamp=99)] == [
        {"start": 0, "end": 100, "value": 3}
    ]
    assert d.state("window-1", "a") == {"0": [100, 3], "100": [200, 2]}
    # watermark 149 = 99 + 50: [0,100) is forgotten; a record of it is late now
    assert d.send("a", {"v": 1, "id": 5}, timestamp=180) == []
    assert d.state("window-1", "a") == {"100": [200, 3]}
    (late,) = d.send("a", {"v": 1, "id": 6}, timestamp=0)
    assert (late.topic, late.headers[:3]) == (
        "late",
        [
            ("lockgate-late-window", "0-100"),
            ("lockgate-late-watermark", "149"),
            ("lockgate-late-event-time", "0"),
        ],
    )


@pytest.mark.parametrize(
    ("spec", "agg_name", "seed"),
    [
        (CountSpec(3), "count", 1),
        (CountSpec(4), "sum", 2),
        (CountSpec(1), "reduce", 3),
        (CountSpec(5), "process", 4),
        (GlobalSpec(1), "count", 5),
        (GlobalSpec(3), "sum", 6),
        (GlobalSpec(2), "reduce", 7),
        (GlobalSpec(4), "process", 8),
    ],
)
@pytest.mark.parametrize("event_time", [True, False])
def test_count_and_global_windows_match_the_model(
    spec: Spec, agg_name: str, seed: int, event_time: bool
) -> None:
    agg = AGGS[agg_name]
    records = gen(seed, n=150)
    model = run(records, PARTITIONS, spec, max_delay_ms=DELAY, fold=agg.fold)
    d = TestDriver(make_app(spec, agg, event_time=event_time), partitions=PARTITIONS)
    for i, rec in enumerate(records):
        emitted = send(d, i, rec)
        # no late records: count windows do not look at the watermark
        assert Counter(out_row(e) for e in emitted) == Counter(expected_rows(model, agg, at=i))
    # windows fire only on records
    if event_time:
        assert d.advance_watermark(FLUSH) == []
    got = [out_row(e) for e in d.emitted]
    assert got == expected_rows(model, agg)  # one key group at a time: arrival order
    for key in KEYS:
        state = d.state("window-1", key)
        pending = model.pending.get(key, 0)
        if isinstance(spec, CountSpec) and pending == 0:
            assert state is None  # fired and purged
        else:
            assert state is not None and state[0] == pending


def test_a_record_beyond_every_allowed_lateness_keeps_its_bytes_and_headers() -> None:
    app = make_app(SlidingSpec(60, 20), AGGS["count"], lateness=10)
    d = TestDriver(app, partitions=1)
    d.send("k", {"v": 1, "id": 0}, timestamp=1000)  # watermark 969
    (late,) = d.send(
        "k", {"id": 1, "v": 2}, timestamp=900, headers=[("trace", b"\x00\xff"), ("n", b"1")]
    )
    assert late == Emitted(
        "late",
        b"k",
        b'{"id":1,"v":2}',
        [
            ("lockgate-late-window", "860-920,880-940,900-960"),
            ("lockgate-late-watermark", "969"),
            ("lockgate-late-event-time", "900"),
            ("trace", b"\x00\xff"),
            ("n", b"1"),
        ],
    )
    # without a late topic a late record is dropped
    d = TestDriver(make_app(SlidingSpec(60, 20), AGGS["count"], late_topic=None), partitions=1)
    d.send("k", {"v": 1, "id": 0}, timestamp=1000)
    assert d.send("k", {"v": 1, "id": 1}, timestamp=900) == []
    assert d.state("window-1", "k") is not None
    assert d.advance_watermark(FLUSH) != []


def test_the_watermark_of_a_key_group_is_the_minimum_over_its_inputs() -> None:
    app = App("win")
    app.stream("a", "b", watermarks=Watermarks.bounded(0)).window(
        Tumbling(100), late_topic="late"
    ).count().map(_as_dict).to("out")
    d = TestDriver(app, partitions=1)
    assert d.send("k", {}, topic="a", timestamp=50) == []
    assert d.send("k", {}, topic="a", timestamp=500) == []
    assert d.watermark(0) == NO_WATERMARK  # input b has no event time yet
    out = d.send("k", {}, topic="b", timestamp=120)
    assert [e.value for e in out] == [{"start": 0, "end": 100, "value": 1}]
    assert d.watermark(0) == 119
    out = d.send("k", {}, topic="b", timestamp=700)
    assert [e.value for e in out] == [{"start": 100, "end": 200, "value": 1}]
    assert d.watermark(0) == 499


def test_a_late_input_record_goes_once_to_the_late_topic() -> None:
    app = App("win")
    app.stream("in", watermarks=Watermarks.bounded(0)).flat_map(lambda v: [v, v]).window(
        Tumbling(100), late_topic="late"
    ).count().map(_as_dict).to("out")
    d = TestDriver(app, partitions=1)
    d.send("a", {"x": 1}, timestamp=500)
    late = d.send("a", {"x": 2}, timestamp=5)
    assert [(e.topic, e.value) for e in late] == [("late", b'{"x":2}')]


def test_event_time_from_the_value_and_the_example_contract() -> None:
    from examples.window_count import MAX_DELAY_MS, WINDOW_MS  # noqa: PLC0415
    from examples.window_count import app as example  # noqa: PLC0415

    rng = random.Random(5)
    t = 5_000_000
    records = []
    for _ in range(300):
        t += rng.randint(0, 900)
        delay = rng.randint(0, MAX_DELAY_MS) if rng.random() < 0.9 else rng.randint(0, 80_000)
        records.append(Rec(rng.choice(KEYS), t - delay, {"ts": t - delay}))
    model = run(records, PARTITIONS, TumblingSpec(WINDOW_MS), max_delay_ms=MAX_DELAY_MS)
    assert model.late
    d = TestDriver(example, partitions=PARTITIONS)
    for rec in records:
        d.send(rec.key, rec.value)  # the record timestamp (now: 0) is not the event time
    got = Counter(
        (e.key, e.value["start"], e.value["end"], e.value["count"])
        for e in d.emitted
        if e.topic == "window-counts"
    )
    assert got == Counter(r.row() for r in model.results)
    late = [e for e in d.emitted if e.topic == "window-count.late"]  # <app>.late
    assert [orjson.loads(e.value)["ts"] for e in late] == [x.ts for x in model.late]


# -- configuration errors -----------------------------------------------------------------------


def test_session_aggregate_without_merge_is_a_config_error() -> None:
    app = App("win")
    ws = app.stream("in", watermarks=Watermarks.bounded(5)).window(Session(10))
    with pytest.raises(ConfigError, match="merge"):
        ws.aggregate(SumAggNoMerge())
    # tumbling windows do not merge: fine there
    app = App("win2")
    app.stream("in", watermarks=Watermarks.bounded(5)).window(Tumbling(10)).aggregate(
        SumAggNoMerge()
    ).map(_as_dict).to("out")
    d = TestDriver(app, partitions=1)
    d.send("a", {"v": 4}, timestamp=1)
    assert [e.value for e in d.advance_watermark(100)] == [{"start": 0, "end": 10, "value": 4}]


@pytest.mark.parametrize("assigner", [Tumbling(10), Sliding(10, 5), Session(10)])
def test_time_window_without_input_event_time_is_a_config_error(assigner: Any) -> None:
    app = App("win")
    app.stream("in").window(assigner).count().map(_as_dict).to("out")
    with pytest.raises(ConfigError, match="event time"):
        TestDriver(app)


# -- determinism and crashes --------------------------------------------------------------------


def run_plain(make: Callable[[], App], records: list[Rec]) -> tuple[list[Any], list[int]]:
    """Every emit of a run without crashes, and how many there were before each record."""
    d = TestDriver(make(), partitions=PARTITIONS)
    before = []
    for i, rec in enumerate(records):
        before.append(len(d.emitted))
        send(d, i, rec)
    before.append(len(d.emitted))
    d.advance_watermark(FLUSH)
    d.commit()
    return [as_tuple(e) for e in d.emitted], before


CRASH_CASES = [
    ("tumbling", TumblingSpec(50), "count", 0),
    ("tumbling-late", TumblingSpec(50), "sum", 40),
    ("sliding", SlidingSpec(60, 20), "reduce", 30),
    ("session", SessionSpec(25), "process", 0),
    ("session-late", SessionSpec(25), "sum", 50),
    ("count", CountSpec(3), "sum", 0),
    ("global", GlobalSpec(2), "count", 0),
]


@pytest.mark.parametrize(("name", "spec", "agg_name", "lateness"), CRASH_CASES)
def test_same_input_same_output(name: str, spec: Spec, agg_name: str, lateness: int) -> None:
    records = gen(31)

    def make() -> App:
        return make_app(spec, AGGS[agg_name], lateness=lateness)

    first, _ = run_plain(make, records)
    second, _ = run_plain(make, records)
    assert first == second
    assert len(first) > 20


@pytest.mark.parametrize(("name", "spec", "agg_name", "lateness"), CRASH_CASES)
@pytest.mark.parametrize("seed", [1, 2])
def test_crashes_and_replays_give_the_output_of_a_run_without_crashes(
    name: str, spec: Spec, agg_name: str, lateness: int, seed: int
) -> None:
    records = gen(seed + 40)

    def make() -> App:
        return make_app(spec, AGGS[agg_name], lateness=lateness)

    reference, before = run_plain(make, records)
    rng = random.Random(seed)
    d = TestDriver(make(), partitions=PARTITIONS)
    committed = 0  # records up to here are committed
    crashes = 0
    i = 0
    while i < len(records):
        send(d, i, records[i])
        i += 1
        x = rng.random()
        if x < 0.1:
            d.commit()
            committed = i
        elif x < 0.16 and crashes < 12:
            d.crash()
            crashes += 1
            # only what the committed records emitted survives (timers they fired included)
            assert [as_tuple(e) for e in d.emitted] == reference[: before[committed]]
            for g in range(PARTITIONS):
                assert d.watermark(g) == committed_watermark(records[:committed], g)
            i = committed  # the input positions went back: resend the lost records
    assert crashes >= 3
    d.commit()
    committed = len(records)
    # a crash after the flush loses it: flush again
    d.advance_watermark(FLUSH)
    d.crash()
    assert [as_tuple(e) for e in d.emitted] == reference[: before[committed]]
    d.advance_watermark(FLUSH)
    d.commit()
    assert [as_tuple(e) for e in d.emitted] == reference
    # every timer fired exactly once: nothing left, nothing fires again
    assert committed_timers(d) == Counter()
    assert d.advance_watermark(FLUSH + 1) == []


def committed_watermark(records: list[Rec], g: int) -> int:
    times = [r.ts for r in records if partition_of(r.key, PARTITIONS) == g]
    return max(times) - DELAY - 1 if times else NO_WATERMARK
