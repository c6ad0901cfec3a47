"""Idleness and upstream-writer watermarks of a key group (processors/_task/time.py).

An idle input stops holding the key group's watermark back after ``idle_ms`` of processing
time; when every input is idle the highest watermark they reached counts. Upstream writers'
barrier watermarks: the minimum over the expected writers, unheard writers hold it at "none",
idle writers are left out.
"""

from __future__ import annotations

from typing import Any

import pytest

from processors import NO_WATERMARK, App, Tumbling, Watermarks, key_group
from processors.exceptions import ConfigError
from processors.testing import TestDriver


def _two_inputs(idle_ms: int | None) -> App:
    app = App("idle")
    wm = Watermarks.bounded(0, idle_ms=idle_ms)
    merged = app.stream("a", "b", watermarks=wm)
    merged.window(Tumbling(100)).count().map(lambda w: [w.start, w.value]).to("out")
    return app


def _fired(out: list[Any]) -> list[Any]:
    return [e.value for e in out if e.topic == "out"]


def test_an_input_without_records_holds_the_key_group_back_without_idleness() -> None:
    d = TestDriver(_two_inputs(None), partitions=1)
    d.send("k", 1, topic="a", timestamp=50)
    assert _fired(d.send("k", 1, topic="a", timestamp=500)) == []
    d.advance(60_000)
    assert d.watermark(0) == NO_WATERMARK  # "b" never had a record: no watermark at all


def test_an_idle_input_stops_holding_the_watermark_after_the_timeout() -> None:
    d = TestDriver(_two_inputs(1000), partitions=1)
    d.send("k", 1, topic="a", timestamp=50)
    d.send("k", 1, topic="a", timestamp=500)
    assert d.watermark(0) == NO_WATERMARK  # "b" is not idle yet
    d.advance(999)
    assert d.watermark(0) == NO_WATERMARK
    d.advance(1)  # "b" idle since 1000 ms; "a" too (no record for 1000 ms): the highest
    assert d.watermark(0) == 499
    assert [e.value for e in d.emitted if e.topic == "out"] == [[0, 1]]
    # "a" active again, "b" still idle: "a" alone decides
    assert _fired(d.send("k", 1, topic="a", timestamp=700)) == [[500, 1]]
    assert d.watermark(0) == 699
    # "b" comes back with an older record: the watermark never goes back
    d.send("k", 1, topic="b", timestamp=650)
    assert d.watermark(0) == 699


def test_idleness_is_per_key_group() -> None:
    d = TestDriver(_two_inputs(1000), partitions=2)
    keys: dict[int, str] = {}
    for i in range(100):
        keys.setdefault(key_group(f"k{i}".encode(), 2), f"k{i}")
    d.send(keys[0], 1, topic="a", timestamp=300)
    d.send(keys[0], 1, topic="b", timestamp=300)
    assert d.watermark(0) == 299
    assert d.watermark(1) == NO_WATERMARK


def _downstream() -> tuple[App, Any]:
    app = App("down")
    app.stream("rep", watermarks=Watermarks.monotonous()).window(Tumbling(100)).count().map(
        lambda w: [w.start, w.value]
    ).to("out")
    svc = app.time_service
    assert svc is not None
    svc.reads_barriers = True
    return app, svc


def test_writer_watermarks_minimum_over_expected_writers_idle_left_out() -> None:
    app, svc = _downstream()
    d = TestDriver(app, partitions=1)
    d.send("k", 1, topic="rep", timestamp=10, headers=[("lockgate-writer", b"up/0")])
    assert d.watermark(0) == NO_WATERMARK  # an internal input: barriers decide
    d.key_group_store(0)  # opens key group 0
    d._kgs[0].bind()  # noqa: SLF001 - drive the barrier path directly
    svc.on_barrier_watermark("rep", "up/0", 3, 500, False)
    svc.on_barrier_watermark("rep", "up/1", 3, 300, False)
    assert svc.watermark() == NO_WATERMARK  # up/2 not heard from
    svc.on_barrier_watermark("rep", "up/2", 3, NO_WATERMARK, False)
    assert svc.watermark() == NO_WATERMARK  # up/2 has no event time yet
    svc.on_barrier_watermark("rep", "up/2", 3, NO_WATERMARK, True)
    assert svc.watermark() == 300  # up/2 idle: min(500, 300)
    out = [e.value for e in d.emitted if e.topic == "out"]
    assert out == [[0, 1]]
    svc.on_barrier_watermark("rep", "up/1", 3, 300, True)
    assert svc.watermark() == 500  # only up/0 active
    svc.on_barrier_watermark("rep", "up/0", 3, 900, True)
    assert svc.watermark() == 900  # every writer idle: the highest they reached
    svc.on_barrier_watermark("rep", "up/0", 3, 950, False)
    assert svc.watermark() == 950  # up/0 active again, the others still idle
    svc.on_barrier_watermark("rep", "up/1", 3, 400, False)
    assert svc.watermark() == 950  # min(950, 400) now, but it never goes back


def _quiet(idle_advance: bool, delay: int = 0) -> App:
    app = App("quiet")
    wm = Watermarks.bounded(delay, idle_ms=1000, idle_advance=idle_advance)
    app.stream("a", watermarks=wm).window(Tumbling(100)).count().map(
        lambda w: [w.start, w.value]
    ).to("out")
    return app


def test_a_quiet_input_lets_processing_time_fire_the_last_window() -> None:
    d = TestDriver(_quiet(idle_advance=True), partitions=1)
    d.send("k", 1, topic="a", timestamp=50)
    assert _fired(d.send("k", 1, topic="a", timestamp=120)) == [[0, 1]]
    d.advance(999)
    assert d.watermark(0) == 119  # not idle yet: [100, 200) stays open
    before = len(d.emitted)
    d.advance(1)  # idle now: the watermark moves to now - 0 - 1 = 999
    assert _fired(d.emitted[before:]) == [[100, 1]]
    assert d.watermark(0) == 999
    d.advance(5000)
    assert d.watermark(0) == 999  # no timer due: the watermark does not follow the clock


def test_without_idle_advance_the_last_window_waits_for_data() -> None:
    d = TestDriver(_quiet(idle_advance=False), partitions=1)
    d.send("k", 1, topic="a", timestamp=50)
    d.send("k", 1, topic="a", timestamp=120)
    d.advance(60_000)
    assert d.watermark(0) == 119
    assert [e.value for e in d.emitted if e.topic == "out"] == [[0, 1]]


def test_idle_advance_keeps_the_delay_and_needs_idle_ms() -> None:
    d = TestDriver(_quiet(idle_advance=True, delay=5000), partitions=1)
    d.send("k", 1, topic="a", timestamp=50)
    d.advance(1000)  # idle, but now - 5000 - 1 is before the window's end
    assert [e.value for e in d.emitted if e.topic == "out"] == []
    d.advance(4099)  # now 5099: 5099 - 5001 = 98 < 99
    assert [e.value for e in d.emitted if e.topic == "out"] == []
    d.advance(1)  # now 5100: the watermark 99 closes [0, 100)
    assert [e.value for e in d.emitted if e.topic == "out"] == [[0, 1]]
    with pytest.raises(ConfigError, match="idle_advance needs idle_ms"):
        Watermarks.bounded(0, idle_advance=True)
