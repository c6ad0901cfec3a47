"""Backfill: replay history on Spark with the app's own code, then hand over to live.

``lockgate backfill MODULE:APP`` plans a job, runs one Spark task per key group
(:mod:`processors._spark.backfill_task` runs the chain), and ends by writing a savepoint
whose offsets are the cut-over point, so ``lockgate run MODULE:APP --from-savepoint
ID`` continues live exactly where the backfill stopped. The job id *is* that
savepoint's id.

Inputs:

* **Kafka** (default): per input partition the offsets ``[from, until)``, where each
  bound is ``earliest`` (``from`` only), ``now`` (``until`` only: the last stable offset
  when the job is planned), a time (ms since the epoch or ISO-8601: the first offset at
  or after it) or explicit offsets ``offsets:0=120,1=98`` (``topic/0=...`` with several
  inputs).
* **Archived Parquet** (``--archive PATH``): columns ``key``, ``value`` (binary or
  string), ``timestamp`` (ms), optional ``topic`` (required with several inputs),
  ``partition`` and ``offset``. Rows are re-keyed with the murmur2 placement of the
  live app (keyless rows go to key group 0) and ordered per key group by (timestamp,
  input declared first, partition, offset, key, value). ``--live-from`` says where the
  live app starts reading Kafka afterwards.

Outputs go to the app's output topics exactly once (see the task module) or, with
``--output-parquet DIR``, to Parquet files (``DIR/key_group=<g>/part-0.parquet``).

The plan is kept in the job's progress topic (``<app>.backfill``), so ``--resume ID``
re-runs a failed job with the same ranges: finished key groups replay without output
and every other one continues from its last commit.
"""

from __future__ import annotations

import logging
import os
import re
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import orjson
from confluent_kafka import Consumer, KafkaError, Producer, TopicPartition

from processors._config.settings import Settings
from processors._dsl.app import App
from processors._dsl.partitioner import key_group
from processors._dsl.record import Record
from processors._dsl.topics import check_output_topics, output_topic_configs, output_topic_specs
from processors._kafka.clients import Admin, producer_config, restore_consumer_config
from processors._spark.backfill_task import (
    Range,
    TaskSpec,
    check_backfillable,
    load_app,
    run_task,
)
from processors.exceptions import ConfigError
from state.savepoint import (
    SavepointStore,
    build_descriptor,
    check_savepoint_id,
    new_savepoint_id,
    state_version,
)

__all__ = ["BackfillError", "Position", "parse_position", "progress_topic", "run_backfill"]

log = logging.getLogger("lockgate.backfill")

_COMPACT = {"cleanup.policy": "compact"}
#: Variables never copied into the executors' environment.
_SECRET_VAR = re.compile(r"PASSWORD|SECRET|TOKEN|CREDENTIAL|_KEY\b|KEY_PEM|JAAS", re.IGNORECASE)


class BackfillError(Exception):
    """The backfill cannot run or did not finish (the message says why)."""


def progress_topic(app_name: str) -> str:
    """Return the topic that holds an app's backfill plans and task progress."""
    return f"{app_name}.backfill"


@dataclass(frozen=True)
class Position:
    """A bound of the input: ``earliest``, ``now``, a time, or explicit offsets."""

    kind: str
    time_ms: int = 0
    offsets: tuple[tuple[str | None, int, int], ...] = ()


def parse_position(text: str, what: str) -> Position:
    """Parse ``earliest``, ``now``, a time (ms or ISO-8601) or ``offsets:[topic/]p=o,...``.

    Raises:
        ConfigError: the text is none of these (the message names ``what``).
    """
    t = text.strip()
    if t in ("earliest", "now", "latest"):
        return Position("now" if t == "latest" else t)
    if t.startswith("offsets:"):
        parts: list[tuple[str | None, int, int]] = []
        for item in t[len("offsets:") :].split(","):
            where, eq, off = item.strip().partition("=")
            topic, slash, part = where.rpartition("/")
            try:
                if not eq:
                    raise ValueError(item)
                parts.append((topic if slash else None, int(part), int(off)))
            except ValueError:
                raise ConfigError(
                    f"{what}: {item!r} is not <partition>=<offset> (or <topic>/<p>=<offset>)"
                ) from None
        return Position("offsets", offsets=tuple(parts))
    if t.isdigit():
        return Position("time", time_ms=int(t))
    try:
        dt = datetime.fromisoformat(t.replace("Z", "+00:00"))
    except ValueError:
        raise ConfigError(
            f"{what}: {text!r} is not earliest, now, a time (ms since the epoch or "
            "ISO-8601) or offsets:<p>=<o>,..."
        ) from None
    if dt.tzinfo is None:
        raise ConfigError(f"{what}: {text!r} has no time zone (add Z or +00:00)")
    return Position("time", time_ms=int(dt.timestamp() * 1000))


def _resolve(
    admin: Admin,
    pos: Position,
    inputs: tuple[str, ...],
    partitions: int,
    what: str,
    stable: dict[tuple[str, int], int],
) -> dict[tuple[str, int], int]:
    """Turn a position into an offset per input partition."""
    tps = [TopicPartition(t, p) for t in inputs for p in range(partitions)]
    if pos.kind == "earliest":
        if what == "--until":
            raise ConfigError("--until earliest reads nothing: give now, a time or offsets")
        return admin.start_offsets(tps)
    if pos.kind == "now":
        if what == "--from":
            raise ConfigError("--from now reads nothing: give earliest, a time or offsets")
        return dict(stable)
    if pos.kind == "time":
        found = admin.offsets_for_time(tps, pos.time_ms)
        return {tp: (off if off >= 0 else stable[tp]) for tp, off in found.items()}
    result: dict[tuple[str, int], int] = {}
    for topic, part, off in pos.offsets:
        if topic is None:
            if len(inputs) > 1:
                raise ConfigError(f"{what}: the app has inputs {list(inputs)}: write topic/p=o")
            topic = inputs[0]
        if topic not in inputs or not 0 <= part < partitions:
            raise ConfigError(f"{what}: {topic}/{part} is not an input partition of the app")
        result[(topic, part)] = off
    missing = [f"{t}/{p}" for t in inputs for p in range(partitions) if (t, p) not in result]
    if missing:
        raise ConfigError(f"{what}: no offset for {', '.join(missing)}")
    return result


def plan_kafka(
    settings: Settings,
    app: App,
    from_: Position,
    until: Position,
) -> tuple[int, dict[int, list[Range]]]:
    """Return the key-group count and the offset ranges of every key group.

    Raises:
        ConfigError: a bound is invalid, beyond the last stable offset, or ``from`` is
            after ``until``.
    """
    admin = Admin(settings)
    inputs = app.input_topics
    p = admin.input_partitions(inputs)
    tps = [TopicPartition(t, g) for t in inputs for g in range(p)]
    stable = admin.stable_offsets(tps)
    low = admin.start_offsets(tps)
    start = _resolve(admin, from_, inputs, p, "--from", stable)
    end = _resolve(admin, until, inputs, p, "--until", stable)
    ranges: dict[int, list[Range]] = {}
    for g in range(p):
        for t in inputs:
            s, e = start[(t, g)], end[(t, g)]
            if e > stable[(t, g)]:
                raise ConfigError(
                    f"--until: {t}/{g} ends at {e}, beyond its last stable offset {stable[(t, g)]}"
                )
            if s < low[(t, g)]:
                raise ConfigError(
                    f"--from: {t}/{g} starts at {s}, before its first offset {low[(t, g)]} "
                    "(deleted by retention?): use earliest or an archive"
                )
            if s > e:
                raise ConfigError(f"{t}/{g}: --from ({s}) is after --until ({e})")
            ranges.setdefault(g, []).append(Range(t, s, e))
    return p, ranges


def _state_version(app: App) -> tuple[dict[str, dict[str, str]], str]:
    schemas = {
        name: {"kind": h.spec.kind, "codec": h.spec.codec.name}
        for name, h in sorted(app.stores.items())
    }
    return schemas, state_version(schemas)


# -- the plan record -------------------------------------------------------------------


def _plan_key(job: str) -> bytes:
    return f"{job}/plan".encode()


def _write_plan(settings: Settings, topic: str, name: str, job: str, plan: dict[str, Any]) -> None:
    producer = Producer(producer_config(settings, name, None))
    producer.produce(topic, orjson.dumps(plan), _plan_key(job), partition=0)
    if producer.flush(30) != 0:
        raise BackfillError(f"cannot write the job plan to {topic}")


def _read_progress(
    settings: Settings, topic: str, name: str, job: str, partitions: int
) -> tuple[dict[str, Any] | None, dict[int, int]]:
    """Return the job's plan and the committed steps per key group (read to the end)."""
    conf = restore_consumer_config(settings, name)
    conf["client.id"] = f"{name}-backfill-driver"
    consumer = Consumer(conf)
    plan: dict[str, Any] | None = None
    steps: dict[int, int] = {}
    prefix = f"{job}/".encode()
    try:
        consumer.assign([TopicPartition(topic, q, -2) for q in range(partitions)])  # BEGINNING
        at_end: set[int] = set()
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            msg = consumer.poll(1.0)
            if msg is None:
                continue
            err = msg.error()
            if err is not None:
                if err.code() == KafkaError._PARTITION_EOF:  # noqa: SLF001 - public code
                    at_end.add(msg.partition() or 0)
                    if len(at_end) == partitions:
                        return plan, steps
                    continue
                raise BackfillError(f"cannot read {topic}: {err.str()}")
            key, raw = msg.key() or b"", msg.value()
            if not key.startswith(prefix) or not raw:
                continue
            rest = key[len(prefix) :].decode()
            if rest == "plan":
                plan = orjson.loads(raw)
            elif rest.isdigit():
                steps[int(rest)] = int(orjson.loads(raw)["steps"])
        raise BackfillError(f"{topic} did not reach its end within 60 s")
    finally:
        consumer.close()


# -- progress -------------------------------------------------------------------------


class _Progress(threading.Thread):
    """Reports tasks done, records, records/s and ETA every few seconds (stderr)."""

    def __init__(
        self,
        report: Callable[[str], None],
        sc: Any,
        job: str,
        total: int | None,
        read_steps: Callable[[], dict[int, int]] | None,
        every_s: float = 5.0,
    ) -> None:
        super().__init__(name="lockgate-backfill-progress", daemon=True)
        self.report, self.sc, self.job, self.total = report, sc, job, total
        self.read_steps = read_steps
        self.every_s = every_s
        self.done = threading.Event()
        self.started = time.monotonic()

    def run(self) -> None:
        while not self.done.wait(self.every_s):
            try:
                self.report(self.line())
            except Exception as exc:  # noqa: BLE001 - progress must never fail the job
                log.debug("progress unavailable: %s", exc)

    def line(self) -> str:
        """One progress line."""
        tracker = self.sc.statusTracker()
        finished = total_tasks = 0
        for sid in tracker.getActiveStageIds():
            info = tracker.getStageInfo(sid)
            if info is not None:
                finished += info.numCompletedTasks
                total_tasks += info.numTasks
        elapsed = time.monotonic() - self.started
        text = f"backfill {self.job}: tasks {finished}/{total_tasks or '?'} done"
        if self.read_steps is not None:
            records = sum(self.read_steps().values())
            rate = records / elapsed if elapsed > 0 else 0.0
            text += f", {records:,} records committed, {rate:,.0f} rec/s"
            if self.total and rate > 0:
                left = int(max(self.total - records, 0) / rate)
                pct = 100 * records / self.total
                text += f", {pct:.1f}%, ETA {left // 60}m{left % 60:02d}s"
        return text


# -- Spark ----------------------------------------------------------------------------


def _attempt() -> int:
    from pyspark import TaskContext

    tc = TaskContext.get()
    return tc.attemptNumber() if tc is not None else 0


def _kafka_task(
    settings: Settings, specs: dict[int, TaskSpec]
) -> Callable[[int, Iterator[Any]], Iterator[dict[str, Any]]]:
    def task(index: int, _: Iterator[Any]) -> Iterator[dict[str, Any]]:
        yield run_task(settings, specs[index], attempt=_attempt()).to_dict()

    return task


def _archive_rows(spark: Any, path: str, inputs: tuple[str, ...], key_groups: int) -> Any:
    """Read the archive; return an RDD of (sort key, row) placed by key group."""
    df = spark.read.parquet(path)
    cols = set(df.columns)
    missing = {"key", "value", "timestamp"} - cols
    if missing:
        raise ConfigError(
            f"--archive {path}: missing column(s) {sorted(missing)} (have {sorted(cols)})"
        )
    if "topic" not in cols and len(inputs) > 1:
        raise ConfigError(
            f"--archive {path}: the app has inputs {list(inputs)}: add a topic column"
        )
    rank = {t: i for i, t in enumerate(inputs)}
    only = inputs[0]
    has_part, has_off, has_topic = "partition" in cols, "offset" in cols, "topic" in cols

    def as_bytes(v: Any) -> bytes | None:
        if v is None:
            return None
        if isinstance(v, str):
            return v.encode()
        return bytes(v)

    def keyed(row: Any) -> tuple[tuple[Any, ...], tuple[Any, ...]]:
        topic = row["topic"] if has_topic else only
        if topic not in rank:
            raise ConfigError(f"archived row of topic {topic!r}: not an input of the app")
        key, value = as_bytes(row["key"]), as_bytes(row["value"])
        g = 0 if key is None else key_group(key, key_groups)
        part = row["partition"] if has_part and row["partition"] is not None else -1
        off = row["offset"] if has_off and row["offset"] is not None else -1
        ts = int(row["timestamp"])
        order = (g, ts, rank[topic], part, off, key or b"", value or b"")
        return order, (topic, part, off, key, value, ts)

    return df.rdd.map(keyed).repartitionAndSortWithinPartitions(
        numPartitions=key_groups, partitionFunc=lambda k: k[0]
    )


def _archive_task(
    settings: Settings, specs: dict[int, TaskSpec]
) -> Callable[[int, Iterator[Any]], Iterator[dict[str, Any]]]:
    def task(index: int, rows: Iterator[Any]) -> Iterator[dict[str, Any]]:
        records = (
            Record(topic, index, off if off >= 0 else i, key, value, ts)
            for i, (_, (topic, _part, off, key, value, ts)) in enumerate(rows)
        )
        yield run_task(settings, specs[index], attempt=_attempt(), rows=records).to_dict()

    return task


# -- the job --------------------------------------------------------------------------


def run_backfill(
    app_spec: str,
    settings: Settings,
    *,
    from_: Position | None = None,
    until: Position | None = None,
    archive: str | None = None,
    live_from: Position | None = None,
    output_parquet: str | None = None,
    master: str = "local[2]",
    spark_conf: dict[str, str] | None = None,
    resume: str | None = None,
    commit_every: int = 5000,
    report: Callable[[str], None] | None = None,
    progress_every_s: float = 5.0,
    spark: Any = None,
) -> dict[str, Any]:
    """Run a backfill job to the end; return its summary (``savepoint`` = the job id).

    Args:
        app_spec: ``module:attribute`` of the App (importable on the executors too).
        settings: the app's settings (``LOCKGATE_SAVEPOINT_DIR`` is required).
        from_: first records (Kafka input); default ``earliest``.
        until: end, exclusive (Kafka input); default ``now``.
        archive: read this Parquet path instead of Kafka.
        live_from: with ``archive``: where the live app starts reading Kafka.
        output_parquet: write outputs to this directory instead of Kafka.
        master: the Spark master (``local[N]``, ``spark://host:port``, ...).
        spark_conf: extra Spark configuration.
        resume: re-run the job with this id (Kafka output), with its original plan.
        commit_every: input records per transaction at most.
        report: called with progress lines (default: log them).
        progress_every_s: seconds between progress lines.
        spark: a SparkSession to use (kept running); default: a new one on ``master``,
            stopped at the end.

    Raises:
        ConfigError: bad arguments, an app a backfill cannot run, a missing savepoint
            dir.
        BackfillError: the Spark job failed (the message has the cause).
    """
    started = time.monotonic()
    say = report or (lambda line: log.info(line))
    if not settings.savepoint_dir:
        raise ConfigError("backfill needs LOCKGATE_SAVEPOINT_DIR (where the final state goes)")
    app = load_app(app_spec)
    check_backfillable(app)
    app.handlers()  # refuses a chain that ends nowhere before Spark starts
    name = settings.app_name or app.name
    app.run_as(name)  # its per-app late topics
    inputs = app.input_topics
    if archive is None and live_from is not None:
        raise ConfigError("--live-from goes with --archive (Kafka input ends at --until)")
    if archive is not None and live_from is None:
        raise ConfigError(
            "--archive needs --live-from: where the live app starts reading Kafka afterwards "
            "(earliest, now, a time or offsets)"
        )
    if archive is not None and (from_ is not None or until is not None):
        raise ConfigError("--from/--until select Kafka input; with --archive use --live-from")
    admin = Admin(settings)
    p = admin.input_partitions(inputs)
    topic = progress_topic(name)
    kafka_out = output_parquet is None
    if kafka_out:
        specs_topics, replication = output_topic_specs(app.outputs.values(), p)
        specs_topics[f"{name}.dlq"] = (p, {})
        # One partition per key group: a task reads its progress to the last stable offset,
        # which only its own transactions may hold back.
        specs_topics[topic] = (p, dict(_COMPACT))
        admin.ensure_topics(specs_topics, replication=replication)
        check_output_topics(admin, output_topic_configs(app.outputs.values()))
        admin.grow_partitions(topic, p)
    plan: dict[str, Any] | None = None
    if resume is not None:
        if not kafka_out:
            raise ConfigError("--resume continues a job with Kafka output; rerun a Parquet job")
        job = check_savepoint_id(resume)
        plan, done_steps = _read_progress(settings, topic, name, job, p)
        if plan is None:
            raise ConfigError(f"--resume {job}: no backfill job with that id in {topic}")
        if plan.get("app_spec") != app_spec:
            raise ConfigError(
                f"--resume {job}: that job ran {plan.get('app_spec')}, not {app_spec}"
            )
        say(f"backfill {job}: resuming ({sum(done_steps.values()):,} records committed before)")
    else:
        job = new_savepoint_id()
    if plan is None:
        if archive is None:
            key_groups, ranges = plan_kafka(
                settings, app, from_ or Position("earliest"), until or Position("now")
            )
        else:
            assert live_from is not None
            tps = [TopicPartition(t, g) for t in inputs for g in range(p)]
            stable = admin.stable_offsets(tps)
            live = _resolve(admin, live_from, inputs, p, "--live-from", stable)
            key_groups = p
            ranges = {g: [Range(t, live[(t, g)], live[(t, g)]) for t in inputs] for g in range(p)}
        plan = {
            "job": job,
            "app": name,
            "app_spec": app_spec,
            "key_groups": key_groups,
            "archive": archive,
            "output_parquet": output_parquet,
            "ranges": {str(g): [[r.topic, r.start, r.end] for r in rs] for g, rs in ranges.items()},
            "created_ms": int(time.time() * 1000),
            "commit_every": commit_every,
        }
        if kafka_out:
            _write_plan(settings, topic, name, job, plan)
    key_groups = int(plan["key_groups"])
    if key_groups != p:
        raise ConfigError(
            f"job {job} was planned for {key_groups} key groups, the inputs now have {p}"
        )
    archive = plan.get("archive")
    specs = {
        g: TaskSpec(
            job=job,
            app_spec=app_spec,
            app_name=name,
            key_group=g,
            key_groups=key_groups,
            ranges=tuple(Range(t, int(s), int(e)) for t, s, e in plan["ranges"][str(g)]),
            savepoint_url=settings.savepoint_dir,
            progress_topic=topic,
            output_dir=plan.get("output_parquet"),
            commit_every=int(plan.get("commit_every", commit_every)),
            clock_ceiling_ms=int(plan["created_ms"]),
        )
        for g in range(key_groups)
    }
    total = None
    if archive is None:
        total = sum(r.end - r.start for s in specs.values() for r in s.ranges)
    say(
        f"backfill {job}: app {name}, {key_groups} key groups, "
        + (f"{total:,} input offsets from Kafka" if total is not None else f"archive {archive}")
        + (f", outputs to {output_parquet}" if output_parquet else ", outputs to Kafka")
        + f", master {master}"
    )
    own = spark is None
    if spark is None:
        from processors._spark.job import spark_session

        top = app_spec.partition(":")[0].split(".")[0]
        conf = dict(spark_conf or {})
        ship = None
        if not master.startswith("local"):
            # Executors outside this process import the code shipped, and the app module
            # reads its LOCKGATE_* variables at import there: pass them (not secrets: the
            # settings travel with the tasks, and Spark shows its configuration).
            ship = ["processors", "state", top]
            for var, value in os.environ.items():
                if var.startswith("LOCKGATE_") and not _SECRET_VAR.search(var):
                    conf.setdefault(f"spark.executorEnv.{var}", value)
        spark = spark_session(master, f"lockgate-backfill-{name}", conf=conf, ship=ship)
    sc = spark.sparkContext
    reader: Callable[[], dict[int, int]] | None = None
    if kafka_out:

        def reader() -> dict[int, int]:
            return _read_progress(settings, topic, name, job, key_groups)[1]

    progress = _Progress(say, sc, job, total, reader, progress_every_s)
    progress.start()
    try:
        if archive is None:
            rdd = sc.parallelize(range(key_groups), key_groups)
            results = rdd.mapPartitionsWithIndex(_kafka_task(settings, specs)).collect()
        else:
            rows = _archive_rows(spark, str(archive), inputs, key_groups)
            results = rows.mapPartitionsWithIndex(_archive_task(settings, specs)).collect()
    except Exception as exc:
        cause = str(exc).strip().splitlines()
        detail = next(
            (ln for ln in cause if "Error" in ln or "Exception" in ln), cause[0] if cause else ""
        )
        raise BackfillError(
            f"backfill {job} failed: {detail[:2000]}"
            + (f" (resume with --resume {job})" if kafka_out else "")
        ) from exc
    finally:
        progress.done.set()
        if own:
            spark.stop()
    manifests = {int(r["key_group"]): r["manifest"] for r in results}
    schemas, version = _state_version(app)
    registry = {
        name: {
            "inputs": list(inputs),
            "outputs": list(app.outputs),
            "internal_outputs": [],
            "stores": schemas,
            "state_version": version,
        }
    }
    now = int(time.time() * 1000)
    descriptor = build_descriptor(
        job, 0, False, now, int(plan["created_ms"]), registry, {name: manifests}, [name]
    )
    records = sum(int(r["records"]) for r in results)
    seconds = round(time.monotonic() - started, 3)
    descriptor["backfill"] = {
        "app_spec": app_spec,
        "records": records,
        "outputs": sum(int(r["outputs"]) for r in results),
        "dead_letters": sum(int(r["dead_letters"]) for r in results),
        "seconds": seconds,
        "archive": archive,
        "output_parquet": plan.get("output_parquet"),
    }
    SavepointStore(settings.savepoint_dir).write_descriptor(job, descriptor)
    summary = {
        "savepoint": job,
        "app": name,
        "key_groups": key_groups,
        "records": records,
        "outputs": descriptor["backfill"]["outputs"],
        "dead_letters": descriptor["backfill"]["dead_letters"],
        "seconds": seconds,
        "records_per_s": round(records / seconds, 1) if seconds > 0 else None,
        "tasks": sorted((r for r in results), key=lambda r: int(r["key_group"])),
    }
    for r in summary["tasks"]:
        r.pop("manifest", None)
    say(
        f"backfill {job}: done, {records:,} records in {seconds:.1f}s "
        f"({summary['records_per_s'] or 0:,.0f} rec/s); savepoint {job}"
    )
    return summary
