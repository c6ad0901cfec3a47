"""``make bench``: one broker, one run, every system; writes benchmarks/RESULTS.md.

Steps (``BENCH_STEPS``, default all): matrix (4 workloads x raw / lockgate / Quix
Streams / Faust, plus Quix Streams running the hand-written window handler; systems
interleaved within each repeat), sweep (commit / checkpoint interval of every system on
the keyed running sum, interleaved), windows (lockgate's window operator: open windows
per key group vs throughput, windows.py), recovery (kill -9 vs state size), latency
(fixed offered load), profile (py-spy on lockgate's exactly-once sum), pipeline (two-app
pipelines, savepoints: pipeline.py), enrich (two-input as-of join vs the running sum:
enrich.py), nexmark (Nexmark queries, lockgate vs Flink at parallelism 1 and 2:
benchmarks/nexmark/step.py).
Every knob is a ``BENCH_*`` variable, see benchmarks/config.py and docs/benchmarks.md.
"""

from __future__ import annotations

import gc
import json
import os
import shutil
import subprocess
import sys
import time
import traceback
from array import array
from dataclasses import replace
from pathlib import Path
from typing import Any

from benchmarks import broker, data, enrich, pipeline, report, runner, venvs, windows
from benchmarks import proc as procs
from benchmarks.admin import Admin, GroupOffsets
from benchmarks.config import Config
from benchmarks.machine import machine, uptime
from benchmarks.paths import BENCH_DIR, LOCKGATE_BIN, MAIN_PY, ROOT
from benchmarks.profiles import analyze_native, analyze_profile
from benchmarks.progress import elapsed, say
from benchmarks.revision import revision

PEER_VENVS = {"quix": "quix", "quix_handler": "quix", "faust": "faust"}
#: the pipeline step's defaults within make bench (its own defaults when run alone are
#: larger): BENCH_PIPELINE_REPEAT and BENCH_SAVEPOINT_KEYS override them
MAKE_BENCH_PIPELINE_REPEAT = 3
MAKE_BENCH_SAVEPOINT_KEYS = (10_000, 100_000)
#: the window sweep's points within make bench (the fewest and the most open windows per
#: key group of windows.py's default points); BENCH_WINDOW_SWEEP overrides them
MAKE_BENCH_WINDOW_SWEEP = "1000:1000,10000:10000:10000"


# ------------------------------------------------------------------ steps


class Bench:
    """The state of one ``make bench`` run."""

    def __init__(self, cfg: Config) -> None:
        self.cfg = cfg
        stamp = time.strftime("%Y%m%d-%H%M%S")
        self.out_dir = BENCH_DIR / "out" / stamp
        self.out_dir.mkdir(parents=True, exist_ok=True)
        self.run_id = stamp[-6:]
        self.admin: Admin | None = None
        self.datasets: dict[tuple[str, int], data.Dataset] = {}
        self.inputs: set[str] = set()
        self.results: dict[str, Any] = {
            "started": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
            "config": {k: v for k, v in vars(cfg).items()},
            "env_line": cfg.env_line(),
            "machine": machine(),
            "uptime_before": uptime(),
            "matrix": [],
            "sweep": [],
            "window_sweep": [],
            "recovery": [],
            "latency": [],
            "profiles": {},
            "pipeline": {},
            "enrich": {},
            "nexmark": {},
            "step_seconds": {},
            "errors": [],
        }

    def save(self) -> None:
        """Write the raw results (after every step, so a failed run keeps them)."""
        (self.out_dir / "results.json").write_text(json.dumps(self.results, indent=1))

    # -- inputs ----------------------------------------------------------------------

    def dataset(self, kind: str, n: int) -> data.Dataset:
        """The pre-produced input of ``kind`` with ``n`` records (produced on first use)."""
        key = (kind, n)
        if key not in self.datasets:
            assert self.admin is not None
            cfg = self.cfg
            topic = f"bench.{self.run_id}.{kind}.{n}"
            if kind == "numbers":
                ds = data.produce_numbers(self.admin, topic, n, cfg.keys, cfg.partitions)
            else:
                ds = data.produce_events(
                    self.admin,
                    topic,
                    n,
                    cfg.window_keys_for(n),
                    cfg.partitions,
                    cfg.windows,
                    cfg.window_ms,
                    cfg.window_delay_ms,
                )
            self.datasets[key] = ds
            self.inputs.add(topic)
            info = {
                "kind": kind,
                "topic": topic,
                "records": n,
                "keys": ds.keys,
                "avg_record_bytes": round(ds.bytes_total / n, 1),
                "produce_seconds": round(ds.produce_seconds, 1),
            }
            if kind == "events":
                info.update(windows.dataset_info(ds))
            self.results.setdefault("datasets", []).append(info)
        return self.datasets[key]

    def idle(self) -> float | None:
        """The broker's idle CPU utilisation now (nothing of the harness running)."""
        got = runner.broker_idle(self.cfg)
        if got is not None:
            say(f"  broker idle: {got:.3f} CPU s/s over {self.cfg.idle_seconds:g}s")
        return got

    def run(
        self, system: str, workload: str, tag: str, idle: float | None = None, **kw: Any
    ) -> dict[str, Any]:
        """One measured run (errors become a failed row, never abort the harness)."""
        assert self.admin is not None
        w = runner.WORKLOADS[workload]
        n = self.cfg.records_for(system)
        ds = self.dataset(w.dataset, n)
        spec = runner.RunSpec(system, w, f"{self.run_id}-{tag}", **kw)
        t0 = time.monotonic()
        try:
            res = runner.measure(self.cfg, self.admin, spec, ds, self.out_dir, idle=idle)
        except Exception as exc:  # noqa: BLE001 - reported, the run goes on
            say(f"  !! {tag} failed: {exc!r}")
            self.results["errors"].append(f"{tag}: {exc!r}\n{traceback.format_exc()}")
            res = {"system": system, "workload": workload, "ok": False, "rate": None}
            res.update(tag=spec.tag, commit_ms=spec.commit_ms)
            res["status"] = f"harness error: {exc!r}"
        finally:
            runner.cleanup_topics(self.admin, self.inputs)
        if w.dataset == "events":
            res["dataset"] = windows.dataset_info(ds)
        res["run_wall_s"] = round(time.monotonic() - t0, 1)
        rate = f"{res['rate']:,}/s" if res.get("rate") else "n/a"
        cpu = res.get("cpu_s_per_m")
        verdict = "complete" if res["ok"] else f"NOT OK: {res.get('status')} {res.get('check')}"
        say(
            f"  {tag}: {rate}, {cpu} CPU s/M, peak RSS {res.get('peak_rss_mb')} MiB, "
            f"load {res.get('load_before')}->{res.get('load_after')}, "
            f"{res['run_wall_s']}s, {verdict}"
        )
        return res

    def step_matrix(self) -> None:
        """Every workload on every system, ``BENCH_REPEAT`` times: repeat -> workload ->
        system, so the systems compared run back to back (A B A B ...); the broker's idle
        CPU is measured once before each workload's block of runs."""
        cfg = self.cfg
        plan = [(w, s) for w in cfg.workloads for s in cfg.systems if runner.runs_workload(s, w)]
        total = cfg.repeat * len(plan)
        i = 0
        for rep in range(1, cfg.repeat + 1):
            for workload in cfg.workloads:
                idle = self.idle()
                for system in cfg.systems:
                    if not runner.runs_workload(system, workload):
                        continue
                    i += 1
                    say(
                        f"matrix {i}/{total}: {workload} on {system} (run {rep}), "
                        f"{cfg.records_for(system):,} records"
                    )
                    res = self.run(system, workload, f"{workload}-{system}-r{rep}", idle=idle)
                    res["rep"] = rep
                    self.results["matrix"].append(res)
                    self.save()

    def step_sweep(self) -> None:
        """The commit / checkpoint interval of every system of BENCH_SWEEP_SYSTEMS on the
        keyed running sum (BENCH_SWEEP_WORKLOADS: exactly-once and at-least-once).

        The 1 s points are the matrix's runs (same harness run, same input) when the
        matrix ran them; the other intervals run here, BENCH_SWEEP_REPEAT times,
        interleaved (repeat -> workload -> interval -> system).
        """
        cfg = self.cfg
        reps = cfg.sweep_repeat or cfg.repeat
        configs: list[tuple[str, int]] = []
        for workload in cfg.sweep_workloads:
            for ms in cfg.sweep_intervals:
                reused = [
                    r
                    for r in self.results["matrix"]
                    if r.get("workload") == workload
                    and r.get("system") in cfg.sweep_systems
                    and r.get("commit_ms", 1000) == ms
                ]
                if reused:
                    for r in reused:
                        self.results["sweep"].append({**r, "from_matrix": True})
                else:
                    configs.append((workload, ms))
        total = reps * len(configs) * len(cfg.sweep_systems)
        i = 0
        for rep in range(1, reps + 1):
            for workload, ms in configs:
                idle = self.idle()
                for system in cfg.sweep_systems:
                    i += 1
                    say(f"sweep {i}/{total}: {system} {workload}, commit every {ms} ms (run {rep})")
                    tag = f"sweep-{workload}-{ms}-{system}-r{rep}"
                    res = self.run(system, workload, tag, idle=idle, commit_ms=ms)
                    res["rep"] = rep
                    self.results["sweep"].append(res)
                    self.save()

    def step_windows(self) -> None:
        """lockgate's window operator: open windows per key group vs throughput (windows.py).

        The window workload of the matrix is the comparison with the peers.
        """
        assert self.admin is not None
        cfg = replace(self.cfg, repeat=self.cfg.window_sweep_repeat)
        wb = windows.WindowBench(cfg, self.admin, self.out_dir, self.run_id, self.inputs)
        try:
            wb.run(["sweep"])
        finally:
            self.results["window_sweep"] = wb.results["sweep"]
            self.results["errors"].extend(f"windows: {e}" for e in wb.results["errors"])
            self.save()

    # -- recovery ---------------------------------------------------------------------

    def step_recovery(self) -> None:
        for keys in self.cfg.recovery_keys:
            try:
                self._recovery(keys)
            except Exception as exc:  # noqa: BLE001 - reported, the run goes on
                say(f"  !! recovery {keys} keys failed: {exc!r}")
                self.results["errors"].append(f"recovery {keys}: {traceback.format_exc()}")
            self.save()

    def _recovery(self, keys: int) -> None:
        assert self.admin is not None
        cfg = self.cfg
        say(f"recovery: {keys:,} keys: loading the state")
        tag = f"{self.run_id}-rec{keys}"
        topic, output, app = f"bench.{tag}.in", f"bench.{tag}.out", f"bench-{tag}"
        self.admin.create({topic: cfg.partitions}, {"retention.ms": "-1"})
        self.admin.create({output: cfg.partitions})
        self.inputs.add(topic)
        _produce_keys(cfg.bootstrap, topic, range(keys), 0)
        state = self.out_dir / "state" / tag
        shutil.rmtree(state, ignore_errors=True)
        env = {
            "BENCH_INPUT": topic,
            "BENCH_OUTPUT": output,
            "LOCKGATE_BOOTSTRAP_SERVERS": cfg.bootstrap,
            "LOCKGATE_APP_NAME": app,
            "LOCKGATE_INSTANCE_ID": "r1",
            "LOCKGATE_STATE_DIR": str(state),
            "LOCKGATE_GUARANTEE": "exactly_once",
            "LOCKGATE_CHECKPOINT_INTERVAL_MS": "1000",
            "LOCKGATE_HTTP_PORT": "0",
            "LOCKGATE_LOG_FORMAT": "console",
        }
        argv = [str(LOCKGATE_BIN), "run", "benchmarks.apps.lockgate_apps:running_sum"]
        groups = GroupOffsets(cfg.bootstrap, app, topic, cfg.partitions)
        logs = self.out_dir / "logs"
        logs.mkdir(parents=True, exist_ok=True)
        t0 = time.time()
        p = procs.Proc(argv, env, logs / f"{tag}-load.log")
        expected = keys
        load_s = _wait_committed(groups, expected, p, 600)
        say(f"  loaded {keys:,} keys in {load_s:.1f}s; kill -9")
        p.kill9()
        row: dict[str, Any] = {"keys": keys, "load_seconds": round(time.time() - t0, 1)}
        for mode in ("local", "changelog"):
            _produce_keys(cfg.bootstrap, topic, range(8), expected)
            expected += 8
            if mode == "changelog":
                shutil.rmtree(state, ignore_errors=True)
            log = logs / f"{tag}-{mode}.log"
            p = procs.Proc(argv, env, log)
            took = _wait_committed(groups, expected, p, 600, since=p.started)
            restored, restore_s = _restore_stats(log)
            row[mode] = {
                "seconds": round(took, 2),
                "restored_records": restored,
                "restore_seconds": round(restore_s, 2),
            }
            say(
                f"  restart with {'local state' if mode == 'local' else 'an empty state dir'}: "
                f"probe outputs committed {took:.2f}s after the start "
                f"(restored {restored:,} changelog records in {restore_s:.2f}s)"
            )
            if mode == "local":
                p.kill9()
        p.stop()
        groups.close()
        ds = data.Dataset("numbers", topic, keys + 16, keys, cfg.partitions)
        ds.sums = [1] * keys
        ds.counts = [1] * keys
        for i in range(min(8, keys)):
            ds.sums[i] = ds.counts[i] = 3
        check = data.read_output(cfg.bootstrap, output, "sum_eos", ds).check()
        row["check"] = check
        row["ok"] = check["ok"]
        self.results["recovery"].append(row)
        shutil.rmtree(state, ignore_errors=True)
        runner.cleanup_topics(self.admin, self.inputs - {topic})
        self.inputs.discard(topic)
        self.admin.admin.delete_topics([topic])

    # -- latency ----------------------------------------------------------------------

    def step_latency(self) -> None:
        cfg = self.cfg
        configs = [
            ("at-least-once (1 s commits)", "at_least_once", 1000),
            ("exactly-once 100 ms", "exactly_once", 100),
            ("exactly-once 1 s", "exactly_once", 1000),
        ]
        for label, guarantee, ms in configs:
            say(
                f"latency: lockgate running sum, {label}, "
                f"{cfg.latency_rate:,} records/s for {cfg.latency_seconds}s (+3s warm-up)"
            )
            try:
                row = self._latency(label, guarantee, ms)
            except Exception as exc:  # noqa: BLE001 - reported, the run goes on
                say(f"  !! latency {label} failed: {exc!r}")
                self.results["errors"].append(f"latency {label}: {traceback.format_exc()}")
                continue
            self.results["latency"].append(row)
            say(
                f"  p50 {row['p50_ms']} ms, p99 {row['p99_ms']} ms, max {row['max_ms']} ms "
                f"({row['measured']:,} records, {row['missing']} missing)"
            )
            self.save()

    def _latency(self, label: str, guarantee: str, ms: int) -> dict[str, Any]:
        assert self.admin is not None
        cfg = self.cfg
        tag = f"{self.run_id}-lat-{guarantee}-{ms}"
        topic, output, app = f"bench.{tag}.in", f"bench.{tag}.out", f"bench-{tag}"
        self.admin.create({topic: cfg.partitions})
        self.admin.create({output: cfg.partitions})
        state = self.out_dir / "state" / tag
        env = {
            "BENCH_INPUT": topic,
            "BENCH_OUTPUT": output,
            "LOCKGATE_BOOTSTRAP_SERVERS": cfg.bootstrap,
            "LOCKGATE_APP_NAME": app,
            "LOCKGATE_INSTANCE_ID": "l1",
            "LOCKGATE_STATE_DIR": str(state),
            "LOCKGATE_GUARANTEE": guarantee,
            "LOCKGATE_CHECKPOINT_INTERVAL_MS": str(ms),
            "LOCKGATE_HTTP_PORT": "0",
            "LOCKGATE_LOG_FORMAT": "console",
        }
        logs = self.out_dir / "logs"
        argv = [str(LOCKGATE_BIN), "run", "benchmarks.apps.lockgate_apps:running_sum"]
        app_p = procs.Proc(argv, env, logs / f"{tag}.log")
        deadline = time.monotonic() + 60
        while "assigned" not in app_p.log_path.read_text(errors="replace"):
            if time.monotonic() > deadline or not app_p.alive:
                app_p.stop()
                raise RuntimeError(f"lockgate did not get its partitions:\n{app_p.log_tail()}")
            time.sleep(0.1)
        warm = 3.0
        seconds = warm + cfg.latency_seconds
        sent_f, got_f = self.out_dir / f"{tag}.sent", self.out_dir / f"{tag}.got"
        lat = [str(MAIN_PY), "-m", "benchmarks.apps.latency"]
        reader = procs.Proc(
            [*lat, "read", cfg.bootstrap, output, str(cfg.partitions), str(seconds + 30)]
            + [str(got_f)],
            {},
            logs / f"{tag}-reader.log",
        )
        time.sleep(1.0)
        prod = procs.Proc(
            [
                *lat,
                "produce",
                cfg.bootstrap,
                topic,
                str(cfg.latency_rate),
                str(seconds),
                str(cfg.keys),
                str(sent_f),
            ],
            {},
            logs / f"{tag}-producer.log",
        )
        cpu0 = app_p.cpu()
        prod.popen.wait(seconds + 60)
        cpu1 = app_p.cpu()
        time.sleep(ms / 1000 + 2.0)
        reader.stop(timeout=10)
        app_p.stop()
        sent = array("d")
        with open(sent_f, "rb") as f:
            sent.frombytes(f.read())
        got = array("d")
        with open(got_f, "rb") as f:
            got.frombytes(f.read())
        recv: dict[int, float] = {}
        for i in range(0, len(got), 2):
            recv.setdefault(int(got[i]), got[i + 1])
        start = sent[0] + warm if sent else 0
        lats = sorted((recv[s] - t) * 1000 for s, t in enumerate(sent) if t >= start and s in recv)
        missing = sum(1 for s in range(len(sent)) if s not in recv)
        shutil.rmtree(state, ignore_errors=True)
        runner.cleanup_topics(self.admin, self.inputs)

        def pct(q: float) -> float:
            return round(lats[min(len(lats) - 1, int(q * len(lats)))], 1) if lats else -1.0

        return {
            "label": label,
            "guarantee": guarantee,
            "interval_ms": ms,
            "rate": cfg.latency_rate,
            "measured": len(lats),
            "missing": missing,
            "p50_ms": pct(0.50),
            "p90_ms": pct(0.90),
            "p99_ms": pct(0.99),
            "max_ms": round(lats[-1], 1) if lats else -1.0,
            "app_cpu_util": round((cpu1 - cpu0) / seconds, 2),
        }

    # -- profile ----------------------------------------------------------------------

    def step_profile(self) -> None:
        """py-spy on lockgate during each of BENCH_PROFILE_WORKLOADS (default sum_eos, sum_alo)."""
        venvs.ensure("pyspy")
        for workload in self.cfg.profile_workloads:
            how = "100 Hz, --native" if workload.endswith("+native") else "100 Hz"
            say(f"profile: lockgate {workload} under py-spy ({how})")
            try:
                prof = self._profile(workload)
            except Exception as exc:  # noqa: BLE001 - reported, the run goes on
                say(f"  !! profile {workload} failed: {exc!r}")
                self.results["errors"].append(f"profile {workload}: {traceback.format_exc()}")
                continue
            self.results["profiles"][workload] = prof
            say(f"  {prof.get('samples', 0)} samples; top self time:")
            for row in (prof.get("self") or prof.get("by_library", []))[:8]:
                say(f"    {row['pct']:5.1f}%  {row['function']}")
            self.save()

    def _profile(self, name: str) -> dict[str, Any]:
        workload, _, mode = name.partition("+")
        native = mode == "native"
        raw = self.out_dir / f"profile-{name}.txt"
        pyspy = str(venvs.python("pyspy").parent / "py-spy")
        extra = ["--native"] if native else ["--function"]

        def attach(p: procs.Proc) -> Any:
            # Blocking mode (the default): py-spy pauses the process for each sample so
            # stacks are consistent; at 100 Hz that costs well under 1%.
            return procs.pyspy_record(pyspy, p.pid, "--format", "raw", *extra, "-o", str(raw))

        assert self.admin is not None
        w = runner.WORKLOADS[workload]
        ds = self.dataset(w.dataset, self.cfg.records)
        spec = runner.RunSpec("lockgate", w, f"{self.run_id}-profile-{workload}{mode}")
        try:
            res = runner.measure(self.cfg, self.admin, spec, ds, self.out_dir, on_started=attach)
        finally:
            runner.cleanup_topics(self.admin, self.inputs)
        prof = analyze_native(raw) if native else analyze_profile(raw)
        prof["workload"] = workload
        prof["native"] = native
        prof["run"] = {k: res.get(k) for k in ("rate", "cpu_s_per_m", "ok")}
        prof["raw_file"] = str(raw.relative_to(ROOT))
        return prof

    # -- pipeline ---------------------------------------------------------------------

    def step_pipeline(self) -> None:
        """Two-app pipeline aligned vs unaligned, alignment time, savepoints (pipeline.py)."""
        assert self.admin is not None
        pc = pipeline.PipelineConfig()
        # make bench's time budget: fewer repeats and no 1M-key savepoint unless asked for
        if not os.environ.get("BENCH_PIPELINE_REPEAT"):
            pc.repeat = MAKE_BENCH_PIPELINE_REPEAT
        if not os.environ.get("BENCH_SAVEPOINT_KEYS"):
            pc.savepoint_keys = list(MAKE_BENCH_SAVEPOINT_KEYS)
        pb = pipeline.PipelineBench(self.cfg, pc, self.admin, self.out_dir, self.run_id)
        try:
            self.results["pipeline"] = pb.run()
        finally:
            self.results["pipeline"] = pb.results
            self.results["errors"].extend(f"pipeline: {e}" for e in pb.results["errors"])

    # -- enrich -----------------------------------------------------------------------

    def step_enrich(self) -> None:
        """Two-input enrichment (as-of join) vs the running sum, same inputs size (enrich.py)."""
        assert self.admin is not None
        eb = enrich.EnrichBench(
            self.cfg, enrich.EnrichConfig(), self.admin, self.out_dir, self.run_id
        )
        try:
            self.results["enrich"] = eb.run()
        finally:
            self.results["enrich"] = eb.results
            self.results["errors"].extend(f"enrich: {e}" for e in eb.results["errors"])
            say("\n".join(enrich.table(eb.results)))
            meta = {
                "started": self.results["started"],
                "command": "make bench",
                "machine": self.results["machine"],
                "uptime_before": self.results["uptime_before"],
                "broker": self.cfg.bootstrap,
            }
            doc = json.dumps({"meta": meta, "enrich": eb.results}, indent=1)
            enrich.OUT_JSON.write_text(doc)

    # -- failover ---------------------------------------------------------------------

    def step_failover(self) -> None:
        """Fresh-volume failover, 1M keys, snapshots off/on (benchmarks/failover.py, short).

        The full form (1M and 10M keys, 3 rounds, a changelog tail, an S3 store) is
        ``make bench-failover``; this step runs it on the harness's broker with
        ``BENCH_FAILOVER_KEYS`` (default 1,000,000) keys, 2 rounds per mode, no tail, and
        keeps its report in the run's directory.
        """
        out = self.out_dir / "failover"
        env = {
            **os.environ,
            "BENCH_BROKER": self.cfg.bootstrap,
            "BENCH_FAILOVER_KEYS": os.environ.get("BENCH_FAILOVER_KEYS", "1000000"),
            "BENCH_FAILOVER_REPEAT": os.environ.get("BENCH_FAILOVER_REPEAT", "2"),
            "BENCH_FAILOVER_TAIL": "0",
            "BENCH_FAILOVER_OUT": str(out),
            "BENCH_FAILOVER_REPORT": str(out / "failover.md"),
        }
        done = subprocess.run(
            [sys.executable, "-m", "benchmarks.failover"], env=env, cwd=ROOT, check=False
        )
        report = out / "failover.md"
        self.results["failover"] = {
            "markdown": report.read_text() if report.exists() else "",
            "exit": done.returncode,
        }
        if done.returncode != 0:
            self.results["errors"].append(f"failover: exit {done.returncode} (see {out})")

    # -- nexmark ----------------------------------------------------------------------

    def step_nexmark(self) -> None:
        """Nexmark queries on lockgate and Flink at parallelism 1 and 2
        (benchmarks/nexmark/step.py).

        Guarded: when the step's ``bench_step`` is missing the step records an error and
        the run goes on.
        """
        assert self.admin is not None
        try:
            from benchmarks.nexmark import step as nexmark_step

            bench_step = nexmark_step.bench_step
        except (ImportError, AttributeError) as exc:
            msg = f"nexmark: benchmarks.nexmark.step.bench_step is not available: {exc!r}"
            say(f"  !! {msg}")
            self.results["nexmark"] = {"errors": [msg]}
            self.results["errors"].append(msg)
            return
        try:
            res = bench_step(self.cfg, self.admin, self.out_dir, self.run_id)
        except Exception as exc:  # noqa: BLE001 - reported, the run goes on
            say(f"  !! nexmark failed: {exc!r}")
            res = {"errors": [f"{exc!r}\n{traceback.format_exc()}"]}
        self.results["nexmark"] = res
        self.results["errors"].extend(f"nexmark: {e}" for e in res.get("errors", []))
        self.save()


def _produce_keys(bootstrap: str, topic: str, keys: Any, seq0: int) -> None:
    """One running-sum record (v=1) per key index in ``keys``."""
    import orjson
    from confluent_kafka import Producer

    p = Producer(
        {
            "bootstrap.servers": bootstrap,
            "partitioner": "murmur2_random",
            "linger.ms": 50,
            "compression.type": "lz4",
            "queue.buffering.max.messages": 1_000_000,
        }
    )
    for i, k in enumerate(keys):
        value = orjson.dumps({"v": 1, "seq": seq0 + i, "pad": data.PAD})
        while True:
            try:
                p.produce(topic, value, data.key_of(k))
                break
            except BufferError:
                p.poll(0.05)
    if p.flush(120) != 0:
        raise RuntimeError(f"could not produce to {topic}")


def _wait_committed(
    groups: GroupOffsets, want: int, p: procs.Proc, timeout: float, since: float = 0
) -> float:
    """Wait until the group committed ``want`` input offsets; return seconds since ``since``."""
    started = since or time.time()
    deadline = time.monotonic() + timeout
    while True:
        if groups.committed() >= want:
            return time.time() - started
        if not p.alive:
            raise RuntimeError(f"lockgate exited:\n{p.log_tail()}")
        if time.monotonic() > deadline:
            raise TimeoutError(f"{want} offsets not committed within {timeout}s")
        time.sleep(0.05)


def _restore_stats(log: Path) -> tuple[int, float]:
    """Sum of records and of seconds over the 'key group restored' log lines."""
    records, seconds = 0, 0.0
    for line in log.read_text(errors="replace").splitlines():
        if "key group restored" not in line:
            continue
        for part in line.split():
            if part.startswith("records="):
                records += int(part.split("=", 1)[1])
            elif part.startswith("seconds="):
                seconds += float(part.split("=", 1)[1])
    return records, seconds


# ------------------------------------------------------------------ main


def versions(cfg: Config) -> dict[str, Any]:
    """Package versions of the project venv and of each peer / tool venv."""
    main = venvs.freeze("main")
    out: dict[str, Any] = {
        "lockgate": {
            "lockgate": main.get("lockgate", "?"),
            "git": revision(),
            "confluent-kafka": main.get("confluent-kafka", "?"),
            "rocksdict": main.get("rocksdict", "?"),
            "orjson": main.get("orjson", "?"),
        },
        "kafka": broker.kafka_version(),
    }
    for name, keys in venvs.KEY_PACKAGES.items():
        if venvs.python(name).exists():
            got = venvs.freeze(name)
            out[name] = {k: got.get(k, "?") for k in keys}
    try:
        from confluent_kafka import libversion

        out["lockgate"]["librdkafka"] = libversion()[0]
    except ImportError:
        pass
    return out


def main() -> int:
    cfg = Config()
    if not os.environ.get("BENCH_WINDOW_SWEEP"):
        cfg.window_sweep = MAKE_BENCH_WINDOW_SWEEP
    bench = Bench(cfg)
    say(
        f"lockgate benchmarks: {cfg.records:,} records per workload "
        f"(Quix Streams {cfg.records_for('quix'):,}, Faust {cfg.records_for('faust'):,}), "
        f"{cfg.repeat} runs each, steps {','.join(cfg.steps)}; output {bench.out_dir}"
    )
    say(f"machine load: {bench.results['uptime_before']}")
    t = time.monotonic()
    systems = set(cfg.systems) | (set(cfg.sweep_systems) if "sweep" in cfg.steps else set())
    needed = {PEER_VENVS[s] for s in systems if s in PEER_VENVS} | {"plot"}
    if "profile" in cfg.steps:
        needed.add("pyspy")
    for name in sorted(needed):
        venvs.ensure(name)
    bench.results["versions"] = versions(cfg)
    bench.results["step_seconds"]["venvs"] = round(time.monotonic() - t, 1)
    code = 0
    try:
        t = time.monotonic()
        if not cfg.external_broker:
            broker.up(cfg.kafka_port)
        bench.admin = Admin(cfg.bootstrap)
        bench.results["step_seconds"]["broker"] = round(time.monotonic() - t, 1)
        t = time.monotonic()
        say("producing the inputs (once per workload and size)")
        for system in cfg.systems:
            for workload in cfg.workloads:
                if runner.runs_workload(system, workload):
                    w = runner.WORKLOADS[workload]
                    bench.dataset(w.dataset, cfg.records_for(system))
        bench.results["step_seconds"]["inputs"] = round(time.monotonic() - t, 1)
        steps = {
            "matrix": bench.step_matrix,
            "sweep": bench.step_sweep,
            "windows": bench.step_windows,
            "recovery": bench.step_recovery,
            "latency": bench.step_latency,
            "profile": bench.step_profile,
            "pipeline": bench.step_pipeline,
            "enrich": bench.step_enrich,
            "failover": bench.step_failover,
            "nexmark": bench.step_nexmark,
        }
        for name in cfg.steps:
            t = time.monotonic()
            say(f"== step {name} ==")
            steps[name]()
            bench.results["step_seconds"][name] = round(time.monotonic() - t, 1)
            bench.save()
    except KeyboardInterrupt:
        say("interrupted")
        code = 130
    except Exception as exc:  # noqa: BLE001 - keep the partial results
        say(f"harness error: {exc!r}")
        bench.results["errors"].append(traceback.format_exc())
        code = 1
    finally:
        bench.admin = None  # its connections would complain once the broker is gone
        gc.collect()
        if not cfg.keep_broker and not cfg.external_broker:
            broker.down(cfg.kafka_port)
        bench.results["uptime_after"] = uptime()
        bench.results["git_after"] = revision()
        bench.results["total_seconds"] = round(elapsed(), 1)
        bench.save()
    say(f"machine load: {bench.results['uptime_after']}")
    md = report.write(bench.results, bench.out_dir)
    say(f"wrote {md.relative_to(ROOT)} ({elapsed() / 60:.1f} min in total)")
    return code


if __name__ == "__main__":
    sys.exit(main())
