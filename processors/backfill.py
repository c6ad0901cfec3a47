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
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import orjson
from confluent_kafka import Consumer, KafkaError, Producer, TopicPartition

from processors._config.settings import Settings
from processors._dsl.app import App
from processors._dsl.topics import check_output_topics, output_topic_configs, output_topic_specs
from processors._kafka.clients import Admin, producer_config, restore_consumer_config
from processors._spark.backfill_plan import (
    Position,
    parse_position,
    plan_kafka,
    progress_topic,
    resolve_position,
)
from processors._spark.backfill_spark import Progress, new_spark_session, run_tasks
from processors._spark.backfill_spec import Range, TaskSpec
from processors._spark.backfill_task import check_backfillable, load_app
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


class BackfillError(Exception):
    """The backfill cannot run or did not finish (the message says why)."""


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

    The steps: check the arguments and the app; create the outputs' and the progress
    topics (Kafka output); plan the job or read the plan of the job resumed; run one Spark
    task per key group; write the savepoint whose offsets are the cut-over point.

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
    savepoint_dir = settings.savepoint_dir
    if not savepoint_dir:
        raise ConfigError("backfill needs LOCKGATE_SAVEPOINT_DIR (where the final state goes)")
    _check_inputs_given(from_, until, archive, live_from)
    app = load_app(app_spec)
    check_backfillable(app)
    app.handlers()  # refuses a chain that ends nowhere before Spark starts
    name = settings.app_name or app.name
    app.run_as(name)  # its per-app late topics
    admin = Admin(settings)
    p = admin.input_partitions(app.input_topics)
    topic = progress_topic(name)
    kafka_out = output_parquet is None
    if kafka_out:
        _create_topics(admin, app, name, topic, p)
    if resume is not None:
        job, plan = _resumed_plan(settings, topic, name, app_spec, resume, p, kafka_out, say)
    else:
        job = new_savepoint_id()
        job_input = _JobInput(from_, until, archive, live_from, output_parquet)
        plan = _new_plan(settings, admin, app, job, app_spec, job_input, p, commit_every)
        if kafka_out:
            _write_plan(settings, topic, name, job, plan)
    specs = _task_specs(savepoint_dir, plan, topic, p, commit_every)
    archive = plan.get("archive")
    total = None
    if archive is None:
        total = sum(r.end - r.start for s in specs.values() for r in s.ranges)
    say(
        f"backfill {job}: app {name}, {len(specs)} key groups, "
        + (f"{total:,} input offsets from Kafka" if total is not None else f"archive {archive}")
        + (f", outputs to {output_parquet}" if output_parquet else ", outputs to Kafka")
        + f", master {master}"
    )
    own = spark is None
    if spark is None:
        spark = new_spark_session(app_spec, name, master, spark_conf)
    reader = None
    if kafka_out:
        reader = lambda: _read_progress(settings, topic, name, job, len(specs))[1]  # noqa: E731
    progress = Progress(say, spark.sparkContext, job, total, reader, progress_every_s)
    progress.start()
    try:
        results = run_tasks(spark, settings, specs, archive, app.input_topics)
    except Exception as exc:
        raise _job_failed(job, exc, kafka_out) from exc
    finally:
        progress.done.set()
        if own:
            spark.stop()
    seconds = round(time.monotonic() - started, 3)
    summary = _write_savepoint(savepoint_dir, app, app_spec, name, plan, results, seconds)
    say(
        f"backfill {job}: done, {summary['records']:,} records in {seconds:.1f}s "
        f"({summary['records_per_s'] or 0:,.0f} rec/s); savepoint {job}"
    )
    return summary


# -- the job's steps ---------------------------------------------------------------------


def _job_failed(job: str, exc: Exception, kafka_out: bool) -> BackfillError:
    """The error for a failed Spark job: its first error line, and how to resume it."""
    cause = str(exc).strip().splitlines()
    detail = next(
        (ln for ln in cause if "Error" in ln or "Exception" in ln), cause[0] if cause else ""
    )
    return BackfillError(
        f"backfill {job} failed: {detail[:2000]}"
        + (f" (resume with --resume {job})" if kafka_out else "")
    )


@dataclass(frozen=True)
class _JobInput:
    """What a new job reads (Kafka ``[from_, until)`` or an archive) and where it writes."""

    from_: Position | None
    until: Position | None
    archive: str | None
    live_from: Position | None
    output_parquet: str | None


def _check_inputs_given(
    from_: Position | None,
    until: Position | None,
    archive: str | None,
    live_from: Position | None,
) -> None:
    """Refuse input options that do not go together (before anything is created)."""
    if archive is None and live_from is not None:
        raise ConfigError("--live-from goes with --archive (Kafka input ends at --until)")
    if archive is not None and live_from is None:
        raise ConfigError(
            "--archive needs --live-from: where the live app starts reading Kafka afterwards "
            "(earliest, now, a time or offsets)"
        )
    if archive is not None and (from_ is not None or until is not None):
        raise ConfigError("--from/--until select Kafka input; with --archive use --live-from")


def _create_topics(admin: Admin, app: App, name: str, topic: str, p: int) -> None:
    """Create the outputs, the dead-letter topic and the progress topic (Kafka output)."""
    specs_topics, replication = output_topic_specs(app.outputs.values(), p)
    specs_topics[f"{name}.dlq"] = (p, {})
    # One partition per key group: a task reads its progress to the last stable offset,
    # which only its own transactions may hold back.
    specs_topics[topic] = (p, dict(_COMPACT))
    admin.ensure_topics(specs_topics, replication=replication)
    check_output_topics(admin, output_topic_configs(app.outputs.values()))
    admin.grow_partitions(topic, p)


def _resumed_plan(
    settings: Settings,
    topic: str,
    name: str,
    app_spec: str,
    resume: str,
    p: int,
    kafka_out: bool,
    say: Callable[[str], None],
) -> tuple[str, dict[str, Any]]:
    """The id and the plan of the job ``resume`` names (read from its progress topic).

    Raises:
        ConfigError: Parquet output (nothing to resume), no such job, or a job of
            another app.
    """
    if not kafka_out:
        raise ConfigError("--resume continues a job with Kafka output; rerun a Parquet job")
    job = check_savepoint_id(resume)
    plan, done_steps = _read_progress(settings, topic, name, job, p)
    if plan is None:
        raise ConfigError(f"--resume {job}: no backfill job with that id in {topic}")
    if plan.get("app_spec") != app_spec:
        raise ConfigError(f"--resume {job}: that job ran {plan.get('app_spec')}, not {app_spec}")
    say(f"backfill {job}: resuming ({sum(done_steps.values()):,} records committed before)")
    return job, plan


def _new_plan(
    settings: Settings,
    admin: Admin,
    app: App,
    job: str,
    app_spec: str,
    job_input: _JobInput,
    p: int,
    commit_every: int,
) -> dict[str, Any]:
    """Plan a new job: the key groups and each one's input ranges (offsets resolved now)."""
    inputs = app.input_topics
    if job_input.archive is None:
        key_groups, ranges = plan_kafka(
            settings,
            app,
            job_input.from_ or Position("earliest"),
            job_input.until or Position("now"),
        )
    else:
        assert job_input.live_from is not None
        tps = [TopicPartition(t, g) for t in inputs for g in range(p)]
        stable = admin.stable_offsets(tps)
        live = resolve_position(admin, job_input.live_from, inputs, p, "--live-from", stable)
        key_groups = p
        ranges = {g: [Range(t, live[(t, g)], live[(t, g)]) for t in inputs] for g in range(p)}
    return {
        "job": job,
        "app": settings.app_name or app.name,
        "app_spec": app_spec,
        "key_groups": key_groups,
        "archive": job_input.archive,
        "output_parquet": job_input.output_parquet,
        "ranges": {str(g): [[r.topic, r.start, r.end] for r in rs] for g, rs in ranges.items()},
        "created_ms": int(time.time() * 1000),
        "commit_every": commit_every,
    }


def _task_specs(
    savepoint_dir: str, plan: dict[str, Any], topic: str, p: int, commit_every: int
) -> dict[int, TaskSpec]:
    """One task per key group of the plan.

    Raises:
        ConfigError: the inputs' partition count changed since the job was planned.
    """
    job = str(plan["job"])
    key_groups = int(plan["key_groups"])
    if key_groups != p:
        raise ConfigError(
            f"job {job} was planned for {key_groups} key groups, the inputs now have {p}"
        )
    return {
        g: TaskSpec(
            job=job,
            app_spec=str(plan["app_spec"]),
            app_name=str(plan["app"]),
            key_group=g,
            key_groups=key_groups,
            ranges=tuple(Range(t, int(s), int(e)) for t, s, e in plan["ranges"][str(g)]),
            savepoint_url=savepoint_dir,
            progress_topic=topic,
            output_dir=plan.get("output_parquet"),
            commit_every=int(plan.get("commit_every", commit_every)),
            clock_ceiling_ms=int(plan["created_ms"]),
        )
        for g in range(key_groups)
    }


def _write_savepoint(
    savepoint_dir: str,
    app: App,
    app_spec: str,
    name: str,
    plan: dict[str, Any],
    results: list[dict[str, Any]],
    seconds: float,
) -> dict[str, Any]:
    """Write the job's savepoint (id = the job id) from the tasks' results; the summary."""
    job = str(plan["job"])
    manifests = {int(r["key_group"]): r["manifest"] for r in results}
    schemas, version = _state_version(app)
    registry = {
        name: {
            "inputs": list(app.input_topics),
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
    descriptor["backfill"] = {
        "app_spec": app_spec,
        "records": records,
        "outputs": sum(int(r["outputs"]) for r in results),
        "dead_letters": sum(int(r["dead_letters"]) for r in results),
        "seconds": seconds,
        "archive": plan.get("archive"),
        "output_parquet": plan.get("output_parquet"),
    }
    SavepointStore(savepoint_dir).write_descriptor(job, descriptor)
    tasks = sorted(results, key=lambda r: int(r["key_group"]))
    for r in tasks:
        r.pop("manifest", None)
    return {
        "savepoint": job,
        "app": name,
        "key_groups": int(plan["key_groups"]),
        "records": records,
        "outputs": descriptor["backfill"]["outputs"],
        "dead_letters": descriptor["backfill"]["dead_letters"],
        "seconds": seconds,
        "records_per_s": round(records / seconds, 1) if seconds > 0 else None,
        "tasks": tasks,
    }
