"""One measured run: start a system on a pre-produced input, watch it finish, check it.

Throughput: every output record is read back with read_committed (so aborted ones do
not count) from an output topic with ``message.timestamp.type=LogAppendTime``; the
rate is the records between the first and the last output's broker append time. The
harness also samples, every 0.2 s, the consumer group's committed input offsets (to
know when the run is complete), the output's last stable offsets (a secondary
"visible" rate), and the CPU of the process tree (utime+stime from /proc/<pid>/stat,
children included), which is interpolated at the first and last append time. Peak
RSS is the sum of VmHWM over the process tree just before it is stopped.

Window workload: outputs are not one per input, so the rate counts the input records
consumed between the first and the last output: the group's committed input offsets
(sampled), interpolated linearly between the samples where they changed (the first
commit's records spread over the commit interval before it), taken at the first and the
last output's append time. When fewer than two commits fall within that span (a run of a
second or two), the model's count stands in: the input records between the first and
the last window-closing record (``rate_basis`` says which).

Broker CPU: the broker's utime+stime over the same span minus its idle rate (measured
with nothing running for ``BENCH_IDLE_SECONDS`` before the run, or before the block of
runs it belongs to) times the span. The 1-minute load average is read before and after
every run.
"""

from __future__ import annotations

import os
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from benchmarks import proc as procs
from benchmarks.admin import Admin, GroupOffsets
from benchmarks.broker import broker_pid
from benchmarks.config import Config
from benchmarks.data import Dataset, read_output
from benchmarks.paths import LOCKGATE_BIN, MAIN_PY, VENVS
from benchmarks.progress import say


@dataclass(frozen=True)
class Workload:
    """A benchmark workload: which input, which app logic, which guarantee."""

    name: str
    dataset: str  # "numbers" | "events"
    logic: str  # "passthrough" | "sum" | "window"
    eos: bool
    title: str


WORKLOADS = {
    "passthrough": Workload(
        "passthrough", "numbers", "passthrough", False, "stateless passthrough (at-least-once)"
    ),
    "sum_alo": Workload(
        "sum_alo", "numbers", "sum", False, "keyed running sum, 100k keys (at-least-once)"
    ),
    "sum_eos": Workload(
        "sum_eos", "numbers", "sum", True, "keyed running sum, 100k keys (exactly-once)"
    ),
    "window": Workload(
        "window",
        "events",
        "window",
        True,
        "tumbling-window count per key, event time (exactly-once)",
    ),
}

SYSTEMS = ["raw", "lockgate", "quix", "quix_handler", "faust"]
#: systems that run only some workloads (quix_handler: Quix Streams running the raw
#: loop's / Faust's per-record window handler instead of its native window)
ONLY = {"quix_handler": {"window"}}


def runs_workload(system: str, workload: str) -> bool:
    """Whether ``system`` takes part in ``workload``."""
    return workload in ONLY.get(system, {workload})


LOCKGATE_APPS = {"passthrough": "passthrough", "sum": "running_sum", "window": "window"}


@dataclass
class RunSpec:
    """What to start for one run."""

    system: str
    workload: Workload
    tag: str
    commit_ms: int = 1000
    env: dict[str, str] = field(default_factory=dict)


def command(system: str, logic: str) -> list[str]:
    """The argv that runs ``logic`` on ``system``."""
    if system == "raw":
        return [str(MAIN_PY), "-m", "benchmarks.apps.raw_loop"]
    if system == "lockgate":
        return [str(LOCKGATE_BIN), "run", f"benchmarks.apps.lockgate_apps:{LOCKGATE_APPS[logic]}"]
    if system in ("quix", "quix_handler"):
        return [str(VENVS / "quix" / "bin" / "python"), "-m", "benchmarks.apps.quix_app"]
    if system == "faust":
        return [
            str(VENVS / "faust" / "bin" / "python"),
            "-m",
            "benchmarks.apps.faust_app",
            "--loop=uvloop",  # read by `import faust` (mode.loop.use)
            "worker",
            "-l",
            "info",  # below WARN: disables the spinner, which sets the root logger to DEBUG
        ]
    raise ValueError(system)


def app_env(cfg: Config, spec: RunSpec, ds: Dataset, output: str, state_dir: Path) -> dict:
    """Environment of one run (BENCH_* for every system, LOCKGATE_* for lockgate)."""
    w = spec.workload
    env = {
        "BENCH_BOOTSTRAP": cfg.bootstrap,
        "BENCH_INPUT": ds.topic,
        "BENCH_OUTPUT": output,
        "BENCH_GROUP": f"bench-{spec.tag}",
        "BENCH_WORKLOAD": w.logic,
        "BENCH_GUARANTEE": "eos" if w.eos else "alo",
        "BENCH_COMMIT_MS": str(spec.commit_ms),
        "BENCH_WINDOW_MS": str(ds.window_ms or cfg.window_ms),
        "BENCH_WINDOW_DELAY_MS": str(ds.delay_ms),
        "BENCH_STATE_DIR": str(state_dir),
        "BENCH_PARTITIONS": str(cfg.partitions),
        "PYTHONUNBUFFERED": "1",
    }
    if spec.system in ("quix", "quix_handler"):
        env["BENCH_QUIX_WINDOW"] = "handler" if spec.system == "quix_handler" else "native"
    if spec.system == "lockgate":
        env.update(
            {
                "LOCKGATE_BOOTSTRAP_SERVERS": cfg.bootstrap,
                "LOCKGATE_APP_NAME": f"bench-{spec.tag}",
                "LOCKGATE_INSTANCE_ID": "b1",
                "LOCKGATE_STATE_DIR": str(state_dir),
                "LOCKGATE_GUARANTEE": "exactly_once" if w.eos else "at_least_once",
                "LOCKGATE_CHECKPOINT_INTERVAL_MS": str(spec.commit_ms),
                "LOCKGATE_HTTP_PORT": "0",
                "LOCKGATE_LOG_FORMAT": "console",
            }
        )
    env.update(spec.env)
    return env


def loadavg() -> float:
    """The 1-minute load average."""
    return float(Path("/proc/loadavg").read_text().split()[0])


def _broker_cpu(port: int) -> float:
    pid = broker_pid(port)
    return procs.cpu_seconds(pid) if pid else 0.0


def broker_idle(cfg: Config) -> float | None:
    """The broker's CPU utilisation (CPU s per s) over ``cfg.idle_seconds`` with nothing
    of the harness running; None when its pid is unknown."""
    pid = broker_pid(cfg.kafka_port)
    if not pid or cfg.idle_seconds <= 0:
        return None
    c0, t0 = procs.cpu_seconds(pid), time.monotonic()
    time.sleep(cfg.idle_seconds)
    return round((procs.cpu_seconds(pid) - c0) / (time.monotonic() - t0), 4)


def measure(
    cfg: Config,
    admin: Admin,
    spec: RunSpec,
    ds: Dataset,
    out_dir: Path,
    on_started: Any = None,
    idle: float | None = None,
) -> dict[str, Any]:
    """Run ``spec`` on ``ds`` until every input offset is committed; return the figures.

    ``on_started(proc)`` is called once the first output is visible (the profiler
    attaches there) and may return a callable that is called when the run is done.
    ``idle``: the broker's idle CPU utilisation measured just before (else measured here).
    """
    w = spec.workload
    if idle is None:
        idle = broker_idle(cfg)
    output = f"bench.{spec.tag}.out"
    admin.create({output: cfg.partitions}, {"message.timestamp.type": "LogAppendTime"})
    state_dir = out_dir / "state" / spec.tag
    shutil.rmtree(state_dir, ignore_errors=True)
    state_dir.mkdir(parents=True)
    env = app_env(cfg, spec, ds, output, state_dir)
    if spec.system == "faust":
        # Faust creates its table's changelog at start-up and may read the metadata before
        # the topic is visible: its agent then crashes with PartitionsMismatch and the
        # worker hangs (seen once in ~20 runs). Created here, with Faust's own settings.
        changelog = f"{env['BENCH_GROUP']}-state-changelog"
        admin.create({changelog: cfg.partitions}, {"cleanup.policy": "compact"})
    groups = GroupOffsets(cfg.bootstrap, env["BENCH_GROUP"], ds.topic, cfg.partitions)
    log_path = out_dir / "logs" / f"{spec.tag}.log"
    log_path.parent.mkdir(parents=True, exist_ok=True)
    load_before = loadavg()
    p = procs.Proc(command(spec.system, w.logic), env, log_path)
    samples: list[tuple[float, list[int], int, float, float]] = []
    deadline = time.monotonic() + cfg.run_timeout
    status = "ok"
    done_at: float | None = None
    stable_since: float | None = None
    finish_hook = None
    started_hook = False
    last_lso: list[int] = []
    try:
        while True:
            t = time.time()
            try:
                lso = admin.end_offsets(output, cfg.partitions, committed=True, timeout=5)
            except Exception:  # noqa: BLE001 - a slow answer: skip this sample
                lso = last_lso or [0] * cfg.partitions
            committed = groups.committed()
            samples.append((t, lso, committed, p.cpu(), _broker_cpu(cfg.kafka_port)))
            if not started_hook and on_started is not None and sum(lso) > 0:
                started_hook = True
                finish_hook = on_started(p)
            if committed >= ds.records:
                if lso != last_lso:
                    stable_since = t
                elif stable_since is not None and t - stable_since >= 1.0:
                    done_at = t
                    break
                stable_since = stable_since or t
            last_lso = lso
            if not p.alive:
                status = f"exited with code {p.popen.returncode}"
                break
            if time.monotonic() > deadline:
                status = f"timeout after {cfg.run_timeout}s"
                break
            time.sleep(0.2)
        rss = p.rss_mb()
    finally:
        if finish_hook is not None:
            finish_hook()
        code = p.stop(timeout=30)
        groups.close()
    load_after = loadavg()
    if status != "ok":
        say(f"  !! {spec.tag}: {status}; log tail:\n{p.log_tail()}")
    out = read_output(cfg.bootstrap, output, w.name, ds)
    check = out.check()
    res: dict[str, Any] = {
        "system": spec.system,
        "workload": w.name,
        "tag": spec.tag,
        "commit_ms": spec.commit_ms,
        "status": status,
        "exit_code": code,
        "peak_rss_mb": round(rss, 1),
        "load_before": load_before,
        "load_after": load_after,
        "broker_idle_util": idle,
        "check": check,
        "ok": status == "ok" and check["ok"],
    }
    res.update(_rates(samples, out, ds, w, p.started, done_at, spec.commit_ms / 1000, idle))
    res["records_in"] = ds.records
    shutil.rmtree(state_dir, ignore_errors=True)
    return res


def _interp(series: list[tuple[float, float]], t: float) -> float:
    """Linear interpolation of a sampled (time, value) series at ``t``."""
    if not series:
        return 0.0
    if t <= series[0][0]:
        return series[0][1]
    for (t0, v0), (t1, v1) in zip(series, series[1:], strict=False):
        if t0 <= t <= t1:
            return v0 if t1 == t0 else v0 + (v1 - v0) * (t - t0) / (t1 - t0)
    return series[-1][1]


def _progress(
    samples: list[tuple[float, list[int], int, float, float]], commit_s: float, started: float
) -> list[tuple[float, float]]:
    """Input records consumed over time, from the committed offsets: one point per sample
    where the sum changed, and the first commit's records spread over the commit interval
    before it (not before the process started)."""
    pts: list[tuple[float, float]] = []
    last = 0
    for t, _, c, _, _ in samples:
        if c > last:
            if not pts:
                pts.append((max(started, t - commit_s), 0.0))
            pts.append((t, float(c)))
            last = c
    return pts


def _rates(
    samples: list[tuple[float, list[int], int, float, float]],
    out: Any,
    ds: Dataset,
    w: Workload,
    started: float,
    done_at: float | None,
    commit_s: float = 1.0,
    idle: float | None = None,
) -> dict[str, Any]:
    """Throughput, CPU and startup figures.

    Rate: output records (read_committed) between the first and the last output's
    LogAppendTime; for the window workload the input records consumed over the same span
    (committed input offsets interpolated at the two append times; see the module doc).
    """
    res: dict[str, Any] = {"rate": None, "cpu_s_per_m": None}
    if out.total < 2 or out.last_ts <= out.first_ts:
        return res
    t_first, t_last = out.first_ts / 1000, out.last_ts / 1000
    secs = t_last - t_first
    if w.logic == "window":
        prog = _progress(samples, commit_s, started)
        inside = sum(1 for t, _ in prog[1:] if t_first <= t <= t_last)
        n = round(_interp(prog, t_last) - _interp(prog, t_first))
        res["rate_basis"] = "committed input offsets"
        if inside < 2 or n <= 0:
            # Fewer than two commits inside the span: interpolating within one commit
            # interval says little, so the model's count (input records between the
            # first and the last window-closing record) stands in.
            n = ds.trigger_span
            res["rate_basis"] = "model (fewer than 2 commits within the output span)"
    else:
        n = out.total - 1
    cpu = [(t, c) for t, _, _, c, _ in samples]
    bcpu = [(t, c) for t, _, _, _, c in samples]
    used = _interp(cpu, t_last) - _interp(cpu, t_first)
    bused = _interp(bcpu, t_last) - _interp(bcpu, t_first)
    bnet = max(0.0, bused - (idle or 0.0) * secs)
    res.update(
        rate=round(n / secs),
        seconds=round(secs, 2),
        records_in_window=n,
        startup_s=round(t_first - started, 2),
        cpu_s_per_m=round(used / n * 1e6, 2) if n else None,
        cpu_util=round(used / secs, 2),
        broker_cpu_s_per_m=round(bnet / n * 1e6, 2) if n else None,
        broker_cpu_gross_s_per_m=round(bused / n * 1e6, 2) if n else None,
    )
    # Secondary: the same span measured on commit visibility (read_committed LSO samples).
    if w.logic != "window":
        vis = [(t, out.committed_count(lso)) for t, lso, _, _, _ in samples]
        first = next((v for v in vis if v[1] > 0), None)
        last = next((v for v in vis if v[1] >= out.total), None)
        if first and last and last[0] > first[0]:
            res["rate_visible"] = round((last[1] - first[1]) / (last[0] - first[0]))
    if done_at is not None:
        res["wall_s"] = round(done_at - started, 1)
    return res


def cleanup_topics(admin: Admin, keep: set[str]) -> None:
    """Delete every benchmark-created topic except ``keep`` (inputs)."""
    doomed = [
        t
        for t in admin.topics()
        if t not in keep
        and not t.startswith("__")
        and t != "lockgate.control"
        # a shared broker (BENCH_BROKER): only the harness's own topics
        and (not os.environ.get("BENCH_BROKER") or "bench" in t)
        and t != "lockgate.registry"
    ]
    if not doomed:
        return
    for fut in admin.admin.delete_topics(doomed, operation_timeout=30).values():
        try:
            fut.result(60)
        except Exception:  # noqa: BLE001, S110 - best effort
            pass
