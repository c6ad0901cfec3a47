"""Two-app pipelines (LOCKGATE_ALIGNMENT aligned vs none, labelled unaligned) and savepoints.

Step ``pipeline`` of ``make bench``, or on its own: ``python -m benchmarks.pipeline``
(then it writes ``benchmarks/out/<timestamp>/results.json`` and replaces only the
pipeline section of benchmarks/RESULTS.md; ``--render PATH`` re-renders that section from
such a results.json). ``BENCH_BROKER=host:port`` uses a broker
that is already running (neither started nor stopped; only this run's topics are
deleted); otherwise the harness starts its own on ``BENCH_KAFKA_PORT``.

The apps of examples/click_pipeline.py declare the topic variables they read
(``App(..., env=["LOCKGATE_CLICKS_TOPIC", "LOCKGATE_USER_COUNTS_TOPIC",
"LOCKGATE_OUTPUT_TOPIC"])``); this harness sets them per run.

1. ``throughput``: examples/click_pipeline.py. N clicks are produced once (key = user,
   ``{"region", "seq"}``); per run one ``click_app`` and one ``region_app`` process start
   on fresh topics and consumer groups; a ``read_committed`` reader in the harness
   follows region-totals until every region's total equals its number of clicks. Figures:
   end-to-end records/s (spawn of the two processes -> last total visible) and
   steady-state records/s (first -> last region-totals record, broker append time).
   Aligned and unaligned runs are interleaved, at each checkpoint interval.
2. ``alignment``: ``lockgate_alignment_seconds`` of region_app from /metrics at the end
   of each run (p50/p99 estimated from the buckets, like Prometheus' histogram_quantile).
3. ``savepoint``: examples/running_sum.py with K keys (one record per key), then
   ``lockgate savepoint trigger --app NAME`` (wall time, bytes of the ``.lgs`` files).
4. restore: SIGTERM, one marker record for key 0, a fresh instance (empty state dir) with
   ``LOCKGATE_FROM_SAVEPOINT``; time from its spawn until the marker's output (sum 2:
   the saved state was used) is visible with read_committed.

A slow upstream partition: ``BENCH_PIPELINE_SLOW=STOP_MS/PERIOD_MS`` (e.g. ``300/1000``)
runs the throughput part with a second ``click_app`` instance that the harness stops
(SIGSTOP) for STOP_MS of every PERIOD_MS, so the key groups it owns write their records
and barriers late, as a GC pause or a noisy neighbour would. Aligned mode then holds the
other writers' records at every checkpoint until the slow one's barrier arrives; ``none``
does not. Such a run writes its results.json only (RESULTS.md keeps the regular run's).
"""

from __future__ import annotations

import json
import os
import random
import shutil
import signal
import subprocess
import sys
import threading
import time
import traceback
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from statistics import median
from typing import Any

import orjson
from confluent_kafka import Consumer, KafkaError, Producer, TopicPartition

from benchmarks import proc as procs
from benchmarks.admin import Admin, GroupOffsets, delete_topics
from benchmarks.config import Config, env_int, env_list
from benchmarks.metrics import histogram, metric, quantile, scrape
from benchmarks.paths import BENCH_DIR, LOCKGATE_BIN, ROOT
from benchmarks.ports import free_port
from benchmarks.progress import elapsed, say
from benchmarks.revision import same_runtime
from benchmarks.sections import section_footer, splice_section
from benchmarks.standalone import run_standalone

CLICK_SPEC = "examples.click_pipeline:click_app"
REGION_SPEC = "examples.click_pipeline:region_app"
SUM_SPEC = "examples.running_sum:app"
BEGIN, END = "<!-- pipeline:begin -->", "<!-- pipeline:end -->"
COMMAND = ".venv/bin/python -m benchmarks.pipeline"
#: Transaction timeout of the second restore attempt when the first one fails.
RETRY_TXN_TIMEOUT_MS = 120_000


@dataclass
class PipelineConfig:
    """``BENCH_PIPELINE_*`` / ``BENCH_SAVEPOINT_*`` settings."""

    records: int = field(default_factory=lambda: env_int("BENCH_PIPELINE_RECORDS", 300_000))
    users: int = field(default_factory=lambda: env_int("BENCH_PIPELINE_USERS", 400))
    regions: int = field(default_factory=lambda: env_int("BENCH_PIPELINE_REGIONS", 8))
    partitions: int = field(default_factory=lambda: env_int("BENCH_PIPELINE_PARTITIONS", 4))
    repeat: int = field(default_factory=lambda: env_int("BENCH_PIPELINE_REPEAT", 5))
    intervals: list[int] = field(
        default_factory=lambda: [int(x) for x in env_list("BENCH_PIPELINE_INTERVALS", "1000,200")]
    )
    savepoint_keys: list[int] = field(
        default_factory=lambda: [
            int(x.replace("_", ""))
            for x in env_list("BENCH_SAVEPOINT_KEYS", "10000,100000,1000000")
        ]
    )
    parts: list[str] = field(
        default_factory=lambda: env_list("BENCH_PIPELINE_PARTS", "throughput,savepoint")
    )
    timeout: int = field(default_factory=lambda: env_int("BENCH_PIPELINE_TIMEOUT", 300))
    #: ``STOP_MS/PERIOD_MS`` of a second, periodically stopped click_app instance, or "".
    slow: str = field(default_factory=lambda: os.environ.get("BENCH_PIPELINE_SLOW", ""))

    def slow_ms(self) -> tuple[int, int] | None:
        """(stop, period) in ms of the slow upstream instance, or None."""
        if not self.slow:
            return None
        stop, _, period = self.slow.partition("/")
        if not (stop.isdigit() and period.isdigit() and 0 < int(stop) < int(period)):
            raise SystemExit(f"BENCH_PIPELINE_SLOW={self.slow!r}: expected STOP_MS/PERIOD_MS")
        return int(stop), int(period)

    def env_line(self) -> str:
        return (
            (f"BENCH_PIPELINE_SLOW={self.slow} " if self.slow else "")
            + f"BENCH_PIPELINE_RECORDS={self.records} BENCH_PIPELINE_USERS={self.users} "
            f"BENCH_PIPELINE_REGIONS={self.regions} "
            f"BENCH_PIPELINE_PARTITIONS={self.partitions} "
            f"BENCH_PIPELINE_REPEAT={self.repeat} "
            f"BENCH_PIPELINE_INTERVALS={','.join(map(str, self.intervals))} "
            f"BENCH_SAVEPOINT_KEYS={','.join(map(str, self.savepoint_keys))}"
        )


# ------------------------------------------------------------------ helpers


class _Pauser(threading.Thread):
    """Stops process ``pid`` (SIGSTOP) for ``stop_ms`` of every ``period_ms`` until stopped."""

    def __init__(self, pid: int, stop_ms: int, period_ms: int) -> None:
        super().__init__(daemon=True)
        self.pid, self.stop_s, self.period_s = pid, stop_ms / 1000, period_ms / 1000
        self._halt = threading.Event()

    def stop(self) -> None:
        self._halt.set()
        self.join(5)

    def run(self) -> None:
        try:
            while not self._halt.wait(self.period_s - self.stop_s):
                os.kill(self.pid, signal.SIGSTOP)
                self._halt.wait(self.stop_s)
                os.kill(self.pid, signal.SIGCONT)
            os.kill(self.pid, signal.SIGCONT)
        except ProcessLookupError:
            pass  # it exited (its run reports that)


def pick_regions(n: int, partitions: int) -> list[str]:
    """``n`` region keys spread evenly over the internal topic's partitions (murmur2)."""
    from processors import key_group

    cap = -(-n // partitions)
    per: Counter[int] = Counter()
    out: list[str] = []
    i = 0
    while len(out) < n:
        name = f"region-{i}"
        g = key_group(name.encode(), partitions)
        if per[g] < cap:
            per[g] += 1
            out.append(name)
        i += 1
    return out


def _producer(bootstrap: str) -> Producer:
    return Producer(
        {
            "bootstrap.servers": bootstrap,
            "partitioner": "murmur2_random",
            "enable.idempotence": True,
            "linger.ms": 20,
            "compression.type": "lz4",
            "queue.buffering.max.messages": 1_000_000,
        }
    )


def _send(p: Producer, topic: str, value: bytes, key: bytes) -> None:
    while True:
        try:
            p.produce(topic, value, key)
            return
        except BufferError:
            p.poll(0.05)


def produce_clicks(
    bootstrap: str, topic: str, n: int, users: int, regions: list[str]
) -> Counter[str]:
    """``n`` clicks of random users (each user in one region); return clicks per region."""
    rng = random.Random(20261126)
    p = _producer(bootstrap)
    per_region: Counter[str] = Counter()
    for seq in range(n):
        u = rng.randrange(users)
        region = regions[u % len(regions)]
        per_region[region] += 1
        _send(p, topic, orjson.dumps({"region": region, "seq": seq}), f"user-{u}".encode())
        if seq % 5000 == 0:
            p.poll(0)
    if p.flush(120) != 0:
        raise RuntimeError(f"could not produce to {topic}")
    return per_region


def produce_keys(bootstrap: str, topic: str, keys: range, seq0: int = 0) -> None:
    """One running-sum record ``{"v": 1, "seq"}`` per key index (key ``k%07d``)."""
    p = _producer(bootstrap)
    for i, k in enumerate(keys):
        _send(p, topic, orjson.dumps({"v": 1, "seq": seq0 + i}), b"k%07d" % k)
        if i % 5000 == 0:
            p.poll(0)
    if p.flush(120) != 0:
        raise RuntimeError(f"could not produce to {topic}")


def _consumer(bootstrap: str) -> Consumer:
    return Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"benchpl-reader-{os.getpid()}-{time.monotonic_ns()}",
            "enable.auto.commit": False,
            "isolation.level": "read_committed",
            "fetch.wait.max.ms": 50,
            "log_level": 0,
        }
    )


class TotalsReader(threading.Thread):
    """Follows region-totals (read_committed) until every region reached its click count."""

    def __init__(self, bootstrap: str, topic: str, partitions: int, expected: Counter[str]) -> None:
        super().__init__(daemon=True)
        self.bootstrap, self.topic, self.partitions = bootstrap, topic, partitions
        self.expected = expected
        self.records = 0
        self.first_seen: float | None = None
        self.done_at: float | None = None
        self.first_ts: int | None = None
        self.last_ts: int | None = None
        self.max_total: dict[str, int] = {}
        self.bad: list[str] = []
        self._halt = threading.Event()

    def stop(self) -> None:
        self._halt.set()

    def run(self) -> None:
        c = _consumer(self.bootstrap)
        c.assign([TopicPartition(self.topic, p, 0) for p in range(self.partitions)])
        left = {r for r, n in self.expected.items() if n}
        try:
            while not self._halt.is_set() and left:
                for m in c.consume(2000, 0.2):
                    if m.error() is not None:
                        if m.error().code() != KafkaError._PARTITION_EOF:  # noqa: SLF001
                            self.bad.append(str(m.error()))
                        continue
                    self.records += 1
                    ts = m.timestamp()[1]
                    if self.first_seen is None:
                        self.first_seen = time.time()
                    self.first_ts = ts if self.first_ts is None else min(self.first_ts, ts)
                    self.last_ts = ts if self.last_ts is None else max(self.last_ts, ts)
                    region = m.key().decode()
                    total = orjson.loads(m.value())["total"]
                    if total > self.max_total.get(region, 0):
                        self.max_total[region] = total
                    if total == self.expected.get(region):
                        left.discard(region)
                if not left:
                    self.done_at = time.time()
        finally:
            c.close()


def _log_fields(log: Path, message: str) -> list[dict[str, str]]:
    """``key=value`` fields of every console log line containing ``message``."""
    out = []
    for line in log.read_text(errors="replace").splitlines():
        if message in line:
            out.append(dict(p.split("=", 1) for p in line.split() if "=" in p))
    return out


# ------------------------------------------------------------------ the section


class PipelineBench:
    """One run of the pipeline section; ``results`` is what goes into results.json."""

    def __init__(
        self, cfg: Config, pcfg: PipelineConfig, admin: Admin, out_dir: Path, run_id: str
    ) -> None:
        self.cfg, self.pcfg, self.admin = cfg, pcfg, admin
        self.bootstrap = admin.bootstrap
        self.out_dir, self.run_id = out_dir, run_id
        self.tag = f"benchpl-{run_id}"
        self.logs = out_dir / "logs"
        self.logs.mkdir(parents=True, exist_ok=True)
        self.results: dict[str, Any] = {
            "config": vars(pcfg),
            "env_line": pcfg.env_line(),
            "runs": [],
            "savepoints": [],
            "errors": [],
        }

    def base_env(self, app: str, iid: str, state: Path) -> dict[str, str]:
        return {
            "LOCKGATE_BOOTSTRAP_SERVERS": self.bootstrap,
            "LOCKGATE_APP_NAME": app,
            "LOCKGATE_INSTANCE_ID": iid,
            "LOCKGATE_STATE_DIR": str(state),
            "LOCKGATE_GUARANTEE": "exactly_once",
            "LOCKGATE_HTTP_PORT": "0",
            "LOCKGATE_LOG_FORMAT": "console",
        }

    def run(self) -> dict[str, Any]:
        try:
            if "throughput" in self.pcfg.parts:
                self.throughput()
            if "savepoint" in self.pcfg.parts:
                self.savepoints()
        finally:
            delete_topics(self.admin, self.tag)
            shutil.rmtree(self.out_dir / "state" / self.tag, ignore_errors=True)
        return self.results

    # -- 1 + 2: throughput and alignment ---------------------------------------------

    def throughput(self) -> None:
        pc = self.pcfg
        regions = pick_regions(pc.regions, pc.partitions)
        from processors import key_group

        placement = {r: key_group(r.encode(), pc.partitions) for r in regions}
        clicks = f"{self.tag}.clicks"
        self.admin.create({clicks: pc.partitions}, {"retention.ms": "-1"})
        say(
            f"pipeline: producing {pc.records:,} clicks ({pc.users} users, "
            f"{len(regions)} regions) to {pc.partitions} partitions"
        )
        t = time.monotonic()
        expected = produce_clicks(self.bootstrap, clicks, pc.records, pc.users, regions)
        self.results["input"] = {
            "topic": clicks,
            "records": pc.records,
            "produce_seconds": round(time.monotonic() - t, 1),
            "regions": {r: {"partition": placement[r], "clicks": expected[r]} for r in regions},
        }
        configs = [(mode, ms) for ms in pc.intervals for mode in ("aligned", "unaligned")]
        total = pc.repeat * len(configs)
        i = 0
        for rep in range(1, pc.repeat + 1):
            for mode, ms in configs:
                i += 1
                say(f"pipeline {i}/{total}: {mode}, {ms} ms checkpoints (run {rep})")
                try:
                    row = self._pipeline_run(clicks, expected, mode, ms, rep)
                except Exception as exc:  # noqa: BLE001 - reported, the run goes on
                    say(f"  !! failed: {exc!r}")
                    self.results["errors"].append(f"{mode} {ms} r{rep}: {traceback.format_exc()}")
                    row = {"mode": mode, "interval_ms": ms, "rep": rep, "ok": False}
                    row["status"] = repr(exc)
                self.results["runs"].append(row)
                if row.get("ok"):
                    say(
                        f"  end-to-end {row['e2e_rate']:,}/s ({row['e2e_seconds']}s), steady "
                        f"{row['steady_rate']:,}/s; alignment p50 {row['align_p50_ms']} ms "
                        f"p99 {row['align_p99_ms']} ms ({row['align_count']:.0f} alignments, "
                        f"{row['alignments_forced']} forced)"
                    )
                else:
                    say(f"  NOT OK: {row.get('status')}")

    def _pipeline_run(
        self, clicks: str, expected: Counter[str], mode: str, ms: int, rep: int
    ) -> dict[str, Any]:
        pc = self.pcfg
        tag = f"{self.tag}-{mode[0]}{ms}-r{rep}"
        counts, totals = f"{tag}.user-counts", f"{tag}.region-totals"
        self.admin.create({counts: pc.partitions})
        self.admin.create({totals: pc.partitions}, {"message.timestamp.type": "LogAppendTime"})
        state = self.out_dir / "state" / self.tag / tag
        shutil.rmtree(state, ignore_errors=True)
        topics = {
            "LOCKGATE_CLICKS_TOPIC": clicks,
            "LOCKGATE_USER_COUNTS_TOPIC": counts,
            "LOCKGATE_OUTPUT_TOPIC": totals,
            "LOCKGATE_ALIGNMENT": "none" if mode == "unaligned" else mode,
            "LOCKGATE_CHECKPOINT_INTERVAL_MS": str(ms),
        }
        port = free_port()
        click_env = {**self.base_env(f"{tag}-click", "c1", state / "click"), **topics}
        region_env = {**self.base_env(f"{tag}-region", "r1", state / "region"), **topics}
        region_env["LOCKGATE_HTTP_PORT"] = str(port)
        reader = TotalsReader(self.bootstrap, totals, pc.partitions, expected)
        reader.start()
        t0 = time.time()
        ps = [
            procs.Proc(
                [str(LOCKGATE_BIN), "run", CLICK_SPEC], click_env, self.logs / f"{tag}-click.log"
            ),
            procs.Proc(
                [str(LOCKGATE_BIN), "run", REGION_SPEC],
                region_env,
                self.logs / f"{tag}-region.log",
            ),
        ]
        pauser: _Pauser | None = None
        slow = pc.slow_ms()
        if slow is not None:
            slow_env = {**self.base_env(f"{tag}-click", "c2", state / "click2"), **topics}
            ps.append(
                procs.Proc(
                    [str(LOCKGATE_BIN), "run", CLICK_SPEC],
                    slow_env,
                    self.logs / f"{tag}-click2.log",
                )
            )
            pauser = _Pauser(ps[-1].pid, *slow)
            pauser.start()
        metrics_text = ""
        try:
            deadline = time.monotonic() + pc.timeout
            while reader.done_at is None:
                for p in ps:
                    if not p.alive:
                        raise RuntimeError(f"{p.argv[-1]} exited:\n{p.log_tail()}")
                if time.monotonic() > deadline:
                    raise TimeoutError(
                        f"not done after {pc.timeout}s: {reader.records:,} totals read, "
                        f"max per region {reader.max_total}"
                    )
                time.sleep(0.05)
            cpu = sum(p.cpu() for p in ps)
            # Let a few more epochs commit (more alignments in the histogram, and any
            # duplicate would show up), then read the downstream's metrics.
            time.sleep(max(1.0, 2 * ms / 1000))
            metrics_text = scrape(port)
        finally:
            if pauser is not None:
                pauser.stop()
            reader.stop()
            for p in ps:
                p.stop()
            reader.join(10)
        (self.out_dir / f"{tag}-region.metrics").write_text(metrics_text)
        hist = histogram(metrics_text, "lockgate_alignment_seconds")
        done = reader.done_at or time.time()
        e2e = done - t0
        steady = ((reader.last_ts or 0) - (reader.first_ts or 0)) / 1000
        ok = reader.records == pc.records and all(
            reader.max_total.get(r) == n for r, n in expected.items()
        )
        p50, p99 = quantile(0.5, hist["buckets"]), quantile(0.99, hist["buckets"])
        shutil.rmtree(state, ignore_errors=True)
        return {
            "mode": mode,
            "interval_ms": ms,
            "rep": rep,
            "slow": pc.slow,
            "ok": ok,
            "status": "ok" if ok else f"{reader.records} totals read (expected {pc.records})",
            "records": pc.records,
            "totals_read": reader.records,
            "e2e_seconds": round(e2e, 2),
            "e2e_rate": round(pc.records / e2e),
            "first_output_after_s": round((reader.first_seen or done) - t0, 2),
            "steady_seconds": round(steady, 2),
            "steady_rate": round((pc.records - 1) / steady) if steady > 0 else None,
            "cpu_s_per_m": round(cpu / pc.records * 1e6, 1),
            "align_p50_ms": None if p50 is None else round(p50 * 1000, 1),
            "align_p99_ms": None if p99 is None else round(p99 * 1000, 1),
            "align_mean_ms": round(hist["sum"] / hist["count"] * 1000, 1)
            if hist["count"]
            else None,
            "align_count": hist["count"],
            "align_buckets": hist["buckets"],
            "alignments_forced": metric(metrics_text, "lockgate_alignments_forced_total"),
            "region_epochs": metric(metrics_text, "lockgate_epochs_committed_total"),
            "region_epochs_aborted": metric(metrics_text, "lockgate_epochs_aborted_total"),
        }

    # -- 3 + 4: savepoint and restore ------------------------------------------------

    def savepoints(self) -> None:
        for keys in self.pcfg.savepoint_keys:
            say(f"savepoint: running sum with {keys:,} keys")
            try:
                row = self._savepoint(keys)
            except Exception as exc:  # noqa: BLE001 - reported, the run goes on
                say(f"  !! savepoint {keys} failed: {exc!r}")
                self.results["errors"].append(f"savepoint {keys}: {traceback.format_exc()}")
                row = {"keys": keys, "ok": False, "status": repr(exc)}
            self.results["savepoints"].append(row)

    def _savepoint(self, keys: int) -> dict[str, Any]:
        pc = self.pcfg
        tag = f"{self.tag}-sp{keys}"
        topic, output, app = f"{tag}.in", f"{tag}.out", f"{tag}-sum"
        self.admin.create({topic: pc.partitions}, {"retention.ms": "-1"})
        self.admin.create({output: pc.partitions})
        root = self.out_dir / "state" / self.tag / tag
        sp_dir = root / "savepoints"
        shutil.rmtree(root, ignore_errors=True)
        sp_dir.mkdir(parents=True)
        t = time.monotonic()
        produce_keys(self.bootstrap, topic, range(keys))
        produce_s = time.monotonic() - t
        env = {
            **self.base_env(app, "s1", root / "state1"),
            "LOCKGATE_INPUT_TOPIC": topic,
            "LOCKGATE_OUTPUT_TOPIC": output,
            "LOCKGATE_CHECKPOINT_INTERVAL_MS": "1000",
            "LOCKGATE_SAVEPOINT_DIR": str(sp_dir),
        }
        argv = [str(LOCKGATE_BIN), "run", SUM_SPEC]
        groups = GroupOffsets(self.bootstrap, app, topic, pc.partitions)
        row: dict[str, Any] = {"keys": keys, "produce_seconds": round(produce_s, 1)}
        log1 = self.logs / f"{tag}-1.log"
        p = procs.Proc(argv, env, log1)
        try:
            t0 = time.time()
            deadline = time.monotonic() + max(pc.timeout, keys / 2000)
            while groups.committed() < keys:
                if not p.alive:
                    raise RuntimeError(f"running_sum exited:\n{p.log_tail()}")
                if time.monotonic() > deadline:
                    raise TimeoutError(f"{keys} offsets not committed")
                time.sleep(0.1)
            row["load_seconds"] = round(time.time() - t0, 1)
            say(f"  {keys:,} keys processed in {row['load_seconds']}s; savepoint trigger")
            cli_env = {
                **os.environ,
                "LOCKGATE_BOOTSTRAP_SERVERS": self.bootstrap,
                "LOCKGATE_SAVEPOINT_DIR": str(sp_dir),
            }
            t = time.monotonic()
            out = subprocess.run(
                [str(LOCKGATE_BIN), "savepoint", "trigger", "--app", app, "--timeout", "600"],
                env=cli_env,
                cwd=ROOT,
                capture_output=True,
                text=True,
                timeout=700,
                check=False,
            )
            trigger_s = time.monotonic() - t
            (self.logs / f"{tag}-trigger.log").write_text(out.stdout + "\n---\n" + out.stderr)
            if out.returncode != 0:
                raise RuntimeError(f"savepoint trigger exit {out.returncode}:\n{out.stderr}")
            sp_id = out.stdout.strip().splitlines()[-1].strip()
            files = list((sp_dir / sp_id).rglob("*.lgs"))
            exported = _log_fields(log1, "savepoint exported")
            row.update(
                savepoint=sp_id,
                trigger_seconds=round(trigger_s, 2),
                lgs_files=len(files),
                lgs_bytes=sum(f.stat().st_size for f in files),
                export_seconds_max=max((float(e.get("seconds", 0)) for e in exported), default=0),
                export_seconds_sum=round(sum(float(e.get("seconds", 0)) for e in exported), 3),
            )
            say(
                f"  savepoint {sp_id}: trigger {trigger_s:.2f}s, "
                f"{row['lgs_bytes'] / 1e6:.1f} MB in {len(files)} .lgs files; SIGTERM"
            )
        finally:
            p.stop(timeout=60)
        # Restore: marker record for key 0 (its sum must become 2), then a fresh instance.
        produce_keys(self.bootstrap, topic, range(1), seq0=keys)
        base2 = {**env, "LOCKGATE_FROM_SAVEPOINT": row["savepoint"]}
        # Same instance id (a replaced pod keeps its name): a new id would first wait out
        # the old static member's session timeout.
        base2["LOCKGATE_INSTANCE_ID"] = "s1"
        try:
            attempt = self._restore(
                base2, root / "state2", self.logs / f"{tag}-2.log", output, keys
            )
        except Exception as exc:  # noqa: BLE001 - reported; retried with a longer timeout
            row["restore_default_error"] = str(exc)[-3000:]
            say(f"  !! restore with the default settings failed: {str(exc)[-400:]}")
            say(f"  retrying with LOCKGATE_TRANSACTION_TIMEOUT_MS={RETRY_TXN_TIMEOUT_MS}")
            base2["LOCKGATE_TRANSACTION_TIMEOUT_MS"] = str(RETRY_TXN_TIMEOUT_MS)
            row["restore_transaction_timeout_ms"] = RETRY_TXN_TIMEOUT_MS
            attempt = self._restore(
                base2, root / "state3", self.logs / f"{tag}-3.log", output, keys
            )
        finally:
            groups.close()
        row.update(attempt)
        got = row["marker_output"]
        row["ok"] = got is not None and got.get("sum") == 2 and got.get("count") == 2
        row["status"] = "ok" if row["ok"] else f"marker output {got} (expected sum 2, count 2)"
        say(
            f"  restore from the savepoint: marker output after {row['restore_seconds']:.2f}s "
            f"({row['seeded_entries']:,} entries seeded in {row['seeded_key_groups']} key groups; "
            f"{row['changelog_records_restored']:,} changelog records restored first), "
            f"{row['status']}"
        )
        shutil.rmtree(root, ignore_errors=True)
        delete_topics(self.admin, tag)
        return row

    def _restore(
        self, env: dict[str, str], state: Path, log: Path, output: str, keys: int
    ) -> dict[str, Any]:
        """Start an instance on an empty ``state``; wait for the marker's output."""
        pc = self.pcfg
        ends = self.admin.end_offsets(output, pc.partitions, committed=False)
        c = _consumer(self.bootstrap)
        c.assign([TopicPartition(output, i, ends[i]) for i in range(pc.partitions)])
        t0 = time.time()
        p = procs.Proc(
            [str(LOCKGATE_BIN), "run", SUM_SPEC], {**env, "LOCKGATE_STATE_DIR": str(state)}, log
        )
        got: dict[str, Any] | None = None
        try:
            deadline = time.monotonic() + max(pc.timeout, keys / 2000)
            while got is None:
                if not p.alive:
                    raise RuntimeError(f"restored running_sum exited:\n{p.log_tail()}")
                if time.monotonic() > deadline:
                    raise TimeoutError("the marker's output did not appear")
                for m in c.consume(100, 0.05):
                    if m.error() is None and m.key() == b"k0000000":
                        value = orjson.loads(m.value())
                        if value.get("seq") == keys:
                            got = value
            restore_s = time.time() - t0
        finally:
            c.close()
            p.stop(timeout=60)
        restored = _log_fields(log, "key group restored")
        seeded = _log_fields(log, "seeded from a savepoint")
        return {
            "restore_seconds": round(restore_s, 2),
            "marker_output": got,
            "changelog_records_restored": sum(int(r.get("records", 0)) for r in restored),
            "changelog_restore_seconds": round(
                sum(float(r.get("seconds", 0)) for r in restored), 2
            ),
            "seeded_entries": sum(int(s.get("entries", 0)) for s in seeded),
            "seeded_key_groups": len(seeded),
        }


# ------------------------------------------------------------------ report


def _fmt(x: Any, digits: int = 0) -> str:
    if x is None:
        return "n/a"
    return f"{x:,.{digits}f}"


def _med(rows: list[dict[str, Any]], key: str) -> float | None:
    vals = [r[key] for r in rows if r.get("ok") and r.get(key) is not None]
    return median(vals) if vals else None


def _pct(r: dict[str, Any], q: float, key: str) -> str:
    """The estimate, or "< bound" when the rank falls in the first bucket (no resolution)."""
    buckets = r.get("align_buckets") or []
    if r.get(key) is None or not buckets:
        return "n/a"
    bound, cum = buckets[0]
    if cum >= q * buckets[-1][1]:
        return f"< {bound * 1000:g} (est. {r[key]:.1f})"
    return _fmt(r[key], 1)


def render(p: dict[str, Any], meta: dict[str, Any]) -> list[str]:  # noqa: C901
    """The pipeline section of RESULTS.md (Markdown lines)."""
    L: list[str] = [BEGIN, "## Pipelines: aligned vs unaligned checkpoints, savepoints", ""]
    a = L.append
    m = meta.get("machine", {})
    a(
        f"Measured by `{meta.get('command', COMMAND)}` (`benchmarks/pipeline.py`) on "
        f"{meta.get('started')}, {meta.get('total_minutes', 0):.1f} min, on "
        f"{m.get('cpu', '?')} ({m.get('cores', '?')} cores, {m.get('memory_gib', '?')} GiB), "
        f"{m.get('os', '')}, Python {m.get('python', '')}; broker: {meta.get('broker')}; "
        f"lockgate git `{meta.get('git', '?')}`. The machine is shared: load before "
        f"`{meta.get('uptime_before', '')}`, after `{meta.get('uptime_after', '')}`."
    )
    if meta.get("git_after") and meta["git_after"] != meta.get("git"):
        a("")
        if same_runtime(meta.get("git", ""), meta["git_after"]):
            a(
                f"HEAD moved during the run (at the end: git `{meta['git_after']}`), by "
                "commits outside `processors/` and `state/`: every run measured the same "
                "lockgate code."
            )
        else:
            a(
                "**The lockgate source changed during the run** (others' commits and "
                f"uncommitted edits in processors/; at the end: git `{meta['git_after']}`): "
                "earlier runs of this section measured different code than later ones."
            )
    a("")
    a(f"Settings: `{p.get('env_line', '')}`")
    a("")
    runs = p.get("runs", [])
    inp = p.get("input")
    if runs and inp:
        parts = Counter(v["partition"] for v in inp["regions"].values())
        pc = p["config"]
        a("### Two-app pipeline throughput (examples/click_pipeline.py)")
        a("")
        a(
            f"{inp['records']:,} clicks preloaded ({pc['users']} users, "
            f"{len(inp['regions'])} regions; {pc['partitions']} partitions for clicks, "
            "user-counts and region-totals; regions per user-counts partition (murmur2): "
            + ", ".join(f"p{k}: {v}" for k, v in sorted(parts.items()))
            + "). Per run: fresh internal and output topics and consumer groups, one "
            "`click_app` and one `region_app` process (exactly-once; `region_app` with "
            "`LOCKGATE_ALIGNMENT`, both with the same `LOCKGATE_CHECKPOINT_INTERVAL_MS`). "
            "**End-to-end**: from spawning both processes until a `read_committed` reader "
            "has seen every region's final total (includes interpreter start, group joins "
            "and the last epoch commit of both apps). **Steady**: first to last "
            "region-totals record, broker append time (LogAppendTime). CPU: both apps' "
            "process trees, per million clicks. Every run's output was checked: exactly "
            f"{inp['records']:,} totals, each region's last total = its clicks."
        )
        a("")
        a(
            "| mode | interval | end-to-end records/s (runs) | median | steady records/s "
            "(runs) | median | CPU s / M | ok |"
        )
        a("| --- | --- | --- | --- | --- | --- | --- | --- |")
        med: dict[tuple[str, int], dict[str, float | None]] = {}
        for ms in pc["intervals"]:
            for mode in ("aligned", "unaligned"):
                rows = [r for r in runs if r["mode"] == mode and r["interval_ms"] == ms]
                if not rows:
                    continue
                med[(mode, ms)] = {k: _med(rows, k) for k in ("e2e_rate", "steady_rate")}
                a(
                    f"| {mode} | {ms} ms | "
                    + " / ".join(_fmt(r.get("e2e_rate")) for r in rows)
                    + f" | {_fmt(med[(mode, ms)]['e2e_rate'])} | "
                    + " / ".join(_fmt(r.get("steady_rate")) for r in rows)
                    + f" | {_fmt(med[(mode, ms)]['steady_rate'])} | "
                    + " / ".join(_fmt(r.get("cpu_s_per_m"), 1) for r in rows)
                    + " | "
                    + " / ".join(
                        "yes" if r.get("ok") else f"**no** ({r.get('status')})" for r in rows
                    )
                    + " |"
                )
        a("")
        a(
            "| interval | aligned / unaligned, end-to-end (medians) | range over runs | "
            "steady (medians) | range over runs | >= 0.90 (end-to-end) |"
        )
        a("| --- | --- | --- | --- | --- | --- |")
        for ms in pc["intervals"]:
            al, un = med.get(("aligned", ms)), med.get(("unaligned", ms))
            if not al or not un:
                continue

            def ratio(k: str, al: Any = al, un: Any = un) -> float | None:
                return al[k] / un[k] if al[k] and un[k] else None

            def spread(k: str, ms: int = ms) -> tuple[float, float] | None:
                al = [
                    r[k]
                    for r in runs
                    if r.get("ok")
                    and r["interval_ms"] == ms
                    and r["mode"] == "aligned"
                    and r.get(k)
                ]
                un = [
                    r[k]
                    for r in runs
                    if r.get("ok")
                    and r["interval_ms"] == ms
                    and r["mode"] == "unaligned"
                    and r.get(k)
                ]
                return (min(al) / max(un), max(al) / min(un)) if al and un else None

            e, s = ratio("e2e_rate"), ratio("steady_rate")
            es, ss = spread("e2e_rate"), spread("steady_rate")
            met = "n/a" if e is None else ("yes" if e >= 0.9 else "**no**")
            if es and es[0] < 0.9 <= es[1]:
                met += " (within run-to-run noise)"
            a(
                f"| {ms} ms | {_fmt(e, 2)}x | "
                + (f"{es[0]:.2f}x - {es[1]:.2f}x" if es else "n/a")
                + f" | {_fmt(s, 2)}x | "
                + (f"{ss[0]:.2f}x - {ss[1]:.2f}x" if ss else "n/a")
                + f" | {met} |"
            )
        a("")
        a(
            "Range over runs: slowest aligned / fastest unaligned run to fastest aligned / "
            "slowest unaligned run of the same interval."
        )
        a("")
        a("### Alignment time per checkpoint (region_app, aligned runs)")
        a("")
        a(
            "`lockgate_alignment_seconds` of `region_app`, scraped from `/metrics` at the end "
            "of each run: one observation per completed alignment of an input partition "
            "that held records (from the first writer passing a barrier to the last one "
            "reaching it). p50/p99 are **estimated from the histogram buckets** (bounds "
            "5, 10, 25, 50, 100, 250, 500 ms, 1 s, ...) by linear interpolation inside the "
            "bucket, like Prometheus' `histogram_quantile`; `< 5` means the rank falls in "
            "the first bucket (0-5 ms), which the histogram cannot resolve further (the "
            "interpolated value is then just a fraction of 5 ms). The mean is the "
            "histogram's sum / count (exact). Unaligned runs observe nothing (nothing is "
            "held; their histograms had count 0). `forced`: alignments that hit the "
            "timeout or held-record bound."
        )
        a("")
        a(
            "| mode | interval | run | alignments | p50 ms | p99 ms | mean ms | forced | "
            "region_app epochs (aborted) |"
        )
        a("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
        for r in sorted(runs, key=lambda r: (-r["interval_ms"], r["rep"])):
            if not r.get("ok") or r["mode"] != "aligned":
                continue
            a(
                f"| {r['mode']} | {r['interval_ms']} ms | {r['rep']} | "
                f"{_fmt(r.get('align_count'))} | {_pct(r, 0.5, 'align_p50_ms')} | "
                f"{_pct(r, 0.99, 'align_p99_ms')} | {_fmt(r.get('align_mean_ms'), 1)} | "
                f"{_fmt(r.get('alignments_forced'))} | {_fmt(r.get('region_epochs'))} "
                f"({_fmt(r.get('region_epochs_aborted'))}) |"
            )
        a("")
    sps = p.get("savepoints", [])
    if sps:
        a("### Savepoint duration and restore time vs state size (examples/running_sum.py)")
        a("")
        a(
            "The running sum (value state per key, exactly-once, 1 s checkpoints, "
            f"{p['config']['partitions']} partitions = key groups, one instance) processes one "
            "record per key. **Trigger**: wall time of `lockgate savepoint trigger --app NAME` "
            "(a CLI process: start-up, request, the app's next epoch end with the export, "
            "every manifest committed, descriptor written). **Export**: the app's own "
            "'savepoint exported' seconds (max over key groups). **Bytes**: sum of the "
            "`.lgs` files. **Restore**: the app gets SIGTERM, one marker record for key 0 "
            "is produced, a fresh instance (empty state dir, same app name) starts with "
            "`LOCKGATE_FROM_SAVEPOINT=<id>`; time from its spawn until the marker's output "
            "is visible (read_committed) with sum 2, i.e. computed from the saved state. "
            "The app's changelog topics still exist, so the instance first restores them "
            "(changelog columns), then seeds the savepoint's entries (and tombstones) and "
            "commits that before processing."
        )
        a("")
        a(
            "| keys | load s | trigger s | export s (max) | .lgs files | .lgs MB | restore s | "
            "changelog restored | changelog s | seeded entries | ok |"
        )
        a("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
        for r in sps:
            a(
                f"| {r['keys']:,} | {_fmt(r.get('load_seconds'), 1)} | "
                f"{_fmt(r.get('trigger_seconds'), 2)} | {_fmt(r.get('export_seconds_max'), 2)} | "
                f"{_fmt(r.get('lgs_files'))} | "
                f"{_fmt((r.get('lgs_bytes') or 0) / 1e6 if 'lgs_bytes' in r else None, 2)} | "
                f"{_fmt(r.get('restore_seconds'), 2)}"
                + (
                    f" (default settings **failed**; retried with "
                    f"`LOCKGATE_TRANSACTION_TIMEOUT_MS={r['restore_transaction_timeout_ms']}`)"
                    if r.get("restore_default_error")
                    else ""
                )
                + " | "
                f"{_fmt(r.get('changelog_records_restored'))} | "
                f"{_fmt(r.get('changelog_restore_seconds'), 2)} | "
                f"{_fmt(r.get('seeded_entries'))} | "
                + ("yes" if r.get("ok") else f"**no**: {str(r.get('status'))[:200]}")
                + " |"
            )
        a("")
        for r in sps:
            err = r.get("restore_default_error")
            if err:
                lines = [x for x in err.splitlines() if "ERROR" in x or "CRITICAL" in x]
                a(
                    f"Restore of {r['keys']:,} keys with the default settings: the instance "
                    "exited; its log's errors:"
                )
                a("")
                a("```")
                L.extend(x[:400] for x in lines[-4:])
                a("```")
                a("")
    L.extend(section_footer(p, "results.json", COMMAND, "pipeline", END))
    return L


def merge(section: list[str], path: Path) -> None:
    """Replace the pipeline section of ``path`` (or insert it before the profiles)."""
    text = splice_section(path, section, BEGIN, END)
    whole = "Every number below comes from that one run"
    if whole in text and "except the Pipelines section" not in text:
        text = text.replace(
            whole, whole + " (except the Pipelines section when it ran on its own: see its date)"
        )
    text = text.replace(
        "Aligned vs unaligned checkpoints: not measured, lockgate has only one checkpoint "
        "mode so far (barrier alignment for chained apps is not implemented yet).",
        "Aligned vs unaligned checkpoints: see the Pipelines section.",
    )
    path.write_text(text)


def main() -> int:
    """Run the section; ``--render PATH`` only re-renders it from a results.json."""
    if sys.argv[1:2] == ["--render"]:
        saved = json.loads(Path(sys.argv[2]).read_text())
        merge(render(saved["pipeline"], saved["meta"]), BENCH_DIR / "RESULTS.md")
        return 0

    cfg, pcfg = Config(), PipelineConfig()
    run = run_standalone(
        cfg,
        "pipeline",
        "results.json",
        COMMAND,
        f"pipeline benchmarks: {pcfg.env_line()}",
        lambda admin, out_dir, run_id: PipelineBench(cfg, pcfg, admin, out_dir, run_id),
    )
    res = run.results
    if pcfg.slow:
        print("\n".join(render(res, run.meta)))
        say(
            f"slow-upstream run: results.json only (RESULTS.md unchanged), {elapsed() / 60:.1f} min"
        )
        return run.code or (1 if res.get("errors") else 0)
    merge(render(res, run.meta), BENCH_DIR / "RESULTS.md")
    say(f"wrote benchmarks/RESULTS.md (pipeline section), {elapsed() / 60:.1f} min")
    return run.code or (1 if res.get("errors") else 0)


if __name__ == "__main__":
    sys.exit(main())
