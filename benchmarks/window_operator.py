"""The window operator alone, in-process: two source trees compared in one interleaved run.

No Kafka: the app runs under :class:`processors.testing.TestDriver` (the production
chain, state cache, codecs and timers on the in-memory backend; an epoch commit every
``--commit-every`` records), so the figure is the operator's own per-record and
per-window cost plus the driver's fixed per-record overhead, which is the same in both
trees. Each run is a fresh child process with ``PYTHONPATH`` set to one tree; the trees
alternate (A B A B ...) ``--repeat`` times per workload, and the report gives, per
workload, each tree's median CPU seconds per million records and the ratio of the
paired runs (before / after CPU: > 1 means the second tree is faster) as median and
range::

    .venv/bin/python -m benchmarks.window_operator --before ../main --after . --repeat 3

The input is the ``window`` workload's (``benchmarks/data.py``: ``event_times``): keys
drawn uniformly, event times rising over ``--windows`` x ``--window-ms`` with up to
``--delay-ms`` of disorder, watermarks bounded by that delay. Workloads:

- ``tumbling``: ``Tumbling(window_ms).count()`` (the ``window`` workload of ``make
  bench``);
- ``sliding``: ``Sliding(window_ms, window_ms // 10).count()`` (ten windows per record);
- ``sliding-sum``: ``Sliding(window_ms, window_ms // 5)`` with an aggregator that has
  ``merge`` and allowed lateness ``delay_ms`` (timers to purge, updates possible);
- ``sliding-reduce``: ``Sliding(window_ms, window_ms // 5).reduce(...)`` (not sliced: one
  entry per window in both trees);
- ``sliding-process``: ``Sliding(window_ms, window_ms // 10).process(...)`` (every value
  kept: before, in each of its ten windows; sliced, once).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

WORKLOADS = ("tumbling", "sliding", "sliding-sum", "sliding-reduce", "sliding-process")
#: The first event time (ms): a multiple of every window size used.
T0 = 1_700_000_000_000


class _Sum:
    def create_accumulator(self) -> int:
        return 0

    def add(self, value: dict[str, int], acc: int) -> int:
        return acc + value["v"]

    def get_result(self, acc: int) -> int:
        return acc

    def merge(self, a: int, b: int) -> int:
        return a + b


def _reduce(a: dict[str, int], b: dict[str, int]) -> dict[str, int]:
    return {"v": a["v"] + b["v"]}


def _sizes(key: str, w: Any) -> list[Any]:
    return [type(w)(w.start, w.end, len(w.value))]


def _output(w: Any) -> dict[str, Any]:
    return {"start": w.start, "value": w.value}


def _app(workload: str, window_ms: int, delay_ms: int) -> Any:
    from processors import App, Sliding, Tumbling, Watermarks  # noqa: PLC0415 - the tree's

    app = App("bench-window-op")
    stream = app.stream("in", watermarks=Watermarks.bounded(delay_ms))
    if workload == "tumbling":
        out = stream.window(Tumbling(window_ms)).count()
    elif workload == "sliding":
        out = stream.window(Sliding(window_ms, window_ms // 10)).count()
    elif workload == "sliding-sum":
        out = stream.window(
            Sliding(window_ms, window_ms // 5), allowed_lateness_ms=delay_ms
        ).aggregate(_Sum())
    elif workload == "sliding-reduce":
        out = stream.window(Sliding(window_ms, window_ms // 5)).reduce(_reduce)
    elif workload == "sliding-process":
        out = stream.window(Sliding(window_ms, window_ms // 10)).process(_sizes)
    else:
        raise ValueError(f"unknown workload {workload!r}")
    out.map(_output).to("out")
    return app


def make_records(args: argparse.Namespace) -> list[tuple[str, int]]:
    """The (key, event time) of each input record, in sending order.

    Event time rises over ``windows`` x ``window_ms`` from ``T0``, each moved back by up
    to ``delay_ms`` (never before ``T0``): no record is late for the watermark.
    """
    rng = random.Random(11)
    span = args.windows * args.window_ms
    keys = [f"k{i}" for i in range(args.keys)]
    return [
        (
            keys[rng.randrange(args.keys)],
            max(T0, T0 + seq * span // args.records - rng.randrange(args.delay_ms + 1)),
        )
        for seq in range(args.records)
    ]


def run_once(args: argparse.Namespace) -> dict[str, Any]:
    """One workload in this process (``processors`` from ``PYTHONPATH``): CPU s and outputs."""
    from processors.testing import TestDriver  # noqa: PLC0415 - the tree's

    driver = TestDriver(_app(args.run, args.window_ms, args.delay_ms), partitions=4)
    records = make_records(args)
    value = {"v": 1}
    outputs = 0
    send, commit = driver.send, driver.commit
    every = args.commit_every
    cpu0, wall0 = time.process_time(), time.perf_counter()
    for i, (key, ts) in enumerate(records, 1):
        send(key, value, timestamp=ts)
        if i % every == 0:
            commit()
            outputs += len(driver._emitted)  # noqa: SLF001 - bounded memory, same in both
            driver._emitted.clear()  # noqa: SLF001
            driver._committed_emits = 0  # noqa: SLF001
    driver.advance_watermark(2**62)
    commit()
    cpu, wall = time.process_time() - cpu0, time.perf_counter() - wall0
    outputs += len(driver._emitted)  # noqa: SLF001
    rss_mib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return {
        "workload": args.run,
        "cpu_s": cpu,
        "wall_s": wall,
        "outputs": outputs,
        "peak_rss_mib": round(rss_mib, 1),
    }


def _child(tree: Path, workload: str, args: argparse.Namespace) -> dict[str, Any]:
    env = dict(os.environ, PYTHONPATH=str(tree))
    cmd = [
        sys.executable,
        str(Path(__file__).resolve()),
        "--run",
        workload,
        "--records",
        str(args.records),
        "--keys",
        str(args.keys),
        "--windows",
        str(args.windows),
        "--window-ms",
        str(args.window_ms),
        "--delay-ms",
        str(args.delay_ms),
        "--commit-every",
        str(args.commit_every),
    ]
    out = subprocess.run(cmd, env=env, check=True, capture_output=True, text=True, cwd=tree)
    return dict(json.loads(out.stdout.strip().splitlines()[-1]))


def compare(args: argparse.Namespace) -> dict[str, Any]:
    """Alternate the two trees per workload; medians and paired ratios."""
    before, after = Path(args.before).resolve(), Path(args.after).resolve()
    report: dict[str, Any] = {"before": str(before), "after": str(after), "workloads": {}}
    for workload in args.workloads.split(","):
        runs: dict[str, list[dict[str, Any]]] = {"before": [], "after": []}
        for i in range(args.repeat):
            order = [("before", before), ("after", after)]
            if i % 2:
                order.reverse()  # B A on odd repeats: neither tree always goes first
            for name, tree in order:
                runs[name].append(_child(tree, workload, args))
        outs = {r["outputs"] for rs in runs.values() for r in rs}
        pairs = zip(runs["before"], runs["after"], strict=True)
        ratios = [b["cpu_s"] / a["cpu_s"] for b, a in pairs]
        per_m = {
            name: statistics.median(r["cpu_s"] for r in rs) / args.records * 1e6
            for name, rs in runs.items()
        }
        row = {
            "before_cpu_s_per_m": round(per_m["before"], 2),
            "after_cpu_s_per_m": round(per_m["after"], 2),
            "speedup_median": round(statistics.median(ratios), 2),
            "speedup_range": [round(min(ratios), 2), round(max(ratios), 2)],
            "peak_rss_mib": {
                name: statistics.median(r["peak_rss_mib"] for r in rs) for name, rs in runs.items()
            },
            "same_outputs": len(outs) == 1,
            "outputs": sorted(outs),
        }
        report["workloads"][workload] = row
        print(f"{workload}: {json.dumps(row)}", flush=True)
    return report


def main() -> None:
    """Compare two trees (``--before``/``--after``), or run one workload (``--run``)."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--before", default=".")
    p.add_argument("--after", default=".")
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--workloads", default=",".join(WORKLOADS))
    p.add_argument("--run", choices=WORKLOADS)
    p.add_argument("--records", type=int, default=200_000)
    p.add_argument("--keys", type=int, default=1_000)
    p.add_argument("--windows", type=int, default=10)
    p.add_argument("--window-ms", type=int, default=10_000)
    p.add_argument("--delay-ms", type=int, default=2_000)
    p.add_argument("--commit-every", type=int, default=20_000)
    p.add_argument("--json", help="write the report here")
    args = p.parse_args()
    if args.run:
        print(json.dumps(run_once(args)))
        return
    report = compare(args)
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=2) + "\n")


if __name__ == "__main__":
    main()
