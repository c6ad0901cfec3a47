"""The harness's settings: the ``BENCH_*`` environment variables."""

from __future__ import annotations

import os
from dataclasses import dataclass, field


def env_int(name: str, default: int) -> int:
    """Integer variable ``name`` (``_`` digit separators allowed), else ``default``."""
    raw = os.environ.get(name, "").replace("_", "")
    return int(raw) if raw else default


def env_list(name: str, default: str) -> list[str]:
    """Comma-separated variable ``name`` (else ``default``), blanks dropped."""
    return [x.strip() for x in os.environ.get(name, default).split(",") if x.strip()]


@dataclass
class Config:
    """Everything a run can be tuned with (``BENCH_*`` environment variables)."""

    records: int = field(default_factory=lambda: env_int("BENCH_RECORDS", 500_000))
    quix_records: int = field(default_factory=lambda: env_int("BENCH_QUIX_RECORDS", 0))
    faust_records: int = field(default_factory=lambda: env_int("BENCH_FAUST_RECORDS", 0))
    keys: int = field(default_factory=lambda: env_int("BENCH_KEYS", 100_000))
    partitions: int = field(default_factory=lambda: env_int("BENCH_PARTITIONS", 8))
    window_keys: int = field(default_factory=lambda: env_int("BENCH_WINDOW_KEYS", 1_000))
    windows: int = field(default_factory=lambda: env_int("BENCH_WINDOWS", 10))
    window_ms: int = field(default_factory=lambda: env_int("BENCH_WINDOW_MS", 10_000))
    #: bounded out-of-orderness of the window input's event times, and every system's
    #: watermark delay / grace period
    window_delay_ms: int = field(default_factory=lambda: env_int("BENCH_WINDOW_DELAY_MS", 2_000))
    #: window sweep points ``keys:window_ms[:delay_ms]`` (event time always spans
    #: BENCH_WINDOWS x BENCH_WINDOW_MS; delay default BENCH_WINDOW_DELAY_MS)
    window_sweep: str = field(
        default_factory=lambda: os.environ.get(
            "BENCH_WINDOW_SWEEP", "1000:1000,1000:1000:10000,10000:10000,10000:10000:10000"
        )
    )
    #: runs per window sweep point (the sweep is lockgate alone: no interleaving needed)
    window_sweep_repeat: int = field(
        default_factory=lambda: env_int("BENCH_WINDOW_SWEEP_REPEAT", 1)
    )
    #: input records per window sweep point (0: BENCH_RECORDS)
    window_sweep_records: int = field(
        default_factory=lambda: env_int("BENCH_WINDOW_SWEEP_RECORDS", 0)
    )
    repeat: int = field(default_factory=lambda: env_int("BENCH_REPEAT", 5))
    systems: list[str] = field(
        default_factory=lambda: env_list("BENCH_SYSTEMS", "raw,lockgate,quix,quix_handler,faust")
    )
    workloads: list[str] = field(
        default_factory=lambda: env_list("BENCH_WORKLOADS", "passthrough,sum_alo,sum_eos,window")
    )
    steps: list[str] = field(
        default_factory=lambda: env_list(
            "BENCH_STEPS",
            "matrix,sweep,windows,recovery,latency,profile,pipeline,enrich,failover,nexmark",
        )
    )
    #: commit / checkpoint intervals (ms) of the sweep; 1000 comes from the matrix
    sweep_intervals: list[int] = field(
        default_factory=lambda: [int(x) for x in env_list("BENCH_SWEEP_INTERVALS", "1000,5000")]
    )
    #: systems of the sweep (each at every interval, interleaved)
    sweep_systems: list[str] = field(
        default_factory=lambda: env_list("BENCH_SWEEP_SYSTEMS", "raw,lockgate,quix,faust")
    )
    #: workloads of the sweep (keyed running sum exactly-once and at-least-once)
    sweep_workloads: list[str] = field(
        default_factory=lambda: env_list("BENCH_SWEEP_WORKLOADS", "sum_eos,sum_alo")
    )
    #: repeats of the sweep's own runs (0: BENCH_REPEAT)
    sweep_repeat: int = field(default_factory=lambda: env_int("BENCH_SWEEP_REPEAT", 2))
    #: seconds of broker idle CPU measured before each block of runs
    idle_seconds: float = field(
        default_factory=lambda: float(os.environ.get("BENCH_IDLE_SECONDS", "2"))
    )
    recovery_keys: list[int] = field(
        default_factory=lambda: [
            int(x.replace("_", "")) for x in env_list("BENCH_RECOVERY_KEYS", "10000,100000")
        ]
    )
    latency_rate: int = field(default_factory=lambda: env_int("BENCH_LATENCY_RATE", 2_000))
    latency_seconds: int = field(default_factory=lambda: env_int("BENCH_LATENCY_SECONDS", 10))
    profile_workloads: list[str] = field(
        default_factory=lambda: env_list("BENCH_PROFILE_WORKLOADS", "sum_eos")
    )
    run_timeout: int = field(default_factory=lambda: env_int("BENCH_RUN_TIMEOUT", 240))
    kafka_port: int = field(default_factory=lambda: env_int("BENCH_KAFKA_PORT", 49092))
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
