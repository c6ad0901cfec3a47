"""Event-time windows: lockgate's window operator vs the peers, and open windows vs throughput.

Step ``windows`` of ``make bench`` runs the sweep (the ``window`` workload of the matrix
is the comparison with the peers); on its own this module runs both and replaces only
the "Windows (real operator)" section of benchmarks/RESULTS.md::

    .venv/bin/python -m benchmarks.windows            # BENCH_* knobs, see docs/benchmarks.md
    .venv/bin/python -m benchmarks.windows --render benchmarks/out/<stamp>/windows.json

``BENCH_BROKER=host:port`` uses a broker that is already running (neither started nor
stopped; only this run's topics, the ones named with ``benchwin<run id>``, are deleted).
``BENCH_WINDOW_PARTS`` (default ``matrix,sweep``) picks the parts.

The workload: a count per key in tumbling event-time windows, exactly-once, 1 s commits.
Input (``benchmarks/data.py``: ``event_times``, ``produce_events``): record timestamps
rising over ``BENCH_WINDOWS`` windows of ``BENCH_WINDOW_MS``, each moved back by a
uniform 0..``BENCH_WINDOW_DELAY_MS`` ms (bounded out-of-orderness), murmur2 keys over
``BENCH_PARTITIONS`` partitions. Every system closes windows the same way: the watermark
of a partition (lockgate: key group) is its newest timestamp minus the delay, and window
``[start, end)`` of any key of the partition closes once it reaches ``end``
(``data.WindowModel``); each run's output must be exactly the model's closed windows.

- lockgate: ``app.stream(topic, watermarks=Watermarks.bounded(delay))
  .window(Tumbling(size)).count()`` (``benchmarks/apps/lockgate_apps.py``);
- Quix Streams: ``tumbling_window(duration_ms=size, grace_ms=delay).count()
  .final(closing_strategy="partition")`` (``benchmarks/apps/quix_app.py``);
- the raw loop and Faust: the same logic by hand (dict / Faust table per key, a heap of
  window ends per partition).

The sweep: lockgate alone, ``BENCH_WINDOW_SWEEP_RECORDS`` records per point, event time
always spanning ``BENCH_WINDOWS x BENCH_WINDOW_MS``; each point of ``BENCH_WINDOW_SWEEP``
(``keys:window_ms[:delay_ms]``) sets the keys and the window size (more, smaller
windows open per key when the delay spans several of them). The model counts the
windows open in the record's key group after each record: the operator's state (one
keyed value per key holding its open windows, one event-time timer per window).
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchmarks import data, runner, venvs
from benchmarks.admin import Admin
from benchmarks.config import Config, env_list
from benchmarks.paths import BENCH_DIR, ROOT
from benchmarks.progress import elapsed, say
from benchmarks.sections import section_footer, splice_section
from benchmarks.standalone import run_standalone

BEGIN, END = "<!-- windows:begin -->", "<!-- windows:end -->"
TITLE = "## Windows (real operator)"
COMMAND = ".venv/bin/python -m benchmarks.windows"
NAMES = {
    "raw": "raw confluent-kafka loop",
    "lockgate": "lockgate",
    "quix": "Quix Streams",
    "faust": "Faust",
}
PEER_VENVS = {"quix": "quix", "faust": "faust"}


@dataclass(frozen=True)
class SweepPoint:
    """One point of the sweep: keys, window size and (optionally) its own delay."""

    keys: int
    window_ms: int
    delay_ms: int | None = None

    def windows(self, span_ms: int) -> int:
        """Windows in an event-time span of ``span_ms``."""
        return max(1, span_ms // self.window_ms)

    def delay(self, default: int) -> int:
        """The point's out-of-orderness (``default``: BENCH_WINDOW_DELAY_MS)."""
        return default if self.delay_ms is None else self.delay_ms


def parse_points(spec: str) -> list[SweepPoint]:
    """``"1000:10000,10000:1000:5000"`` -> sweep points (``keys:window_ms[:delay_ms]``)."""
    points = []
    for item in spec.split(","):
        parts = [int(x.replace("_", "")) for x in item.strip().split(":") if x.strip()]
        if len(parts) not in (2, 3):
            raise ValueError(f"BENCH_WINDOW_SWEEP: {item!r} is not keys:window_ms[:delay_ms]")
        points.append(SweepPoint(*parts))
    return points


def env_line(cfg: Config) -> str:
    """The BENCH_* settings of this section as a shell prefix."""
    return (
        f"BENCH_SYSTEMS={','.join(cfg.systems)} BENCH_RECORDS={cfg.records} "
        f"BENCH_QUIX_RECORDS={cfg.records_for('quix')} "
        f"BENCH_FAUST_RECORDS={cfg.records_for('faust')} BENCH_REPEAT={cfg.repeat} "
        f"BENCH_PARTITIONS={cfg.partitions} BENCH_WINDOW_KEYS={cfg.window_keys} "
        f"BENCH_WINDOWS={cfg.windows} BENCH_WINDOW_MS={cfg.window_ms} "
        f"BENCH_WINDOW_DELAY_MS={cfg.window_delay_ms} BENCH_WINDOW_SWEEP={cfg.window_sweep} "
        f"BENCH_WINDOW_SWEEP_RECORDS={cfg.sweep_records}"
    )


def dataset_info(ds: data.Dataset) -> dict[str, Any]:
    """What a run's row records about its window input."""
    return {
        "topic": ds.topic,
        "records": ds.records,
        "keys": ds.keys,
        "partitions": ds.partitions,
        "windows": ds.windows,
        "window_ms": ds.window_ms,
        "delay_ms": ds.delay_ms,
        "expected_windows": len(ds.closed),
        "open_per_kg_mean": ds.open_mean,
        "open_per_kg_max": ds.open_max,
        "open_per_key_mean": round(ds.open_mean * ds.partitions / ds.keys, 2),
        "trigger_span": ds.trigger_span,
        "produce_seconds": round(ds.produce_seconds, 1),
    }


class WindowBench:
    """The window comparison and sweep; ``results`` is what goes into the JSON.

    ``keep``: topics other steps still need (``make bench``: its inputs); then the
    harness's usual cleanup (every benchmark topic but those) runs after each run.
    Without it (on its own) only this run's topics are deleted.
    """

    def __init__(
        self,
        cfg: Config,
        admin: Admin,
        out_dir: Path,
        run_id: str,
        keep: set[str] | None = None,
    ) -> None:
        self.cfg, self.admin, self.out_dir = cfg, admin, out_dir
        self.tag = f"benchwin{run_id}"
        self.keep = keep
        self.inputs: set[str] = set()
        self.datasets: dict[tuple[int, int, int, int, int], data.Dataset] = {}
        self.points = parse_points(cfg.window_sweep)
        self.results: dict[str, Any] = {
            "config": {
                "systems": cfg.systems,
                "records": cfg.records,
                "repeat": cfg.repeat,
                "partitions": cfg.partitions,
                "window_keys": cfg.window_keys,
                "windows": cfg.windows,
                "window_ms": cfg.window_ms,
                "window_delay_ms": cfg.window_delay_ms,
                "window_sweep": cfg.window_sweep,
                "sweep_records": cfg.sweep_records,
                "records_for": {s: cfg.records_for(s) for s in runner.SYSTEMS},
            },
            "env_line": env_line(cfg),
            "matrix": [],
            "sweep": [],
            "errors": [],
        }

    # -- parts ------------------------------------------------------------------------------

    def run(self, parts: list[str] | None = None) -> dict[str, Any]:
        """The comparison (``matrix``) and the sweep (``sweep``)."""
        parts = parts or ["matrix", "sweep"]
        try:
            if "matrix" in parts:
                self.matrix()
            if "sweep" in parts:
                self.sweep()
        finally:
            self.drop_inputs()
        return self.results

    def matrix(self) -> None:
        """The window workload on every system of BENCH_SYSTEMS, BENCH_REPEAT times."""
        cfg = self.cfg
        for system in cfg.systems:
            if system in PEER_VENVS:
                venvs.ensure(PEER_VENVS[system])
        for system in cfg.systems:  # inputs first, before anything is measured
            self._matrix_input(system)
        total, i = cfg.repeat * len(cfg.systems), 0
        for rep in range(1, cfg.repeat + 1):
            for system in cfg.systems:
                i += 1
                ds = self._matrix_input(system)
                say(f"windows {i}/{total}: {system} (run {rep}), {ds.records:,} records")
                row = self._measure(system, ds, f"{system}-r{rep}")
                row["rep"] = rep
                self.results["matrix"].append(row)

    def sweep(self) -> None:
        """lockgate at each sweep point, BENCH_REPEAT times (interleaved)."""
        cfg = self.cfg
        for point in self.points:
            self._sweep_input(point)
        total, i = cfg.repeat * len(self.points), 0
        for rep in range(1, cfg.repeat + 1):
            for n, point in enumerate(self.points):
                i += 1
                ds = self._sweep_input(point)
                say(
                    f"window sweep {i}/{total}: {point.keys:,} keys, {ds.window_ms:,} ms "
                    f"windows, delay {ds.delay_ms:,} ms: {ds.open_mean:,.0f} open per key "
                    f"group (run {rep})"
                )
                row = self._measure("lockgate", ds, f"sweep{n}-r{rep}")
                row.update(rep=rep, point=n)
                self.results["sweep"].append(row)

    # -- inputs -----------------------------------------------------------------------------

    def _matrix_input(self, system: str) -> data.Dataset:
        cfg = self.cfg
        n = cfg.records_for(system)
        keys = cfg.window_keys_for(n)
        return self.dataset(n, keys, cfg.windows, cfg.window_ms, cfg.window_delay_ms)

    def _sweep_input(self, point: SweepPoint) -> data.Dataset:
        cfg = self.cfg
        windows = point.windows(cfg.windows * cfg.window_ms)
        delay = point.delay(cfg.window_delay_ms)
        return self.dataset(cfg.sweep_records, point.keys, windows, point.window_ms, delay)

    def dataset(
        self, records: int, keys: int, windows: int, window_ms: int, delay_ms: int
    ) -> data.Dataset:
        """The input with these parameters (produced on first use)."""
        k = (records, keys, windows, window_ms, delay_ms)
        ds = self.datasets.get(k)
        if ds is None:
            topic = f"bench.{self.tag}.in.{records}.{keys}.{windows}x{window_ms}.d{delay_ms}"
            ds = data.produce_events(
                self.admin, topic, records, keys, self.cfg.partitions, windows, window_ms, delay_ms
            )
            self.inputs.add(topic)
            if self.keep is not None:
                self.keep.add(topic)
            self.datasets[k] = ds
            self.results.setdefault("datasets", []).append(dataset_info(ds))
        return ds

    def drop_inputs(self) -> None:
        """Delete this bench's inputs."""
        if self.keep is not None:
            self.keep.difference_update(self.inputs)
        if self.inputs:
            for fut in self.admin.admin.delete_topics(sorted(self.inputs)).values():
                try:
                    fut.result(60)
                except Exception:  # noqa: BLE001, S110 - best effort
                    pass
        self.inputs.clear()
        self.datasets.clear()

    def _cleanup(self) -> None:
        if self.keep is not None:
            runner.cleanup_topics(self.admin, self.keep)
            return
        doomed = [t for t in self.admin.topics() if self.tag in t and t not in self.inputs]
        if doomed:
            for fut in self.admin.admin.delete_topics(doomed, operation_timeout=30).values():
                try:
                    fut.result(60)
                except Exception:  # noqa: BLE001, S110 - best effort
                    pass

    # -- one run ----------------------------------------------------------------------------

    def _measure(self, system: str, ds: data.Dataset, label: str) -> dict[str, Any]:
        spec = runner.RunSpec(system, runner.WORKLOADS["window"], f"{self.tag}-{label}")
        try:
            row = runner.measure(self.cfg, self.admin, spec, ds, self.out_dir)
        except Exception as exc:  # noqa: BLE001 - reported, the run goes on
            say(f"  !! {label} failed: {exc!r}")
            self.results["errors"].append(f"{label}: {exc!r}\n{traceback.format_exc()}")
            row = {"system": system, "workload": "window", "tag": spec.tag, "ok": False}
            row.update(rate=None, status=f"harness error: {exc!r}")
        finally:
            self._cleanup()
        row["dataset"] = dataset_info(ds)
        rate = f"{row['rate']:,}/s" if row.get("rate") else "n/a"
        verdict = "output checked: ok" if row["ok"] else f"NOT OK: {row.get('status')}"
        say(
            f"  {label}: {rate}, {row.get('cpu_s_per_m')} CPU s/M, peak RSS "
            f"{row.get('peak_rss_mb')} MiB, {verdict} {row.get('check', '')}"
        )
        if not row["ok"] and "harness error" not in str(row.get("status")):
            self.results["errors"].append(f"{label}: {row.get('status')} {row.get('check')}")
        return row


# ------------------------------------------------------------------ rendering


def _fmt(x: Any, digits: int = 0) -> str:
    return "n/a" if x is None else f"{x:,.{digits}f}"


def _mean(xs: list[float]) -> float | None:
    return sum(xs) / len(xs) if xs else None


def _runs(rows: list[dict[str, Any]], key: str, digits: int = 0) -> str:
    parts = []
    for r in rows:
        s = _fmt(r.get(key), digits)
        if not r.get("ok"):
            s += " (failed)"
        parts.append(s)
    return " / ".join(parts) or "-"


def _ok_mean(rows: list[dict[str, Any]], key: str = "rate") -> float | None:
    return _mean([r[key] for r in rows if r.get("ok") and r.get(key) is not None])


def _check(rows: list[dict[str, Any]]) -> str:
    out = []
    for r in rows:
        c = r.get("check") or {}
        if r.get("ok"):
            out.append("ok")
        elif c:
            bad = {
                k: c.get(k)
                for k in ("missing", "wrong_counts", "unexpected", "duplicates", "undecodable")
                if c.get(k)
            }
            out.append(f"**FAILED** {bad or r.get('status')}")
        else:
            out.append(f"**FAILED** ({r.get('status')})")
    return " / ".join(out) or "-"


def _semantics(cfg: dict[str, Any]) -> str:
    d = cfg.get("window_delay_ms", 0)
    w = cfg.get("window_ms", 0)
    return (
        f"Per-key count in tumbling event-time windows, exactly-once, 1 s commits. Input: "
        f"{cfg.get('partitions')} partitions (murmur2 keys), ~100-byte records, event time "
        f"= the record timestamp, rising over {cfg.get('windows')} windows of {w / 1000:g} s, "
        f"each record moved back by a uniform 0-{d:,} ms: bounded out-of-orderness, so no "
        "record is late. Every system closes windows the same way, checked against one "
        "model (`benchmarks/data.py` `WindowModel`): a partition's (key group's) watermark "
        f"is the newest event time seen on it minus {d:,} ms, and window [start, end) of "
        "every key of the partition closes once the watermark reaches its end (the last "
        "windows of each partition never close: no idleness, no end-of-input flush). "
        f"lockgate: `Watermarks.bounded({d})` + `Tumbling({w})`, `.count()` (fires when "
        "the key group's watermark, newest - delay - 1, reaches end - 1). Quix Streams: "
        f"`tumbling_window(duration_ms={w}, grace_ms={d}).count()"
        '.final(closing_strategy="partition")`: per its docs a window closes "when the '
        "event time (the maximum observed timestamp across the partition) passes its end "
        'timestamp + grace period", and the `partition` strategy closes the windows of '
        "every key of the partition (its default, `key`, only those of the record's own "
        "key: another set of windows). The raw loop and Faust: the same logic by hand "
        "(per key a dict / Faust table entry of open windows, per partition a heap of "
        "window ends; Faust's own windowed tables close on wall-clock timers). A run "
        "passes when its output holds exactly the model's closed windows, each once with "
        "its count (no missing, wrong, unexpected or duplicate window). Rate: input "
        "records between the first and the last record that closes a window (from the "
        "model), over the broker append times of the first and last output."
    )


def render(res: dict[str, Any], meta: dict[str, Any]) -> list[str]:  # noqa: C901
    """The Windows section of RESULTS.md (Markdown lines)."""
    L: list[str] = [BEGIN, TITLE, ""]
    a = L.append
    cfg = res.get("config", {})
    m = meta.get("machine", {})
    a(
        f"Measured by `{meta.get('command', COMMAND)}` on {meta.get('started')}, "
        f"{meta.get('total_minutes', 0):.1f} min, on {m.get('cpu', '?')} "
        f"({m.get('cores', '?')} cores, {m.get('memory_gib', '?')} GiB), {m.get('os', '')}, "
        f"Python {m.get('python', '')}; broker: {meta.get('broker')}; lockgate git "
        f"`{meta.get('git', '?')}`"
        + (
            f" (at the end: `{meta['git_after']}`)"
            if meta.get("git_after") and meta.get("git_after") != meta.get("git")
            else ""
        )
        + ". The machine is shared (2 cores; other engineers' test suites run on it): "
        f"load before `{meta.get('uptime_before', '')}`, after "
        f"`{meta.get('uptime_after', '')}`; compare ratios from this section, not "
        "absolute numbers across runs."
    )
    a("")
    if meta.get("standalone"):
        a(
            "Measured on its own: the `window` rows of the tables above come from the last "
            "full `make bench` (see its date), which ran the earlier hand-written per-key "
            "handler (a key's window closed on the key's next window), not this operator."
        )
        a("")
    a(f"Settings: `{res.get('env_line', '')}`")
    a("")
    a(_semantics(cfg))
    a("")

    rows = res.get("matrix", [])
    if rows:
        a("### The window operator vs the peers (same input, same semantics)")
        a("")
        a(
            "| system | input records | keys | closed windows expected | open windows per "
            "key group (mean / peak) | records/s (runs) | mean | CPU s / M | peak RSS MiB | "
            "output check |"
        )
        a("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
        systems = list(dict.fromkeys(r["system"] for r in rows))
        for s in systems:
            rs = [r for r in rows if r["system"] == s]
            ds = rs[0].get("dataset", {})
            a(
                f"| {NAMES.get(s, s)} | {_fmt(ds.get('records'))} | {_fmt(ds.get('keys'))} | "
                f"{_fmt(ds.get('expected_windows'))} | {_fmt(ds.get('open_per_kg_mean'))} / "
                f"{_fmt(ds.get('open_per_kg_max'))} | {_runs(rs, 'rate')} | "
                f"{_fmt(_ok_mean(rs))} | {_runs(rs, 'cpu_s_per_m', 1)} | "
                f"{_runs(rs, 'peak_rss_mb', 1)} | {_check(rs)} |"
            )
        a("")
        lg = _ok_mean([r for r in rows if r["system"] == "lockgate"])
        ratios = []
        for s in systems:
            if s == "lockgate":
                continue
            other = _ok_mean([r for r in rows if r["system"] == s])
            if lg and other:
                ratios.append(f"{lg / other:.2f}x {NAMES.get(s, s)}")
        if ratios:
            a(f"lockgate (mean of its passing runs) = {', '.join(ratios)}.")
            a("")
        a(
            "The peers process a smaller input (a scaled copy: same windows, same records per "
            "key and window, fewer keys), as in the matrix."
        )
        a("")

    sweep = res.get("sweep", [])
    if sweep:
        a("### Open windows per key group vs lockgate throughput")
        a("")
        a(
            f"lockgate alone, {cfg.get('sweep_records', 0):,} input records per point, event "
            f"time spanning {cfg.get('windows', 0) * cfg.get('window_ms', 0) / 1000:g} s at "
            "every point; each point sets the keys, the window size and the delay. Open "
            "windows per key group: created and not yet closed, in the record's key group "
            "after each record (from the model), mean over the records / peak: what the "
            "operator keeps in keyed state (per key one value holding its open windows, "
            "per window one event-time timer). Per key: mean open windows per key group / "
            "keys per key group. Outputs: closed windows per 1,000 input records (each is "
            "one output record and one timer firing)."
        )
        a("")
        a(
            "| keys | window | delay | windows open per key group (mean / peak) | open per "
            "key | outputs per 1k inputs | records/s (runs) | mean | CPU s / M | peak RSS MiB "
            "| output check |"
        )
        a("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
        for n in sorted({r.get("point", 0) for r in sweep}):
            rs = [r for r in sweep if r.get("point", 0) == n]
            ds = rs[0].get("dataset", {})
            per_k = ds.get("expected_windows", 0) * 1000 / max(1, ds.get("records", 1))
            a(
                f"| {_fmt(ds.get('keys'))} | {ds.get('window_ms', 0) / 1000:g} s "
                f"({_fmt(ds.get('windows'))} windows) | {ds.get('delay_ms', 0) / 1000:g} s | "
                f"{_fmt(ds.get('open_per_kg_mean'))} / {_fmt(ds.get('open_per_kg_max'))} | "
                f"{_fmt(ds.get('open_per_key_mean'), 2)} | {per_k:.1f} | "
                f"{_runs(rs, 'rate')} | {_fmt(_ok_mean(rs))} | {_runs(rs, 'cpu_s_per_m', 1)} | "
                f"{_runs(rs, 'peak_rss_mb', 1)} | {_check(rs)} |"
            )
        a("")
    L.extend(section_footer(res, "the JSON", COMMAND, "windows", END))
    return L


def from_make_bench(results: dict[str, Any]) -> dict[str, Any]:
    """The section's results out of a ``make bench`` results.json."""
    cfg = results.get("config", {})
    return {
        "config": {
            **{k: cfg.get(k) for k in ("partitions", "windows", "window_ms", "window_keys")},
            "window_delay_ms": cfg.get("window_delay_ms", 0),
            "sweep_records": cfg.get("window_sweep_records") or cfg.get("records"),
        },
        "env_line": results.get("env_line", ""),
        "matrix": [r for r in results.get("matrix", []) if r.get("workload") == "window"],
        "sweep": results.get("window_sweep", []),
        "errors": [],
    }


def merge(section: list[str], path: Path) -> None:
    """Replace the Windows section of ``path`` (or insert it after the enrich section)."""
    text = splice_section(path, section, BEGIN, END, after="<!-- enrich:end -->")
    whole = "Every number below comes from that one run"
    own = "the Windows section when it ran on its own"
    if whole in text and own not in text:
        head, rest = text.split(whole, 1)
        if rest.startswith(" (except "):
            close = rest.index(")")
            inner = rest[len(" (except ") : close].replace(": see its date", "")
            inner = inner.replace(": see their dates", "")
            rest = f" (except {inner}, and {own}: see their dates)" + rest[close + 1 :]
        else:
            rest = f" (except {own}: see its date)" + rest
        text = head + whole + rest
    path.write_text(text)


def main() -> int:
    """Run the section on its own (see the module docs)."""
    if sys.argv[1:2] == ["--render"]:
        saved = json.loads(Path(sys.argv[2]).read_text())
        merge(render(saved["windows"], saved["meta"]), BENCH_DIR / "RESULTS.md")
        return 0
    if sys.argv[1:]:
        print(__doc__)
        return 2
    cfg = Config()
    parts = env_list("BENCH_WINDOW_PARTS", "matrix,sweep")
    # The exact command: the BENCH_* variables set (run_standalone adds BENCH_BROKER).
    knobs = [
        f"{k}={v}"
        for k, v in sorted(os.environ.items())
        if k.startswith("BENCH_") and k != "BENCH_BROKER"
    ]
    run = run_standalone(
        cfg,
        "windows",
        "windows.json",
        " ".join([*knobs, COMMAND]),
        f"window benchmarks ({','.join(parts)}): {env_line(cfg)}",
        lambda admin, out_dir, run_id: _Standalone(cfg, admin, out_dir, run_id, parts),
        keep_errors=True,
    )
    res, meta = run.results, dict(run.meta)
    meta["standalone"] = True
    doc = json.loads(run.doc)
    doc["meta"] = meta
    (run.out_dir / "windows.json").write_text(json.dumps(doc, indent=1))
    if res.get("matrix") or res.get("sweep"):
        merge(render(res, meta), BENCH_DIR / "RESULTS.md")
        say(
            f"wrote {(run.out_dir / 'windows.json').relative_to(ROOT)} and the Windows "
            f"section of benchmarks/RESULTS.md ({elapsed() / 60:.1f} min)"
        )
    if res.get("errors"):
        say("FAILED: " + " | ".join(e.strip().splitlines()[0][:300] for e in res["errors"]))
    return run.code or (1 if res.get("errors") else 0)


class _Standalone(WindowBench):
    def __init__(
        self, cfg: Config, admin: Admin, out_dir: Path, run_id: str, parts: list[str]
    ) -> None:
        super().__init__(cfg, admin, out_dir, run_id)
        self.parts = parts

    def run(self, parts: list[str] | None = None) -> dict[str, Any]:
        try:
            return super().run(parts or self.parts)
        finally:
            shutil.rmtree(self.out_dir / "state", ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
