"""The window benchmark's input generator and expected-output model (no broker).

The model (``benchmarks.data.WindowModel``) is what every system's window output is
checked against; here it is checked on hand-made cases and against lockgate's own
window operator (the benchmark app, run by the TestDriver) on generated inputs.
"""

from __future__ import annotations

from collections import defaultdict

import pytest

from benchmarks.apps.lockgate_apps import window_app
from benchmarks.data import WindowModel, event_times, key_of
from benchmarks.windows import SweepPoint, parse_points
from processors import key_group
from processors.testing import TestDriver

W = 10_000


def model_of(events: list[tuple[int, int, int]], delay: int, partitions: int = 2) -> WindowModel:
    """Feed (key index, partition, ts) records to a fresh model."""
    m = WindowModel(partitions, W, delay)
    for seq, (k, p, ts) in enumerate(events):
        m.add(seq, k, p, ts)
    return m


def test_a_window_closes_when_its_partition_passes_end_plus_delay() -> None:
    # key 0 and key 1 share partition 0; key 2 is alone on partition 1
    m = model_of([(0, 0, 100), (1, 0, 9_999), (2, 1, 50_000), (1, 0, 10_500)], delay=1_000)
    assert m.closed() == {}  # partition 0 reached 10,500 < 10,000 + 1,000
    m.add(4, 1, 0, 11_000)  # key 1 takes partition 0 to end + delay: key 0's window too
    assert m.closed() == {(0, 0): 1, (1, 0): 1}
    assert m.counts[(1, 10_000)] == 2  # still open
    assert (2, 50_000) not in m.closed()  # another partition's time closes nothing here
    assert (m.first_trigger, m.last_trigger) == (4, 4)


def test_per_partition_not_per_key() -> None:
    # Per-key closing would close key 0's first window at its own later record; per
    # partition it stays open until the partition's time passes end + delay.
    m = model_of([(0, 0, 1_000), (0, 0, 10_100)], delay=500)
    assert m.closed() == {}
    m = model_of([(0, 0, 1_000), (0, 0, 10_100), (5, 0, 10_500)], delay=500)
    assert m.closed() == {(0, 0): 1}


def test_out_of_order_records_within_the_delay_count() -> None:
    m = model_of([(0, 0, 9_000), (0, 0, 10_500), (0, 0, 9_700), (0, 0, 12_000)], delay=2_000)
    assert m.late == 0
    assert m.closed() == {(0, 0): 2}
    assert m.counts[(0, 10_000)] == 2


def test_late_records_are_dropped() -> None:
    m = model_of([(0, 0, 1_000), (0, 0, 12_000), (0, 0, 9_999)], delay=1_000)
    assert m.late == 1
    assert m.closed() == {(0, 0): 1}


def test_open_windows_per_key_group() -> None:
    m = model_of([(0, 0, 1), (1, 0, 2), (0, 0, 10_001), (1, 0, 10_002)], delay=0)
    # open after each record: 1, 2, 1 (both of window 0 closed, key 0's window 1 opened),
    # 2; the first window closes at the third record
    assert m.open_mean == pytest.approx((1 + 2 + 1 + 2) / 4)
    assert m.open_max == 2
    assert m.first_trigger == 2


def test_event_times_are_bounded_out_of_order() -> None:
    t0, delay = 1_000_000, 2_000
    seen = list(event_times(20_000, 50, 10, W, delay, t0))
    newest = -1
    for _k, ts in seen:
        assert t0 <= ts < t0 + 10 * W
        assert ts >= newest - delay
        newest = max(newest, ts)
    assert any(ts < newest for _k, ts in seen)  # actually out of order
    # delay 0: the rising event times of the original input, same keys
    ordered = list(event_times(1_000, 50, 10, W, 0, t0))
    assert [ts for _k, ts in ordered] == sorted(ts for _k, ts in ordered)


@pytest.mark.parametrize(
    ("keys", "window_ms", "delay_ms"), [(40, 10_000, 0), (40, 10_000, 2_000), (25, 1_000, 5_000)]
)
def test_model_matches_lockgates_window_operator(keys: int, window_ms: int, delay_ms: int) -> None:
    """The benchmark app on the TestDriver emits exactly the model's closed windows."""
    partitions, records, t0 = 4, 6_000, 1_700_000_000_000
    app = window_app(f"bench-window-test-{delay_ms}", "in", "out", window_ms, delay_ms)
    driver = TestDriver(app, partitions=partitions)
    model = WindowModel(partitions, window_ms, delay_ms)
    events = list(event_times(records, keys, 100_000 // window_ms, window_ms, delay_ms, t0))
    for seq, (k, ts) in enumerate(events):
        model.add(seq, k, key_group(key_of(k), partitions), ts)
        driver.send(key_of(k).decode(), {"v": 1, "seq": seq}, timestamp=ts)
        if seq % 500 == 0:
            driver.commit()
    driver.commit()
    got: dict[tuple[int, int], list[int]] = defaultdict(list)
    for e in driver.emitted:
        got[(int(e.key[1:]), e.value["start"])].append(e.value["count"])
    expected = model.closed()
    assert model.late == 0
    assert len(expected) > keys  # several windows per key closed
    assert {kw: [c] for kw, c in expected.items()} == dict(got)


def test_sweep_points() -> None:
    assert parse_points("1000:10000:2000, 10000:1000") == [
        SweepPoint(1000, 10_000, 2_000),
        SweepPoint(10_000, 1_000, None),
    ]
    with pytest.raises(ValueError, match="keys:window_ms"):
        parse_points("1000")
    p = SweepPoint(1000, 1_000, 10_000)
    assert p.windows(100_000) == 100
    assert p.delay(2_000) == 10_000
    assert SweepPoint(1000, 10_000, None).delay(2_000) == 2_000
