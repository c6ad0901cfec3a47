"""The Nexmark harness's span: it starts at the first committed input, and no earlier
than the consumer group formed when the harness waited for it (--parallelism)."""

from __future__ import annotations

from types import SimpleNamespace

from benchmarks.nexmark.harness import Harness

#: (time, committed input, output size, process CPU s, broker CPU s), every 1 s
SAMPLES = [
    (100.0, 0, 0, 0.0, 0.0),
    (101.0, 1_000, 0, 1.0, 0.0),  # one instance took every partition
    (102.0, 1_000, 10, 1.5, 0.0),  # the rebalance
    (103.0, 2_000, 20, 2.0, 0.0),  # the group formed
    (104.0, 6_000, 40, 4.0, 0.0),
    (105.0, 10_000, 50, 6.0, 0.0),
]


def _figures(formed_at: float | None) -> dict[str, object]:
    fake = SimpleNamespace(input_records=10_000, broker_idle=None, broker_pid=None)
    return Harness._figures(fake, SAMPLES, 100.0, formed_at)  # type: ignore[arg-type]


def test_the_span_starts_at_the_first_committed_input() -> None:
    fig = _figures(None)
    assert fig["span_s"] == 4.0 and fig["events_in_span"] == 9_000
    assert fig["rate"] == 2_250 and fig["cpu_s_per_m"] == round(5.0 / 9_000 * 1e6, 2)


def test_the_span_starts_once_the_group_formed() -> None:
    fig = _figures(102.5)
    # the first sample at or after 102.5 s: 103 s, 2,000 events committed then
    assert fig["span_s"] == 2.0 and fig["events_in_span"] == 8_000
    assert fig["rate"] == 4_000 and fig["cpu_s_per_m"] == round(4.0 / 8_000 * 1e6, 2)
    assert fig["startup_s"] == 3.0
