"""Regression tests for defects an adversarial review found in event time.

Each test names the defect it pins: chained windows, the event time of updated results,
event-time timers without event time, the timer clock and uncommitted (seeded) timers,
pending barrier watermarks across a crash, upstreams without event time.
"""

from __future__ import annotations

from typing import Any

import pytest

from processors import NO_WATERMARK, App, ConfigError, Tumbling, Watermarks
from processors._task.time import _EVENT, MAX_PENDING_PER_WRITER, timer_key
from processors.testing import TestDriver


def _chained(lateness: int) -> App:
    app = App("chain")
    first = (
        app.stream("in", watermarks=Watermarks.monotonous())
        .window(Tumbling(10), allowed_lateness_ms=lateness)
        .count()
        .map(lambda w: w.value)
    )
    first.window(Tumbling(20), allowed_lateness_ms=lateness).reduce(lambda a, b: a + b).map(
        lambda w: [w.start, w.end, w.value]
    ).to("out")
    return app


@pytest.mark.parametrize("lateness", [0, 1, 5])
def test_two_windows_chained_in_one_app_lose_and_duplicate_nothing(lateness: int) -> None:
    d = TestDriver(_chained(lateness), partitions=1)
    for t in range(0, 100):  # one record per ms: every 10 ms window counts 10
        d.send("k", {}, timestamp=t)
    d.advance_watermark(1000)
    out = [e.value for e in d.emitted if e.topic == "out"]
    assert out == [[s, s + 20, 20] for s in range(0, 100, 20)]


def test_an_updated_result_within_the_allowed_lateness_has_the_windows_event_time() -> None:
    app = App("upd")
    seen: list[tuple[int, int]] = []

    def record(key: Any, w: Any, ctx: Any) -> None:
        seen.append((w.value, ctx.event_time))

    (
        app.stream("in", watermarks=Watermarks.monotonous())
        .window(Tumbling(60), allowed_lateness_ms=100)
        .count()
        .process(record)
    )
    d = TestDriver(app, partitions=1)
    d.send("k", {}, timestamp=10)
    d.send("k", {}, timestamp=70)  # fires [0, 60): event time 59
    d.send("k", {}, timestamp=20)  # late but allowed: the update is at 59 too, not 20
    assert seen == [(1, 59), (2, 59)]


def test_event_time_timers_without_any_event_time_refuse() -> None:
    app = App("nowm")

    @app.on_timer
    def fire(key: Any, ctx: Any) -> None:  # pragma: no cover - never fires
        pass

    @app.process("in")
    def handle(key: Any, value: Any, ctx: Any) -> None:
        ctx.timers.set_event_time(100)

    d = TestDriver(app, partitions=1, on_error="fail")
    with pytest.raises(ConfigError, match="event-time timers need an input with event time"):
        d.send("k", {}, timestamp=5)


def test_process_decorator_takes_watermarks_and_its_timers_fire() -> None:
    app = App("proc-wm")

    @app.on_timer
    def fire(key: Any, ctx: Any) -> None:
        ctx.emit("out", key, ctx.timestamp)

    @app.process("in", outputs=["out"], watermarks=Watermarks.monotonous())
    def handle(key: Any, value: Any, ctx: Any) -> None:
        ctx.timers.set_event_time(ctx.event_time + 10)

    d = TestDriver(app, partitions=1)
    d.send("k", {}, timestamp=5)
    assert [e.value for e in d.send("k", {}, timestamp=16)] == [15]


def test_the_timer_clock_counts_timers_written_but_not_committed() -> None:
    app = App("seeded")

    @app.on_timer
    def fire(key: Any, ctx: Any) -> None:
        ctx.emit("out", key, ctx.timestamp)

    app.output("out")
    app.stream("in", watermarks=Watermarks.monotonous()).process(lambda k, v, c: None)
    svc = app.time_service
    assert svc is not None
    d = TestDriver(app, partitions=1)
    kg = d.key_group_store(0) and d._kgs[0]  # noqa: SLF001 - open key group 0
    kg.bind()
    cache = kg.caches["lockgate.time"]
    # What seeding from a savepoint does: timers straight into the cache, uncommitted.
    cache.put(timer_key(_EVENT, 40, b"a"), ["u"])
    cache.derived = None
    assert svc.announce(cache) == (NO_WATERMARK, False)  # does not build a clock
    assert cache.derived is None
    out = d.advance_watermark(50)
    assert [(e.key, e.value) for e in out] == [("a", 40)]


def test_pending_barrier_watermarks_survive_a_crash() -> None:
    app = App("pend")
    app.stream("rep", watermarks=Watermarks.monotonous()).window(Tumbling(100)).count().map(
        lambda w: [w.start, w.value]
    ).to("out")
    svc = app.time_service
    assert svc is not None
    d = TestDriver(app, partitions=1)
    d.send("k", {}, timestamp=10)
    d._kgs[0].bind()  # noqa: SLF001 - drive the barrier path directly
    svc.stash_barrier("rep", 7, "up/0", 1, 500, False)
    assert svc.watermark() == 10 - 1
    d.commit()
    d.crash()  # the barrier is behind the committed offsets: never read again
    d._kg(0).bind()  # noqa: SLF001
    assert svc.apply_pending("rep", 7) is True  # checkpoint 7 completed
    assert svc.watermark() == 500
    assert [e.value for e in d.emitted if e.topic == "out"] == [[0, 1]]


def test_an_upstream_without_event_time_leaves_record_times_in_charge() -> None:
    app = App("noet")
    app.stream("rep", watermarks=Watermarks.monotonous()).window(Tumbling(100)).count().map(
        lambda w: [w.start, w.value]
    ).to("out")
    svc = app.time_service
    assert svc is not None
    svc.reads_barriers = True
    d = TestDriver(app, partitions=1)
    d.send("k", {}, timestamp=10, headers=[("lockgate-writer", b"up/0")])
    assert d.watermark(0) == NO_WATERMARK  # internal: waits for barriers
    d._kgs[0].bind()  # noqa: SLF001
    svc.on_barrier_without_event_time("rep")
    assert svc.watermark() == 9  # record times now
    out = d.send("k", {}, timestamp=200, headers=[("lockgate-writer", b"up/0")])
    assert [e.value for e in out] == [[0, 1]]


def test_pending_barrier_watermarks_are_bounded_per_writer_without_losing_a_wake_up() -> None:
    """Completions that never come (a writer without barriers) must not grow the time state.

    Entries that only raise the watermark are dropped past the bound; the entry that makes
    an idle writer active again is kept, and the newest watermark still applies.
    """
    app = App("bound")
    app.stream("rep", watermarks=Watermarks.monotonous()).window(Tumbling(100)).count().map(
        lambda w: [w.start, w.value]
    ).to("out")
    svc = app.time_service
    assert svc is not None
    d = TestDriver(app, partitions=1)
    d.send("k", {}, timestamp=10)
    d._kgs[0].bind()  # noqa: SLF001 - drive the barrier path directly
    svc.stash_barrier("rep", 1, "up/0", 1, 20, True)
    svc.apply_pending("rep", 1)  # the writer is idle now
    svc.stash_barrier("rep", 2, "up/0", 1, 30, True)  # idle again: droppable
    svc.stash_barrier("rep", 3, "up/0", 1, 40, False)  # active again: kept
    for ckpt in range(4, 4 + 3 * MAX_PENDING_PER_WRITER):
        svc.stash_barrier("rep", ckpt, "up/0", 1, 40 + ckpt, False)
    pending = [p for p in svc.clock().pending if p[2] == "up/0"]
    assert len(pending) == MAX_PENDING_PER_WRITER
    assert [3, 40] in [[p[1], p[4]] for p in pending]  # the wake-up survived
    newest = 3 + 3 * MAX_PENDING_PER_WRITER
    assert max(p[1] for p in pending) == newest
    assert svc.apply_pending("rep", newest) is True
    assert svc.watermark() == 40 + newest
    assert svc.clock().pending == []
