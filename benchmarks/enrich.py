"""Enrichment (two co-partitioned inputs, as-of join) vs the single-input running sum.

Step ``enrich`` of ``make bench``, or on its own::

    .venv/bin/python -m benchmarks.enrich [--quick] [--records N] [--customers K] [--profile]

On its own it writes ``benchmarks/out/enrich.json`` (``--quick``:
``benchmarks/out/enrich-quick.json``), keeps the logs in ``benchmarks/out/<timestamp>/``
and replaces only the enrich section of benchmarks/RESULTS.md (not with ``--quick``;
``--render PATH`` re-renders that section from such a JSON). ``BENCH_BROKER=host:port``
uses a broker that is already running (neither started nor stopped; only this run's
topics are deleted); otherwise the harness starts its own on ``BENCH_KAFKA_PORT``.

Inputs, produced once before anything is measured (``murmur2_random`` partitioner, i.e.
Java-compatible murmur2 of the key, explicit record timestamps over one hour of event
time that ended an hour ago; every topic has ``BENCH_ENRICH_PARTITIONS`` partitions):

* customers: ``BENCH_ENRICH_CUSTOMERS`` ids (``cust-000042``); 98% of them get 1-4
  versions (the first one in the first 5% of the hour for 90% of them, the rest anywhere),
  every later version is a tombstone with probability 0.15; 2% never get a record. Sent
  in timestamp order (so every partition is in timestamp order), even milliseconds.
* orders: ``BENCH_ENRICH_RECORDS`` orders ``{"order_id", "amount"}`` of uniformly random
  customers, timestamps rising with the order number, odd milliseconds (never equal to a
  customer record's timestamp: no ties, so the expected join does not depend on tie rules).
* numbers: as many running-sum records ``{"v", "seq"}`` as the two enrichment inputs hold
  together (orders + customer records), over as many keys as there are customers, same
  hour of timestamps: both apps process the same number of input records.

Per run of an app (``examples.enrich_orders:app``, ``examples.running_sum:app``;
``BENCH_ENRICH_REPEAT`` runs each, default 3, alternating which app goes first), one cold
start: fresh app name (consumer group, changelogs), fresh output topic, empty state dir,
one ``lockgate run`` process with the default settings (exactly-once, 1 s checkpoints).
The summary holds the medians per app and their ratios.
The harness follows the output with a ``read_committed`` consumer (counting) and polls the
group's committed input offsets every 50 ms. Figures:

* **end-to-end** records/s: input records / (spawn of the process -> the reader has seen
  every expected output committed);
* **commit window** records/s: input records committed after the first commit that
  carried any / (that first commit -> every input offset committed), i.e. the rate once
  the app is up, without interpreter start, group join and the first epoch;
* **output span** records/s: input records / (broker append time of the first -> the
  last output record; the output topics use LogAppendTime): the processing rate, not
  quantized by the 1 s epochs as the commit window is (the last epoch commits up to 1 s
  after the last record was processed);
* **CPU s / M**: utime + stime of the app's process tree (``/proc/<pid>/stat``) per
  million input records, from spawn to done (``cpu_s_per_m``) and inside the commit
  window (``window_cpu_s_per_m``);
* **peak RSS**: VmHWM summed over the process tree just before it is stopped.

After the process stopped, the whole output is read again (read_committed) and checked
against a model computed by this harness: enrichment, every order exactly once, keyed by
its customer, with its amount, and with the customer's latest version at or before the
order's timestamp (null when none or deleted), per key in order; running sum, every input
``seq`` exactly once with the right key, count and sum. Any difference fails the run.
``--profile`` attaches py-spy (``BENCH_PYSPY`` or the harness's pyspy venv or ``py-spy``
on PATH; 100 Hz, blocking, ``--idle --threads``) to each app and adds the main thread's
top functions (wall time: waiting in ``consume()`` counts as self time of the loop) to the
JSON; that slows the apps, so profiled rates are not the benchmark's figures.

The app declares the topic variables it reads: ``App("enrich-orders",
env=["LOCKGATE_ORDERS_TOPIC", "LOCKGATE_CUSTOMERS_TOPIC"])``.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import sys
import threading
import time
import traceback
from array import array
from bisect import bisect_right
from dataclasses import dataclass, field
from pathlib import Path
from statistics import median
from typing import Any

import orjson
from confluent_kafka import Consumer, KafkaError, Producer, TopicPartition

from benchmarks import proc as procs
from benchmarks import venvs
from benchmarks.admin import Admin, GroupOffsets, delete_topics
from benchmarks.config import Config, env_int
from benchmarks.metrics import histogram, metric, scrape
from benchmarks.paths import BENCH_DIR, LOCKGATE_BIN, ROOT
from benchmarks.ports import free_port
from benchmarks.producers import input_producer
from benchmarks.profiles import analyze_profile
from benchmarks.progress import say
from benchmarks.sections import section_footer, splice_section
from benchmarks.standalone import run_standalone

ENRICH_SPEC = "examples.enrich_orders:app"
SUM_SPEC = "examples.running_sum:app"
BEGIN, END = "<!-- enrich:begin -->", "<!-- enrich:end -->"
COMMAND = ".venv/bin/python -m benchmarks.enrich"
OUT_JSON = BENCH_DIR / "out" / "enrich.json"
QUICK_JSON = BENCH_DIR / "out" / "enrich-quick.json"
QUICK = {"records": 50_000, "customers": 2_000}
SPAN_MS = 3_600_000  # event time of the inputs: one hour ...
AGE_MS = 7_200_000  # ... starting two hours ago
TIERS = ("bronze", "silver", "gold", "platinum")
REGIONS = ("eu-west", "eu-central", "us-east", "us-west", "ap-south")


@dataclass
class EnrichConfig:
    """``BENCH_ENRICH_*`` settings (``--records`` / ``--customers`` / ``--quick`` override)."""

    records: int = field(default_factory=lambda: env_int("BENCH_ENRICH_RECORDS", 200_000))
    customers: int = field(default_factory=lambda: env_int("BENCH_ENRICH_CUSTOMERS", 10_000))
    partitions: int = field(default_factory=lambda: env_int("BENCH_ENRICH_PARTITIONS", 4))
    repeat: int = field(default_factory=lambda: env_int("BENCH_ENRICH_REPEAT", 3))
    timeout: int = field(default_factory=lambda: env_int("BENCH_ENRICH_TIMEOUT", 600))
    seed: int = field(default_factory=lambda: env_int("BENCH_ENRICH_SEED", 20261126))
    profile: bool = field(default_factory=lambda: os.environ.get("BENCH_ENRICH_PROFILE") == "1")
    quick: bool = False

    def env_line(self) -> str:
        return (
            f"BENCH_ENRICH_RECORDS={self.records} BENCH_ENRICH_CUSTOMERS={self.customers} "
            f"BENCH_ENRICH_PARTITIONS={self.partitions} BENCH_ENRICH_REPEAT={self.repeat}"
        )


# ------------------------------------------------------------------ inputs and model


def cust_key(c: int) -> bytes:
    return b"cust-%06d" % c


def num_key(k: int) -> bytes:
    return b"k%07d" % k


@dataclass
class Inputs:
    """The three pre-produced input topics and what a correct run must output."""

    orders_topic: str
    customers_topic: str
    numbers_topic: str
    orders: int
    customer_records: int
    numbers: int
    #: per order: customer index, amount, expected ``customer`` value (None: null)
    order_cust: array[int] = field(default_factory=lambda: array("i"))
    order_amount: array[int] = field(default_factory=lambda: array("i"))
    order_expected: list[Any] = field(default_factory=list)
    #: per running-sum record: key index and v
    sum_keys: array[int] = field(default_factory=lambda: array("i"))
    sum_values: array[int] = field(default_factory=lambda: array("b"))
    stats: dict[str, Any] = field(default_factory=dict)

    @property
    def enrich_inputs(self) -> int:
        return self.orders + self.customer_records


def _send(p: Producer, topic: str, value: bytes | None, key: bytes, ts: int) -> None:
    while True:
        try:
            p.produce(topic, value, key, timestamp=ts)
            return
        except BufferError:
            p.poll(0.05)


def _flush(p: Producer, topic: str) -> None:
    if p.flush(120) != 0:
        raise RuntimeError(f"could not produce every input record to {topic}")


def produce_inputs(admin: Admin, ec: EnrichConfig, tag: str) -> Inputs:
    """Create and fill the three input topics; return them with the expected results."""
    rng = random.Random(ec.seed)
    n, k = ec.records, ec.customers
    inp = Inputs(f"{tag}.orders", f"{tag}.customers", f"{tag}.numbers", n, 0, 0)
    admin.create(
        {inp.customers_topic: ec.partitions, inp.orders_topic: ec.partitions},
        {"retention.ms": "-1"},
    )
    admin.create({inp.numbers_topic: ec.partitions}, {"retention.ms": "-1"})
    base = (int(time.time() * 1000) - AGE_MS) // 1000 * 1000
    half = SPAN_MS // 2

    # Customers: versions at even milliseconds.
    versions: list[tuple[list[int], list[Any]]] = []  # per customer: stamps, values
    records: list[tuple[int, int, Any]] = []  # (ts offset, customer, value or None)
    never = tombstones = 0
    for c in range(k):
        if rng.random() < 0.02:
            never += 1
            versions.append(([], []))
            continue
        nv = rng.randint(1, 4)
        if rng.random() < 0.9:
            first = rng.randrange(half // 20)
            rest = rng.sample(range(first + 1, half), nv - 1)
            slots = [first, *sorted(rest)]
        else:
            slots = sorted(rng.sample(range(half), nv))
        stamps, values = [], []
        for j, s in enumerate(slots):
            if j > 0 and rng.random() < 0.15:
                value: Any = None
                tombstones += 1
            else:
                value = {
                    "id": cust_key(c).decode(),
                    "name": f"Customer {c}",
                    "tier": rng.choice(TIERS),
                    "region": rng.choice(REGIONS),
                    "version": j,
                }
            stamps.append(2 * s)
            values.append(value)
            records.append((2 * s, c, value))
        versions.append((stamps, values))
    records.sort(key=lambda r: r[0])
    inp.customer_records = len(records)
    t = time.monotonic()
    p = input_producer(admin.bootstrap)
    for i, (off, c, value) in enumerate(records):
        _send(
            p,
            inp.customers_topic,
            None if value is None else orjson.dumps(value),
            cust_key(c),
            base + off,
        )
        if i % 20_000 == 0:
            p.poll(0)
    _flush(p, inp.customers_topic)

    # Orders: odd milliseconds, rising with the order number.
    nulls = deleted = 0
    dumps = orjson.dumps
    for i in range(n):
        c = rng.randrange(k)
        amount = rng.randrange(1, 100_000)
        off = 2 * (i * half // n) + 1
        stamps, values = versions[c]
        j = bisect_right(stamps, off)
        expected = values[j - 1] if j else None
        if expected is None:
            if j:
                deleted += 1
            else:
                nulls += 1
        inp.order_cust.append(c)
        inp.order_amount.append(amount)
        inp.order_expected.append(expected)
        value = dumps({"order_id": f"o{i:08d}", "amount": amount})
        _send(p, inp.orders_topic, value, cust_key(c), base + off)
        if i % 20_000 == 0:
            p.poll(0)
    _flush(p, inp.orders_topic)
    enrich_s = time.monotonic() - t

    # Running-sum input: as many records as both enrichment inputs.
    m = inp.enrich_inputs
    inp.numbers = m
    t = time.monotonic()
    for seq in range(m):
        key = rng.randrange(k)
        v = rng.randrange(100)
        inp.sum_keys.append(key)
        inp.sum_values.append(v)
        _send(
            p,
            inp.numbers_topic,
            dumps({"v": v, "seq": seq}),
            num_key(key),
            base + seq * SPAN_MS // m,
        )
        if seq % 20_000 == 0:
            p.poll(0)
    _flush(p, inp.numbers_topic)
    inp.stats = {
        "orders": n,
        "customers": k,
        "customer_records": len(records),
        "customer_tombstones": tombstones,
        "customers_without_record": never,
        "orders_matched": n - nulls - deleted,
        "orders_null_no_version_yet": nulls,
        "orders_null_deleted": deleted,
        "numbers": m,
        "produce_seconds_enrich": round(enrich_s, 1),
        "produce_seconds_numbers": round(time.monotonic() - t, 1),
    }
    say(
        f"enrich: produced {n:,} orders + {len(records):,} customer records "
        f"({tombstones:,} tombstones, {k:,} ids) in {enrich_s:.1f}s and {m:,} running-sum "
        f"records in {inp.stats['produce_seconds_numbers']}s; orders joining a customer: "
        f"{inp.stats['orders_matched']:,}, null (none yet / never): {nulls:,}, "
        f"null (deleted): {deleted:,}"
    )
    return inp


# ------------------------------------------------------------------ following a run


def _consumer(bootstrap: str, eof: bool = False) -> Consumer:
    return Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"benchenrich-reader-{os.getpid()}-{time.monotonic_ns()}",
            "enable.auto.commit": False,
            "isolation.level": "read_committed",
            "enable.partition.eof": eof,
            "fetch.wait.max.ms": 50,
            "fetch.max.bytes": 52_428_800,
            "max.partition.fetch.bytes": 10_485_760,
            "log_level": 0,
        }
    )


class CountReader(threading.Thread):
    """Counts the committed records of the output topic until ``expected`` are visible."""

    def __init__(self, bootstrap: str, topic: str, partitions: int, expected: int) -> None:
        super().__init__(daemon=True)
        self.bootstrap, self.topic, self.partitions = bootstrap, topic, partitions
        self.expected = expected
        self.records = 0
        self.first_seen: float | None = None
        self.done_at: float | None = None
        #: Broker append times (LogAppendTime, ms) of the first and last output record.
        self.first_ts = 1 << 62
        self.last_ts = 0
        self.errors: list[str] = []
        self._halt = threading.Event()

    def stop(self) -> None:
        self._halt.set()

    def run(self) -> None:
        c = _consumer(self.bootstrap)
        c.assign([TopicPartition(self.topic, p, 0) for p in range(self.partitions)])
        try:
            while not self._halt.is_set():
                msgs = c.consume(10_000, 0.1)
                for m in msgs:
                    if m.error() is not None:
                        self.errors.append(str(m.error()))
                        continue
                    self.records += 1
                    ts = m.timestamp()[1]
                    if ts < self.first_ts:
                        self.first_ts = ts
                    if ts > self.last_ts:
                        self.last_ts = ts
                if msgs and self.first_seen is None and self.records:
                    self.first_seen = time.time()
                if self.done_at is None and self.records >= self.expected:
                    self.done_at = time.time()
        finally:
            c.close()


def read_back(bootstrap: str, topic: str, partitions: int) -> list[tuple[Any, Any]]:
    """Every committed record of ``topic`` (key, value), each partition in offset order."""
    c = _consumer(bootstrap, eof=True)
    c.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
    out: list[tuple[Any, Any]] = []
    eof: set[int] = set()
    idle = time.monotonic() + 60
    try:
        while len(eof) < partitions:
            msgs = c.consume(10_000, 1.0)
            if msgs:
                idle = time.monotonic() + 60
            elif time.monotonic() > idle:
                raise TimeoutError(f"reading {topic}: no progress for 60 s")
            for m in msgs:
                err = m.error()
                if err is None:
                    out.append((m.key(), m.value()))
                elif err.code() == KafkaError._PARTITION_EOF:  # noqa: SLF001
                    eof.add(int(m.partition() or 0))
                else:
                    raise RuntimeError(f"reading {topic}: {err}")
    finally:
        c.close()
    return out


# ------------------------------------------------------------------ checks


def check_enriched(records: list[tuple[Any, Any]], inp: Inputs) -> dict[str, Any]:
    """Every order exactly once, right key, amount and customer version, per key in order."""
    n = inp.orders
    seen = bytearray(n)
    last: dict[bytes, int] = {}
    bad = {"undecodable": 0, "unknown_order": 0, "wrong_key": 0, "wrong_amount": 0}
    bad.update(wrong_customer=0, out_of_order=0)
    examples: list[str] = []
    for key, value in records:
        try:
            v = orjson.loads(value)
            i = int(v["order_id"][1:])
            amount, customer = v["amount"], v["customer"]
        except (ValueError, KeyError, TypeError):
            bad["undecodable"] += 1
            continue
        if not 0 <= i < n:
            bad["unknown_order"] += 1
            continue
        seen[i] = min(255, seen[i] + 1)
        if key != cust_key(inp.order_cust[i]):
            bad["wrong_key"] += 1
        if amount != inp.order_amount[i]:
            bad["wrong_amount"] += 1
        if customer != inp.order_expected[i]:
            bad["wrong_customer"] += 1
            if len(examples) < 5:
                examples.append(
                    f"order o{i:08d} of {cust_key(inp.order_cust[i]).decode()}: got "
                    f"{customer}, expected {inp.order_expected[i]}"
                )
        if last.get(key, -1) >= i:
            bad["out_of_order"] += 1
        last[key] = i
    missing = seen.count(0)
    dupes = sum(x - 1 for x in seen if x > 1)
    res: dict[str, Any] = {"records_out": len(records), "missing": missing, "duplicates": dupes}
    res.update(bad)
    res["examples"] = examples
    res["ok"] = len(records) == n and missing == 0 and dupes == 0 and not any(bad.values())
    return res


def check_sums(records: list[tuple[Any, Any]], inp: Inputs) -> dict[str, Any]:
    """Every input seq exactly once, with its key, per key count + 1 and sum + v in order."""
    m = inp.numbers
    seen = bytearray(m)
    counts: dict[bytes, int] = {}
    sums: dict[bytes, int] = {}
    bad = {"undecodable": 0, "unknown_seq": 0, "wrong_key": 0, "wrong_count_or_sum": 0}
    for key, value in records:
        try:
            v = orjson.loads(value)
            seq, s, c = int(v["seq"]), v["sum"], v["count"]
        except (ValueError, KeyError, TypeError):
            bad["undecodable"] += 1
            continue
        if not 0 <= seq < m:
            bad["unknown_seq"] += 1
            continue
        seen[seq] = min(255, seen[seq] + 1)
        if key != num_key(inp.sum_keys[seq]):
            bad["wrong_key"] += 1
        if c != counts.get(key, 0) + 1 or s != sums.get(key, 0) + inp.sum_values[seq]:
            bad["wrong_count_or_sum"] += 1
        counts[key], sums[key] = c, s
    missing = seen.count(0)
    dupes = sum(x - 1 for x in seen if x > 1)
    res: dict[str, Any] = {"records_out": len(records), "missing": missing, "duplicates": dupes}
    res.update(bad)
    res["ok"] = len(records) == m and missing == 0 and dupes == 0 and not any(bad.values())
    return res


# ------------------------------------------------------------------ the step


def pyspy_path() -> str | None:
    """py-spy: BENCH_PYSPY, the harness's pyspy venv, or PATH."""
    explicit = os.environ.get("BENCH_PYSPY")
    if explicit:
        return explicit
    own = venvs.python("pyspy").parent / "py-spy"
    return str(own) if own.exists() else shutil.which("py-spy")


class EnrichBench:
    """One run of the enrich section; ``results`` is what goes into the JSON."""

    def __init__(
        self, cfg: Config, ec: EnrichConfig, admin: Admin, out_dir: Path, run_id: str
    ) -> None:
        self.cfg, self.ec, self.admin = cfg, ec, admin
        self.bootstrap = admin.bootstrap
        self.out_dir = out_dir
        self.tag = f"benchenrich-{run_id}"
        self.logs = out_dir / "logs"
        self.logs.mkdir(parents=True, exist_ok=True)
        self.results: dict[str, Any] = {
            "config": vars(ec),
            "env_line": ec.env_line(),
            "runs": [],
            "errors": [],
        }

    def run(self) -> dict[str, Any]:
        try:
            inp = produce_inputs(self.admin, self.ec, self.tag)
            self.results["input"] = {
                "topics": [inp.orders_topic, inp.customers_topic, inp.numbers_topic],
                **inp.stats,
            }
            for rep in range(1, self.ec.repeat + 1):
                # Alternate which app goes first (odd runs: the running sum).
                order = ["sum", "enrich"] if rep % 2 else ["enrich", "sum"]
                for which in order:
                    row = self._measured(which, rep, inp)
                    self.results["runs"].append(row)
            self.results["summary"] = summarize(self.results["runs"])
        finally:
            delete_topics(self.admin, self.tag)
            shutil.rmtree(self.out_dir / "state" / self.tag, ignore_errors=True)
        return self.results

    def _measured(self, which: str, rep: int, inp: Inputs) -> dict[str, Any]:
        title = "enrich_orders" if which == "enrich" else "running_sum"
        say(f"enrich: {title} (run {rep}), cold start, exactly-once defaults")
        try:
            row = self._run_app(which, rep, inp)
        except Exception as exc:  # noqa: BLE001 - reported, the run goes on
            say(f"  !! {title} run {rep} failed: {exc!r}")
            self.results["errors"].append(f"{title} r{rep}: {traceback.format_exc()}")
            return {"app": title, "rep": rep, "ok": False, "status": repr(exc)[:2000]}
        chk = row["check"]
        if row["ok"]:
            say(
                f"  {row['e2e_rate']:,} records/s end-to-end ({row['e2e_seconds']} s; first "
                f"commit after {row['first_commit_after_s']} s), "
                f"{_fmt(row['window_rate'])} records/s in the commit window "
                f"({row['window_seconds']} s), {_fmt(row['output_span_rate'])} over the "
                f"output span, {row['cpu_s_per_m']} CPU s/M, "
                f"peak RSS {row['peak_rss_mb']} MiB; output checked: ok"
            )
        else:
            msg = {k: v for k, v in chk.items() if v and k not in ("ok", "records_out")}
            say(f"  !! {title} run {rep}: OUTPUT WRONG: {msg}")
            self.results["errors"].append(f"{title} r{rep}: output check failed: {msg}")
        return row

    def _run_app(self, which: str, rep: int, inp: Inputs) -> dict[str, Any]:
        ec = self.ec
        tag = f"{self.tag}-{which}-r{rep}"
        output = f"{tag}.out"
        self.admin.create({output: ec.partitions}, {"message.timestamp.type": "LogAppendTime"})
        state = self.out_dir / "state" / self.tag / tag
        shutil.rmtree(state, ignore_errors=True)
        port = free_port()
        env = {
            "LOCKGATE_BOOTSTRAP_SERVERS": self.bootstrap,
            "LOCKGATE_APP_NAME": tag,
            "LOCKGATE_INSTANCE_ID": "i1",
            "LOCKGATE_STATE_DIR": str(state),
            "LOCKGATE_HTTP_PORT": str(port),
            "LOCKGATE_LOG_FORMAT": "console",
            "LOCKGATE_OUTPUT_TOPIC": output,
        }
        if which == "enrich":
            spec, topics = ENRICH_SPEC, [inp.orders_topic, inp.customers_topic]
            env["LOCKGATE_ORDERS_TOPIC"] = inp.orders_topic
            env["LOCKGATE_CUSTOMERS_TOPIC"] = inp.customers_topic
            total_in, expected_out = inp.enrich_inputs, inp.orders
        else:
            spec, topics = SUM_SPEC, [inp.numbers_topic]
            env["LOCKGATE_INPUT_TOPIC"] = inp.numbers_topic
            total_in, expected_out = inp.numbers, inp.numbers
        offsets = GroupOffsets(self.bootstrap, tag, topics, ec.partitions)
        reader = CountReader(self.bootstrap, output, ec.partitions, expected_out)
        reader.start()
        log = self.logs / f"{tag}.log"
        t0 = time.time()
        p = procs.Proc([str(LOCKGATE_BIN), "run", spec], env, log)
        detach = self._attach_pyspy(p, tag) if ec.profile else None
        first: tuple[float, int, float] | None = None  # time, committed, cpu
        last: tuple[float, float] | None = None  # time, cpu
        metrics_text = ""
        try:
            deadline = time.monotonic() + ec.timeout
            while reader.done_at is None or last is None:
                c = offsets.committed()
                now = time.time()
                if first is None and c > 0:
                    first = (now, c, p.cpu())
                if last is None and c >= total_in:
                    last = (now, p.cpu())
                if not p.alive:
                    raise RuntimeError(f"{spec} exited:\n{p.log_tail()}")
                if time.monotonic() > deadline:
                    raise TimeoutError(
                        f"not done after {ec.timeout}s: {c:,} of {total_in:,} input offsets "
                        f"committed, {reader.records:,} of {expected_out:,} outputs visible"
                    )
                time.sleep(0.05)
            done = reader.done_at
            cpu = p.cpu()
            rss = p.rss_mb()
            try:
                metrics_text = scrape(port)
            except OSError as exc:
                say(f"  (no /metrics: {exc!r})")
        finally:
            if detach is not None:
                detach()
            p.stop(timeout=60)
            reader.stop()
            reader.join(10)
            offsets.close()
        assert first is not None and last is not None and done is not None
        (self.out_dir / f"{tag}.metrics").write_text(metrics_text)
        records = read_back(self.bootstrap, output, ec.partitions)
        chk = check_enriched(records, inp) if which == "enrich" else check_sums(records, inp)
        e2e = done - t0
        span = (reader.last_ts - reader.first_ts) / 1000
        window = last[0] - first[0]
        in_window = total_in - first[1]
        commit_hist = histogram(metrics_text, "lockgate_epoch_commit_seconds")
        row: dict[str, Any] = {
            "app": "enrich_orders" if which == "enrich" else "running_sum",
            "spec": spec,
            "rep": rep,
            "ok": bool(chk["ok"]),
            "input_records": total_in,
            "orders": inp.orders if which == "enrich" else None,
            "outputs": expected_out,
            "e2e_seconds": round(e2e, 2),
            "e2e_rate": round(total_in / e2e),
            "first_commit_after_s": round(first[0] - t0, 2),
            "first_commit_records": first[1],
            "window_seconds": round(window, 2),
            "window_records": in_window,
            "window_rate": round(in_window / window) if window > 0 else None,
            "output_span_seconds": round(span, 2),
            "output_span_rate": round(total_in / span) if span > 0 else None,
            "cpu_seconds": round(cpu, 2),
            "cpu_s_per_m": round(cpu / total_in * 1e6, 1),
            "window_cpu_s_per_m": round((last[1] - first[2]) / in_window * 1e6, 1)
            if in_window > 0
            else None,
            "peak_rss_mb": round(rss, 1),
            "epochs_committed": metric(metrics_text, "lockgate_epochs_committed_total"),
            "epochs_aborted": metric(metrics_text, "lockgate_epochs_aborted_total"),
            "epoch_commit_mean_ms": round(commit_hist["sum"] / commit_hist["count"] * 1000, 1)
            if commit_hist["count"]
            else None,
            "records_in_metric": metric(metrics_text, "lockgate_records_in_total"),
            "records_out_metric": metric(metrics_text, "lockgate_records_out_total"),
            "check": chk,
            "log": str(log.relative_to(ROOT)) if log.is_relative_to(ROOT) else str(log),
        }
        if which == "enrich":
            row["e2e_orders_rate"] = round(inp.orders / e2e)
        if ec.profile:
            raw = self.out_dir / f"profile-{tag}.txt"
            main_only = self.out_dir / f"profile-{tag}-main.txt"
            main_only.write_text("".join(_main_thread_stacks(raw)))
            prof = analyze_profile(main_only)
            row["profile"] = {
                "raw_file": str(raw),
                "main_thread_samples": prof["samples"],
                "self": prof["self"][:15],
                "total": prof["total"][:20],
            }
        shutil.rmtree(state, ignore_errors=True)
        return row

    def _attach_pyspy(self, p: procs.Proc, tag: str) -> Any:
        exe = pyspy_path()
        if exe is None:
            say("  (--profile: no py-spy found; set BENCH_PYSPY)")
            return None
        raw = self.out_dir / f"profile-{tag}.txt"
        return procs.pyspy_record(
            exe, p.pid, "--function", "--idle", "--threads", "--format", "raw", "-o", str(raw)
        )


def _main_thread_stacks(raw: Path) -> list[str]:
    """The main thread's collapsed stacks of a ``py-spy --threads`` file, thread frame cut.

    With ``--idle`` the main thread is sampled whether it runs or waits, so its samples
    are its wall time: waiting inside ``consume()`` shows as self time of the loop.
    """
    if not raw.exists():
        return []
    out = []
    for line in raw.read_text().splitlines(keepends=True):
        head, sep, rest = line.partition(";")
        if sep and head.startswith("thread (") and head.endswith(": MainThread"):
            out.append(rest)
    return out


RATIO_KEYS = (
    "e2e_rate",
    "window_rate",
    "output_span_rate",
    "cpu_s_per_m",
    "window_cpu_s_per_m",
    "first_commit_after_s",
)


PAIRED = ("e2e_rate", "output_span_rate", "cpu_s_per_m")


def summarize(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Best-of and ratios (enrichment / running sum) over the runs that passed."""
    out: dict[str, Any] = {}
    for app in ("enrich_orders", "running_sum"):
        rows = [r for r in runs if r.get("app") == app and r.get("ok")]
        if not rows:
            continue
        out[app] = {
            k: median([r[k] for r in rows if r.get(k) is not None])
            for k in RATIO_KEYS
            if any(r.get(k) is not None for r in rows)
        }
        out[app]["peak_rss_mb"] = max(r["peak_rss_mb"] for r in rows)
    e, s = out.get("enrich_orders"), out.get("running_sum")
    if e and s:
        out["ratio"] = {
            k: round(e[k] / s[k], 2) if e.get(k) and s.get(k) else None for k in RATIO_KEYS
        }
    # Paired: the two apps' runs of the same repetition ran back to back (similar load).
    pairs = []
    for rep in sorted({r["rep"] for r in runs}):
        er = next((r for r in runs if r["rep"] == rep and r.get("app") == "enrich_orders"), None)
        sr = next((r for r in runs if r["rep"] == rep and r.get("app") == "running_sum"), None)
        if er and sr and er.get("ok") and sr.get("ok"):
            pairs.append(
                {"rep": rep}
                | {k: round(er[k] / sr[k], 2) if er.get(k) and sr.get(k) else None for k in PAIRED}
            )
    if pairs:
        out["paired_ratios"] = pairs
        out["paired_ratio_median"] = {
            k: median(vals) if (vals := [p[k] for p in pairs if p[k] is not None]) else None
            for k in PAIRED
        }
    return out


# ------------------------------------------------------------------ report


def _fmt(x: Any, digits: int = 0) -> str:
    return "n/a" if x is None else f"{x:,.{digits}f}"


def _x(x: float | None) -> str:
    return "n/a" if x is None else f"{x:.2f}x"


def table(res: dict[str, Any]) -> list[str]:
    """The per-run table (Markdown; also printed on stderr)."""
    L = [
        "| app | run | input records | end-to-end s | end-to-end records/s | first commit "
        "after s | commit window s | commit-window records/s | output-span records/s "
        "| CPU s / M (all) | CPU s / M (window) | peak RSS MiB | epochs | output check |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in res.get("runs", []):
        chk = r.get("check") or {}
        verdict = (
            f"ok ({chk.get('records_out', 0):,} outputs)"
            if r.get("ok")
            else f"**FAILED**: {r.get('status') or {k: v for k, v in chk.items() if v}}"
        )
        L.append(
            f"| {r['app']} | {r['rep']} | {_fmt(r.get('input_records'))} | "
            f"{_fmt(r.get('e2e_seconds'), 2)} | {_fmt(r.get('e2e_rate'))} | "
            f"{_fmt(r.get('first_commit_after_s'), 2)} | "
            f"{_fmt(r.get('window_seconds'), 2)} | {_fmt(r.get('window_rate'))} | "
            f"{_fmt(r.get('output_span_rate'))} | "
            f"{_fmt(r.get('cpu_s_per_m'), 1)} | {_fmt(r.get('window_cpu_s_per_m'), 1)} | "
            f"{_fmt(r.get('peak_rss_mb'), 1)} | {_fmt(r.get('epochs_committed'))} | {verdict} |"
        )
    summary = res.get("summary", {})
    for app in ("running_sum", "enrich_orders"):
        med = summary.get(app)
        if med and len([r for r in res.get("runs", []) if r.get("app") == app]) > 1:
            L.append(
                f"| {app} | **median** | | | {_fmt(med.get('e2e_rate'))} | "
                f"{_fmt(med.get('first_commit_after_s'), 2)} | | "
                f"{_fmt(med.get('window_rate'))} | {_fmt(med.get('output_span_rate'))} | "
                f"{_fmt(med.get('cpu_s_per_m'), 1)} | {_fmt(med.get('window_cpu_s_per_m'), 1)} | "
                f"{_fmt(med.get('peak_rss_mb'), 1)} (max) | | |"
            )
    ratio = summary.get("ratio")
    if ratio:
        L.append("")
        L.append(
            "enrich_orders / running_sum (medians): end-to-end rate "
            f"{_x(ratio.get('e2e_rate'))}, "
            f"commit-window rate {_x(ratio.get('window_rate'))}, output-span rate "
            f"{_x(ratio.get('output_span_rate'))}; CPU per input record "
            f"{_x(ratio.get('cpu_s_per_m'))} (window {_x(ratio.get('window_cpu_s_per_m'))})"
        )
    pairs = summary.get("paired_ratios") or []
    if len(pairs) > 1:
        med = summary["paired_ratio_median"]

        def runs(k: str) -> str:
            return " / ".join(_x(p.get(k)) for p in pairs) + f" (median {_x(med.get(k))})"

        L.append("")
        L.append(
            "Paired by run (the two apps' runs of one repetition ran back to back): "
            f"end-to-end rate {runs('e2e_rate')}; output-span rate "
            f"{runs('output_span_rate')}; CPU per input record {runs('cpu_s_per_m')}"
        )
    return L


def render(res: dict[str, Any], meta: dict[str, Any]) -> list[str]:
    """The enrich section of RESULTS.md (Markdown lines)."""
    L: list[str] = [BEGIN, "## Multi-input: enrichment (as-of join) vs the running sum", ""]
    a = L.append
    m = meta.get("machine", {})
    a(
        f"Measured by `{meta.get('command', COMMAND)}` (`benchmarks/enrich.py`) on "
        f"{meta.get('started')}, {meta.get('total_minutes', 0):.1f} min, on "
        f"{m.get('cpu', '?')} ({m.get('cores', '?')} cores, {m.get('memory_gib', '?')} GiB), "
        f"{m.get('os', '')}, Python {m.get('python', '')}; broker: {meta.get('broker')}; "
        f"lockgate git `{meta.get('git', '?')}`. The machine is shared: load before "
        f"`{meta.get('uptime_before', '')}`, after `{meta.get('uptime_after', '')}`."
    )
    a("")
    a(f"Settings: `{res.get('env_line', '')}`")
    a("")
    inp = res.get("input")
    if inp:
        a(
            f"Inputs ({res['config']['partitions']} partitions each, murmur2 keys, explicit "
            f"timestamps over one hour): {inp['orders']:,} orders over {inp['customers']:,} "
            f"customer ids and {inp['customer_records']:,} customer records "
            f"({inp['customer_tombstones']:,} tombstones; {inp['customers_without_record']:,} "
            f"ids never get one) for `examples.enrich_orders:app`; "
            f'{inp["numbers"]:,} records `{{"v", "seq"}}` over {inp["customers"]:,} keys '
            "for `examples.running_sum:app` (the same number of input records). Expected "
            f"joins: {inp['orders_matched']:,} orders with a customer, "
            f"{inp['orders_null_no_version_yet']:,} null (no version yet or never), "
            f"{inp['orders_null_deleted']:,} null (deleted). Per run one `lockgate run` "
            f"process, cold start (fresh group, changelogs, state dir); {res['config']['repeat']} "
            "runs per app, alternating which app goes first; default settings "
            "(exactly-once, 1 s checkpoints). **End-to-end**: input records / (spawn -> "
            "every output visible to a read_committed reader). **First commit after**: "
            "spawn -> the first commit that carried input offsets. **Commit window**: input "
            "records committed after that first commit / (first commit -> every input "
            "offset committed), from the group's committed offsets polled every 50 ms "
            "(quantized by the 1 s epochs: the last one commits up to 1 s after the last "
            "record). **Output span**: input records / (broker append time of the first -> "
            "last output record, LogAppendTime). CPU: the app's process tree per million "
            "input records (all: spawn to "
            "done, incl. start-up; window: inside the commit window). Every output was "
            "checked against the harness's model (every order exactly once with the "
            "customer version as of its timestamp; every sum input exactly once, in order)."
        )
        a("")
    L.extend(table(res))
    a("")
    L.extend(section_footer(res, "the JSON", COMMAND, "enrich", END))
    return L


def merge(section: list[str], path: Path) -> None:
    """Replace the enrich section of ``path`` (or insert it after the pipeline section)."""
    text = splice_section(path, section, BEGIN, END, after="<!-- pipeline:end -->")
    whole = "Every number below comes from that one run"
    own = "the Multi-input section when it ran on its own"
    if whole in text and own not in text:
        pipeline = "(except the Pipelines section when it ran on its own: see its date)"
        if pipeline in text:
            text = text.replace(
                pipeline,
                f"(except the Pipelines section when it ran on its own, and {own}: see "
                "their dates)",
            )
        else:
            text = text.replace(whole, f"{whole} (except {own}: see its date)")
    path.write_text(text)


def main() -> int:
    """Run the section on its own (see the module docs)."""
    ap = argparse.ArgumentParser(
        prog="python -m benchmarks.enrich",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ap.add_argument("--records", type=int, help="orders (default 200000, BENCH_ENRICH_RECORDS)")
    ap.add_argument("--customers", type=int, help="customer ids (default 10000)")
    ap.add_argument(
        "--quick", action="store_true", help="smoke run: 50k orders, 2k customers, 1 run each"
    )
    ap.add_argument("--profile", action="store_true", help="py-spy each app (slows it)")
    ap.add_argument("--render", metavar="JSON", help="only re-render RESULTS.md from a JSON")
    args = ap.parse_args()
    if args.render:
        saved = json.loads(Path(args.render).read_text())
        merge(render(saved["enrich"], saved["meta"]), BENCH_DIR / "RESULTS.md")
        return 0

    cfg, ec = Config(), EnrichConfig()
    if args.quick:
        ec.quick = True
        ec.records, ec.customers, ec.repeat = QUICK["records"], QUICK["customers"], 1
    if args.records:
        ec.records = args.records
    if args.customers:
        ec.customers = args.customers
    ec.profile = ec.profile or args.profile
    argv = " ".join(sys.argv[1:])
    run = run_standalone(
        cfg,
        "enrich",
        "enrich.json",
        COMMAND + (f" {argv}" if argv else ""),
        f"enrich benchmark: {ec.env_line()}",
        lambda admin, out_dir, run_id: EnrichBench(cfg, ec, admin, out_dir, run_id),
        keep_errors=True,
    )
    res, meta, doc = run.results, run.meta, run.doc
    dest = QUICK_JSON if ec.quick else OUT_JSON
    dest.write_text(doc)
    print("\n".join(table(res)))
    if not ec.quick and not ec.profile and res.get("runs"):
        merge(render(res, meta), BENCH_DIR / "RESULTS.md")
        say(f"wrote {dest.relative_to(ROOT)} and the enrich section of benchmarks/RESULTS.md")
    else:
        say(f"wrote {dest.relative_to(ROOT)}")
    if res.get("errors"):
        say("FAILED: " + " | ".join(e.strip().splitlines()[-1][:300] for e in res["errors"]))
    return run.code or (1 if res.get("errors") else 0)


if __name__ == "__main__":
    sys.exit(main())
