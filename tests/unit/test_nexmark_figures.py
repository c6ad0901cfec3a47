"""The Nexmark harness: the span of a run, and its broker's group join delay."""

from __future__ import annotations

import subprocess
from pathlib import Path
from types import SimpleNamespace

from benchmarks import broker
from benchmarks.nexmark.harness import Harness

ROOT = Path(__file__).resolve().parents[2]

#: (time, committed input, output size, process CPU s, broker CPU s), every 1 s
SAMPLES = [
    (100.0, 0, 0, 0.0, 0.0),
    (101.0, 1_000, 0, 1.0, 0.0),
    (102.0, 1_000, 10, 1.5, 0.0),
    (103.0, 2_000, 20, 2.0, 0.0),
    (104.0, 6_000, 40, 4.0, 0.0),
    (105.0, 10_000, 50, 6.0, 0.0),
]


def _figures() -> dict[str, object]:
    fake = SimpleNamespace(input_records=10_000, broker_idle=None, broker_pid=None)
    return Harness._figures(fake, SAMPLES, 100.0)  # type: ignore[arg-type]


def test_the_span_starts_at_the_first_committed_input() -> None:
    fig = _figures()
    assert fig["span_s"] == 4.0 and fig["events_in_span"] == 9_000
    assert fig["rate"] == 2_250 and fig["cpu_s_per_m"] == round(5.0 / 9_000 * 1e6, 2)


def test_the_harness_broker_delays_a_new_groups_first_assignment_when_asked() -> None:
    """--parallelism: the instances must all be in the group's first assignment."""
    assert broker._env(49092)["LOCKGATE_KAFKA_GROUP_INITIAL_REBALANCE_DELAY_MS"] == "0"
    env = broker._env(49092, group_join_delay_ms=3000)
    props = subprocess.run(
        [str(ROOT / "docker" / "kafka" / "server-properties.sh"), "49092", "49093", "/tmp/x"],
        env=env,
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    assert "group.initial.rebalance.delay.ms=3000" in props.splitlines()
