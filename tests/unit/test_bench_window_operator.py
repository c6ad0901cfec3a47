"""benchmarks/window_operator.py: every workload fires what a plain group-by says."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from benchmarks import window_operator as wo

ROOT = Path(__file__).resolve().parents[2]


def _args(workload: str) -> argparse.Namespace:
    return argparse.Namespace(
        run=workload,
        records=3_000,
        keys=25,
        windows=6,
        window_ms=1_000,
        delay_ms=150,
        commit_every=700,
    )


def _windows(workload: str, ts: int, size: int) -> list[int]:
    """Window starts containing ``ts`` (independent of processors.windows)."""
    slide = {"tumbling": size, "sliding": size // 10, "sliding-process": size // 10}.get(
        workload, size // 5
    )
    return [s for s in range(ts - ts % slide - size, ts + 1, slide) if s <= ts < s + size]


@pytest.mark.parametrize("workload", wo.WORKLOADS)
def test_a_workload_fires_one_result_per_key_and_window(workload: str) -> None:
    args = _args(workload)
    want = {
        (key, s)
        for key, ts in wo.make_records(args)
        for s in _windows(workload, ts, args.window_ms)
    }
    got = wo.run_once(args)
    assert got["workload"] == workload
    assert got["outputs"] == len(want)
    assert got["cpu_s"] > 0


def test_the_comparison_runs_both_trees_and_checks_their_outputs() -> None:
    args = argparse.Namespace(
        before=str(ROOT),
        after=str(ROOT),
        repeat=2,
        workloads="tumbling",
        records=500,
        keys=10,
        windows=3,
        window_ms=1_000,
        delay_ms=100,
        commit_every=100,
    )
    row = wo.compare(args)["workloads"]["tumbling"]
    assert row["same_outputs"] is True
    assert row["outputs"] == [len({(k, ts // 1_000) for k, ts in wo.make_records(args)})]
    low, high = row["speedup_range"]
    assert 0 < low <= row["speedup_median"] <= high
