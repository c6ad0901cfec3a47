"""Writes benchmarks/RESULTS.md (and the sweeps chart) from the harness's results."""

from __future__ import annotations

import shutil
import subprocess
from collections import defaultdict
from pathlib import Path
from typing import Any

from benchmarks import venvs
from benchmarks.common import BENCH_DIR, ROOT, say
from benchmarks.enrich import render as enrich_render
from benchmarks.pipeline import render as pipeline_render
from benchmarks.runner import WORKLOADS
from benchmarks.windows import from_make_bench as windows_results
from benchmarks.windows import render as windows_render

NAMES = {
    "raw": "raw confluent-kafka loop",
    "lockgate": "lockgate",
    "quix": "Quix Streams",
    "faust": "Faust",
}
CHART = BENCH_DIR / "sweeps.png"


def _label_order(label: str) -> tuple[int, int]:
    digits = "".join(c for c in label if c.isdigit())
    return (0, 0) if "least" in label else (1, int(digits or 0))


def _mean(xs: list[float]) -> float | None:
    return sum(xs) / len(xs) if xs else None


def _fmt(x: float | None, digits: int = 0) -> str:
    if x is None:
        return "n/a"
    return f"{x:,.{digits}f}"


def _ratio(a: float | None, b: float | None) -> str:
    if not a or not b:
        return "n/a"
    return f"{a / b:.2f}x"


def _rates(rows: list[dict[str, Any]], key: str = "rate") -> dict[tuple[str, str], list[float]]:
    out: dict[tuple[str, str], list[float]] = defaultdict(list)
    for r in rows:
        if r.get("ok") and r.get(key) is not None:
            out[(r["workload"], r["system"])].append(r[key])
    return out


def _runs(rows: list[dict[str, Any]], workload: str, system: str, key: str) -> str:
    vals = [r for r in rows if r.get("workload") == workload and r.get("system") == system]
    if not vals:
        return "-"
    parts = []
    for r in vals:
        v = r.get(key)
        s = _fmt(v, 0 if key == "rate" else 1) if v is not None else "n/a"
        if not r.get("ok"):
            s += " (failed)"
        parts.append(s)
    return " / ".join(parts)


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
    src = out_dir / "results.json"
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


def render(res: dict[str, Any], chart: bool) -> str:  # noqa: C901 - one long document
    """The Markdown document."""
    cfg = res["config"]
    matrix = res.get("matrix", [])
    sweep = res.get("sweep", [])
    rates = _rates(matrix)
    mean = {k: _mean(v) for k, v in rates.items()}
    systems = [s for s in ["raw", "lockgate", "quix", "faust"] if s in cfg["systems"]]
    workloads = [w for w in cfg["workloads"] if w in WORKLOADS]
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
        "**The machine was shared and noisy** (other engineers' test suites ran "
        "concurrently on its 2 cores): compare ratios from this run, not absolute numbers "
        "across runs. Each measurement ran "
        f"{cfg['repeat']} time(s); tables show every run (`run 1 / run 2`) and ratios use "
        "the mean."
    )
    a("")
    a(f"- load before: `{res.get('uptime_before', '')}`")
    a(f"- load after: `{res.get('uptime_after', '')}`")
    a("")

    # ---- targets
    a("## Targets of issue #5")
    a("")
    a("| target | measured (means) | range over runs | met |")
    a("| --- | --- | --- | --- |")
    runs_of = rates

    def target(name: str, num: list[float] | None, den: list[float] | None, want: float) -> None:
        n, d = _mean(num or []), _mean(den or [])
        if not n or not d:
            a(f"| {name} | n/a | n/a | n/a |")
            return
        r = n / d
        lo, hi = min(num or [0]) / max(den or [1]), max(num or [0]) / min(den or [1])
        met = "yes" if r >= want else "**no**"
        if lo < want <= hi:
            met += " (within run-to-run noise)"
        a(
            f"| {name} | {r:.2f}x ({_fmt(n)} vs {_fmt(d)} records/s) | "
            f"{lo:.2f}x - {hi:.2f}x | {met} |"
        )

    lg_runs = runs_of.get(("sum_eos", "lockgate"))
    target(
        "lockgate exactly-once keyed sum >= 3x Quix Streams exactly-once",
        lg_runs,
        runs_of.get(("sum_eos", "quix")),
        3,
    )
    target(
        "lockgate exactly-once keyed sum >= 10x Faust exactly-once",
        lg_runs,
        runs_of.get(("sum_eos", "faust")),
        10,
    )
    target(
        "lockgate exactly-once keyed sum >= 60% of the raw exactly-once loop",
        lg_runs,
        runs_of.get(("sum_eos", "raw")),
        0.6,
    )
    target(
        "(reference) lockgate exactly-once keyed sum vs the raw at-least-once loop",
        lg_runs,
        runs_of.get(("sum_alo", "raw")),
        0.6,
    )
    sw = defaultdict(list)
    for r in sweep:
        if r.get("ok") and r.get("rate"):
            sw[r["label"]].append(r["rate"])
    eos1 = sw.get("exactly-once 1000 ms") or lg_runs
    alo_runs = sw.get("at-least-once") or runs_of.get(("sum_alo", "lockgate"))
    alo = _mean(alo_runs or [])
    target("lockgate exactly-once (1 s epochs) >= 90% of at-least-once", eos1, alo_runs, 0.9)
    a("")

    # ---- throughput
    a("## Throughput (records/s)")
    a("")
    a(
        "Records per second between the first and the last output record's broker append "
        "time (output topics use `message.timestamp.type=LogAppendTime`; records are read "
        "back with `read_committed`, so aborted ones never count). Window workload: input "
        "records between the first and the last window-closing input record, over the same "
        "span. Startup, group join and the end-of-input idle time are excluded."
    )
    a("")
    a("| workload | " + " | ".join(NAMES[s] for s in systems) + " |")
    a("| --- | " + " | ".join("---" for _ in systems) + " |")
    for w in workloads:
        a(
            f"| {WORKLOADS[w].title} | "
            + " | ".join(_runs(matrix, w, s, "rate") for s in systems)
            + " |"
        )
    a("")
    a(
        "Input records per run: "
        + ", ".join(f"{NAMES[s]} {_records_for(cfg, s):,}" for s in systems)
        + " (the peers are much slower, so they get a prefix of the same seeded input; "
        "see Method)."
    )
    a("")

    a("### Ratios (means)")
    a("")
    cols = []
    if "lockgate" in systems:
        cols = [(x, f"lockgate / {NAMES[x]}") for x in systems if x != "lockgate"]
    a("| workload | " + " | ".join(c[1] for c in cols) + " |")
    a("| --- | " + " | ".join("---" for _ in cols) + " |")
    for w in workloads:
        a(
            f"| {w} | "
            + " | ".join(_ratio(mean.get((w, "lockgate")), mean.get((w, x))) for x, _ in cols)
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
            a(
                f"| {w} | "
                + " | ".join(_ratio(mean.get((w, s)), mean.get((w, "raw"))) for s in others)
                + " |"
            )
        a("")

    # ---- cpu / rss
    a("## CPU seconds per million records, peak RSS")
    a("")
    a(
        "CPU: utime+stime of the system's process tree (from `/proc/<pid>/stat`, children "
        "included) over the measured span, per million records. Broker CPU over the same span "
        "is listed separately (the broker is shared, so only same-run comparisons mean "
        "anything). Peak RSS: sum of `VmHWM` over the process tree at the end of the run."
    )
    a("")
    a(
        "| workload | system | CPU s / M records | broker CPU s / M | CPU utilisation | "
        "peak RSS MiB | startup s |"
    )
    a("| --- | --- | --- | --- | --- | --- | --- |")
    for w in workloads:
        for s in systems:
            a(
                f"| {w} | {NAMES[s]} | {_runs(matrix, w, s, 'cpu_s_per_m')} | "
                f"{_runs(matrix, w, s, 'broker_cpu_s_per_m')} | "
                f"{_runs(matrix, w, s, 'cpu_util')} | {_runs(matrix, w, s, 'peak_rss_mb')} | "
                f"{_runs(matrix, w, s, 'startup_s')} |"
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
    a("## lockgate sweeps")
    a("")
    if chart:
        a("![sweeps](sweeps.png)")
        a("")
    if sweep:
        a("### Guarantee and checkpoint interval (keyed running sum, 100k keys)")
        a("")
        a(
            "| configuration | records/s (runs) | mean | vs at-least-once | CPU s / M | "
            "broker CPU s / M |"
        )
        a("| --- | --- | --- | --- | --- | --- |")
        for label, vals in sorted(sw.items(), key=lambda kv: _label_order(kv[0])):
            rows = [r for r in sweep if r.get("label") == label]
            a(
                f"| {label} | "
                + " / ".join(_fmt(r.get("rate")) for r in rows)
                + f" | {_fmt(_mean(vals))} | {_ratio(_mean(vals), alo)} | "
                + " / ".join(_fmt(r.get("cpu_s_per_m"), 1) for r in rows)
                + " | "
                + " / ".join(_fmt(r.get("broker_cpu_s_per_m"), 1) for r in rows)
                + " |"
            )
        a("")
        a(
            f"Input: {cfg['records']:,} records per run. Aligned vs unaligned checkpoints: "
            "see the Pipelines section."
        )
        a("")
    rec = res.get("recovery", [])
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

    # ---- event-time windows (benchmarks/windows.py)
    win = windows_results(res)
    if win["matrix"] or win["sweep"]:
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
        L.extend(windows_render(win, meta))
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
        "`python -m benchmarks.apps.faust_app worker -l info`, "
        "`python -m benchmarks.apps.raw_loop`) until the group has committed every input "
        "offset and the output is stable, then gets SIGTERM."
    )
    a(
        "- Commit / checkpoint interval 1 s for every system (lockgate checkpoint interval, "
        "Quix `commit_interval`, Faust `broker_commit_interval`, raw loop commit or "
        "transaction every 1 s). Producers: linger 5 ms, lz4 (Faust: `producer_linger=0.005`, "
        "lz4; Quix: its defaults)."
    )
    a(
        "- raw loop: `consume(1000)` -> `orjson.loads` -> workload -> `orjson.dumps` -> "
        "`produce`; at-least-once: flush + synchronous offset commit per second; exactly-once "
        "(`sum_eos`, `window`): one transaction per second with `send_offsets_to_transaction`. "
        "Its state is a dict: no changelog, no local database, not durable. It is the ceiling "
        "of a Python consume-process-produce loop, not a competitor."
    )
    a(
        "- lockgate: RocksDB state (rocksdict), changelog per store, one transaction per "
        "epoch. Window: its window operator (`Watermarks.bounded(delay)`, "
        "`.window(Tumbling(size)).count()`), per-key-group watermarks; the raw loop and "
        "Faust implement the same closing rule by hand (see the Windows section)."
    )
    a(
        "- Quix Streams: `Application(processing_guarantee=..., commit_interval=1.0)`, "
        "`sdf.apply(stateful=True)` for the sum (RocksDB state + changelog), and its native "
        "`tumbling_window(duration_ms=size, grace_ms=delay).count()"
        '.final(closing_strategy="partition")` for the window: a window closes when its '
        "partition's newest timestamp passes end + grace (the same windows as lockgate's)."
    )
    a(
        "- Faust: faust-streaming with the `rocksdb://` store (rocksdict), one agent per "
        "workload (`async for key, value in stream.items()`, `await topic.send()`), "
        "`processing_guarantee='exactly_once'` for the exactly-once workloads. It runs with "
        "`-l info` because at the default WARN level Faust's worker sets the root logger to "
        "DEBUG to drive its terminal spinner, which costs ~8% (measured)."
    )
    a(
        "- Input sizes: the peers are 10-200x slower than lockgate, so to fit the run in its "
        "time budget they process a prefix of the same seeded input (Quix Streams "
        f"{_records_for(cfg, 'quix'):,}, Faust {_records_for(cfg, 'faust'):,} records, "
        f"lockgate and the raw loop {cfg['records']:,}). Rates are steady-state rates over "
        "at least several seconds each; the smaller inputs touch fewer distinct keys "
        "(fewer state entries), which favours the peers if anything."
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
    a("BENCH_RECORDS=50000 BENCH_REPEAT=1 BENCH_RECOVERY_KEYS=10000 make bench")
    a("```")
    a("")
    steps = res.get("step_seconds", {})
    if steps:
        a("Time per step (s): " + ", ".join(f"{k} {val}" for k, val in steps.items()) + ".")
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
    state_pct = total("ValueState.value") + total("ValueState.update")
    parts = [
        f"Per-record path (`Runner._process`, inclusive) {total('Runner._process'):.0f}% of "
        f"the samples: the handler {total('_sum '):.0f}%, of which `ctx.emit` (encode + "
        f"produce of the output) {total('Context.emit'):.0f}% and keyed state access "
        f"(`ValueState.value` + `update`) {state_pct:.0f}%.",
        f"Epoch commit (`Runner._end_epoch`, inclusive) {total('Runner._end_epoch'):.0f}%: "
        f"encoding every dirty key (`StoreCache.drain` {own('StoreCache.drain'):.0f}%), "
        "producing it to the changelog, the RocksDB write batch "
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
    if system == "quix":
        return min(records, cfg.get("quix_records") or max(5_000, records // 10))
    if system == "faust":
        return min(records, cfg.get("faust_records") or max(5_000, records // 100))
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
