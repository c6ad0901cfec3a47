"""Nexmark on one broker: lockgate, Flink SQL and Quix Streams, query by query, checked.

``python -m benchmarks.nexmark [--quick] [--events N] [--queries q0,q1,...]
[--systems lockgate,flink,quix] [--repeat R] [--disorder G] [--flink-shared-jvm]`` (or
``make bench-nexmark``; ``make bench``'s step: benchmarks/nexmark/step.py).
The default is the long form: 2,000,000 events, 3 runs per system and query (medians and
ranges); ``--quick`` is 100,000 events, q0 q1 q2 q7, one run each:

1. the broker (the harness's own on ``BENCH_KAFKA_PORT``, or ``BENCH_BROKER``'s) and its
   idle CPU, measured for 10 s before anything runs;
2. N events from benchmarks/nexmark/generator.py (seeded) into one topic of
   ``--partitions`` partitions, written once and read by every run;
3. per query, runs of each system, interleaved (lockgate, flink, quix, lockgate, ...):
   lockgate (``lockgate run benchmarks.nexmark.apps:<query>``, exactly-once, checkpoints
   every 1 s; q5 and q7 are two apps, two processes; ``--parallelism N``: N instances of
   each app in one group), Flink (benchmarks/nexmark/flink_job.py: mini-cluster,
   parallelism 1 or N, checkpoints every 1 s, exactly-once sink; with
   ``--flink-shared-jvm`` one process runs every query) and Quix Streams
   (benchmarks/nexmark/quix_apps.py: exactly-once, commit interval 1 s; not run with
   ``--parallelism`` above 1);
4. figures per run, from samples every 0.25 s: the input's committed offsets (consumer
   group), the output's last stable offsets, the CPU of the process tree. The run's span
   starts at the first sample with committed input (so start-up and the first checkpoint
   are outside it) and ends when the output reached its final committed size (with
   ``--parallelism`` above 1 the harness's broker delays a new group's first assignment
   by 3 s, so every lockgate instance joins before any reads; a run one of whose groups
   formed only at or after that group's own first committed input (q5, q7: the second
   app's on the stage topic) is not counted: status ``late group``, :func:`late_group`).
   Rate = the
   input events consumed in that span / its seconds; CPU s per million events over the
   same span; peak RSS = the tree's summed VmHWM at the end; broker CPU over the span minus
   its idle rate;
5. the check: every run's output, read back with ``read_committed``, as a multiset of
   rows, must equal the query's first successful run (lockgate's when it ran); on
   in-order input (the default) the systems must agree exactly;
6. benchmarks/RESULTS-nexmark.md and ``benchmarks/out/<timestamp>/nexmark.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from decimal import Decimal
from pathlib import Path
from statistics import median
from typing import Any

import orjson
from confluent_kafka import Consumer, KafkaError, TopicPartition

from benchmarks import broker, flink, venvs
from benchmarks import proc as procs
from benchmarks.admin import Admin, GroupOffsets, group_formed
from benchmarks.machine import machine, uptime
from benchmarks.nexmark.generator import GenConfig, produce
from benchmarks.paths import BENCH_DIR, LOCKGATE_BIN, ROOT
from benchmarks.progress import say
from benchmarks.revision import revision

QUERIES = ["q0", "q1", "q2", "q7", "q3", "q5", "q8"]
TWO_STAGE = {"q5", "q7"}
SYSTEMS = ["lockgate", "flink", "quix"]
#: queries Quix Streams cannot express with the same results, and why (none today:
#: benchmarks/nexmark/quix_apps.py says how each one is written)
QUIX_CANNOT: dict[str, str] = {}
#: Quix apps that re-key through a repartition topic (group_by)
QUIX_REPARTITION = {"q5", "q7"}
RESULTS = BENCH_DIR / "RESULTS-nexmark.md"
TITLES = {
    "q0": "pass-through (bids)",
    "q1": "currency conversion",
    "q2": "selection (auction % 123)",
    "q3": "local item suggestion (persons ⋈ auctions)",
    "q5": "hot items (10 s hop windows, 2 s slide)",
    "q7": "highest bid (10 s tumbling windows)",
    "q8": "new users (10 s tumbling window join)",
}


#: ``group.initial.rebalance.delay.ms`` of the harness's broker with ``--parallelism``
#: above 1 (Kafka's own default; the test broker's is 0)
GROUP_JOIN_DELAY_MS = 3000


@dataclass
class Settings:
    """One harness run's settings."""

    events: int = 2_000_000
    partitions: int = 4
    rate: int = 10_000
    seed: int = 42
    disorder: int = 1
    delay_ms: int = 4_000
    repeat: int = 3
    queries: list[str] = field(default_factory=lambda: list(QUERIES))
    systems: list[str] = field(default_factory=lambda: list(SYSTEMS))
    run_timeout: int = 1800
    #: one PyFlink process (one gateway JVM) runs every query, one after another
    flink_shared_jvm: bool = False
    #: lockgate instances per app and Flink's parallelism (Quix Streams: 1 only)
    parallelism: int = 1
    kafka_port: int = 49092
    external_broker: str = ""

    @property
    def gen(self) -> GenConfig:
        """The generator's config."""
        return GenConfig(self.events, self.rate, self.seed, self.disorder)

    @property
    def watermark_delay_ms(self) -> int:
        """Both systems' bounded out-of-orderness: at least the generator's bound."""
        return max(self.delay_ms, self.gen.disorder_ms())


# --------------------------------------------------------------------------- broker


def pid_listening(port: int) -> int | None:
    """The pid of the process listening on ``port`` (for a broker the harness did not
    start), via ``ss``."""
    try:
        out = subprocess.run(
            ["ss", "-ltnpH", f"sport = :{port}"], capture_output=True, text=True, check=False
        ).stdout
    except OSError:
        return None
    found = re.search(r"pid=(\d+)", out)
    return int(found.group(1)) if found else None


def idle_cpu(pid: int | None, seconds: float = 10.0) -> float | None:
    """The broker's CPU use (cores) while nothing runs."""
    if pid is None:
        return None
    c0, t0 = procs.cpu_seconds(pid), time.monotonic()
    time.sleep(seconds)
    return (procs.cpu_seconds(pid) - c0) / (time.monotonic() - t0)


def wait_rehearsal() -> None:
    """A CI rehearsal needs the machine: wait while /tmp/rehearsal-running exists."""
    flag = Path("/tmp/rehearsal-running")  # noqa: S108 - the machine's agreed flag file
    if flag.exists():
        say("a CI rehearsal is running: waiting until it ends")
        while flag.exists():
            time.sleep(5)


# --------------------------------------------------------------------------- outputs


def _row(query: str, v: dict[str, Any]) -> tuple[Any, ...]:
    """The comparable row of one output value (nexmark.md §3)."""
    if query in ("q0", "q7"):
        cols = ("auction", "bidder", "price", "dateTime", "extra")
        return tuple(v[c] for c in cols)
    if query == "q1":
        price = Decimal(str(v["price"])).quantize(Decimal("0.001"))
        return (v["auction"], v["bidder"], price, v["dateTime"], v["extra"])
    if query == "q2":
        return (v["auction"], v["price"])
    if query == "q3":
        return (v["name"], v["city"], v["state"], v["id"])
    if query == "q5":
        return (v["auction"], v["num"])
    if query == "q8":
        return (v["id"], v["name"], v["starttime"])
    raise ValueError(query)


def read_rows(bootstrap: str, topic: str, query: str) -> Counter[tuple[Any, ...]]:
    """Every committed output record of ``topic`` as a multiset of rows."""
    c = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"nexmark-reader-{topic}",
            "enable.auto.commit": False,
            "isolation.level": "read_committed",
            "enable.partition.eof": True,
            "log_level": 0,
        }
    )
    rows: Counter[tuple[Any, ...]] = Counter()
    try:
        md = c.list_topics(topic, timeout=10).topics[topic]
        parts = sorted(md.partitions)
        c.assign([TopicPartition(topic, p, 0) for p in parts])
        eof: set[int] = set()
        deadline = time.monotonic() + 60
        while len(eof) < len(parts):
            msgs = c.consume(10_000, 1.0)
            if msgs:
                deadline = time.monotonic() + 60
            elif time.monotonic() > deadline:
                raise TimeoutError(f"reading {topic}: no progress for 60 s")
            for m in msgs:
                err = m.error()
                if err is not None:
                    part = m.partition()
                    if err.code() == KafkaError._PARTITION_EOF and part is not None:  # noqa: SLF001
                        eof.add(part)
                    continue
                value = m.value()
                if value is None:
                    continue
                rows[_row(query, orjson.loads(value))] += 1
    finally:
        c.close()
    return rows


# --------------------------------------------------------------------------- one run


@dataclass
class Run:
    """One system running one query."""

    system: str
    query: str
    tag: str
    procs: list[procs.Proc] = field(default_factory=list)
    #: the shared Flink JVM's answer file for this run (``Settings.flink_shared_jvm``)
    done_file: Path | None = None


def _interp(series: list[tuple[float, float]], t: float) -> float:
    if not series:
        return 0.0
    if t <= series[0][0]:
        return series[0][1]
    for (t0, v0), (t1, v1) in zip(series, series[1:], strict=False):
        if t0 <= t <= t1:
            return v0 if t1 == t0 else v0 + (v1 - v0) * (t - t0) / (t1 - t0)
    return series[-1][1]


class Harness:
    """The whole run: input once, then every (query, system, repeat)."""

    def __init__(
        self,
        s: Settings,
        admin: Admin,
        out_dir: Path,
        broker_pid: int | None,
        run_name: str | None = None,
    ) -> None:
        self.s = s
        self.admin = admin
        self.bootstrap = admin.bootstrap
        self.out_dir = out_dir
        self.broker_pid = broker_pid
        #: names this run's topics and groups (its last 6 characters are in every one)
        self.run_name = run_name or out_dir.name
        self.input = f"nexmark.{self.run_name}.events"
        self.input_records = 0
        self.broker_idle: float | None = None
        self.results: dict[str, Any] = {"runs": [], "errors": [], "checks": {}}
        self.jar: Path | None = None
        self.flink_server: procs.Proc | None = None
        self.flink_requests = 0

    # -- setup
    def prepare(self) -> None:
        """Set up Flink (venv, connector), measure the broker idle, write the input."""
        if "flink" in self.s.systems:
            try:
                self.jar = flink.ensure()
            except Exception as exc:  # noqa: BLE001 - the other systems still run
                self._drop("flink", exc)
        if "flink" in self.s.systems:
            assert self.jar is not None
            self.results["flink"] = {
                "versions": {
                    k: v
                    for k, v in venvs.freeze("flink").items()
                    if k in ("apache-flink", "apache-flink-libraries")
                },
                "connector": self.jar.name,
                "java": flink.java_version(),
                "shared_jvm": self.s.flink_shared_jvm,
            }
        if "quix" in self.s.systems:
            try:
                venvs.ensure("quix")
            except Exception as exc:  # noqa: BLE001 - the other systems still run
                self._drop("quix", exc)
        if "quix" in self.s.systems:
            self.results["quix"] = {
                "versions": {
                    k: v
                    for k, v in venvs.freeze("quix").items()
                    if k in ("quixstreams", "confluent-kafka", "rocksdict", "orjson")
                },
                "cannot": {q: QUIX_CANNOT[q] for q in self.s.queries if q in QUIX_CANNOT},
            }
        wait_rehearsal()
        say("measuring the broker's idle CPU for 10 s")
        self.broker_idle = idle_cpu(self.broker_pid)
        self.results["broker_idle_cores"] = self.broker_idle
        self.results["repeat"] = self.s.repeat
        self.results["parallelism"] = self.s.parallelism
        self.admin.create({self.input: self.s.partitions}, {"retention.ms": "-1"})
        t0 = time.monotonic()
        self.input_records = produce(self.bootstrap, self.input, self.s.partitions, self.s.gen)
        say(
            f"wrote {self.s.events:,} events (+{self.s.partitions} end markers) to "
            f"{self.input} in {time.monotonic() - t0:.1f} s"
        )
        self.results["input"] = {
            "topic": self.input,
            "events": self.s.events,
            "records": self.input_records,
            "partitions": self.s.partitions,
            "rate_event_time": self.s.rate,
            "seed": self.s.seed,
            "disorder_group": self.s.disorder,
            "disorder_ms": self.s.gen.disorder_ms(),
            "watermark_delay_ms": self.s.watermark_delay_ms,
        }

    def _drop(self, system: str, exc: Exception) -> None:
        say(f"  !! {system} cannot be set up: {exc!r}")
        self.results["errors"].append(f"{system} setup: {exc!r}")
        self.s.systems = [x for x in self.s.systems if x != system]

    # -- start
    def _start(self, run: Run) -> None:
        s = self.s
        logs = self.out_dir / "logs"
        logs.mkdir(parents=True, exist_ok=True)
        state = self.out_dir / "state" / run.tag
        shutil.rmtree(state, ignore_errors=True)
        state.mkdir(parents=True)
        output = f"nexmark.{run.tag}.out"
        base = {
            "BENCH_BOOTSTRAP": self.bootstrap,
            "BENCH_INPUT": self.input,
            "BENCH_OUTPUT": output,
            "BENCH_GROUP": f"nexmark-{run.tag}",
            "BENCH_STATE_DIR": str(state),
            "NEXMARK_DELAY_MS": str(s.watermark_delay_ms),
            "PYTHONUNBUFFERED": "1",
        }
        if run.system == "flink":
            assert self.jar is not None
            env = {
                **base,
                "NEXMARK_PARALLELISM": str(s.parallelism),
                "NEXMARK_CONNECTOR_JAR": str(self.jar),
                # the JVM's own log per run (PyFlink's default is one file in the venv)
                "FLINK_LOG_DIR": str(logs / f"{run.tag}-flink"),
            }
            if s.flink_shared_jvm:
                self._flink_request(run, env, logs, state)
                return
            argv = [str(flink.python()), str(flink.JOB), run.query]
            run.procs.append(procs.Proc(argv, env, logs / f"{run.tag}.log"))
            return
        if run.system == "quix":
            env = {**base, "NEXMARK_PARTITIONS": str(s.partitions)}
            argv = [str(venvs.python("quix")), "-m", "benchmarks.nexmark.quix_apps", run.query]
            run.procs.append(procs.Proc(argv, env, logs / f"{run.tag}.log"))
            return
        stage = f"nexmark.{run.tag}.stage"
        stages = ["_a", "_b"] if run.query in TWO_STAGE else [""]
        # --parallelism N: N instances of each app (one consumer group: the partitions split)
        for suffix, n in ((x, i) for x in stages for i in range(1, s.parallelism + 1)):
            app = f"nexmark-{run.tag}{suffix.replace('_', '-')}"
            inst = "" if s.parallelism == 1 else f"-n{n}"
            env = {
                **base,
                "NEXMARK_STAGE_TOPIC": stage,
                "LOCKGATE_BOOTSTRAP_SERVERS": self.bootstrap,
                "LOCKGATE_APP_NAME": app,
                "LOCKGATE_INSTANCE_ID": f"n{n}",
                "LOCKGATE_STATE_DIR": str(state / (suffix or "app") / f"n{n}"),
                "LOCKGATE_GUARANTEE": "exactly_once",
                "LOCKGATE_CHECKPOINT_INTERVAL_MS": "1000",
                "LOCKGATE_HTTP_PORT": "0",
                "LOCKGATE_LOG_FORMAT": "console",
            }
            argv = [str(LOCKGATE_BIN), "run", f"benchmarks.nexmark.apps:{run.query}{suffix}"]
            run.procs.append(procs.Proc(argv, env, logs / f"{run.tag}{suffix}{inst}.log"))

    def _flink_request(self, run: Run, env: dict[str, str], logs: Path, state: Path) -> None:
        """Ask the shared Flink process (started at the first request) to run ``run``."""
        control = self.out_dir / "flink-control"
        if self.flink_server is None or not self.flink_server.alive:
            shutil.rmtree(control, ignore_errors=True)
            control.mkdir(parents=True)
            env = {**env, "FLINK_LOG_DIR": str(logs / "flink-shared")}
            argv = [str(flink.python()), str(flink.JOB), "--serve", str(control)]
            self.flink_server = procs.Proc(argv, env, logs / "flink-shared.log")
        self.flink_requests += 1
        name = f"{self.flink_requests:04d}"
        request = {
            "query": run.query,
            "output": env["BENCH_OUTPUT"],
            "group": env["BENCH_GROUP"],
            "state_dir": str(state),
        }
        # the peak RSS of this run only: reset each process's VmHWM (clear_refs 5)
        for pid in procs.descendants(self.flink_server.pid):
            try:
                Path(f"/proc/{pid}/clear_refs").write_text("5")
            except OSError:
                pass
        tmp = control / f"{name}.tmp"
        tmp.write_text(json.dumps(request))
        tmp.replace(control / f"{name}.json")
        run.procs.append(self.flink_server)
        run.done_file = control / f"{name}.done"

    def stop_flink(self) -> None:
        """Stop the shared Flink process, if one runs."""
        if self.flink_server is None:
            return
        (self.out_dir / "flink-control" / "stop").touch()
        self.flink_server.stop(timeout=30)
        self.flink_server = None

    def _group(self, run: Run) -> str:
        if run.system in ("flink", "quix"):
            return f"nexmark-{run.tag}"
        return f"nexmark-{run.tag}-a" if run.query in TWO_STAGE else f"nexmark-{run.tag}"

    # -- measure
    def measure(self, system: str, query: str, i: int) -> dict[str, Any]:
        """Run ``system`` on ``query`` to the end of the input; return its figures."""
        wait_rehearsal()
        s = self.s
        tag = f"{self.run_name[-6:]}-{query}-{system[:2]}{i}"
        run = Run(system, query, tag)
        output = f"nexmark.{tag}.out"
        # no time retention: Quix's outputs carry the events' 2015 timestamps
        keep = {"retention.ms": "-1"}
        self.admin.create({output: s.partitions}, keep)
        if system == "lockgate" and query in TWO_STAGE:
            self.admin.create({f"nexmark.{tag}.stage": s.partitions}, keep)
        groups = GroupOffsets(self.bootstrap, self._group(run), self.input, s.partitions)
        # two-stage lockgate: the second app's progress on the stage topic
        stage_b = (
            GroupOffsets(self.bootstrap, f"nexmark-{tag}-b", f"nexmark.{tag}.stage", s.partitions)
            if system == "lockgate" and query in TWO_STAGE
            else None
        )
        last_b = -1
        # two-stage lockgate: the stage's committed end once the first app committed the
        # whole input (every record it will write lies below it); the first app then keeps
        # writing barriers to the stage every checkpoint, so the second app's offsets never
        # stop moving: it is done when it committed up to that end
        stage_end: int | None = None
        # Quix's q5/q7: its progress on its repartition topic (created at its start)
        quix_repartition = system == "quix" and query in QUIX_REPARTITION
        load_before = Path("/proc/loadavg").read_text().split()[0]
        self._start(run)
        started = time.time()
        samples: list[tuple[float, int, int, float, float]] = []
        status = "ok"
        stable_since: float | None = None
        # --parallelism N, lockgate: when a group forms only after its input started
        # flowing, the instance that joined first read every partition alone and handed
        # half on mid-run (a rebalance and a changelog restore inside the span): such a
        # run is flagged (the broker's group.initial.rebalance.delay.ms prevents it). Each
        # group against its own input: a two-stage query's second group forms after the
        # first group's first commit, and that is fine, as long as it forms before its own
        track_group = system == "lockgate" and s.parallelism > 1
        lockgate_groups = [self._group(run)] + ([f"nexmark-{tag}-b"] if query in TWO_STAGE else [])
        formed_at: dict[str, float] = {}
        first_commit_at: dict[str, float] = {}
        last_out = -1
        rss = 0.0
        deadline = time.monotonic() + s.run_timeout
        try:
            while True:
                t = time.time()
                try:
                    out = sum(self.admin.end_offsets(output, s.partitions, timeout=5))
                except Exception:  # noqa: BLE001 - a slow answer: keep the last one
                    out = max(last_out, 0)
                committed = groups.committed()
                for i, g in enumerate(lockgate_groups if track_group else []):
                    if g not in first_commit_at:
                        first = committed if i == 0 or stage_b is None else stage_b.committed()
                        if first > 0:
                            first_commit_at[g] = t
                    if g not in formed_at and group_formed(self.admin, g, s.parallelism):
                        formed_at[g] = t
                cpu = sum(p.cpu() for p in run.procs)
                bcpu = procs.cpu_seconds(self.broker_pid) if self.broker_pid else 0.0
                samples.append((t, committed, out, cpu, bcpu))
                if len(samples) % 4 == 1:  # peak RSS while the tree lives (Flink exits)
                    rss = max(rss, sum(p.rss_mb() for p in run.procs))
                alive = [p.alive for p in run.procs]
                if run.done_file is not None:
                    if run.done_file.exists():
                        answer = run.done_file.read_text()
                        if answer != "ok":
                            status = answer
                        break
                    if not alive[0]:
                        status = f"the shared Flink process exited ({alive})"
                        break
                elif system == "flink":
                    if not alive[0]:
                        code = run.procs[0].popen.returncode
                        if code != 0:
                            status = f"exited with code {code}"
                        break
                else:
                    if not all(alive):
                        status = "a process exited"
                        break
                    if committed >= self.input_records:
                        if quix_repartition and stage_b is None:
                            stage_b = self._quix_stage(tag)
                        b = stage_b.committed() if stage_b is not None else 0
                        if stage_b is not None and not quix_repartition:
                            if stage_end is None:
                                stage = f"nexmark.{tag}.stage"
                                try:
                                    stage_end = sum(self.admin.end_offsets(stage, s.partitions))
                                except Exception:  # noqa: BLE001 - ask again at the next sample
                                    stage_end = None
                            moved = out != last_out or stage_end is None or b < stage_end
                        else:
                            moved = out != last_out or b != last_b
                        last_b = b
                        if moved:
                            stable_since = t
                        elif stable_since is not None and t - stable_since >= 3.0:
                            break
                        stable_since = stable_since or t
                last_out = out
                if time.monotonic() > deadline:
                    status = f"timeout after {s.run_timeout} s"
                    break
                time.sleep(0.25)
            rss = max(rss, sum(p.rss_mb() for p in run.procs))
        finally:
            if run.done_file is None:
                codes = [p.stop(timeout=30) for p in run.procs]
            else:
                codes = [0]
                if status != "ok":  # a job may still run in it: start afresh
                    self.stop_flink()
            groups.close()
            if stage_b is not None:
                stage_b.close()
        if status != "ok":
            tails = "\n".join(p.log_tail(20) for p in run.procs)
            say(f"  !! {tag}: {status}; log tail:\n{tails}")
        res: dict[str, Any] = {
            "system": system,
            "query": query,
            "tag": tag,
            "status": status,
            "exit_codes": codes,
            "peak_rss_mb": round(rss, 1),
            "load_before": float(load_before),
            "load_after": float(Path("/proc/loadavg").read_text().split()[0]),
            "wall_s": round(time.time() - started, 1),
        }
        res.update(self._figures(samples, started))
        # not a measurement of N instances: the run does not count (runs ok < repeat)
        if track_group:
            if len(formed_at) == len(lockgate_groups):
                res["group_formed_s"] = round(max(formed_at.values()) - started, 1)
            late = late_group(lockgate_groups, formed_at, first_commit_at, s.parallelism)
            if late and res["status"] == "ok":
                res["status"] = late
        if res["status"].startswith("late group"):
            say(f"  !! {tag}: {res['status']}")
        t_read = time.monotonic()
        rows = read_rows(self.bootstrap, output, query)
        res["readback_s"] = round(time.monotonic() - t_read, 1)
        res["outputs"] = sum(rows.values())
        res["_rows"] = rows
        shutil.rmtree(self.out_dir / "state" / tag, ignore_errors=True)
        return res

    def _quix_stage(self, tag: str) -> GroupOffsets | None:
        """The Quix app's progress on its repartition topic(s), when they exist yet."""
        group = f"nexmark-{tag}"
        try:
            mine = [t for t in self.admin.topics() if t.startswith("repartition__") and group in t]
        except Exception:  # noqa: BLE001 - try again at the next sample
            return None
        return GroupOffsets(self.bootstrap, group, mine, self.s.partitions) if mine else None

    def _figures(
        self, samples: list[tuple[float, int, int, float, float]], started: float
    ) -> dict[str, Any]:
        """Rate, CPU and broker CPU over the span (see the module docstring)."""
        first = next((x for x in samples if x[1] > 0), None)
        final_out = samples[-1][2] if samples else 0
        end = next((x for x in samples if x[2] >= final_out), None) if final_out else None
        if first is None or end is None or end[0] <= first[0]:
            return {"rate": None, "cpu_s_per_m": None}
        secs = end[0] - first[0]
        n = self.input_records - first[1]
        if n <= 0:  # the whole input went in the first checkpoint: no span to measure
            return {"rate": None, "cpu_s_per_m": None}
        cpu = [(t, c) for t, _, _, c, _ in samples]
        bcpu = [(t, b) for t, _, _, _, b in samples]
        used = _interp(cpu, end[0]) - _interp(cpu, first[0])
        bused = _interp(bcpu, end[0]) - _interp(bcpu, first[0])
        if self.broker_idle is not None:
            bused -= self.broker_idle * secs
        return {
            "rate": round(n / secs),
            "span_s": round(secs, 2),
            "events_in_span": n,
            "startup_s": round(first[0] - started, 1),
            "cpu_s_per_m": round(used / n * 1e6, 2),
            "cpu_cores": round(used / secs, 2),
            "broker_cpu_s_per_m": round(bused / n * 1e6, 2) if self.broker_pid else None,
        }

    # -- all
    def run(self) -> dict[str, Any]:
        """Every query: the systems interleaved, ``repeat`` times; then the checks."""
        self.prepare()
        try:
            self._queries()
        finally:
            self.stop_flink()
        return self.results

    def _queries(self) -> None:
        for query in self.s.queries:
            reference: Counter[tuple[Any, ...]] | None = None
            ref_tag = ""
            for i in range(self.s.repeat):
                for system in self.s.systems:
                    if system == "quix" and query in QUIX_CANNOT:
                        continue
                    say(f"{query} ({TITLES[query]}): {system} run {i + 1}/{self.s.repeat}")
                    try:
                        res = self.measure(system, query, i)
                    except Exception as exc:  # noqa: BLE001 - keep going, report it
                        say(f"  !! {query} {system}: {exc!r}")
                        self.results["errors"].append(f"{query} {system}: {exc!r}")
                        continue
                    rows = res.pop("_rows")
                    if reference is None and res["status"] == "ok" and rows:
                        reference, ref_tag = rows, res["tag"]
                        res["check"] = "reference"
                    elif reference is not None:
                        res["check"] = _compare(rows, reference, ref_tag)
                    else:
                        res["check"] = "no reference"
                    res["ok"] = res["status"] == "ok" and res["check"] in ("reference", "same")
                    say(
                        f"  {system}: {res.get('rate')} events/s, "
                        f"{res.get('cpu_s_per_m')} CPU s/M, {res['peak_rss_mb']} MB, "
                        f"{res['outputs']} outputs, check: {res['check']}"
                    )
                    self.results["runs"].append(res)


def late_group(
    groups: list[str],
    formed_at: dict[str, float],
    first_commit_at: dict[str, float],
    members: int,
) -> str | None:
    """Why a ``--parallelism`` run does not count, or ``None`` when it does.

    It does not when one of its consumer ``groups`` never formed with ``members`` members
    (``formed_at`` lacks it), or formed only at or after its own first committed input
    (``first_commit_at``: the first sample with committed offsets of that group): one
    instance read alone, then handed partitions on mid-run.
    """
    for g in groups:
        if g not in formed_at:
            return f"late group: {g} never formed with {members} members"
    for g in groups:
        if g in first_commit_at and formed_at[g] >= first_commit_at[g]:
            return (
                f"late group: {g} formed {formed_at[g] - first_commit_at[g]:.1f} s after its "
                "first committed input (one instance read alone, then handed partitions "
                "on; see GROUP_JOIN_DELAY_MS)"
            )
    return None


def _compare(rows: Counter[tuple[Any, ...]], ref: Counter[tuple[Any, ...]], ref_tag: str) -> str:
    """``same``, or what differs from the reference run's rows."""
    if rows == ref:
        return "same"
    missing = ref - rows
    extra = rows - ref
    ex_m = next(iter(missing), None)
    ex_e = next(iter(extra), None)
    return (
        f"DIFFERS from {ref_tag}: {sum(missing.values())} rows missing (e.g. {ex_m}), "
        f"{sum(extra.values())} extra (e.g. {ex_e})"
    )


# --------------------------------------------------------------------------- report


def med_range(values: Sequence[float | None]) -> str:
    """``values``' median with its range, as a table cell: ``"1,234 (1,100–1,300)"``.

    ``None`` values are skipped; no value left gives ``"—"``; one value has no range.
    Medians of 100 and more are whole numbers, smaller ones have one decimal.
    """
    vals = [v for v in values if v is not None]
    if not vals:
        return "—"
    m = median(vals)
    text = f"{m:,.0f}" if m >= 100 else f"{m:,.1f}"
    if len(vals) > 1:
        lo, hi = min(vals), max(vals)
        rng = f"{lo:,.0f}–{hi:,.0f}" if m >= 100 else f"{lo:,.1f}–{hi:,.1f}"
        text += f" ({rng})"
    return text


def _loads(runs: list[dict[str, Any]]) -> str:
    """The 1-minute load average before and after each run."""
    return " ".join(f"{r['load_before']:.1f}→{r['load_after']:.1f}" for r in runs)


def render(doc: dict[str, Any]) -> str:
    """RESULTS-nexmark.md from a nexmark.json document."""
    meta, res = doc["meta"], doc["nexmark"]
    lines = [
        "# Nexmark: lockgate, Flink SQL and Quix Streams on one broker",
        "",
        f"Run {meta['started']} on {meta['machine'].get('cpu', '?')} "
        f"({meta['machine'].get('cores', '?')} cores), git {meta['git']}; "
        f"{meta['total_minutes']:.1f} min in all. Command: `{meta['command']}`. "
        f"{meta['broker']}.",
        "",
        f"Load before: {meta['uptime_before']}. After: {meta['uptime_after']}.",
        "",
    ]
    if meta.get("note"):
        lines += [meta["note"], ""]
    lines += body(res)
    lines += [
        'Method and caveats: docs/benchmarks.md, section "Nexmark and Flink". The machine '
        "may be shared with other work during a run (load averages above).",
        "",
    ]
    return "\n".join(lines)


def body(res: dict[str, Any]) -> list[str]:
    """The input and config sentences, the per-query table, the ratios, the errors."""
    inp = res.get("input", {})
    lines: list[str] = []
    if inp:
        lines += [
            f"Input: {inp['events']:,} events (seed {inp['seed']}, "
            f"{inp['rate_event_time']:,} events per second of event time, "
            f"disorder group {inp['disorder_group']} = at most {inp['disorder_ms']} ms out of "
            f"order) on {inp['partitions']} partitions; watermark delay (Quix: grace) "
            f"{inp['watermark_delay_ms']} ms in every system; {res.get('repeat', 1)} run(s) "
            "per system and query, interleaved. Broker idle CPU: "
            + (
                f"{res['broker_idle_cores'] * 100:.1f} % of a core (subtracted from the broker "
                "column)."
                if res.get("broker_idle_cores") is not None
                else "not measured."
            ),
            "",
        ]
    fl = res.get("flink")
    if fl:
        lines += [
            f"Flink: {', '.join(f'{k} {v}' for k, v in fl['versions'].items())}, "
            f"{fl['connector']}, {fl['java']}; mini-cluster, parallelism "
            f"{res.get('parallelism', 1)}, checkpoints every "
            "1 s (exactly-once), heap state, exactly-once Kafka sink"
            + (
                "; one PyFlink process (one JVM) ran the queries in turn, each as its own "
                "job (start-up: the first query's includes the JVM's; peak RSS: reset at "
                "each query, but the heap the JVM kept from earlier queries counts)"
                if fl.get("shared_jvm")
                else "; a fresh PyFlink process (JVM) per run"
            )
            + ".",
            "",
        ]
    qx = res.get("quix")
    if qx:
        lines += [
            f"Quix Streams: {', '.join(f'{k} {v}' for k, v in qx['versions'].items())}; "
            "exactly-once, commit interval 1 s, RocksDB state with changelog topics, one "
            'process; windows with `closing_strategy="partition"`; q5 and q7 re-key with '
            "`group_by` (a repartition topic) in the same process "
            "(benchmarks/nexmark/quix_apps.py).",
            "",
        ]
        for q, why in qx.get("cannot", {}).items():
            lines += [f"Quix cannot express {q}: {why}", ""]
    par = res.get("parallelism", 1)
    lines += [
        "lockgate: exactly-once, checkpoints every 1 s, "
        + (
            "one instance (q5, q7: two apps, two processes)."
            if par == 1
            else f"{par} instances of each app (q5, q7: two apps, {2 * par} processes)."
        ),
        "",
        "Rate: input events consumed per second between the first committed input offset "
        "and the output's final committed size (start-up excluded); CPU: seconds of the "
        "system's process tree (the Flink JVM included) per million input events over the "
        "same span; RSS: peak, summed over the tree. Medians (ranges) over the runs. "
        "Check: each run's committed output, as a multiset of rows, against the query's "
        "first successful run (lockgate's when it ran).",
        "",
        "| query | system | runs ok | events/s | CPU s / M events | peak RSS MB | "
        "broker CPU s / M | start-up s | span s | load before → after | outputs | check |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    runs = res.get("runs", [])
    for query in QUERIES:
        for system in SYSTEMS:
            rs = [r for r in runs if r["query"] == query and r["system"] == system]
            if not rs:
                continue
            ok = [r for r in rs if r.get("ok")]
            use = ok or rs
            checks = sorted({str(r.get("check")) for r in rs})
            lines.append(
                f"| {query} {TITLES[query]} | {system} | {len(ok)}/{len(rs)} | "
                f"{med_range([r.get('rate') for r in use])} | "
                f"{med_range([r.get('cpu_s_per_m') for r in use])} | "
                f"{med_range([r.get('peak_rss_mb') for r in use])} | "
                f"{med_range([r.get('broker_cpu_s_per_m') for r in use])} | "
                f"{med_range([r.get('startup_s') for r in use])} | "
                f"{med_range([r.get('span_s') for r in use])} | "
                f"{_loads(rs)} | "
                f"{' / '.join(format(r['outputs'], ',') for r in rs)} | {'; '.join(checks)} |"
            )
    lines.append("")
    spent = _time_spent(runs)
    if spent:
        lines += [f"Time spent per system (runs, start-up and read-back included): {spent}.", ""]
    for peer, label in (("flink", "Flink"), ("quix", "Quix Streams")):
        ratios = []
        for query in QUERIES:
            lg = ok_rates(runs, query, "lockgate")
            other = ok_rates(runs, query, peer)
            if lg and other:
                ratios.append(f"{query} {median(lg) / median(other):.2f}×")
            elif peer == "quix" and query in QUIX_CANNOT and lg:
                ratios.append(f"{query} —")
        if ratios:
            lines += [f"lockgate / {label} throughput (medians): {', '.join(ratios)}.", ""]
    if res.get("errors"):
        lines += [f"Errors: {len(res['errors'])}:", ""]
        lines += [f"- `{e}`" for e in res["errors"]]
        lines.append("")
    return lines


def _time_spent(runs: list[dict[str, Any]]) -> str:
    """Minutes of wall time per system: its runs plus reading their outputs back."""
    minutes: dict[str, float] = {}
    for r in runs:
        spent = (r.get("wall_s") or 0) + (r.get("readback_s") or 0)
        minutes[r["system"]] = minutes.get(r["system"], 0.0) + spent / 60
    return ", ".join(f"{system} {m:.1f} min" for system, m in minutes.items())


def ok_rates(runs: list[dict[str, Any]], query: str, system: str) -> list[float]:
    """The rates of the successful runs of ``system`` on ``query``."""
    return [
        r["rate"]
        for r in runs
        if r["query"] == query and r["system"] == system and r.get("ok") and r.get("rate")
    ]


# --------------------------------------------------------------------------- main


def parse(argv: list[str] | None = None) -> tuple[Settings, argparse.Namespace]:
    """Settings from the command line (``BENCH_KAFKA_PORT``/``BENCH_BROKER`` from the
    environment, like the other harness sections)."""
    ap = argparse.ArgumentParser(prog="python -m benchmarks.nexmark", description=__doc__)
    ap.add_argument(
        "--quick", action="store_true", help="100k events, q0 q1 q2 q7 only, one run each"
    )
    ap.add_argument("--events", type=int, help="input events (default 2,000,000)")
    ap.add_argument("--queries", help=f"comma-separated (default {','.join(QUERIES)})")
    ap.add_argument("--systems", help="comma-separated (default lockgate,flink,quix)")
    ap.add_argument("--repeat", type=int, help="runs per system and query (default 3)")
    ap.add_argument("--partitions", type=int, default=4)
    ap.add_argument("--disorder", type=int, default=1, help="out-of-order group size")
    ap.add_argument("--seed", type=int, default=42)
    ap.add_argument("--timeout", type=int, default=1800, help="seconds per run")
    ap.add_argument(
        "--flink-shared-jvm",
        action="store_true",
        help="one PyFlink process (one JVM) runs all queries (default: one per query)",
    )
    ap.add_argument(
        "--parallelism",
        type=int,
        default=1,
        help="lockgate instances per app and Flink's parallelism (Quix Streams is not run)",
    )
    ap.add_argument("--no-results", action="store_true", help="do not write RESULTS-nexmark.md")
    ap.add_argument("--render", metavar="JSON", help="only re-render RESULTS-nexmark.md")
    ns = ap.parse_args(argv)
    s = Settings()
    if ns.quick:
        s.events = 100_000
        s.queries = ["q0", "q1", "q2", "q7"]
        s.repeat = 1
    if ns.events:
        s.events = ns.events
    if ns.queries:
        s.queries = [q.strip() for q in ns.queries.split(",") if q.strip()]
    if ns.systems:
        s.systems = [x.strip() for x in ns.systems.split(",") if x.strip()]
    unknown = set(s.queries) - set(QUERIES) or set(s.systems) - set(SYSTEMS)
    if unknown:
        ap.error(f"unknown: {sorted(unknown)}")
    if ns.repeat:
        s.repeat = ns.repeat
    s.partitions, s.disorder = ns.partitions, ns.disorder
    s.seed, s.run_timeout = ns.seed, ns.timeout
    s.flink_shared_jvm = ns.flink_shared_jvm
    s.parallelism = ns.parallelism
    if s.parallelism > 1 and "quix" in s.systems:
        say("--parallelism: Quix Streams runs one process only; not running it")
        s.systems = [x for x in s.systems if x != "quix"]
    if s.parallelism < 1 or s.parallelism > s.partitions:
        ap.error("--parallelism must be between 1 and --partitions")
    s.kafka_port = int(os.environ.get("BENCH_KAFKA_PORT", "49092"))
    s.external_broker = os.environ.get("BENCH_BROKER", "")
    return s, ns


def main(argv: list[str] | None = None) -> int:
    """Run the harness (or re-render)."""
    s, ns = parse(argv)
    if ns.render:
        doc = json.loads(Path(ns.render).read_text())
        RESULTS.write_text(render(doc))
        return 0
    stamp = time.strftime("%Y%m%d-%H%M%S")
    out_dir = BENCH_DIR / "out" / f"nexmark-{stamp}"
    out_dir.mkdir(parents=True, exist_ok=True)
    cmd = "python -m benchmarks.nexmark " + " ".join(argv if argv is not None else [])
    import sys

    if argv is None:
        cmd = "python -m benchmarks.nexmark " + " ".join(sys.argv[1:])
    meta: dict[str, Any] = {
        "started": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
        "command": (f"BENCH_BROKER={s.external_broker} " if s.external_broker else "")
        + cmd.strip(),
        "machine": machine(),
        "uptime_before": uptime(),
        "git": revision(),
    }
    t0 = time.monotonic()
    code = 0
    if s.external_broker:
        bootstrap = s.external_broker
        port = int(bootstrap.rsplit(":", 1)[1])
        pid = pid_listening(port)
        meta["broker"] = f"existing broker at {bootstrap} (not started or stopped here)"
        if s.parallelism > 1:
            say(
                "--parallelism with BENCH_BROKER: start that broker with "
                "group.initial.rebalance.delay.ms=3000 (LOCKGATE_KAFKA_GROUP_INITIAL_"
                "REBALANCE_DELAY_MS), or lockgate's first instance reads alone until the "
                "others join"
            )
    else:
        # --parallelism: a new group waits 3 s (Kafka's default) for more members, so
        # every lockgate instance is in its first assignment
        delay = GROUP_JOIN_DELAY_MS if s.parallelism > 1 else 0
        bootstrap = broker.up(s.kafka_port, group_join_delay_ms=delay)
        pid = broker.broker_pid(s.kafka_port)
        meta["broker"] = f"Kafka {broker.kafka_version()} started by the harness on {bootstrap}" + (
            f" (group.initial.rebalance.delay.ms={delay})" if delay else ""
        )
    say(f"nexmark: output {out_dir}")
    harness = Harness(s, Admin(bootstrap), out_dir, pid)
    try:
        res = harness.run()
    except KeyboardInterrupt:
        code = 130
        res = harness.results
    finally:
        if not s.external_broker:
            broker.down(s.kafka_port)
        _cleanup_topics(bootstrap, out_dir.name, keep_broker=bool(s.external_broker))
    meta["uptime_after"] = uptime()
    meta["total_minutes"] = (time.monotonic() - t0) / 60
    doc = {"meta": meta, "nexmark": res}
    (out_dir / "nexmark.json").write_text(json.dumps(doc, indent=1, default=str))
    if not ns.no_results:
        RESULTS.write_text(render(doc))
        say(f"wrote {RESULTS.relative_to(ROOT)}")
    bad = [r for r in res.get("runs", []) if not r.get("ok")]
    return code or (1 if bad or res.get("errors") else 0)


def _cleanup_topics(bootstrap: str, run_name: str, keep_broker: bool) -> None:
    """Delete this run's topics on a broker that stays up."""
    if not keep_broker:
        return
    admin = Admin(bootstrap)
    delete_best_effort(admin, [t for t in admin.topics() if run_name[-6:] in t or run_name in t])


def delete_best_effort(admin: Admin, topics: list[str]) -> None:
    """Delete ``topics`` (best effort: a failure leaves a topic behind, nothing more)."""
    if topics:
        for fut in admin.admin.delete_topics(topics, operation_timeout=30).values():
            try:
                fut.result(60)
            except Exception:  # noqa: BLE001, S110 - best effort
                pass
