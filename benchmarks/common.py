"""Settings, paths and progress output shared by the harness modules."""

from __future__ import annotations

import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

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

    records: int = field(default_factory=lambda: _int("BENCH_RECORDS", 1_000_000))
    quix_records: int = field(default_factory=lambda: _int("BENCH_QUIX_RECORDS", 0))
    faust_records: int = field(default_factory=lambda: _int("BENCH_FAUST_RECORDS", 0))
    keys: int = field(default_factory=lambda: _int("BENCH_KEYS", 100_000))
    partitions: int = field(default_factory=lambda: _int("BENCH_PARTITIONS", 8))
    window_keys: int = field(default_factory=lambda: _int("BENCH_WINDOW_KEYS", 1_000))
    windows: int = field(default_factory=lambda: _int("BENCH_WINDOWS", 10))
    window_ms: int = field(default_factory=lambda: _int("BENCH_WINDOW_MS", 10_000))
    repeat: int = field(default_factory=lambda: _int("BENCH_REPEAT", 2))
    systems: list[str] = field(
        default_factory=lambda: _list("BENCH_SYSTEMS", "raw,lockgate,quix,faust")
    )
    workloads: list[str] = field(
        default_factory=lambda: _list("BENCH_WORKLOADS", "passthrough,sum_alo,sum_eos,window")
    )
    steps: list[str] = field(
        default_factory=lambda: _list(
            "BENCH_STEPS", "matrix,sweep,recovery,latency,profile,pipeline,enrich"
        )
    )
    sweep_intervals: list[int] = field(
        default_factory=lambda: [int(x) for x in _list("BENCH_SWEEP_INTERVALS", "100,1000,5000")]
    )
    recovery_keys: list[int] = field(
        default_factory=lambda: [
            int(x.replace("_", "")) for x in _list("BENCH_RECOVERY_KEYS", "10000,100000,1000000")
        ]
    )
    latency_rate: int = field(default_factory=lambda: _int("BENCH_LATENCY_RATE", 2_000))
    latency_seconds: int = field(default_factory=lambda: _int("BENCH_LATENCY_SECONDS", 15))
    profile_workloads: list[str] = field(
        default_factory=lambda: _list("BENCH_PROFILE_WORKLOADS", "sum_eos,sum_alo,sum_eos+native")
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
        and values). Defaults: Quix Streams 1/10, Faust 1/100 of BENCH_RECORDS (at least
        5,000 records), so that their runs last about as long as lockgate's.
        """
        if system == "quix":
            return min(self.records, self.quix_records or max(5_000, self.records // 10))
        if system == "faust":
            return min(self.records, self.faust_records or max(5_000, self.records // 100))
        return self.records

    def window_keys_for(self, records: int) -> int:
        """Keys of the window input of ``records`` records (same records per window)."""
        return max(10, round(self.window_keys * records / self.records))

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
            f"BENCH_WINDOW_KEYS={self.window_keys} BENCH_WINDOWS={self.windows} "
            f"BENCH_WINDOW_MS={self.window_ms} "
            f"BENCH_RECOVERY_KEYS={','.join(map(str, self.recovery_keys))} "
            f"BENCH_LATENCY_RATE={self.latency_rate} "
            f"BENCH_LATENCY_SECONDS={self.latency_seconds}"
        )
