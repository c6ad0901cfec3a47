"""Writes benchmarks/RESULTS.md (and the sweeps chart) from the harness's results."""

from __future__ import annotations

import json
import shutil
import statistics
import subprocess
from pathlib import Path
from typing import Any

from benchmarks import venvs
from benchmarks.enrich import render as enrich_render
from benchmarks.paths import BENCH_DIR, ROOT
from benchmarks.pipeline import render as pipeline_render
from benchmarks.progress import say
from benchmarks.revision import same_runtime
from benchmarks.runner import ONLY, WORKLOADS
from benchmarks.windows import from_make_bench as windows_results
from benchmarks.windows import render as windows_render

NAMES = {
    "raw": "raw confluent-kafka loop",
    "lockgate": "lockgate",
    "quix": "Quix Streams",
    "quix_handler": "Quix Streams (same handler)",
    "faust": "Faust",
}
ORDER = ["raw", "lockgate", "quix", "quix_handler", "faust"]
CHART = BENCH_DIR / "sweeps.png"
DASH = "\u2013"  # en dash between min and max


def _median(xs: list[float]) -> float | None:
    return statistics.median(xs) if xs else None


def _fmt(x: float | None, digits: int = 0) -> str:
    if x is None:
        return "n/a"
    return f"{x:,.{digits}f}"


def _vals(rows: list[dict[str, Any]], key: str = "rate") -> list[float]:
    """The figure ``key`` of the passing runs among ``rows``."""
    return [r[key] for r in rows if r.get("ok") and r.get(key) is not None]


def _sel(rows: list[dict[str, Any]], workload: str, system: str) -> list[dict[str, Any]]:
    return [r for r in rows if r.get("workload") == workload and r.get("system") == system]


def _cell(rows: list[dict[str, Any]], key: str = "rate", digits: int = 0) -> str:
    """``median [min-max]`` over the passing runs (``(k of n failed)`` when some failed)."""
    if not rows:
        return "-"
    vals = _vals(rows, key)
    failed = sum(1 for r in rows if not r.get("ok"))
    if not vals:
        return f"n/a ({failed} of {len(rows)} failed)" if failed else "n/a"
    med = _fmt(_median(vals), digits)
    out = (
        med
        if len(vals) == 1
        else f"{med} [{_fmt(min(vals), digits)}{DASH}{_fmt(max(vals), digits)}]"
    )
    if failed:
        out += f" ({failed} of {len(rows)} failed)"
    return out


def _overlap(a: list[float], b: list[float]) -> bool:
    """Whether the [min, max] ranges of ``a`` and ``b`` overlap."""
    return bool(a and b) and max(min(a), min(b)) <= min(max(a), max(b))


def _ratio(a: list[float], b: list[float]) -> tuple[float, float, float] | None:
    """Median ratio and the range of ratios any two runs could give (min/max, max/min)."""
    if not a or not b or not min(b) or not _median(b):
        return None
    return (_median(a) or 0) / (_median(b) or 1), min(a) / max(b), max(a) / min(b)


def _ratio_cell(a: list[float], b: list[float]) -> str:
    r = _ratio(a, b)
    if r is None:
        return "n/a"
    med, lo, hi = r
    out = f"{med:.2f}x [{lo:.2f}{DASH}{hi:.2f}]"
    if len(a) > 1 and len(b) > 1 and _overlap(a, b):
        out += " ranges overlap"
    return out


def _loads(rows: list[dict[str, Any]]) -> str:
    """The range of the 1-minute load average before and after ``rows``."""
    xs = [r[k] for r in rows for k in ("load_before", "load_after") if r.get(k) is not None]
    if not xs:
        return "-"
    return f"{min(xs):.1f}{DASH}{max(xs):.1f}"


def _label_order(label: str) -> tuple[int, int]:
    digits = "".join(c for c in label if c.isdigit())
    return (0, 0) if "least" in label else (1, int(digits or 0))


def write(res: dict[str, Any], out_dir: Path) -> Path:
    """Render RESULTS.md (and sweeps.png through the plot venv); return its path."""
    chart_ok = _chart(out_dir)
    md = render(res, chart_ok)
    path = BENCH_DIR / "RESULTS.md"
    path.write_text(md)
    shutil.copy(path, out_dir / "RESULTS.md")
    return path


def _chart(out_dir: Path) -> bool:
    py = venvs.python("plot")
    if not py.exists():
        return False
    # plot.py charts lockgate's sweep by label: give it lockgate's sweep rows, labelled.
    res = json.loads((out_dir / "results.json").read_text())
    res["sweep"] = [
        {
            **r,
            "label": f"{WORKLOADS[r['workload']].title.split('(')[-1].rstrip(')')} "
            f"{r.get('commit_ms', 1000)} ms",
        }
        for r in res.get("sweep", [])
        if r.get("system") == "lockgate" and r.get("workload") in WORKLOADS
    ]
    src = out_dir / "plot-input.json"
    src.write_text(json.dumps(res))
    try:
        subprocess.run(
            [str(py), str(BENCH_DIR / "plot.py"), str(src), str(CHART)],
            check=True,
            timeout=120,
            capture_output=True,
        )
    except (subprocess.CalledProcessError, subprocess.TimeoutExpired) as exc:
        say(f"  chart failed: {exc}")
        return False
    shutil.copy(CHART, out_dir / CHART.name)
    return True


def render(res: dict[str, Any], chart: bool) -> str:  # noqa: C901, PLR0915 - one document
    """The Markdown document."""
    cfg = res["config"]
    matrix = res.get("matrix", [])
    sweep = res.get("sweep", [])
    present = {r.get("system") for r in matrix}
    systems = [s for s in ORDER if s in cfg["systems"] or s in present]
    workloads = [w for w in cfg["workloads"] if w in WORKLOADS]

    def cols_for(w: str) -> list[str]:
        return [s for s in systems if w in ONLY.get(s, {w})]

    L: list[str] = []
    a = L.append
    a("# lockgate benchmarks: results")
    a("")
    a(
        f"Written by `make bench` (`benchmarks/run.py`) on {res.get('started')}; the whole run "
        f"took {res.get('total_seconds', 0) / 60:.1f} min. Every number below comes from that "
        "one run, against one Kafka broker started by the harness. Raw data: "
        "`benchmarks/out/<timestamp>/results.json` (not committed)."
    )
    a("")
    a(
        "**The machine is shared** (other engineers' suites may run on its 2 cores): the 1-min "
        "load average before and after every run is in the tables (`load`) and in the "
        "appendix. Each matrix cell ran "
        f"{cfg['repeat']} time(s), the systems of a workload back to back within each repeat "
        "(A B A B ...). Tables show the **median [min" + DASH + "max]** over the passing runs. "
        "A ratio is the ratio of the medians, with the range any two runs could give "
        "(min/max " + DASH + " max/min); **ranges overlap** marks a comparison whose two "
        "systems' ranges overlap, i.e. the runs do not separate them."
    )
    a("")
    a(f"- load before: `{res.get('uptime_before', '')}`")
    a(f"- load after: `{res.get('uptime_after', '')}`")
    a("")

    # ---- targets (issue 15, item 3)
    a("## Targets of issue #15")
    a("")
    a(
        "From the medians of this run (keyed running sum, 100k keys, 1 s commits). Verdict: "
        "met / **not met** on the medians; **within noise** when the target lies inside the "
        "range of ratios the runs allow (the medians' verdict in brackets)."
    )
    a("")
    a("| target | median ratio | range | medians | ranges overlap | verdict |")
    a("| --- | --- | --- | --- | --- | --- |")

    def target(
        name: str, num: list[float], den: list[float], want: float, unit: str, higher: bool
    ) -> None:
        r = _ratio(num, den)
        if r is None:
            a(f"| {name} | n/a | n/a | n/a | n/a | n/a (no passing runs) |")
            return
        med, lo, hi = r
        digits = 0 if unit == "records/s" else 1
        met = med >= want if higher else med <= want
        verdict = "met" if met else "**not met**"
        if lo <= want <= hi:
            verdict = f"**within noise** ({'met' if met else 'not met'} on the medians)"
        a(
            f"| {name} | {med:.2f}x | {lo:.2f}x{DASH}{hi:.2f}x | "
            f"{_fmt(_median(num), digits)} vs {_fmt(_median(den), digits)} {unit} | "
            f"{'yes' if _overlap(num, den) else 'no'} | {verdict} |"
        )

    def mv(w: str, s: str, key: str = "rate") -> list[float]:
        return _vals(_sel(matrix, w, s), key)

    target(
        "lockgate exactly-once keyed sum >= 0.75x the raw exactly-once loop (records/s)",
        mv("sum_eos", "lockgate"),
        mv("sum_eos", "raw"),
        0.75,
        "records/s",
        True,
    )
    target(
        "lockgate exactly-once keyed sum >= 0.9x lockgate at-least-once (records/s)",
        mv("sum_eos", "lockgate"),
        mv("sum_alo", "lockgate"),
        0.9,
        "records/s",
        True,
    )
    target(
        "lockgate exactly-once CPU per record <= 1.3x the raw exactly-once loop",
        mv("sum_eos", "lockgate", "cpu_s_per_m"),
        mv("sum_eos", "raw", "cpu_s_per_m"),
        1.3,
        "CPU s/M",
        False,
    )
    a("")

    # ---- throughput
    a("## Throughput (records/s)")
    a("")
    a(
        "Records per second between the first and the last output record's broker append "
        "time (output topics use `message.timestamp.type=LogAppendTime`; records are read "
        "back with `read_committed`, so aborted ones never count). Window workload: the input "
        "records consumed between the first and the last output (the group's committed input "
        "offsets, interpolated between commits at the two append times), over the same span; "
        "a run with fewer than two commits within its span counts the model's input records "
        "between the first and the last window-closing record instead (`(m)` in the "
        "appendix). "
        "Startup, group join and the end-of-input idle time are excluded. `load`: the range "
        "of the 1-min load average before/after the cell's runs."
    )
    a("")
    a("| workload | " + " | ".join(NAMES[s] for s in systems) + " |")
    a("| --- | " + " | ".join("---" for _ in systems) + " |")
    for w in workloads:
        cells = []
        for s in systems:
            rows = _sel(matrix, w, s)
            cells.append(f"{_cell(rows)} (load {_loads(rows)})" if rows else "-")
        a(f"| {WORKLOADS[w].title} | " + " | ".join(cells) + " |")
    a("")
    a(
        "Input records per run: "
        + ", ".join(f"{NAMES[s]} {_records_for(cfg, s):,}" for s in systems)
        + " (the peers are much slower, so they get a prefix of the same seeded input; "
        "see Method). `Quix Streams (same handler)` runs only the window workload: Quix "
        "with the per-record window handler of the raw loop and Faust instead of its native "
        "window (see Method)."
    )
    a("")

    a("### Ratios (medians)")
    a("")
    peers = [s for s in systems if s != "lockgate"]
    if "lockgate" in systems and peers:
        a("| workload | " + " | ".join(f"lockgate / {NAMES[x]}" for x in peers) + " |")
        a("| --- | " + " | ".join("---" for _ in peers) + " |")
        for w in workloads:
            lg = mv(w, "lockgate")
            a(
                f"| {w} | "
                + " | ".join(_ratio_cell(lg, mv(w, x)) if x in cols_for(w) else "-" for x in peers)
                + " |"
            )
        a("")
    others = [s for s in systems if s != "raw"]
    if "raw" in systems and others:
        a("Each system relative to the raw loop of the same workload (the Python ceiling):")
        a("")
        a("| workload | " + " | ".join(f"{NAMES[s]} / raw" for s in others) + " |")
        a("| --- | " + " | ".join("---" for _ in others) + " |")
        for w in workloads:
            raw = mv(w, "raw")
            a(
                f"| {w} | "
                + " | ".join(
                    _ratio_cell(mv(w, s), raw) if s in cols_for(w) else "-" for s in others
                )
                + " |"
            )
        a("")

    # ---- cpu / rss
    a("## CPU seconds per million records, peak RSS")
    a("")
    idles = [r["broker_idle_util"] for r in matrix if r.get("broker_idle_util") is not None]
    idle_txt = (
        f"measured {len(idles)} times, {min(idles):.3f}{DASH}{max(idles):.3f} CPU s/s"
        if idles
        else "not measured (broker pid unknown: external broker)"
    )
    a(
        "CPU: utime+stime of the system's process tree (from `/proc/<pid>/stat`, children "
        "included) over the measured span, per million records. Broker CPU: the broker "
        "process's CPU over the same span **minus its idle CPU** (the broker's CPU rate with "
        f"nothing running, over {cfg.get('idle_seconds', 0):g} s before each workload's block "
        f"of runs; {idle_txt}) times the span, per million records. Peak RSS: sum of "
        "`VmHWM` over the process tree at the end of the run."
    )
    a("")
    a(
        "| workload | system | CPU s / M records | broker CPU s / M (idle subtracted) | "
        "CPU utilisation | peak RSS MiB | startup s | load |"
    )
    a("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for w in workloads:
        for s in cols_for(w):
            rows = _sel(matrix, w, s)
            if not rows:
                continue
            a(
                f"| {w} | {NAMES[s]} | {_cell(rows, 'cpu_s_per_m', 1)} | "
                f"{_cell(rows, 'broker_cpu_s_per_m', 1)} | {_cell(rows, 'cpu_util', 2)} | "
                f"{_cell(rows, 'peak_rss_mb', 1)} | {_cell(rows, 'startup_s', 1)} | "
                f"{_loads(rows)} |"
            )
    a("")

    # ---- completeness
    a("## Completeness checks")
    a("")
    a(
        "Every run's output is read back in full with `read_committed` and checked: "
        "passthrough: every input seq present; running sum: the last (highest-count) output "
        "of every key equals the model's sum and count; window: every closed (key, window) "
        "emitted once with the model's count (partition watermarks: see the Windows "
        "section). `dup` = records beyond the exact count."
    )
    a("")
    a("| run | status | records out | missing | wrong | dup |")
    a("| --- | --- | --- | --- | --- | --- |")
    extra = [r for r in sweep if not r.get("from_matrix")] + res.get("window_sweep", [])
    for r in matrix + extra:
        c = r.get("check") or {}
        wrong = c.get("wrong_final_sums", c.get("wrong_counts", 0))
        status = "ok" if r.get("ok") else f"**FAILED** ({r.get('status')})"
        a(
            f"| {r.get('tag', r.get('workload'))} | {status} | {_fmt(c.get('records_out'))} | "
            f"{_fmt(c.get('missing'))} | {_fmt(wrong)} | {_fmt(c.get('duplicates'))} |"
        )
    a("")

    # ---- sweeps
    if sweep:
        a("## Commit interval sweep (keyed running sum, every system)")
        a("")
        sweep_reps = cfg.get("sweep_repeat") or cfg.get("repeat")
        a(
            "Each system's commit / checkpoint interval (lockgate checkpoint interval, raw "
            "loop commit or transaction period, Quix `commit_interval`, Faust "
            "`broker_commit_interval`) on the keyed running sum, exactly-once and "
            "at-least-once. The 1 s runs are the matrix's; the other intervals ran "
            f"{sweep_reps} time(s) each, the systems back to back within each repeat. Median "
            f"[min{DASH}max]; `vs 1 s`: ratio of the medians to the same system's 1 s runs."
        )
        a("")
        sw_systems = [s for s in ORDER if any(r.get("system") == s for r in sweep)]
        intervals = sorted({r.get("commit_ms", 1000) for r in sweep})
        a(
            "| workload | system | interval | records/s | vs 1 s | CPU s / M | "
            "broker CPU s / M | load |"
        )
        a("| --- | --- | --- | --- | --- | --- | --- | --- |")
        for w in [x for x in ("sum_eos", "sum_alo") if any(r["workload"] == x for r in sweep)]:
            for s in sw_systems:
                base = _vals([r for r in _sel(sweep, w, s) if r.get("commit_ms", 1000) == 1000])
                for ms in intervals:
                    rows = [r for r in _sel(sweep, w, s) if r.get("commit_ms", 1000) == ms]
                    if not rows:
                        continue
                    vs = _ratio_cell(_vals(rows), base) if ms != 1000 else "-"
                    a(
                        f"| {w} | {NAMES.get(s, s)} | {ms / 1000:g} s | {_cell(rows)} | {vs} | "
                        f"{_cell(rows, 'cpu_s_per_m', 1)} | "
                        f"{_cell(rows, 'broker_cpu_s_per_m', 1)} | {_loads(rows)} |"
                    )
        a("")

        def at(w: str, ms: int) -> list[float]:
            return _vals([r for r in _sel(sweep, w, "lockgate") if r.get("commit_ms", 1000) == ms])

        lg = {ms: at("sum_eos", ms) for ms in intervals}
        alo = {ms: at("sum_alo", ms) for ms in intervals}
        pairs = [
            f"{ms / 1000:g} s: {_ratio_cell(lg[ms], alo[ms])}"
            for ms in intervals
            if lg.get(ms) and alo.get(ms)
        ]
        if pairs:
            a(
                "lockgate exactly-once / at-least-once at the same interval: "
                + "; ".join(pairs)
                + "."
            )
            a("")
    rec = res.get("recovery", [])
    if chart or rec or res.get("latency"):
        a("## lockgate: chart, recovery, latency")
        a("")
    if chart:
        a("![sweeps](sweeps.png)")
        a("")
    if rec:
        a("### Recovery after kill -9 vs state size")
        a("")
        a(
            "The running sum (exactly-once, 1 s checkpoints) is loaded with one record per "
            "key and killed with SIGKILL; 8 probe records are produced; then it is restarted "
            "(a) with its local RocksDB state, (b) with the state dir wiped, so every key "
            "group is rebuilt from its changelog. Time: from the restart (process spawn) "
            "until the probes' outputs are committed (includes interpreter start, imports, "
            "group join, `init_transactions` fencing, restore, one epoch). The restore "
            "columns come from lockgate's 'key group restored' log lines."
        )
        a("")
        a(
            "| keys | load s | local: recovery s | local: restored records | local: restore s | "
            "changelog only: recovery s | changelog: restored records | changelog: restore s | "
            "check |"
        )
        a("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
        for r in rec:
            lo, ch = r.get("local", {}), r.get("changelog", {})
            a(
                f"| {r['keys']:,} | {r.get('load_seconds')} | {lo.get('seconds')} | "
                f"{_fmt(lo.get('restored_records'))} | {lo.get('restore_seconds')} | "
                f"{ch.get('seconds')} | "
                f"{_fmt(ch.get('restored_records'))} | {ch.get('restore_seconds')} | "
                f"{'ok' if r.get('ok') else '**FAILED** ' + str(r.get('check'))} |"
            )
        a("")
    lat = res.get("latency", [])
    if lat:
        a("### End-to-end latency at a fixed offered load")
        a("")
        a(
            f"A producer process sends {lat[0]['rate']:,} records/s (100k keys) for "
            f"{cfg['latency_seconds']} s after a 3 s warm-up; a `read_committed` reader "
            "process records when each output becomes visible. Latency = visible time - send "
            "time (same clock). With exactly-once an output is visible only after its epoch "
            "commits, so latency is about half the checkpoint interval plus the commit."
        )
        a("")
        a(
            "| configuration | p50 ms | p90 ms | p99 ms | max ms | records | missing | "
            "app CPU utilisation |"
        )
        a("| --- | --- | --- | --- | --- | --- | --- | --- |")
        for r in lat:
            a(
                f"| {r['label']} | {r['p50_ms']} | {r['p90_ms']} | {r['p99_ms']} | "
                f"{r['max_ms']} | {r['measured']:,} | {r['missing']} | {r['app_cpu_util']} |"
            )
        a("")

    # ---- pipelines (benchmarks/pipeline.py)
    if res.get("pipeline", {}).get("runs") or res.get("pipeline", {}).get("savepoints"):
        versions = res.get("versions", {}).get("lockgate", {})
        meta = {
            "command": "make bench",
            "started": res.get("started"),
            "total_minutes": res.get("step_seconds", {}).get("pipeline", 0) / 60,
            "machine": res.get("machine", {}),
            "broker": cfg.get("external_broker")
            or f"Kafka {res.get('versions', {}).get('kafka', '?')} started by the harness",
            "git": versions.get("git", "?"),
            "git_after": res.get("git_after", ""),
            "uptime_before": res.get("uptime_before", ""),
            "uptime_after": res.get("uptime_after", ""),
        }
        L.extend(pipeline_render(res["pipeline"], meta))
        a("")

    # ---- multi-input enrichment (benchmarks/enrich.py)
    if res.get("enrich", {}).get("runs"):
        versions = res.get("versions", {}).get("lockgate", {})
        meta = {
            "command": "make bench",
            "started": res.get("started"),
            "total_minutes": res.get("step_seconds", {}).get("enrich", 0) / 60,
            "machine": res.get("machine", {}),
            "broker": cfg.get("external_broker")
            or f"Kafka {res.get('versions', {}).get('kafka', '?')} started by the harness",
            "git": versions.get("git", "?"),
            "git_after": res.get("git_after", ""),
            "uptime_before": res.get("uptime_before", ""),
            "uptime_after": res.get("uptime_after", ""),
        }
        L.extend(enrich_render(res["enrich"], meta))
        a("")

    # ---- fresh-volume failover (benchmarks/failover.py, short form)
    failover_md = res.get("failover", {}).get("markdown", "")
    if failover_md:
        for line in failover_md.splitlines():
            a("#" + line if line.startswith("#") else line)
        a("")

    # ---- event-time windows (benchmarks/windows.py)
    win = windows_results(res)
    # The comparison with the peers is in the tables above (medians and ranges, both Quix
    # variants); the section keeps the semantics and lockgate's open-windows sweep.
    win["matrix"] = []
    if win["sweep"]:
        versions = res.get("versions", {}).get("lockgate", {})
        meta = {
            "command": "make bench",
            "started": res.get("started"),
            "total_minutes": res.get("total_seconds", 0) / 60,
            "machine": res.get("machine", {}),
            "broker": cfg.get("external_broker")
            or f"Kafka {res.get('versions', {}).get('kafka', '?')} started by the harness",
            "git": versions.get("git", "?"),
            "git_after": res.get("git_after", ""),
            "uptime_before": res.get("uptime_before", ""),
            "uptime_after": res.get("uptime_after", ""),
        }
        L.extend(_window_lines(windows_render(win, meta)))
        a("")

    # ---- nexmark (benchmarks/nexmark/step.py)
    nx = res.get("nexmark") or {}
    if nx:
        L.extend(_nexmark_lines(nx, res.get("step_seconds", {}).get("nexmark")))
        a("")

    # ---- profile
    profiles = res.get("profiles") or {}
    for name, prof in profiles.items():
        workload = name.partition("+")[0]
        if not prof.get("samples") or prof.get("native"):
            continue
        a(f"## Profile: lockgate {WORKLOADS[workload].title}")
        a("")
        run = prof.get("run", {})
        a(
            f"py-spy 0.4 (`record --rate 100 --function --format raw`, blocking mode) attached "
            f"to the lockgate process from its first output to the end of the input; "
            f"{prof['samples']:,} samples (idle time, i.e. waiting in `consume()` with the GIL "
            f"released, is not sampled). The profiled run did {_fmt(run.get('rate'))} "
            f"records/s. Without `--native`, time in C extensions (librdkafka's `produce()`/"
            f"`consume()`, orjson, rocksdict) is the self time of the Python function that "
            f"calls them. Collapsed stacks: `{prof.get('raw_file')}`."
        )
        a("")
        a("| self % | function |")
        a("| --- | --- |")
        for r in prof.get("self", [])[:15]:
            a(f"| {r['pct']} | `{r['function']}` |")
        a("")
        a("Inclusive (self + callees):")
        a("")
        a("| total % | function |")
        a("| --- | --- |")
        for r in prof.get("total", [])[:15]:
            a(f"| {r['pct']} | `{r['function']}` |")
        a("")

    for name, prof in profiles.items():
        if not prof.get("samples") or not prof.get("native"):
            continue
        workload = name.partition("+")[0]
        run = prof.get("run", {})
        a(f"### Native profile: lockgate {WORKLOADS[workload].title}")
        a("")
        a(
            f"py-spy `--native` (blocking, 100 Hz; {prof['samples']:,} samples): the leaf "
            "frame of every sample grouped by the binary it runs in, i.e. where the CPU "
            f"goes, C extensions included. Native unwinding slows the process (this run did "
            f"{_fmt(run.get('rate'))} records/s), so read shares, not rates. Samples with the "
            f"cyclic garbage collector on the stack: **{prof.get('gc_pct')}%**."
        )
        a("")
        a("| share % | where |")
        a("| --- | --- |")
        for r in prof.get("by_library", []):
            a(f"| {r['pct']} | {r['function']} |")
        a("")
        a("| self % | leaf function [binary or file:line] |")
        a("| --- | --- |")
        for r in prof.get("leaves", [])[:12]:
            a(f"| {r['pct']} | `{r['function']}` |")
        a("")

    bounds = _bounds(profiles)
    if bounds:
        a("### What the profiles say bounds lockgate's exactly-once keyed sum")
        a("")
        a(bounds)
        a("")

    # ---- method
    a("## Method")
    a("")
    if cfg.get("external_broker"):
        a(
            f"- One broker: an existing one at {cfg['external_broker']} (`BENCH_BROKER`), "
            "neither started nor stopped by the harness."
        )
    else:
        a(
            f"- One broker: Apache Kafka {res.get('versions', {}).get('kafka', '?')} (KRaft, "
            f"single node, `docker/kafka/broker.sh`, heap 1 GiB) on "
            f"127.0.0.1:{cfg['kafka_port']}, started fresh by the harness and stopped at "
            "the end."
        )
    a(
        f"- Inputs are produced once per workload and size before anything is measured: "
        f"{cfg['partitions']} partitions, ~100-byte records (8-byte key, JSON value "
        '`{"v": int, "seq": int, "pad": "..."}`), lz4, murmur2 partitioner. Running sum: '
        f"{cfg['keys']:,} keys, uniformly random. Window: {cfg['windows']} tumbling windows "
        f"of {cfg['window_ms'] / 1000:g} s of event time (record timestamps, increasing "
        f"with seq, each moved back by up to {cfg.get('window_delay_ms', 0):,} ms: bounded "
        f"out-of-orderness, no late records), {cfg['window_keys']:,} keys at "
        f"{cfg['records']:,} records (fewer for the peers' smaller inputs, so every (key, "
        "window) has the same number of records)."
    )
    a(
        "- Each run: a fresh output topic, consumer group and state dir; the system runs "
        "as its own process (`lockgate run`, `python -m benchmarks.apps.quix_app`, "
        "`python -m benchmarks.apps.faust_app --loop=uvloop worker -l info`, "
        "`python -m benchmarks.apps.raw_loop`) until the group has committed every input "
        "offset and the output is stable, then gets SIGTERM. Order: repeat -> workload -> "
        "system, so the systems compared run back to back in every repeat; the broker's "
        "idle CPU is measured before each workload's block of runs."
    )
    a(
        "- Commit / checkpoint interval 1 s for every system in the matrix (lockgate "
        "checkpoint interval, Quix `commit_interval`, Faust `broker_commit_interval`, raw loop "
        "commit or transaction every 1 s); the sweep runs every system at the other "
        "intervals."
    )
    a(
        "- **One client-tuning policy** (lockgate's own producer settings, "
        "`processors/_kafka/clients.py`): producer `linger.ms` 5, `compression.type` lz4, "
        "idempotent, "
        "and under exactly-once `retry.backoff.ms` 10 (a retriable CONCURRENT_TRANSACTIONS "
        "right after a commit then costs ~10 ms instead of librdkafka's 100 ms); consumer "
        "`fetch.wait.max.ms` 100 and `fetch.queue.backoff.ms` 20. The raw loop sets them in "
        "its client configs, Quix Streams through `Application(producer_extra_config=..., "
        "consumer_extra_config=...)`. Faust "
        "(aiokafka) has knobs for the linger and the compression only: "
        "`producer_compression_type='lz4'`, `producer_linger` 5 ms at-least-once and 50 ms "
        "exactly-once (a fuller batch per transaction); its retry backoff stays aiokafka's "
        "100 ms."
    )
    a(
        "- raw loop: `consume(1000)` -> `orjson.loads` -> workload -> `orjson.dumps` -> "
        "`produce`; at-least-once: flush + synchronous offset commit per interval; "
        "exactly-once (`sum_eos`, `window`): one transaction per interval with "
        "`send_offsets_to_transaction`. Its state is a dict: no changelog, no local database, "
        "not durable. It is the ceiling of a Python consume-process-produce loop, not a "
        "competitor."
    )
    a(
        "- lockgate: RocksDB state (rocksdict), changelog per store, one transaction per "
        "epoch. Window: its window operator (`Watermarks.bounded(delay)`, "
        "`.window(Tumbling(size)).count()`), per-key-group watermarks; the raw loop, Faust "
        "and `Quix Streams (same handler)` implement the same closing rule by hand (see the "
        "Windows section)."
    )
    a(
        "- Quix Streams: `Application(processing_guarantee=..., commit_interval=...)`, "
        "`sdf.apply(stateful=True)` for the sum (RocksDB state + changelog). Window, two "
        "variants: `Quix Streams` runs its native `tumbling_window(duration_ms=size, "
        'grace_ms=delay).count().final(closing_strategy="partition")` (a window closes when '
        "its partition's newest timestamp passes end + grace: the same windows as "
        "lockgate's); `Quix Streams (same handler)` runs the raw loop's / Faust's per-record "
        "handler as `sdf.apply(handler, stateful=True, metadata=True, expand=True)`: per key "
        "a state entry with its open windows (Quix RocksDB state + changelog), per partition "
        "the newest timestamp and a heap of window ends in memory, closed windows of other "
        "keys reached through the partition's state transaction, output keyed by the "
        "window's key. Both are checked against the same model."
    )
    a(
        "- Faust: faust-streaming with the `rocksdb://` store (rocksdict), one agent per "
        "workload (`async for key, value in stream.items()`), "
        "`processing_guarantee='exactly_once'` for the exactly-once workloads, tuned as its "
        "expert users would: the uvloop event loop (`--loop=uvloop`), "
        "`stream_buffer_maxsize=16384`, at-least-once outputs with `topic.send_soon()` "
        "(buffered; flushed before each offset commit) and exactly-once outputs with "
        "`await topic.send()`. It runs with `-l info` because at the default WARN level "
        "Faust's worker sets the root logger to DEBUG to drive its terminal spinner, which "
        "costs ~8% (measured)."
    )
    a(
        "- Input sizes: the peers are 10-200x slower than lockgate, so to fit the run in its "
        "time budget they process a prefix of the same seeded input (Quix Streams "
        f"{_records_for(cfg, 'quix'):,}, Faust {_records_for(cfg, 'faust'):,} records, "
        f"lockgate and the raw loop {cfg['records']:,}). Rates are steady-state rates over "
        "the span between the first and the last output; the smaller inputs touch fewer "
        "distinct keys (fewer state entries), which favours the peers if anything."
    )
    a("")

    # ---- machine & versions
    m = res.get("machine", {})
    a("## Machine")
    a("")
    a(f"- CPU: {m.get('cpu')} ({m.get('cores')} cores), {m.get('memory_gib')} GiB RAM")
    a(f"- OS: {m.get('os')}, kernel {m.get('kernel')}; {m.get('java')}")
    a(f"- Python {m.get('python')} for every system (one venv each)")
    a("")
    a("## Versions")
    a("")
    v = res.get("versions", {})
    a("| venv | packages |")
    a("| --- | --- |")
    for name, path in (
        ("lockgate", ".venv"),
        ("quix", ".cache/bench/venvs/quix"),
        ("faust", ".cache/bench/venvs/faust"),
        ("plot", ".cache/bench/venvs/plot"),
        ("pyspy", ".cache/bench/venvs/pyspy"),
    ):
        if name in v:
            pk = ", ".join(f"{k} {val}" for k, val in v[name].items())
            a(f"| `{path}` | {pk} |")
    a("")
    a("Peer venvs are created by the harness with pinned versions (`benchmarks/venvs.py`).")
    lg = v.get("lockgate", {})
    a("")
    a(
        f"lockgate source measured: git `{lg.get('git', '?')}`; "
        f"librdkafka {lg.get('librdkafka', '?')}."
    )
    after = res.get("git_after")
    if after and after != lg.get("git"):
        a("")
        if same_runtime(lg.get("git", ""), after):
            a(
                f"HEAD moved during the run (at the end: git `{after}`), by commits outside "
                "`processors/` and `state/`: every run measured the same lockgate code."
            )
        else:
            a(
                f"**The lockgate source changed during the run** (at the end: git `{after}`): "
                "runs before and after the change measured different code."
            )
    a("")
    a("## Commands")
    a("")
    a("```sh")
    a("make bench   # = .venv/bin/python -m benchmarks.run")
    a(f"# with these settings (the defaults):\n{res.get('env_line', '')} make bench")
    a("# a quick development run:")
    a(
        "BENCH_RECORDS=50000 BENCH_REPEAT=1 BENCH_SWEEP_REPEAT=1 BENCH_RECOVERY_KEYS=10000 "
        "BENCH_STEPS=matrix,sweep,recovery,latency make bench"
    )
    a("```")
    a("")
    steps = res.get("step_seconds", {})
    if steps:
        a("## Wall time per step")
        a("")
        a("| step | minutes |")
        a("| --- | --- |")
        for k, val in steps.items():
            a(f"| {k} | {val / 60:.1f} |")
        a(f"| whole run | {res.get('total_seconds', 0) / 60:.1f} |")
        a("")
    runs = matrix + [r for r in sweep if not r.get("from_matrix")]
    if runs:
        a("## Appendix: every run")
        a("")
        a(
            "In the order they ran. `load`: the 1-min load average before -> after the run; "
            "`broker idle`: the broker's CPU rate (CPU s/s) measured with nothing running "
            "before the run's block, subtracted from its broker CPU; `wall s`: the whole run "
            "(start, processing, stop, read-back and check); `(m)`: window rate from the "
            "model's count (fewer than two commits within the output span)."
        )
        a("")
        a(
            "| run | system | workload | commit ms | records/s | CPU s / M | broker CPU s / M "
            "(gross) | broker idle | load | wall s | ok |"
        )
        a("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
        for r in runs:
            a(
                f"| {r.get('tag', '')} | {NAMES.get(r.get('system', ''), r.get('system'))} | "
                f"{r.get('workload')} | {r.get('commit_ms', '')} | {_fmt(r.get('rate'))}"
                f"{' (m)' if str(r.get('rate_basis', '')).startswith('model') else ''} | "
                f"{_fmt(r.get('cpu_s_per_m'), 1)} | {_fmt(r.get('broker_cpu_s_per_m'), 1)} "
                f"({_fmt(r.get('broker_cpu_gross_s_per_m'), 1)}) | "
                f"{_fmt(r.get('broker_idle_util'), 3)} | {r.get('load_before')} -> "
                f"{r.get('load_after')} | {r.get('run_wall_s', '')} | "
                f"{'yes' if r.get('ok') else '**no**'} |"
            )
        a("")
    if res.get("errors"):
        a("## Errors during the run")
        a("")
        a("```")
        for e in res["errors"]:
            a(e.strip()[-1500:])
        a("```")
        a("")
    return "\n".join(L)


OLD_WINDOW_RATE = (
    "Rate: input records between the first and the last record that closes a window (from the "
    "model), over the broker append times of the first and last output."
)
NEW_WINDOW_RATE = (
    "Rate: input records consumed between the first and the last output (the group's "
    "committed input offsets, interpolated between commits at the broker append times of "
    "the first and last output), over that span."
)


def _window_lines(lines: list[str]) -> list[str]:
    """The Windows section with the rate definition this harness uses (runner._rates)."""
    return [line.replace(OLD_WINDOW_RATE, NEW_WINDOW_RATE) for line in lines]


def _nexmark_lines(nx: dict[str, Any], seconds: float | None) -> list[str]:
    """The Nexmark section from benchmarks.nexmark.step.markdown_section (guarded)."""
    try:
        from benchmarks.nexmark import step as nexmark_step

        section = nexmark_step.markdown_section
    except (ImportError, AttributeError) as exc:
        section = None
        why = f"benchmarks.nexmark.step.markdown_section is not available: {exc!r}"
    lines: list[str] = []
    if section is not None:
        why = "markdown_section returned no lines"
        try:
            lines = list(section(nx))
        except Exception as exc:  # noqa: BLE001 - the rest of the report still renders
            why = f"markdown_section failed: {exc!r}"
            lines = []
    if lines:
        return lines
    took = f" (the step took {seconds / 60:.1f} min)" if seconds else ""
    out = ["## Nexmark", "", f"No Nexmark section: {why}{took}."]
    errors = nx.get("errors") or []
    if errors:
        out += ["", "Errors of the step:", "", "```"]
        out += [str(e).strip()[-1500:] for e in errors]
        out += ["```"]
    return out


def _bounds(profiles: dict[str, Any]) -> str:
    """A data-driven summary of where the exactly-once keyed sum spends its CPU."""
    prof = profiles.get("sum_eos") or {}
    if not prof.get("samples"):
        return ""

    def total(fn: str) -> float:
        return next((r["pct"] for r in prof.get("total", []) if r["function"].startswith(fn)), 0)

    def own(fn: str) -> float:
        return next((r["pct"] for r in prof.get("self", []) if r["function"].startswith(fn)), 0)

    native = profiles.get("sum_eos+native") or {}
    libs = {r["function"]: r["pct"] for r in native.get("by_library", [])}
    kafka_c = libs.get("confluent-kafka binding (cimpl)", 0) + libs.get("librdkafka", 0)

    def largest(*fns: str) -> float:
        # The name a function shows up under depends on the class that defines it (the
        # runtime's mixins, then components) and on the version (ctx.emit is the runtime's
        # emit itself).
        return max(total(fn) for fn in fns)

    state_pct = total("ValueState.value") + total("ValueState.update")
    emit_pct = largest("Context.emit", "RunnerCore._emit", "OutputWriter.emit")
    end_pct = largest(
        "Runner._end_epoch",
        "RebalanceMixin._end_epoch",
        "EpochMixin._end_epoch",
        "EpochCommitter.end_epoch",
    )
    changelogs_pct = largest("EpochMixin._produce_changelogs", "EpochCommitter._produce_changelogs")
    parts = [
        f"Per-record path (`Runner._process`, inclusive) {total('Runner._process'):.0f}% of "
        f"the samples: the handler {total('_sum '):.0f}%, of which `ctx.emit` (encode + "
        f"produce of the output) {emit_pct:.0f}% and keyed state access "
        f"(`ValueState.value` + `update`) {state_pct:.0f}%.",
        f"Epoch commit (`_end_epoch`, inclusive) {end_pct:.0f}%: "
        f"encoding every dirty key (`StoreCache.drain` {own('StoreCache.drain'):.0f}%), "
        "producing it to the changelog (`_produce_changelogs`, inclusive "
        f"{changelogs_pct:.0f}%), the RocksDB write batch "
        f"(`RocksDBKeyGroupStore.apply` {own('RocksDBKeyGroupStore.apply'):.0f}%) and the "
        "transaction calls. With 100k keys and tens of thousands of records per epoch, most "
        "records touch a key not yet dirty in that epoch, so the changelog adds close to one "
        "produced record per input on top of the output (the raw loop has no changelog).",
        f"`consume()` (self time of `Runner._loop`: librdkafka handing over messages as "
        f"Python objects) {own('Runner._loop'):.0f}%.",
    ]
    if native.get("samples"):
        parts.append(
            f"In the native profile the Kafka client's C code is {kafka_c:.0f}%, RocksDB "
            f"{libs.get('rocksdict / RocksDB', 0):.0f}%, orjson "
            f"{libs.get('orjson', 0):.0f}%, and the cyclic garbage collector is on the stack "
            f"in {native.get('gc_pct', 0):.0f}% of the samples (the epoch cache keeps one "
            "Python list per key, so every full collection walks ~100k+ objects); the rest "
            "is Python bytecode and allocation, i.e. interpreter overhead per record."
        )
    return " ".join(parts)


def _records_for(cfg: dict[str, Any], system: str) -> int:
    records = cfg["records"]
    if system in ("quix", "quix_handler"):
        return min(records, cfg.get("quix_records") or max(2_500, records // 20))
    if system == "faust":
        return min(records, cfg.get("faust_records") or max(2_500, records // 200))
    return records


def main() -> None:
    """Re-render RESULTS.md from a results.json: ``python -m benchmarks.report PATH``."""
    import json
    import sys

    src = Path(sys.argv[1])
    res = json.loads(src.read_text())
    path = write(res, src.parent)
    print(path.relative_to(ROOT))


if __name__ == "__main__":
    main()
