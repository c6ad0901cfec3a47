"""Where one lockgate Nexmark app's time goes (docs/benchmarks.md, "What bounded q2").

``python -m benchmarks.nexmark.probe TAG [--query q2] [--events N] [--conf JSON] [--spy]``
on the broker at ``BENCH_BROKER`` (default 127.0.0.1:48092): writes the generator's
``N`` events once (topic ``nexmark.probe<N>.events``, reused), runs ``lockgate run
benchmarks.nexmark.apps:<query>`` (exactly-once, checkpoints every 1 s, as the harness
does) under timing wrappers, samples every 0.25 s and prints one JSON line:

- the span and rate as the harness measures them (first committed input offset to the
  output's final committed size);
- per thread (``/proc/<pid>/task/*/schedstat``) over the span: seconds on a CPU and
  seconds runnable but waiting for one (the run queue); the rest of the span the thread
  slept;
- from the wrappers (``benchmarks/out/probe/probe-TAG.json``): ``consume()`` calls, their
  batch sizes (a power-of-two histogram), seconds in ``consume()`` (and in the empty
  ones), in ``Runner._process`` and in ``EpochCommitter.end_epoch``, and librdkafka's
  statistics every second (fetch requests, fetch queue length and bytes per partition);
- ``--conf JSON`` merges librdkafka properties into the input consumer's configuration
  (e.g. ``'{"fetch.queue.backoff.ms": 1000}'``; with ``"debug": "fetch"`` librdkafka logs
  to the app's log, where "not fetchable: queued.max.messages.kbytes exceeded" shows);
- ``--spy``: ``py-spy record --idle`` (raw collapsed stacks, 50 Hz) from 1 s after the
  start until the input is committed, and the main thread's shares of the loop.

The wrappers are installed by ``python -m benchmarks.nexmark.probe --launch APP`` (the
app's own process), around ``processors._runtime.runner``'s consumer and loop steps.
"""

from __future__ import annotations

import argparse
import atexit
import collections
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from benchmarks.paths import BENCH_DIR, MAIN_PY

OUT = BENCH_DIR / "out" / "probe"


# --------------------------------------------------------------------------- in the app


def launch(app_spec: str) -> None:
    """Run ``lockgate run app_spec`` with the timing wrappers (in the app's process)."""
    from confluent_kafka import Consumer

    import processors._runtime.runner as runner
    from processors._runtime.epoch import EpochCommitter
    from processors.cli import main

    t0 = time.monotonic()
    st: dict[str, Any] = {
        "consume_calls": 0,
        "consume_empty": 0,
        "consume_full": 0,
        "consume_s": 0.0,
        "consume_empty_s": 0.0,
        "consume_records": 0,
        "hist": {},
        "process_s": 0.0,
        "end_epoch_s": 0.0,
        "end_epoch_calls": 0,
        "first_record": None,
        "last_record": None,
        "rdk": [],
        "conf": None,
    }

    def stats_cb(raw: str) -> None:
        d = json.loads(raw)
        snap: dict[str, Any] = {"t": round(time.monotonic() - t0, 2), "brokers": {}, "parts": {}}
        for name, b in d.get("brokers", {}).items():
            if b.get("nodeid", -1) >= 0:
                snap["brokers"][name] = {
                    "fetch_req": b.get("req", {}).get("Fetch"),
                    "rxbytes": b["rxbytes"],
                    "rtt_avg_ms": b["rtt"]["avg"] / 1000,
                }
        for topic in d.get("topics", {}).values():
            for part, p in topic["partitions"].items():
                if part != "-1":
                    snap["parts"][part] = {
                        "fetchq_cnt": p["fetchq_cnt"],
                        "fetchq_size": p["fetchq_size"],
                        "rxmsgs": p["rxmsgs"],
                    }
        st["rdk"].append(snap)

    class TimedConsumer(Consumer):
        def __init__(self, conf: dict[str, Any]) -> None:
            conf = {**conf, **json.loads(os.environ.get("PROBE_CONF", "{}"))}
            if "debug" in conf:
                conf.pop("logger", None)  # librdkafka's own log to stderr
            st["conf"] = {k: v for k, v in conf.items() if isinstance(v, int | str | float)}
            conf["statistics.interval.ms"] = 1000
            conf["stats_cb"] = stats_cb
            super().__init__(conf)

        def consume(self, num_messages: int = 1, timeout: float = -1) -> list[Any]:
            t = time.monotonic()
            msgs: list[Any] = super().consume(num_messages, timeout)
            d = time.monotonic() - t
            n = len(msgs)
            st["consume_calls"] += 1
            st["consume_s"] += d
            st["consume_records"] += n
            if n == 0:
                st["consume_empty"] += 1
                st["consume_empty_s"] += d
            else:
                st["first_record"] = st["first_record"] or t - t0
                st["last_record"] = t + d - t0
            st["consume_full"] += n >= num_messages
            bucket = str(1 << (n.bit_length() - 1)) if n else "0"
            st["hist"][bucket] = st["hist"].get(bucket, 0) + 1
            return msgs

    def timed(cls: type, name: str, key: str) -> None:
        inner = getattr(cls, name)

        def wrapper(self: Any, *args: Any) -> Any:
            t = time.monotonic()
            try:
                return inner(self, *args)
            finally:
                st[key] += time.monotonic() - t
                if key == "end_epoch_s":
                    st["end_epoch_calls"] += 1

        setattr(cls, name, wrapper)  # before the runner is built: its wiring binds this

    setattr(runner, "Consumer", TimedConsumer)  # noqa: B010 - the runner's own name
    timed(runner.Runner, "_process", "process_s")
    timed(EpochCommitter, "end_epoch", "end_epoch_s")

    def dump() -> None:
        st["wall_s"] = time.monotonic() - t0
        Path(os.environ["PROBE_OUT"]).write_text(json.dumps(st, indent=1))

    atexit.register(dump)
    main(["run", app_spec])


# --------------------------------------------------------------------------- the driver


def _threads(pid: int) -> dict[str, list[float]]:
    """Seconds on a CPU and waiting in the run queue, summed per thread name."""
    out: dict[str, list[float]] = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            comm = Path(f"/proc/{pid}/task/{tid}/comm").read_text().strip()
            cpu, delay, _ = Path(f"/proc/{pid}/task/{tid}/schedstat").read_text().split()
        except (OSError, ValueError):
            continue
        name = comm.split(":")[0] + (":" + comm.split(":")[1][:4] if ":" in comm else "")
        acc = out.setdefault(name, [0.0, 0.0])
        acc[0] += int(cpu) / 1e9
        acc[1] += int(delay) / 1e9
    return out


def spy_shares(raw: Path) -> dict[str, float]:
    """The main thread's samples in the loop by step, as percentages (py-spy raw)."""
    shares: collections.Counter[str] = collections.Counter()
    for line in raw.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if "MainThread" not in stack.split(";", 1)[0] or "_loop (" not in stack:
            continue
        if "_process" in stack:
            step = "_process"
        elif "consume (" in stack:
            step = "consume()"
        elif "end_epoch (" in stack:
            step = "end_epoch"
        else:
            step = "other"
        shares[step] += int(count)
    total = sum(shares.values()) or 1
    return {k: round(100 * v / total, 1) for k, v in shares.most_common()}


def drive(ns: argparse.Namespace) -> dict[str, Any]:
    """One probed run; returns the figures (also printed as one JSON line)."""
    from benchmarks.admin import Admin, GroupOffsets
    from benchmarks.nexmark.generator import GenConfig, produce

    boot = os.environ.get("BENCH_BROKER", "127.0.0.1:48092")
    OUT.mkdir(parents=True, exist_ok=True)
    admin = Admin(boot)
    inp = f"nexmark.probe{ns.events}.events"
    if inp not in admin.topics():
        admin.create({inp: 4}, {"retention.ms": "-1"})
        produce(boot, inp, 4, GenConfig(ns.events, 10_000, 42, 1))
    records = ns.events + 4
    tag = ns.tag
    out = f"nexmark.probe-{tag}.out"
    admin.create({out: 4}, {"retention.ms": "-1"})
    state = OUT / f"state-{tag}"
    shutil.rmtree(state, ignore_errors=True)
    env = {
        **os.environ,
        "BENCH_INPUT": inp,
        "BENCH_OUTPUT": out,
        "NEXMARK_STAGE_TOPIC": f"nexmark.probe-{tag}.stage",
        "NEXMARK_DELAY_MS": "4000",
        "LOCKGATE_BOOTSTRAP_SERVERS": boot,
        "LOCKGATE_APP_NAME": f"probe-{tag}",
        "LOCKGATE_INSTANCE_ID": "n1",
        "LOCKGATE_STATE_DIR": str(state),
        "LOCKGATE_GUARANTEE": "exactly_once",
        "LOCKGATE_CHECKPOINT_INTERVAL_MS": "1000",
        "LOCKGATE_HTTP_PORT": "0",
        "LOCKGATE_LOG_FORMAT": "console",
        "PROBE_OUT": str(OUT / f"probe-{tag}.json"),
        "PROBE_CONF": ns.conf,
    }
    groups = GroupOffsets(boot, f"probe-{tag}", inp, 4)
    load0 = Path("/proc/loadavg").read_text().split()[:3]
    argv = [str(MAIN_PY), "-m", "benchmarks.nexmark.probe", "--launch"]
    with (OUT / f"{tag}.log").open("w") as log:
        app = subprocess.Popen(  # noqa: S603 - our own interpreter
            [*argv, f"benchmarks.nexmark.apps:{ns.query}"],
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    atexit.register(lambda: app.kill() if app.poll() is None else None)
    spy = None
    if ns.spy:
        time.sleep(1.0)
        spy = subprocess.Popen(  # noqa: S603 - py-spy from the venv (dev extra)
            [str(MAIN_PY.parent / "py-spy"), "record", "--idle", "-r", "50", "-f", "raw"]
            + ["-o", str(OUT / f"spy-{tag}.txt"), "--threads", "-p", str(app.pid)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
    samples: list[tuple[float, int, int, dict[str, list[float]]]] = []
    stable: float | None = None
    last = -1
    while app.poll() is None:
        t = time.time()
        try:
            o = sum(admin.end_offsets(out, 4))
        except Exception:  # noqa: BLE001 - a slow answer: keep the last one
            o = max(last, 0)
        c = groups.committed()
        samples.append((t, c, o, _threads(app.pid)))
        if c >= records:
            if spy is not None and spy.poll() is None:
                spy.send_signal(signal.SIGINT)
                spy.wait(30)
            if o != last or stable is None:
                stable = t
            elif t - stable >= 3:
                break
        last = o
        time.sleep(0.25)
    app.send_signal(signal.SIGTERM)
    app.wait(60)
    groups.close()
    first = next(x for x in samples if x[1] > 0)
    end = next(x for x in samples if x[2] >= samples[-1][2])
    secs = end[0] - first[0]
    n = records - first[1]
    per = {
        k: [
            round(v[0] - first[3].get(k, [0, 0])[0], 2),
            round(v[1] - first[3].get(k, [0, 0])[1], 2),
        ]
        for k, v in end[3].items()
    }
    res: dict[str, Any] = {
        "tag": tag,
        "query": ns.query,
        "conf": ns.conf,
        "load_before": load0,
        "load_after": Path("/proc/loadavg").read_text().split()[:3],
        "span_s": round(secs, 2),
        "rate": round(n / secs),
        "cpu_s_per_m": round(sum(v[0] for v in per.values()) / n * 1e6, 2),
        "threads_cpu_runq_s": per,
    }
    loop_thread = per.get("python", [0.0, 0.0])
    res["main_thread_asleep_s"] = round(secs - loop_thread[0] - loop_thread[1], 2)
    probe = json.loads((OUT / f"probe-{tag}.json").read_text())
    window = (probe["last_record"] or 0) - (probe["first_record"] or 0)
    tail = probe["wall_s"] - (probe["last_record"] or 0)  # idle consume() after the input
    res["loop"] = {
        "window_s": round(window, 2),
        "consume_s": round(probe["consume_s"] - tail, 2),
        "process_s": round(probe["process_s"], 2),
        "end_epoch_s": round(probe["end_epoch_s"], 2),
        "epochs": probe["end_epoch_calls"],
        "consume_calls": probe["consume_calls"],
        "batch_hist": probe["hist"],
    }
    rdk = probe["rdk"]
    if rdk and rdk[-1]["brokers"]:
        res["fetch_requests"] = next(iter(rdk[-1]["brokers"].values()))["fetch_req"]
    if spy is not None:
        res["spy_main_thread_pct"] = spy_shares(OUT / f"spy-{tag}.txt")
    return res


def main(argv: list[str] | None = None) -> int:
    """``--launch APP`` (inside the app's process) or one probed run."""
    args = sys.argv[1:] if argv is None else argv
    if args[:1] == ["--launch"]:
        launch(args[1])
        return 0
    ap = argparse.ArgumentParser(prog="python -m benchmarks.nexmark.probe")
    ap.add_argument("tag", help="names this run's topics, group and files")
    ap.add_argument("--query", default="q2", help="a one-app query: q0 q1 q2 q3 q8")
    ap.add_argument("--events", type=int, default=2_000_000)
    ap.add_argument("--conf", default="{}", help="librdkafka properties (JSON) to merge")
    ap.add_argument("--spy", action="store_true", help="py-spy record --idle the loop")
    print(json.dumps(drive(ap.parse_args(args))), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
