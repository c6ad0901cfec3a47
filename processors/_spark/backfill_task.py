"""One backfill task: a key group's operator chain over a bounded input, exactly once.

Runs inside a Spark task (or any process): the app's own handlers, state handles,
codecs, watermarks and timers, on a fresh local RocksDB, over

* a Kafka offset range per input partition of the key group (read_committed, ending at
  an offset at or below the last stable offset: transaction markers and aborted records
  leave gaps that the reader steps over), co-partitioned inputs merged as the live
  runtime's interleaver does (smallest record timestamp at the heads, ties: the input
  declared first, each partition in offset order); or
* archived records (rows), already re-keyed to this key group and ordered.

**Processing time is record time.** A backfill replays history, so the clock that TTL,
processing-time timers and idleness read is the timestamp of the record in progress
(never going back, never past the job's planning time), not the wall clock. Expired
entries read as absent, as live; the backfill runs no TTL sweep (what a sweep removes
depends on where commits fall), the live app's sweep removes them after the hand-over.
With deterministic user code, every attempt rebuilds the same state: what the state
depends on is a function of the records and their order only, not of where commits or
replays fall (the event-time clock's idleness bookkeeping, which is not stored, is put
back when a chunk is replayed).

**Exactly once into Kafka.** Outputs (and dead letters) go out in transactions of a
producer whose ``transactional.id`` is ``<app>.backfill.<job>.<key group>``; each
transaction also carries a progress record (``<job>/<key group>`` -> steps done) to the
job's progress topic. A retried attempt first fences the earlier one
(``init_transactions`` aborts its open transaction), reads the committed progress, and
replays the steps the earlier attempts committed with every output suppressed — only
to rebuild the state, which is deterministic — before it produces again. A *step* is
one input record taken (processed or dead-lettered), with what its watermark fired.

**Parquet output** has no transactions: a retried attempt starts over and replaces the
earlier attempt's file (written under a temporary name, renamed at the end).

**A record whose user code raises** (or whose output the producer can never write) is
dead-lettered as live: the transaction since the last commit is aborted and the steps
since then are replayed without it. The progress record lists the steps dead-lettered
so far, so a retry dead-letters the same steps without running them again (an output
rejection is not repeated by a replay that writes nothing). A producer failure that is
not the record's fault (:class:`SinkFailed`) fails the task; Spark's retry resumes.
"""

from __future__ import annotations

import contextlib
import importlib
import logging
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from confluent_kafka import KafkaError, KafkaException

from processors._checkpoint.protocol import (
    ERROR_VALUE_DROPPED,
    record_error_headers,
    timer_error_headers,
)
from processors._config.settings import Settings
from processors._dsl.app import App
from processors._dsl.context import Headers, direct_context
from processors._dsl.record import Record
from processors._kafka.errors import Kind, classify, describe
from processors._spark.backfill_input import kafka_steps
from processors._spark.backfill_outputs import KafkaSink, ParquetSink, SinkFailed, TaskSink
from processors._spark.backfill_spec import TaskResult, TaskSpec
from processors._task.failures import stop_error
from processors._task.keygroups import KeyGroup
from processors.exceptions import ConfigError, UserCodeError
from state.codecs import CodecUnavailable
from state.rocksdb.store import RocksDBBackend
from state.savepoint import SavepointStore, key_group_manifest

log = logging.getLogger("lockgate.backfill")

#: Steps between processing-time timer ticks (fixed: the same steps in every attempt, so
#: replays rebuild the same state).
TICK_EVERY = 100


def load_app(spec: str) -> App:
    """Import ``module:attribute`` and return the App (the current dir on sys.path).

    Raises:
        ConfigError: the spec is malformed, the module cannot be imported, or the
            attribute is not an App.
    """
    module_name, _, attr = spec.partition(":")
    if not module_name or not attr:
        raise ConfigError(f"expected MODULE:APP (e.g. examples.running_sum:app), got {spec!r}")
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ConfigError(f"cannot import {module_name!r}: {exc}") from exc
    app = getattr(module, attr, None)
    if not isinstance(app, App):
        raise ConfigError(f"{spec} is not a lockgate App")
    return app


def check_backfillable(app: App) -> None:
    """Refuse what a backfill task cannot run the same way as live.

    Raises:
        ConfigError: the app repartitions with ``key_by`` (an internal topic between
            two stages of one app), reads global tables or writes postgres outputs.
    """
    internal = sorted(t for t, spec in app.outputs.items() if spec.internal)
    if internal:
        raise ConfigError(
            f"app {app.name!r} repartitions with key_by (internal topics {internal}): a "
            "backfill runs one stage; split the stages into apps and backfill each"
        )
    if app.global_tables:
        raise ConfigError(
            f"app {app.name!r} reads global tables {sorted(app.global_tables)}: backfill "
            "does not load global tables yet"
        )
    if app.sinks:
        raise ConfigError(
            f"app {app.name!r} writes outputs outside Kafka {sorted(app.sinks)} (postgres outputs, "
            "iceberg outputs): backfill cannot "
            "write them exactly once (its tasks commit to Kafka only); run the app live "
            "(lockgate run --until ...) instead"
        )


class _Poisoned(Exception):  # noqa: N818 - a control-flow signal, not an error
    """A step's user code raised: abort and replay the chunk without it."""

    def __init__(self, step: int, error: Exception, stage: str) -> None:
        super().__init__(f"step {step}: {type(error).__name__}: {error}")
        self.step, self.error, self.stage = step, error, stage


class BackfillTask:
    """Runs one key group (see the module docs)."""

    def __init__(self, settings: Settings, spec: TaskSpec, *, attempt: int = 0) -> None:
        self.settings = settings
        self.spec = spec
        self.attempt = attempt
        self.app = load_app(spec.app_spec)
        check_backfillable(self.app)
        self.name = spec.app_name
        self.app.run_as(self.name)  # its per-app late topics
        self.g = spec.key_group
        self.inputs = self.app.input_topics
        planned = sorted({r.topic for r in spec.ranges})
        if planned and planned != sorted(self.inputs):
            raise ConfigError(
                f"the app imported here reads {sorted(self.inputs)}, the job was planned for "
                f"{planned}: the module reads its topics from the environment, which this "
                "executor does not have (set spark.executorEnv.<VAR>)"
            )
        self.handlers = self.app.handlers()
        self.handles = self.app.stores
        self.cursor = self.app.cursor
        self._decoders = {}
        for t in self.inputs:
            kcodec, vcodec = self.app.input_codecs(t)
            self._decoders[t] = (kcodec.decode, vcodec.decode)
        self._encoders = {t: (o.key.encode, o.value.encode) for t, o in self.app.outputs.items()}
        self.outputs = self.app.outputs
        self.dlq = f"{self.name}.dlq"
        self._root = Path(
            tempfile.mkdtemp(prefix=f"lockgate-backfill-{self.g}-", dir=spec.local_dir)
        )
        self.backend = RocksDBBackend(self._root)
        db = self.backend.open(self.name, self.g, list(self.handles))
        self.kg = KeyGroup(self.g, db, self.handles)
        self.kg.bind()  # the only key group of this process: bound once
        svc = self.app.time_service
        self.svc = svc
        # ctx.emit *is* self._emit: one Python call less per output than Context.emit.
        self.ctx = direct_context(self._emit, None if svc is None else svc.timers)
        if svc is not None:
            svc.emit = self._emit
            svc.on_error = self._timer_failed
            svc.decode_key = self.app.key_codec.decode
            svc.reads_barriers = False  # upstream barriers are not read: record times count
            # No changelog: an attempt rebuilds its state by replay, and a chunk's writes
            # reach the database only after its commit.
            svc.atomic_epochs = True
        self.sink: TaskSink = TaskSink()
        self.emitting = False
        self.records = 0
        self.dead = 0
        self._clock = 0
        #: ``dead`` and ``_clock`` at the start of the open chunk (restored by a replay).
        self._chunk_dead = 0
        self._chunk_clock = 0
        self._crash_at = _crash_point(self.g, attempt)
        #: Processing time (record time) never passes the job's planning time.
        self._ceiling = spec.clock_ceiling_ms if spec.clock_ceiling_ms is not None else 1 << 62
        #: Steps dead-lettered in committed chunks (replayed as dead letters, never re-run:
        #: an output rejection or non-deterministic user code would not fail again).
        self._skip: set[int] = set()
        #: Idleness bookkeeping of the event-time clock at the open chunk's start (it is
        #: not stored; a chunk replay puts it back, so the replay sees the same clock).
        self._chunk_idle: tuple[dict[str, int], int | None] | None = None
        self._compacted: frozenset[str] = frozenset()

    # -- emits ------------------------------------------------------------------------------

    def _emit(
        self,
        topic: str,
        key: Any,
        value: Any,
        headers: Headers = None,
        timestamp: int | None = None,
    ) -> None:
        """Encode and write one output (``ctx.emit`` itself, with its contract).

        Raises:
            ConfigError: ``topic`` is not a declared output.
            SinkFailed: an output codec's service is unavailable, or the producer failed
                for a reason that is not the record's.
            _OutputRejected: the record can never be written (no key for a compacted
                topic, or the producer rejects it).
        """
        codecs = self._encoders.get(topic)
        if codecs is None:
            raise ConfigError(f"emit to {topic!r}: not a declared output of app {self.name!r}")
        try:
            raw_key = None if key is None else codecs[0](key)
            data = None if value is None else codecs[1](value)
        except CodecUnavailable as exc:
            # Not the record's fault: fail the task (Spark retries it), never dead-letter.
            raise SinkFailed(f"output to {topic}: a codec's service is unavailable: {exc}") from exc
        if raw_key is None and topic in self._compacted:
            raise _OutputRejected(
                f"output to {topic} has no key: the topic is compacted "
                "(cleanup.policy=compact), so the broker refuses keyless records"
            )
        if not self.emitting:
            return
        try:
            if headers is None and timestamp is None:
                self.sink.put_plain(topic, raw_key, data)
                return
            hs: list[tuple[str, bytes | str]] | None
            if headers is None:
                hs = None
            elif isinstance(headers, dict):
                hs = list(headers.items())
            else:
                hs = list(headers)
            self.sink.put(topic, raw_key, data, hs, timestamp)
        except KafkaException as exc:
            err = exc.args[0]
            if isinstance(err, KafkaError) and classify(err) is Kind.RECORD:
                reason = f"output to {topic} cannot be written: {describe(err)}"
                raise _OutputRejected(reason) from exc
            raise SinkFailed(f"output to {topic}: {exc}") from exc

    def _put_dead(
        self,
        key: bytes | None,
        value: bytes | None,
        headers: list[tuple[str, bytes | str]],
    ) -> None:
        """Write a dead letter; one too large to write goes without its value."""
        try:
            try:
                self.sink.put(self.dlq, key, value, headers, None)
            except KafkaException as exc:
                err = exc.args[0]
                if not (isinstance(err, KafkaError) and classify(err) is Kind.RECORD):
                    raise
                note = (ERROR_VALUE_DROPPED, f"{describe(err)}"[:500])
                self.sink.put(self.dlq, key, None, [*headers, note], None)
        except KafkaException as exc:
            raise SinkFailed(f"dead letter to {self.dlq}: {exc}") from exc

    def _timer_failed(self, raw_key: bytes | None, t: int, name: str, exc: BaseException) -> None:
        stop = stop_error(self.settings.on_error, f"timer {name!r} at {t}", exc)
        if stop is not None:
            raise stop
        self.dead += 1
        if not self.emitting:
            return
        self._put_dead(raw_key, None, timer_error_headers(exc, t, name))

    def _dead_letter(self, msg: Any, exc: BaseException, stage: str) -> None:
        where = f"{msg.topic()}[{msg.partition()}]@{msg.offset()}"
        stop = stop_error(self.settings.on_error, f"record {where}", exc, stage)
        if stop is not None:
            raise stop
        self.dead += 1
        if self.emitting:
            self._put_dead(msg.key(), msg.value(), record_error_headers(msg, exc, stage))

    # -- steps ------------------------------------------------------------------------------

    def _step(self, index: int, msg: Any, poison: dict[int, _Poisoned]) -> None:
        """Take input record number ``index`` (process or dead-letter it)."""
        ts = msg.timestamp()[1]
        if ts > self._clock:
            self._clock = min(ts, self._ceiling)
        cursor = self.cursor
        cursor.now_ms = self._clock
        if self.svc is not None and index and index % TICK_EVERY == 0:
            self.svc.tick(self._clock)
        if poison or self._skip:
            bad = poison.get(index)
            if bad is not None:
                self._dead_letter(msg, bad.error, bad.stage)
                return
            if index in self._skip:
                self._dead_letter(msg, _Replayed("dead-lettered by an earlier attempt"), "process")
                return
        topic = msg.topic()
        raw_key = msg.key()
        cursor.key = raw_key
        self.ctx.message = msg
        kdec, vdec = self._decoders[topic]
        try:
            key = None if raw_key is None else kdec(raw_key)
            raw_value = msg.value()
            value = None if raw_value is None else vdec(raw_value)
        except CodecUnavailable as exc:
            raise SinkFailed(f"input {topic}: a codec's service is unavailable: {exc}") from exc
        except Exception as exc:  # noqa: BLE001 - any decode failure is bad input
            self._dead_letter(msg, exc, "deserialize")
            return
        try:
            self.handlers[topic](key, value, self.ctx)
        except (ConfigError, UserCodeError):
            raise
        except Exception as exc:  # noqa: BLE001 - user code may raise anything
            raise _Poisoned(index, exc, "process") from exc

    def _drain(self) -> dict[str, dict[bytes, bytes | None]]:
        """Encode the open chunk's state changes (before its outputs commit).

        Raises:
            ConfigError: user code stored a value its store's codec cannot encode.
        """
        writes: dict[str, dict[bytes, bytes | None]] = {}
        for name, cache in self.kg.caches.items():
            try:
                drained = cache.drain()
            except Exception as exc:  # noqa: BLE001 - any codec failure
                raise ConfigError(
                    f"key group {self.g}: state of store {name!r} cannot be encoded with its "
                    f"codec ({type(exc).__name__}: {exc}); nothing of this transaction was "
                    "committed. Fix the app (store encodable values) and --resume the job"
                ) from exc
            if drained:
                writes[name] = drained
        return writes

    def _apply(self, writes: dict[str, dict[bytes, bytes | None]]) -> None:
        """Write the drained changes to the local database."""
        self.kg.db.apply(writes, {})
        for cache in self.kg.caches.values():
            cache.trim(200_000)

    def run(self, steps: Iterable[Any], sink: TaskSink) -> TaskResult:
        """Run every step, committing as it goes; export the final state.

        Raises:
            UserCodeError: user code failed under ``LOCKGATE_ON_ERROR=fail``.
            ConfigError: a programming error in the app (e.g. emit to an undeclared
                output).
            KafkaException: the output or the input failed (the task fails; a retry
                resumes from the last commit).
        """
        started = time.monotonic()
        self.sink = sink
        ok = False
        try:
            resume, skipped = sink.committed_steps()
            self._skip = set(skipped)
            self._compacted = (
                self._compacted_outputs() if isinstance(sink, KafkaSink) else frozenset()
            )
            chunk: list[Any] = []
            chunk_start = 0
            poison: dict[int, _Poisoned] = {}
            index = 0
            txn_started = time.monotonic()
            max_txn_s = self.settings.transaction_timeout_ms / 1000 / 3
            for msg in steps:
                chunk.append(msg)
                self.emitting = index >= resume
                try:
                    self._step(index, msg, poison)
                except (_Poisoned, _OutputRejected) as bad:
                    failed = bad if isinstance(bad, _Poisoned) else _Poisoned(index, bad, "process")
                    self._replay(chunk, chunk_start, resume, poison, failed)
                index += 1
                self.records = index
                if index == self._crash_at:
                    log.error("injected crash (test)", extra={"key_group": self.g, "step": index})
                    os._exit(137)
                full = len(chunk) >= self.spec.commit_every
                late = (
                    not index & 255
                    and index > resume
                    and time.monotonic() - txn_started > max_txn_s
                )
                if full or late:
                    self._commit(index, resume, done=False, poison=poison)
                    chunk.clear()
                    chunk_start = index
                    poison.clear()
                    txn_started = time.monotonic()
            self.emitting = True
            self._commit(index, resume, done=True, poison=poison)
            manifest = self._export()
            sink.close(True)  # a Parquet file that cannot be closed fails the task
            ok = True
            return TaskResult(
                key_group=self.g,
                records=self.records,
                outputs=sink.produced,
                dead_letters=self.dead,
                resumed_from=resume,
                seconds=round(time.monotonic() - started, 3),
                manifest=manifest,
            )
        finally:
            if not ok:
                with contextlib.suppress(Exception):
                    sink.close(False)
            self.kg.close()
            shutil.rmtree(self._root, ignore_errors=True)

    def _commit(self, index: int, resume: int, done: bool, poison: dict[int, _Poisoned]) -> None:
        """End the chunk: encode state, commit outputs with the progress, apply state."""
        if done and index < resume:
            raise RuntimeError(
                f"key group {self.g}: an earlier attempt committed {resume} steps, the input "
                f"now has {index}: the input changed under the job (retention, deletion?)"
            )
        writes = self._drain()
        self._skip.update(poison)
        if index > resume or done:
            self.sink.commit(index, done, sorted(self._skip))
        self._apply(writes)
        self._chunk_dead = self.dead
        self._chunk_clock = self._clock
        if self.svc is not None:
            clock = self.svc.clock()
            self._chunk_idle = (dict(clock.last_seen), clock.idle_since)

    def _compacted_outputs(self) -> frozenset[str]:
        """The output topics with ``cleanup.policy=compact`` (keyless emits are refused)."""
        from processors._kafka.clients import Admin

        admin = Admin(self.settings)
        return frozenset(
            t
            for t in self.outputs
            if "compact" in admin.topic_config(t).get("cleanup.policy", "").split(",")
        )

    def _replay(
        self,
        chunk: list[Any],
        chunk_start: int,
        resume: int,
        poison: dict[int, _Poisoned],
        failed: _Poisoned,
    ) -> None:
        """Abort the open unit; replay the chunk with ``failed`` dead-lettered instead."""
        while True:
            poison[failed.step] = failed
            self.sink.abort()
            self.kg.discard()
            self.dead = self._chunk_dead
            self._clock = self._chunk_clock
            if self.svc is not None and self._chunk_idle is not None:
                clock = self.svc.clock()  # rebuilt from the committed state
                clock.last_seen = dict(self._chunk_idle[0])
                clock.idle_since = self._chunk_idle[1]
            try:
                for offset, msg in enumerate(chunk):
                    i = chunk_start + offset
                    self.emitting = i >= resume
                    try:
                        self._step(i, msg, poison)
                    except _OutputRejected as exc:
                        raise _Poisoned(i, exc, "process") from exc
            except _Poisoned as again:  # another record (or the same, non-deterministic)
                failed = again
                continue
            return

    def _export(self) -> dict[str, Any]:
        """Write the final state as the key group's slice of the job's savepoint."""
        location = SavepointStore(self.spec.savepoint_url)
        stores: dict[str, Any] = {}
        db = self.kg.db
        for name, handle in sorted(self.handles.items()):
            written = location.write_store(self.spec.job, self.name, self.g, name, db.items(name))
            op = self.app.store_operator(name)
            stores[name] = {
                "kind": handle.spec.kind,
                "codec": handle.spec.codec.name,
                **(op.store_fields() if op is not None else {}),
                **written.to_dict(),
            }
        manifest = key_group_manifest(
            self.spec.job,
            self.name,
            self.g,
            offsets={r.topic: r.end for r in self.spec.ranges},
            stores=stores,
            instance="backfill",
            backfill=True,
        )
        location.write_manifest(self.spec.job, self.name, self.g, manifest)
        return manifest


class _OutputRejected(Exception):  # noqa: N818 - names what happened to the output
    """The producer can never write an output of this record (e.g. it is too large)."""


class _Replayed(Exception):  # noqa: N818 - the reason shown for a replayed dead letter
    """A step an earlier attempt dead-lettered (its dead letter is committed already)."""


def _crash_point(g: int, attempt: int) -> int:
    """Test fault injection: ``LOCKGATE_TEST_BACKFILL_CRASH=<g>:<step>`` kills attempt 0."""
    raw = os.environ.get("LOCKGATE_TEST_BACKFILL_CRASH", "")
    if not raw or attempt != 0:
        return -1
    kg, _, step = raw.partition(":")
    return int(step) if int(kg) == g else -1


def run_task(
    settings: Settings,
    spec: TaskSpec,
    *,
    attempt: int = 0,
    rows: Iterable[Record] | None = None,
) -> TaskResult:
    """Run one backfill task to the end; return its result.

    Args:
        settings: the app's settings (bootstrap servers, client config, on_error).
        spec: the task.
        attempt: the Spark attempt number (0 first).
        rows: archived input records of this key group in order; ``None``: read
            ``spec.ranges`` from Kafka.

    Raises:
        See :meth:`BackfillTask.run`.
    """
    task = BackfillTask(settings, spec, attempt=attempt)
    sink: TaskSink = ParquetSink(spec) if spec.output_dir else KafkaSink(settings, spec)
    steps: Iterable[Any] = kafka_steps(settings, spec, task.inputs) if rows is None else rows
    return task.run(steps, sink)
