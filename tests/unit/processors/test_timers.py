"""Keyed timers (``@app.on_timer``, ``ctx.timers``) under the TestDriver.

Timers are keyed state: they fire in time order when the key group's watermark (event
time) or the driver's clock (processing time) reaches them, exactly once across
crashes, and a callback that raises is dead-lettered without stopping anything.
"""

from __future__ import annotations

import random
from collections import Counter
from typing import Any

import pytest

from processors import NO_WATERMARK, App, ConfigError, Watermarks, key_group
from processors.exceptions import UserCodeError
from processors.testing import TestDriver
from state.exceptions import StateError


def keys_of_partition(p: int, partitions: int, n: int) -> list[str]:
    out = [k for k in (f"key-{i}" for i in range(500)) if key_group(k.encode(), partitions) == p]
    return out[:n]


def timer_app(*, event_time: bool = True, delay: int = 0, fail_on: str | None = None) -> App:
    """Records set/delete timers as their value says; every firing emits to ``fired``.

    value: ``{"e": [[t, name], ...], "p": [...], "de": [...], "dp": [...], "emit": x}``
    (event-time / processing-time timers to set, and to delete); a timer whose name
    is ``fail_on`` emits, then raises; one named ``chain:<t>`` sets an event-time timer
    at ``t`` (named ``chained``) when it fires.
    """
    app = App("timers")
    app.output("fired")
    app.output("seen")

    @app.on_timer
    def on_timer(key: Any, ctx: Any) -> None:
        ctx.emit(
            "fired",
            key,
            {"t": ctx.timestamp, "name": ctx.name, "wm": ctx.watermark, "et": ctx.event_time},
        )
        if fail_on is not None and ctx.name == fail_on:
            raise RuntimeError(f"timer {ctx.name} at {ctx.timestamp}")
        if ctx.name.startswith("chain:"):
            ctx.timers.set_event_time(int(ctx.name.split(":")[1]), "chained")

    def handle(key: Any, value: dict[str, Any], ctx: Any) -> None:
        ctx.emit("seen", key, {"wm": ctx.watermark if event_time else None})
        for t, name in value.get("e", []):
            ctx.timers.set_event_time(t, name)
        for t, name in value.get("p", []):
            ctx.timers.set_processing_time(t, name)
        for t, name in value.get("de", []):
            ctx.timers.delete_event_time(t, name)
        for t, name in value.get("dp", []):
            ctx.timers.delete_processing_time(t, name)

    watermarks = Watermarks.bounded(delay) if event_time else None
    app.stream("in", watermarks=watermarks).process(handle)
    return app


def fired(emitted: list[Any]) -> list[tuple[Any, int, str]]:
    return [(e.key, e.value["t"], e.value["name"]) for e in emitted if e.topic == "fired"]


# -- event time -----------------------------------------------------------------------------------


def test_event_time_timers_fire_in_time_order_as_the_watermark_advances() -> None:
    rng = random.Random(3)
    keys = keys_of_partition(0, 1, 6)
    d = TestDriver(timer_app(), partitions=1)
    pending: set[tuple[str, int, str]] = set()
    for _ in range(60):
        key = rng.choice(keys)
        timers = [[rng.randint(1_000, 5_000), rng.choice(["x", "y"])] for _ in range(3)]
        d.send(key, {"e": timers}, timestamp=0)  # the watermark stays at -1
        pending |= {(key, t, n) for t, n in timers}
    assert fired(d.emitted) == []
    # setting a timer again is a no-op: each (key, time, name) fires once
    level = 0
    while pending:
        level += rng.randint(50, 700)
        got = fired(d.advance_watermark(level))
        due = {p for p in pending if p[1] <= level}
        assert Counter(got) == Counter(due)
        assert [t for _, t, _ in got] == sorted(t for _, t, _ in got)  # time order
        pending -= due
    assert fired(d.advance_watermark(10**9)) == []


def test_a_record_that_moves_the_watermark_fires_the_timers_after_its_own_output() -> None:
    d = TestDriver(timer_app(delay=5), partitions=1)
    out = d.send("a", {"e": [[100, "t100"], [120, "t120"], [90, "t90"]]}, timestamp=50)
    assert [e.topic for e in out] == ["seen"]
    assert out[0].value == {"wm": NO_WATERMARK}  # the watermark before the record
    out = d.send("b", {"e": [[100, "b"]]}, timestamp=106)  # watermark 100
    assert [(e.topic, e.key) for e in out] == [
        ("seen", "b"),
        ("fired", "a"),
        ("fired", "a"),
        ("fired", "b"),
    ]
    assert [e.value for e in out[1:]] == [
        {"t": 90, "name": "t90", "wm": 100, "et": 90},
        {"t": 100, "name": "t100", "wm": 100, "et": 100},
        {"t": 100, "name": "b", "wm": 100, "et": 100},
    ]
    assert out[0].value == {"wm": 44}
    # an older record does not move it back
    assert fired(d.send("a", {}, timestamp=10)) == []
    assert d.watermark(0) == 100
    assert fired(d.send("a", {}, timestamp=126)) == [("a", 120, "t120")]


def test_deleted_timers_do_not_fire() -> None:
    d = TestDriver(timer_app(), partitions=1)
    d.send("a", {"e": [[100, "x"], [100, "y"], [200, "x"]]}, timestamp=0)
    d.send("a", {"de": [[100, "x"], [300, "never-set"]]}, timestamp=0)
    d.commit()
    d.send("a", {"de": [[200, "x"]]}, timestamp=0)
    assert fired(d.advance_watermark(1000)) == [("a", 100, "y")]
    # the deletion of 200 was not committed: after a crash the timer is back
    d.crash()
    assert fired(d.advance_watermark(1000)) == [("a", 100, "y"), ("a", 200, "x")]


def test_a_timer_callback_can_set_timers() -> None:
    d = TestDriver(timer_app(), partitions=1)
    d.send("a", {"e": [[10, "chain:500"]]}, timestamp=0)
    assert fired(d.advance_watermark(400)) == [("a", 10, "chain:500")]
    assert fired(d.advance_watermark(499)) == []
    assert fired(d.advance_watermark(500)) == [("a", 500, "chained")]


def test_watermarks_and_timers_are_per_key_group() -> None:
    a = keys_of_partition(0, 2, 1)[0]
    b = keys_of_partition(1, 2, 1)[0]
    d = TestDriver(timer_app(), partitions=2)
    d.send(a, {"e": [[100, "a"]]}, timestamp=0)
    d.send(b, {"e": [[100, "b"]]}, timestamp=0)
    assert fired(d.send(a, {}, timestamp=500)) == [(a, 100, "a")]
    assert (d.watermark(0), d.watermark(1)) == (499, -1)
    assert fired(d.advance_watermark(100, partition=1)) == [(b, 100, "b")]


def test_advance_watermark_never_goes_back() -> None:
    d = TestDriver(timer_app(delay=10), partitions=1)
    d.send("a", {"e": [[300, "x"]]}, timestamp=100)
    assert d.watermark(0) == 89
    d.advance_watermark(250)
    assert d.watermark(0) == 250
    d.send("a", {}, timestamp=200)  # its own watermark would be 189
    assert d.watermark(0) == 250
    d.advance_watermark(120)
    assert d.watermark(0) == 250
    assert fired(d.send("a", {}, timestamp=311)) == [("a", 300, "x")]


def test_committed_timers_are_keyed_state() -> None:
    d = TestDriver(timer_app(), partitions=1)
    d.send("a", {"e": [[100, "x"]], "p": [[50, "p"]]}, timestamp=0)
    d.commit()
    stored = [k for k, _ in d.key_group_store(0).items("lockgate.time") if k.startswith(b"t")]
    assert len(stored) == 2 and all(k.endswith(b"a") for k in stored)
    d.advance_watermark(100)
    d.advance(50)
    d.commit()
    assert [k for k, _ in d.key_group_store(0).items("lockgate.time") if k.startswith(b"t")] == []


# -- processing time ------------------------------------------------------------------------------


def test_processing_time_timers_fire_when_the_clock_reaches_them() -> None:
    d = TestDriver(timer_app(event_time=False), partitions=3)
    d.send("a", {"p": [[300, "a3"], [100, "a1"]]})
    d.send("b", {"p": [[200, "b2"], [200, "b2"]]})
    d.send("c", {"p": [[250, "c"]], "dp": [[250, "c"]]})
    d.advance(99)
    assert fired(d.emitted) == []
    d.advance(1)
    assert fired(d.emitted) == [("a", 100, "a1")]
    d.advance(1_000)
    # a timer set twice fires once; a deleted one never (order: per key group)
    assert Counter(fired(d.emitted)[1:]) == Counter([("b", 200, "b2"), ("a", 300, "a3")])
    assert [e.value["wm"] for e in d.emitted if e.topic == "fired"] == [NO_WATERMARK] * 3
    d.advance(10_000)
    assert len(fired(d.emitted)) == 3


def test_processing_time_timers_of_one_key_group_fire_in_time_order() -> None:
    keys = keys_of_partition(1, 2, 4)
    rng = random.Random(9)
    d = TestDriver(timer_app(event_time=False), partitions=2)
    want = []
    for k in keys:
        ts = [rng.randint(1, 10_000) for _ in range(5)]
        d.send(k, {"p": [[t, "p"] for t in ts]})
        want += [(k, t, "p") for t in ts]
    d.advance(10_000)
    got = fired(d.emitted)
    assert Counter(got) == Counter(want)
    assert [t for _, t, _ in got] == sorted(t for _, t, _ in got)


def test_processing_time_timer_fires_once_across_crashes() -> None:
    d = TestDriver(timer_app(event_time=False), partitions=2)
    d.send("a", {"p": [[100, "p"]]})
    d.commit()
    d.advance(150)
    assert fired(d.emitted) == [("a", 100, "p")]
    d.crash()  # the firing was not committed: it fires again
    assert fired(d.emitted) == []
    d.send("a", {})
    d.advance(0)
    assert fired(d.emitted) == [("a", 100, "p")]
    d.commit()
    d.crash()  # committed: never again
    d.send("a", {})
    d.advance(1_000)
    assert fired(d.emitted) == [("a", 100, "p")]


def test_processing_time_timers_fire_after_a_crash_without_new_records() -> None:
    d = TestDriver(timer_app(event_time=False), partitions=4)
    d.send("a", {"p": [[100, "p"]]})
    d.commit()
    d.crash()  # a restart: the key group is restored, its timers are due at 100
    d.advance(200)
    assert fired(d.emitted) == [("a", 100, "p")]


# -- exactly once across crashes -----------------------------------------------------------------


def test_event_time_timer_fires_exactly_once_across_crashes() -> None:
    d = TestDriver(timer_app(), partitions=1)
    d.send("a", {"e": [[100, "x"]]}, timestamp=0)
    d.commit()
    assert fired(d.send("b", {}, timestamp=200)) == [("a", 100, "x")]
    d.crash()  # the firing was not committed
    assert fired(d.emitted) == []
    assert d.watermark(0) == -1
    assert fired(d.send("b", {}, timestamp=200)) == [("a", 100, "x")]  # the lost record again
    d.commit()
    d.crash()
    assert fired(d.send("b", {}, timestamp=300)) == []
    assert fired(d.advance_watermark(10**6)) == []
    assert fired(d.emitted) == [("a", 100, "x")]


def test_a_timer_set_and_fired_within_one_epoch_writes_nothing(monkeypatch: Any) -> None:
    """No changelog record or tombstone for it; a timer that outlives its epoch gets both."""
    d = TestDriver(timer_app(), partitions=1)
    d.send("a", {}, timestamp=0)  # opens the key group
    d.commit()
    db = d.key_group_store(0)
    written: list[dict[str, dict[bytes, bytes | None]]] = []
    apply = db.apply

    def recording_apply(per_store: Any, meta: Any) -> None:
        written.append({name: dict(w) for name, w in per_store.items()})
        apply(per_store, meta)

    monkeypatch.setattr(db, "apply", recording_apply)

    def timer_writes() -> list[tuple[bytes, bool]]:
        return [
            (k[10:], v is None)
            for w in written
            for k, v in w.get("lockgate.time", {}).items()
            if k.startswith(b"t")
        ]

    d.send("a", {"e": [[100, "x"]]}, timestamp=0)
    assert fired(d.send("b", {}, timestamp=200)) == [("a", 100, "x")]  # same epoch
    d.commit()
    assert timer_writes() == []
    d.send("a", {"e": [[300, "y"]]}, timestamp=200)
    d.commit()  # the timer is committed ...
    assert fired(d.send("b", {}, timestamp=400)) == [("a", 300, "y")]
    d.commit()  # ... so its firing writes a tombstone
    assert timer_writes() == [(b"a", False), (b"a", True)]
    assert not [k for k, _ in db.items("lockgate.time") if k.startswith(b"t")]
    d.crash()
    assert fired(d.advance_watermark(10**6)) == []  # nothing fires twice


def test_at_least_once_a_timer_set_and_fired_within_one_epoch_still_writes_its_tombstone(
    monkeypatch: Any,
) -> None:
    """Under at-least-once an aborted epoch's changelog records stay in the changelog.

    The epoch that set the timer produced it and then failed to commit its offsets; the
    replay sets it again and fires it in one epoch. Without the tombstone the compacted
    changelog would keep the timer, and a restore from it would fire it a second time.
    """
    app = timer_app()
    assert app.time_service is not None
    d = TestDriver(app, partitions=1)
    app.time_service.atomic_epochs = False  # what the runtime sets under at-least-once
    d.send("b", {}, timestamp=0)
    d.commit()
    db = d.key_group_store(0)
    written: list[tuple[bytes, bytes | None]] = []
    apply = db.apply

    def recording_apply(per_store: Any, meta: Any) -> None:
        written.extend(per_store.get("lockgate.time", {}).items())
        apply(per_store, meta)

    monkeypatch.setattr(db, "apply", recording_apply)
    d.send("a", {"e": [[100, "x"]]}, timestamp=0)
    assert fired(d.send("b", {}, timestamp=200)) == [("a", 100, "x")]
    d.commit()
    timers = [(k[10:], v) for k, v in written if k.startswith(b"t")]
    assert timers == [(b"a", None)]  # the tombstone, whatever an aborted attempt wrote


def script(seed: int, n: int = 250) -> list[tuple[str, dict[str, Any], int]]:
    """Records that set and delete timers, with a bounded-disorder watermark."""
    rng = random.Random(seed)
    t = 1_000
    out = []
    for _ in range(n):
        t += rng.choice([0, 3, 10, 25])
        ts = t - rng.randint(0, 40)
        names = ["x", "y", f"chain:{ts + 300}"]
        value: dict[str, Any] = {}
        if rng.random() < 0.7:
            value["e"] = [[ts + rng.randint(-60, 200), rng.choice(names)] for _ in range(2)]
        if rng.random() < 0.2:
            value["de"] = [[ts + rng.randint(-60, 200), rng.choice(names)]]
        out.append((rng.choice("abcdefgh"), value, ts))
    return out


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_random_crashes_fire_every_timer_exactly_once(seed: int) -> None:
    records = script(seed)
    ref = TestDriver(timer_app(delay=20), partitions=3)
    for key, value, ts in records:
        ref.send(key, value, timestamp=ts)
    ref.advance_watermark(10**9)
    ref.commit()
    reference = [(e.topic, e.key, e.value) for e in ref.emitted]
    assert len(fired(ref.emitted)) > 50
    assert any(name == "chained" for _, _, name in fired(ref.emitted))

    rng = random.Random(seed)
    d = TestDriver(timer_app(delay=20), partitions=3)
    committed = i = crashes = 0
    while i < len(records):
        key, value, ts = records[i]
        d.send(key, value, timestamp=ts)
        i += 1
        x = rng.random()
        if x < 0.1:
            d.commit()
            committed = i
        elif x < 0.17 and crashes < 15:
            d.crash()
            crashes += 1
            i = committed
    assert crashes >= 3
    d.advance_watermark(10**9)
    d.commit()
    assert [(e.topic, e.key, e.value) for e in d.emitted] == reference


# -- failures and misuse -------------------------------------------------------------------------


def test_a_failing_timer_is_dead_lettered_and_processing_goes_on() -> None:
    d = TestDriver(timer_app(fail_on="bad"), partitions=1)
    d.send("a", {"e": [[100, "bad"], [100, "good"], [150, "later"]]}, timestamp=0)
    d.send("b", {"e": [[120, "b"]]}, timestamp=0)
    out = d.advance_watermark(200)
    # what the failing callback emitted before raising stays (as in the runtime)
    assert fired(out) == [
        ("a", 100, "bad"),
        ("a", 100, "good"),
        ("b", 120, "b"),
        ("a", 150, "later"),
    ]
    (dead,) = d.dead_letters
    assert (dead.stage, dead.key, dead.timestamp, dead.value) == ("timer", "a", 100, None)
    assert isinstance(dead.error, RuntimeError)
    # the failed timer is gone, records go on
    d.commit()
    d.crash()
    assert fired(d.advance_watermark(300)) == []
    assert [e.topic for e in d.send("a", {"e": [[400, "ok"]]}, timestamp=1_000)] == [
        "seen",
        "fired",
    ]
    assert len(d.dead_letters) == 1


def test_a_failing_timer_with_on_error_fail_raises_and_loses_the_epoch() -> None:
    d = TestDriver(timer_app(fail_on="bad"), partitions=1, on_error="fail")
    d.send("a", {"e": [[100, "bad"]]}, timestamp=0)
    d.commit()
    with pytest.raises(UserCodeError, match="bad"):
        d.advance_watermark(200)
    assert [e.topic for e in d.emitted] == ["seen"]  # the committed record's output only
    assert d.dead_letters == []
    # the timer was not fired for good: it fails again
    with pytest.raises(UserCodeError, match="bad"):
        d.advance_watermark(200)


def test_ctx_timers_without_a_timer_handler_is_a_config_error() -> None:
    # an app without event time and without @app.on_timer: no timers at all
    app = App("no-timers")
    app.stream("in").process(lambda k, v, ctx: ctx.timers.set_processing_time(10))
    with pytest.raises(ConfigError, match="on_timer"):
        TestDriver(app).send("a", {})
    # event time (watermarks) but no handler: setting a timer is a config error
    for setter in ("set_event_time", "set_processing_time"):
        app = App("no-handler")
        app.stream("in", watermarks=Watermarks.bounded(5)).process(
            lambda k, v, ctx, s=setter: getattr(ctx.timers, s)(10)
        )
        d = TestDriver(app)
        with pytest.raises(ConfigError, match="on_timer"):
            d.send("a", {}, timestamp=1)
    # ...while reading the watermark is fine there
    app = App("wm-only")
    app.output("out")
    app.stream("in", watermarks=Watermarks.bounded(5)).process(
        lambda k, v, ctx: ctx.emit("out", k, ctx.watermark)
    )
    d = TestDriver(app, partitions=1)
    d.send("a", {}, timestamp=100)
    assert [e.value for e in d.send("a", {}, timestamp=100)] == [94]


def test_a_second_timer_handler_is_a_config_error() -> None:
    app = timer_app()
    with pytest.raises(ConfigError):
        app.on_timer(lambda key, ctx: None)


def test_timers_of_a_keyless_record_are_an_error() -> None:
    for kind in ("e", "p"):
        d = TestDriver(timer_app(), partitions=1)
        assert d.send(None, {kind: [[100, "x"]]}, timestamp=0) == []
        (dead,) = d.dead_letters
        assert dead.stage == "process" and isinstance(dead.error, StateError)
        assert "key" in str(dead.error)
        d = TestDriver(timer_app(), partitions=1, on_error="fail")
        with pytest.raises(UserCodeError) as err:
            d.send(None, {kind: [[100, "x"]]}, timestamp=0)
        assert isinstance(err.value.__cause__, StateError)


# -- found bugs ----------------------------------------------------------------------------------


def test_a_timer_set_below_the_watermark_by_a_record_that_moves_it_fires_after_it() -> None:
    d = TestDriver(timer_app(), partitions=1)
    d.send("a", {}, timestamp=1_000)  # watermark 999
    out = d.send("a", {"e": [[800, "past"]]}, timestamp=1_001)
    assert fired(out) == [("a", 800, "past")]


def test_a_timer_set_at_or_below_the_watermark_fires_after_the_record() -> None:
    d = TestDriver(timer_app(), partitions=1)
    d.send("a", {}, timestamp=1_000)  # watermark 999
    out = d.send("a", {"e": [[800, "past"]]}, timestamp=500)
    assert fired(out) == [("a", 800, "past")]


def test_a_dead_lettered_record_does_not_undo_advance_watermark() -> None:
    app = timer_app()
    d = TestDriver(app, partitions=1)
    d.send("a", {"e": [[100, "x"]]}, timestamp=0)
    assert fired(d.advance_watermark(500)) == [("a", 100, "x")]
    d.send("a", {"e": [["not a time", "x"]]}, timestamp=0)  # raises: dead-lettered
    assert len(d.dead_letters) == 1
    assert d.watermark(0) == 500  # "It never goes back"
    assert fired(d.emitted) == [("a", 100, "x")]


def test_same_epoch_timer_writes_are_skipped_only_where_epochs_are_declared_atomic() -> None:
    """A time service nobody configured keeps every timer write (fails closed)."""
    app = timer_app()
    assert app.time_service is not None
    assert app.time_service.atomic_epochs is False
    TestDriver(app, partitions=1)  # the driver's commit applies an epoch whole
    assert app.time_service.atomic_epochs is True
