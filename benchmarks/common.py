"""Settings, paths and progress output shared by the harness modules."""

from __future__ import annotations

import json
import os
import sys
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from benchmarks.broker import Admin

ROOT = Path(__file__).resolve().parents[1]
BENCH_DIR = ROOT / "benchmarks"
CACHE = ROOT / ".cache" / "bench"
VENVS = CACHE / "venvs"
MAIN_PY = ROOT / ".venv" / "bin" / "python"
LOCKGATE_BIN = ROOT / ".venv" / "bin" / "lockgate"

_T0 = time.monotonic()


def say(msg: str) -> None:
    """Print one progress line on stderr, prefixed with the elapsed time."""
    el = time.monotonic() - _T0
    print(f"[bench {int(el // 60):02d}:{el % 60:04.1f}] {msg}", file=sys.stderr, flush=True)


def elapsed() -> float:
    """Seconds since the harness started."""
    return time.monotonic() - _T0


def _int(name: str, default: int) -> int:
    raw = os.environ.get(name, "").replace("_", "")
    return int(raw) if raw else default


def _list(name: str, default: str) -> list[str]:
    return [x.strip() for x in os.environ.get(name, default).split(",") if x.strip()]


@dataclass
class Config:
    """Everything a run can be tuned with (``BENCH_*`` environment variables)."""

    records: int = field(default_factory=lambda: _int("BENCH_RECORDS", 500_000))
    quix_records: int = field(default_factory=lambda: _int("BENCH_QUIX_RECORDS", 0))
    faust_records: int = field(default_factory=lambda: _int("BENCH_FAUST_RECORDS", 0))
    keys: int = field(default_factory=lambda: _int("BENCH_KEYS", 100_000))
    partitions: int = field(default_factory=lambda: _int("BENCH_PARTITIONS", 8))
    window_keys: int = field(default_factory=lambda: _int("BENCH_WINDOW_KEYS", 1_000))
    windows: int = field(default_factory=lambda: _int("BENCH_WINDOWS", 10))
    window_ms: int = field(default_factory=lambda: _int("BENCH_WINDOW_MS", 10_000))
    #: bounded out-of-orderness of the window input's event times, and every system's
    #: watermark delay / grace period
    window_delay_ms: int = field(default_factory=lambda: _int("BENCH_WINDOW_DELAY_MS", 2_000))
    #: window sweep points ``keys:window_ms[:delay_ms]`` (event time always spans
    #: BENCH_WINDOWS x BENCH_WINDOW_MS; delay default BENCH_WINDOW_DELAY_MS)
    window_sweep: str = field(
        default_factory=lambda: os.environ.get(
            "BENCH_WINDOW_SWEEP", "1000:1000,1000:1000:10000,10000:10000,10000:10000:10000"
        )
    )
    #: runs per window sweep point (the sweep is lockgate alone: no interleaving needed)
    window_sweep_repeat: int = field(default_factory=lambda: _int("BENCH_WINDOW_SWEEP_REPEAT", 1))
    #: input records per window sweep point (0: BENCH_RECORDS)
    window_sweep_records: int = field(default_factory=lambda: _int("BENCH_WINDOW_SWEEP_RECORDS", 0))
    repeat: int = field(default_factory=lambda: _int("BENCH_REPEAT", 5))
    systems: list[str] = field(
        default_factory=lambda: _list("BENCH_SYSTEMS", "raw,lockgate,quix,quix_handler,faust")
    )
    workloads: list[str] = field(
        default_factory=lambda: _list("BENCH_WORKLOADS", "passthrough,sum_alo,sum_eos,window")
    )
    steps: list[str] = field(
        default_factory=lambda: _list(
            "BENCH_STEPS",
            "matrix,sweep,windows,recovery,latency,profile,pipeline,enrich,nexmark",
        )
    )
    #: commit / checkpoint intervals (ms) of the sweep; 1000 comes from the matrix
    sweep_intervals: list[int] = field(
        default_factory=lambda: [int(x) for x in _list("BENCH_SWEEP_INTERVALS", "1000,5000")]
    )
    #: systems of the sweep (each at every interval, interleaved)
    sweep_systems: list[str] = field(
        default_factory=lambda: _list("BENCH_SWEEP_SYSTEMS", "raw,lockgate,quix,faust")
    )
    #: workloads of the sweep (keyed running sum exactly-once and at-least-once)
    sweep_workloads: list[str] = field(
        default_factory=lambda: _list("BENCH_SWEEP_WORKLOADS", "sum_eos,sum_alo")
    )
    #: repeats of the sweep's own runs (0: BENCH_REPEAT)
    sweep_repeat: int = field(default_factory=lambda: _int("BENCH_SWEEP_REPEAT", 2))
    #: seconds of broker idle CPU measured before each block of runs
    idle_seconds: float = field(
        default_factory=lambda: float(os.environ.get("BENCH_IDLE_SECONDS", "2"))
    )
    recovery_keys: list[int] = field(
        default_factory=lambda: [
            int(x.replace("_", "")) for x in _list("BENCH_RECOVERY_KEYS", "10000,100000")
        ]
    )
    latency_rate: int = field(default_factory=lambda: _int("BENCH_LATENCY_RATE", 2_000))
    latency_seconds: int = field(default_factory=lambda: _int("BENCH_LATENCY_SECONDS", 10))
    profile_workloads: list[str] = field(
        default_factory=lambda: _list("BENCH_PROFILE_WORKLOADS", "sum_eos")
    )
    run_timeout: int = field(default_factory=lambda: _int("BENCH_RUN_TIMEOUT", 240))
    kafka_port: int = field(default_factory=lambda: _int("BENCH_KAFKA_PORT", 49092))
    keep_broker: bool = field(default_factory=lambda: os.environ.get("BENCH_KEEP_BROKER") == "1")
    #: host:port of a broker that already runs: the harness neither starts nor stops it
    #: and deletes only topics with "bench" in their name.
    external_broker: str = field(default_factory=lambda: os.environ.get("BENCH_BROKER", ""))

    def records_for(self, system: str) -> int:
        """Input size of ``system``: the peers are 10-200x slower, so they get less input.

        A smaller running-sum input is a prefix of the larger one (same seed: same keys
        and values). Defaults: Quix Streams (both variants) 1/20, Faust 1/200 of
        BENCH_RECORDS (at least 2,500 records), so that their runs last a few seconds,
        as lockgate's do, and make bench stays within its time budget.
        """
        if system in ("quix", "quix_handler"):
            return min(self.records, self.quix_records or max(2_500, self.records // 20))
        if system == "faust":
            return min(self.records, self.faust_records or max(2_500, self.records // 200))
        return self.records

    def window_keys_for(self, records: int) -> int:
        """Keys of the window input of ``records`` records (same records per window)."""
        return max(10, round(self.window_keys * records / self.records))

    @property
    def sweep_records(self) -> int:
        """Input records per window sweep point."""
        return self.window_sweep_records or self.records

    @property
    def bootstrap(self) -> str:
        """The bootstrap address of the harness's own broker (or of BENCH_BROKER)."""
        return self.external_broker or f"127.0.0.1:{self.kafka_port}"

    def env_line(self) -> str:
        """The BENCH_* settings as a shell prefix (for RESULTS.md)."""
        return (
            f"BENCH_RECORDS={self.records} BENCH_QUIX_RECORDS={self.records_for('quix')} "
            f"BENCH_FAUST_RECORDS={self.records_for('faust')} BENCH_KEYS={self.keys} "
            f"BENCH_PARTITIONS={self.partitions} BENCH_REPEAT={self.repeat} "
            f"BENCH_SYSTEMS={','.join(self.systems)} "
            f"BENCH_SWEEP_INTERVALS={','.join(map(str, self.sweep_intervals))} "
            f"BENCH_SWEEP_SYSTEMS={','.join(self.sweep_systems)} "
            f"BENCH_SWEEP_WORKLOADS={','.join(self.sweep_workloads)} "
            f"BENCH_SWEEP_REPEAT={self.sweep_repeat or self.repeat} "
            f"BENCH_IDLE_SECONDS={self.idle_seconds:g} "
            f"BENCH_WINDOW_KEYS={self.window_keys} BENCH_WINDOWS={self.windows} "
            f"BENCH_WINDOW_MS={self.window_ms} BENCH_WINDOW_DELAY_MS={self.window_delay_ms} "
            f"BENCH_WINDOW_SWEEP={self.window_sweep} "
            f"BENCH_WINDOW_SWEEP_RECORDS={self.sweep_records} "
            f"BENCH_WINDOW_SWEEP_REPEAT={self.window_sweep_repeat} "
            f"BENCH_RECOVERY_KEYS={','.join(map(str, self.recovery_keys))} "
            f"BENCH_LATENCY_RATE={self.latency_rate} "
            f"BENCH_LATENCY_SECONDS={self.latency_seconds} "
            f"BENCH_PROFILE_WORKLOADS={','.join(self.profile_workloads)}"
        )


class Bench(Protocol):
    """What :func:`run_standalone` drives: ``run()`` returns the section's results;
    ``results`` holds them so far (kept when the run is interrupted)."""

    results: dict[str, Any]

    def run(self) -> dict[str, Any]: ...


@dataclass
class Standalone:
    """The outcome of :func:`run_standalone`."""

    out_dir: Path
    meta: dict[str, Any]
    results: dict[str, Any]
    code: int
    #: the JSON written to ``out_dir`` (``{"meta": ..., <section>: ...}``)
    doc: str


def run_standalone(
    cfg: Config,
    section: str,
    json_name: str,
    command: str,
    title: str,
    make_bench: Callable[[Admin, Path, str], Bench],
    *,
    keep_errors: bool = False,
) -> Standalone:
    """Run one section of the harness on its own: a fresh ``benchmarks/out/<timestamp>/``,
    the run's meta data, the harness's own broker (or ``BENCH_BROKER``'s, neither started
    nor stopped), the bench (Ctrl-C keeps the partial results, exit code 130; with
    ``keep_errors`` any other exception too, added to ``errors``), then
    ``out_dir/<json_name>`` with ``{"meta": ..., <section>: results}``.

    ``command`` is the command line for the meta data (``BENCH_BROKER=...`` is prepended
    when set), ``title`` starts the first progress line, ``make_bench(admin, out_dir,
    run_id)`` builds the bench.
    """
    from benchmarks import broker
    from benchmarks.run import _dirty, _sh, machine, uptime

    def git() -> str:
        return _sh("git", "-C", str(ROOT), "rev-parse", "--short", "HEAD") + _dirty()

    stamp = time.strftime("%Y%m%d-%H%M%S")
    out_dir = BENCH_DIR / "out" / stamp
    out_dir.mkdir(parents=True, exist_ok=True)
    external = os.environ.get("BENCH_BROKER", "")
    meta: dict[str, Any] = {
        "started": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
        "command": (f"BENCH_BROKER={external} " if external else "") + command,
        "machine": machine(),
        "uptime_before": uptime(),
        "git": git(),
    }
    say(f"{title}; output {out_dir}")
    res: dict[str, Any] = {}
    code = 0
    if external:
        bootstrap = external
        meta["broker"] = f"existing broker at {external} (not started or stopped by the harness)"
    else:
        bootstrap = broker.up(cfg.kafka_port)
        meta["broker"] = f"Kafka {broker.kafka_version()} started by the harness on {bootstrap}"
    try:
        admin = broker.Admin(bootstrap)
        bench = make_bench(admin, out_dir, stamp[-6:])
        try:
            res = bench.run()
        except KeyboardInterrupt:
            code = 130
            res = bench.results
        except Exception as exc:
            if not keep_errors:
                raise
            say(f"harness error: {exc!r}")
            res = bench.results
            res["errors"].append(traceback.format_exc())
    finally:
        if not external:
            broker.down(cfg.kafka_port)
    meta["uptime_after"] = uptime()
    meta["git_after"] = git()
    meta["total_minutes"] = elapsed() / 60
    doc = json.dumps({"meta": meta, section: res}, indent=1)
    (out_dir / json_name).write_text(doc)
    return Standalone(out_dir, meta, res, code, doc)


def splice_section(
    path: Path, section: list[str], begin: str, end: str, after: str | None = None
) -> str:
    """The text of results file ``path`` (a new one's if missing) with ``section`` in
    place of the one between ``begin`` and ``end``; without one, inserted after marker
    ``after`` (when given and present), else before the profiles (or the method), else
    appended."""
    text = path.read_text() if path.exists() else "# lockgate benchmarks: results\n"
    block = "\n".join(section)
    if begin in text and end in text:
        head, rest = text.split(begin, 1)
        return head + block + rest.split(end, 1)[1]
    if after is not None and after in text:
        i = text.index(after) + len(after)
        return text[:i] + "\n\n" + block + text[i:]
    for anchor in ("\n## Profile", "\n## Method"):
        if anchor in text:
            i = text.index(anchor)
            return text[: i + 1] + block + "\n\n" + text[i + 1 :]
    return text.rstrip("\n") + "\n\n" + block + "\n"


def section_footer(
    res: dict[str, Any], results_file: str, command: str, step: str, end: str
) -> list[str]:
    """The last lines of a RESULTS.md section: notes added by hand to the results file
    (then ``--render``), the error count, how to reproduce it, the ``end`` marker."""
    lines = [f"- {note}" for note in res.get("notes", [])]
    if res.get("notes"):
        lines.append("")
    if res.get("errors"):
        lines += [f"Errors in this section: {len(res['errors'])} (see {results_file}).", ""]
    lines += [
        f"Reproduce: `{res.get('env_line', '')} {command}` (or the `{step}` step of `make bench`).",
        "",
        end,
    ]
    return lines
