"""The processing loop of one instance: consume, process, commit epochs.

One thread owns the consumer, the operator chain and the producer. Every
``LOCKGATE_CHECKPOINT_INTERVAL_MS`` the open epoch ends with the commit sequence
(exactly-once):

1. produce the final value of every dirty state key to its changelog partition,
   barrier records to internal outputs, and a checkpoint record per key group to
   ``lockgate.control``;
2. ``send_offsets_to_transaction`` with the input positions (metadata carries the
   checkpoint id) and fresh consumer group metadata;
3. ``commit_transaction``; then write the epoch's changes to the local databases
   (with the changelog offsets in ``__meta``); then ``begin_transaction``.

Nothing reaches the local databases before step 3 succeeded, so an abort is
"drop the caches and seek back to the committed offsets". A record that makes
user code raise aborts the epoch; the replay sends that record to the dead-letter
topic instead of calling user code again, so its partial effects never commit.
"""

from __future__ import annotations

import logging
import signal
import time
from collections.abc import Callable
from types import FrameType
from typing import Any

import orjson
from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition

from processors._app import App
from processors._context import Context, Headers
from processors._faults import crash_point
from processors._health import HealthServer, Metrics
from processors._kafka import (
    CONTROL_TOPIC,
    PARTITION_EOF,
    AbortEpoch,
    Admin,
    consumer_config,
    kafka_call,
    producer_config,
    restore_consumer_config,
)
from processors._keygroups import KeyGroup, Restorer
from processors._settings import Guarantee, OnError, Settings, StateBackendKind
from processors.exceptions import ConfigError, FatalKafkaError, UserCodeError
from state.base.store import (
    META_CHANGELOG_PREFIX,
    META_CHECKPOINT,
    META_UPDATED_MS,
    StateBackend,
    checkpoint_of,
)
from state.cache import changelog_topic
from state.memory.store import MemoryBackend
from state.rocksdb.store import RocksDBBackend

log = logging.getLogger("lockgate.runtime")

_CONTROL_HEADER = "lockgate-type"


_MAX_CONSECUTIVE_ABORTS = 10
_PURGED = {KafkaError._PURGE_QUEUE, KafkaError._PURGE_INFLIGHT}  # noqa: SLF001 - public codes


class _InstanceIdInUse(FatalKafkaError):
    """The group still has a member with this instance id (KIP-848 fences the newcomer)."""


class _Rewind(Exception):  # noqa: N818 - internal control flow
    """User code raised: abort the epoch and replay with the record dead-lettered."""


def _is_control(headers: list[tuple[str, bytes]]) -> bool:
    return any(k == _CONTROL_HEADER for k, _ in headers)


def _error_headers(msg: Any, exc: BaseException, stage: str) -> list[tuple[str, bytes | str]]:
    headers: list[tuple[str, bytes | str]] = [
        ("lockgate-error-type", type(exc).__name__),
        ("lockgate-error-message", str(exc)[:2000]),
        ("lockgate-error-stage", stage),
        ("lockgate-source-topic", msg.topic()),
        ("lockgate-source-partition", str(msg.partition())),
        ("lockgate-source-offset", str(msg.offset())),
        ("lockgate-source-timestamp", str(msg.timestamp()[1])),
    ]
    headers.extend(msg.headers() or [])
    return headers


class Runner:
    """Runs an :class:`App` until stopped; one instance of the app's consumer group."""

    def __init__(self, app: App, settings: Settings) -> None:
        self.app = app
        self.settings = settings
        self.name = settings.app_name or app.name
        self.eos = settings.guarantee is Guarantee.EXACTLY_ONCE
        self.metrics = Metrics(self.name, settings.instance_id)
        self._handles = app.stores
        self._handler = app.handler()
        self._inputs = app.input_topics
        if len(self._inputs) > 1:
            raise ConfigError(
                "this version supports one input topic per app (co-partitioned multi-input "
                "assignment is not implemented yet); chain apps through a topic instead"
            )
        self._outputs = {t: (spec.key.encode, spec.value.encode) for t, spec in app.outputs.items()}
        self._internal_outputs = [t for t, spec in app.outputs.items() if spec.internal]
        self._dlq = f"{self.name}.dlq"
        self._cursor = app.cursor
        self._ctx = Context(self._emit)
        self._stop = False
        self._fatal: BaseException | None = None
        self._kgs: dict[int, KeyGroup] = {}
        self._committed: dict[tuple[str, int], int] = {}
        self._uncommitted = 0  # records consumed since the last commit
        self._last_epoch_records = 0
        self._poison: dict[tuple[str, int, int], tuple[BaseException, str]] = {}
        self._commit_now = False
        self._checkpoint = 0
        self._delivery_error: KafkaError | None = None
        self._partitions = 0
        self._backend: StateBackend = (
            MemoryBackend()
            if settings.state_backend is StateBackendKind.MEMORY
            else RocksDBBackend(settings.state_dir)
        )
        self._producer: Any = None
        self._consumer: Any = None
        self._restorer: Restorer | None = None
        self._admin: Admin | None = None
        self._http: HealthServer | None = None
        self._stop_committing = False
        self._consecutive_aborts = 0
        self._producer_error: KafkaError | None = None  # set by _emit, checked per record
        # Processing stops at this time within an epoch (half the transaction timeout).
        self._epoch_deadline = time.monotonic() + settings.transaction_timeout_ms / 2000
        self._emitted = 0  # records emitted, folded into metrics once per batch
        self._produce_fast: Any = None
        self._internal_partitions: dict[str, int] = {}

    # -- life cycle ---------------------------------------------------------------------

    def request_stop(self, signum: int | None = None, frame: FrameType | None = None) -> None:
        """Ask the loop to finish the epoch and stop (signal-safe)."""
        self._stop = True

    def run(self) -> int:
        """Run until SIGTERM/SIGINT (exit code 0) or a fatal error (non-zero).

        Raises:
            ConfigError, TopicError: the app or topics are misconfigured (before any
                record is processed).
        """
        signal.signal(signal.SIGTERM, self.request_stop)
        signal.signal(signal.SIGINT, self.request_stop)
        s = self.settings
        if s.http_port:
            self._http = HealthServer(self.metrics, s.http_host, s.http_port, s.liveness_timeout_ms)
            self._http.start()
        try:
            self._setup()
            return self._loop()
        finally:
            if self._http is not None:
                self._http.stop()

    def _setup(self) -> None:
        s = self.settings
        if self.eos and s.transaction_timeout_ms < 2 * s.checkpoint_interval_ms:
            raise ConfigError(
                "LOCKGATE_TRANSACTION_TIMEOUT_MS must be at least twice "
                "LOCKGATE_CHECKPOINT_INTERVAL_MS (an epoch must fit well inside a transaction)"
            )
        self._admin = admin = Admin(s)
        self._partitions = p = admin.input_partitions(self._inputs)
        compact = {"cleanup.policy": "compact"}
        topics: dict[str, tuple[int, dict[str, str]]] = {
            spec.topic: (spec.partitions or p, {}) for spec in self.app.outputs.values()
        }
        topics.update({changelog_topic(self.name, n): (p, compact) for n in self._handles})
        topics[self._dlq] = (p, {})
        topics[CONTROL_TOPIC] = (1, compact)
        admin.ensure_topics(topics)
        self._internal_partitions = {
            t: n for t, n in admin.partitions_of(self._internal_outputs).items()
        }
        tid = f"{self.name}-{s.instance_id}" if self.eos else None
        pconf = producer_config(s, self.name, tid)
        # Python callbacks for failures only (a callback per record costs ~10%).
        pconf["delivery.report.only.error"] = True
        pconf["on_delivery"] = self._on_delivery_error
        self._producer = Producer(pconf)
        self._produce_fast = self._producer.produce
        if self.eos:
            # Fences an older incarnation with the same id and aborts its open transaction.
            kafka_call(
                self._producer.init_transactions,
                s.transaction_timeout_ms / 1000 * 2,
                what="init_transactions",
            )
            self._producer.begin_transaction()
        self._restorer = Restorer(
            self.name,
            self._backend,
            Consumer(restore_consumer_config(s, self.name)),
            admin.end_offsets,
            self._restore_progress,
            s.restore_batch_records,
        )
        self._subscribe()
        self.metrics.started = True
        log.info(
            "started",
            extra={
                "app": self.name,
                "instance": s.instance_id,
                "guarantee": s.guarantee.value,
                "inputs": list(self._inputs),
                "key_groups": p,
                "checkpoint_interval_ms": s.checkpoint_interval_ms,
            },
        )

    def _subscribe(self) -> None:
        self._consumer = Consumer(consumer_config(self.settings, self.name))
        self._consumer.subscribe(
            list(self._inputs),
            on_assign=self._on_assign,
            on_revoke=self._on_revoke,
            on_lost=self._on_lost,
        )

    def _rejoin_later(self, exc: _InstanceIdInUse) -> None:
        """The previous incarnation of this instance id still holds its membership.

        Under KIP-848 the broker fences the *new* member until the old one's session
        expires; nothing is assigned yet, so wait and join again with a fresh consumer.
        """
        log.warning(
            "instance id still held by a previous incarnation; rejoining in 2s "
            "(until the broker's group.consumer.session.timeout.ms expires it)",
            extra={"instance": self.settings.instance_id, "detail": str(exc)},
        )
        self._consumer.close()
        deadline = time.monotonic() + 2.0
        while time.monotonic() < deadline and not self._stop:
            self.metrics.beat()
            time.sleep(0.1)
        self._subscribe()

    def _loop(self) -> int:
        s = self.settings
        batch = s.consume_batch_size
        interval = s.checkpoint_interval_ms / 1000
        metrics = self.metrics
        next_epoch = time.monotonic() + interval
        code = 0
        try:
            while not self._stop:
                try:
                    msgs = self._consumer.consume(batch, 0.1)
                    if self._fatal is not None:
                        raise self._fatal
                    if msgs:
                        self._process(msgs)
                except _Rewind:
                    self._abort_epoch("user code raised: replaying with the record dead-lettered")
                except AbortEpoch as exc:
                    self._abort_epoch(str(exc))
                except _InstanceIdInUse as exc:
                    if self._kgs:
                        raise FatalKafkaError(str(exc)) from exc
                    self._rejoin_later(exc)
                    continue
                now = time.monotonic()
                metrics.heartbeat = now
                if now >= next_epoch or self._commit_now:
                    try:
                        self._end_epoch()
                    except AbortEpoch as exc:
                        self._abort_epoch(str(exc))
                    next_epoch = now + interval
            log.info("stopping: finishing the open epoch")
            try:
                self._end_epoch()
            except AbortEpoch as exc:
                self._abort_epoch(str(exc))
        except (FatalKafkaError, UserCodeError, ConfigError) as exc:
            hint = ""
            if "FENCED" in str(exc) or "UNRELEASED_INSTANCE_ID" in str(exc):
                hint = (
                    f" (another process runs with LOCKGATE_INSTANCE_ID={self.settings.instance_id}"
                    " for this app: instance ids must be unique per live instance)"
                )
            log.error("stopping on a fatal error: %s%s", exc, hint)
            if isinstance(exc, UserCodeError):
                code = 3
            elif isinstance(exc, ConfigError):
                code = 2
            else:
                code = 1
            self._close(graceful=False)
            return code
        except Exception:
            # Kafka, RocksDB (e.g. a locked or unreadable state dir) or anything else: stop
            # without committing; the orchestrator restarts from the last checkpoint.
            log.exception("stopping on an unexpected error")
            self._close(graceful=False)
            return 1
        self._close(graceful=True)
        if self._fatal is not None:  # raised by the final revoke (e.g. fenced)
            log.error("stopped after a fatal error during shutdown: %s", self._fatal)
            return 1
        log.info("stopped", extra={"last_checkpoint": self._checkpoint})
        return code

    def _close(self, graceful: bool) -> None:
        if not graceful:
            # Never commit on the way out after a failure, and end the transaction before
            # the consumer leaves the group, so a new owner does not wait for it.
            self._stop_committing = True
            if self._producer is not None and self.eos:
                try:
                    self._producer.abort_transaction(5)
                except Exception:  # noqa: BLE001, S110 - fenced producers cannot abort
                    pass
        if self._consumer is not None:
            try:
                self._consumer.close()
            except Exception as exc:  # noqa: BLE001 - best effort on the way out
                log.warning("consumer close failed: %s", exc)
        for kg in list(self._kgs.values()):
            try:
                kg.close()
            except Exception as exc:  # noqa: BLE001 - best effort on the way out
                log.warning("closing key group %s failed: %s", kg.index, exc)
        self._kgs.clear()
        if self._producer is not None:
            self._producer.flush(10)

    # -- the per-record path ------------------------------------------------------------

    def _process(self, msgs: list[Any]) -> None:
        handler = self._handler
        ctx = self._ctx
        cursor = self._cursor
        kdec = self.app.key_codec.decode
        vdec = self.app.value_codec.decode
        kgs = self._kgs
        poison = self._poison
        cursor.now_ms = int(time.time() * 1000)
        current = -1
        count = 0
        deadline = self._epoch_deadline
        for index, msg in enumerate(msgs):
            if not index & 63 and index and time.monotonic() > deadline:
                # Slow user code: end the epoch well inside transaction.timeout.ms and
                # hand the rest of the batch back to the consumer.
                self._put_back(msgs[index:])
                break
            if msg.error() is not None:
                self._consume_error(msg.error())
                continue
            part = msg.partition()
            if part != current:
                kg = kgs.get(part)
                if kg is None:  # revoked while this batch was in flight
                    continue
                kg.bind()
                current = part
            count += 1
            headers = msg.headers()
            if headers is not None and _is_control(headers):
                continue  # barriers from upstream lockgate apps (alignment: next issue)
            raw_key = msg.key()
            cursor.key = raw_key
            ctx.message = msg
            if poison:
                entry = poison.get((msg.topic(), part, msg.offset()))
                if entry is not None:
                    self._dead_letter(msg, entry[0], entry[1])
                    self._commit_now = True  # keep the replay span short
                    continue
            try:
                key = None if raw_key is None else kdec(raw_key)
                raw_value = msg.value()
                value = None if raw_value is None else vdec(raw_value)
            except Exception as exc:  # noqa: BLE001 - any decode failure is bad input
                self._bad_input(msg, exc, "deserialize")
                continue
            try:
                handler(key, value, ctx)
            except ConfigError:
                raise  # a programming error (e.g. emit to an undeclared topic): stop
            except Exception as exc:  # noqa: BLE001 - user code may raise anything
                if self._producer_error is None:
                    self._bad_input(msg, exc, "process", replay=True)
            if self._producer_error is not None:
                # The producer refused a record (e.g. the transaction is in an abortable
                # state): not the record's fault, even if user code swallowed the error.
                err, self._producer_error = self._producer_error, None
                if err.fatal():
                    raise FatalKafkaError(f"produce: {err.name()}: {err.str()}")
                raise AbortEpoch(f"produce failed: {err.name()}: {err.str()}")
        self._uncommitted += count
        self.metrics.records_in += count
        self.metrics.records_out += self._emitted
        self._emitted = 0
        self._producer.poll(0)

    def _reset_epoch_deadline(self) -> None:
        self._epoch_deadline = time.monotonic() + self.settings.transaction_timeout_ms / 2000

    def _put_back(self, msgs: list[Any]) -> None:
        """Seek every partition in ``msgs`` to its first unprocessed record."""
        first: dict[tuple[str, int], int] = {}
        for msg in msgs:
            if msg.error() is None:
                first.setdefault((msg.topic(), msg.partition()), msg.offset())
        for (topic, part), offset in first.items():
            if part in self._kgs:
                self._consumer.seek(TopicPartition(topic, part, offset))
        self._commit_now = True
        log.warning(
            "epoch cut short: the batch took too long (slow user code?)",
            extra={"records_put_back": len(msgs)},
        )

    def _emit(self, topic: str, key: Any, value: Any, headers: Headers) -> None:
        codecs = self._outputs.get(topic)
        if codecs is None:
            raise ConfigError(f"emit to {topic!r}: not a declared output of app {self.name!r}")
        kenc, venc = codecs
        data = None if value is None else venc(value)
        raw_key = None if key is None else kenc(key)
        try:
            if headers is None:
                self._produce_fast(topic, data, raw_key)
            else:
                self._produce_fast(topic, data, raw_key, headers=headers)
        except BufferError:
            self._produce(topic, data, raw_key, headers=headers)
        except KafkaException as exc:
            self._producer_error = exc.args[0]
            raise
        self._emitted += 1

    def _produce(self, topic: str, value: bytes | None, key: bytes | None, **kw: Any) -> None:
        produce = self._producer.produce
        while True:
            try:
                produce(topic, value, key, **kw)
                return
            except BufferError:
                self._producer.poll(0.05)  # queue full: let deliveries drain

    def _consume_error(self, err: KafkaError) -> None:
        if err.code() == PARTITION_EOF:
            return
        if err.fatal() or err.code() == KafkaError._FATAL:  # noqa: SLF001 - public code
            detail = f"consumer: {err.name()}: {err.str()}"
            if "instance ID is still used" in err.str():
                raise _InstanceIdInUse(detail)
            raise FatalKafkaError(detail)
        log.warning("consumer error", extra={"error": err.name(), "detail": err.str()})

    def _bad_input(self, msg: Any, exc: BaseException, stage: str, replay: bool = False) -> None:
        where = f"{msg.topic()}[{msg.partition()}]@{msg.offset()}"
        if self.settings.on_error is OnError.FAIL:
            raise UserCodeError(
                f"record {where} failed in {stage}: {type(exc).__name__}: {exc} "
                "(LOCKGATE_ON_ERROR=fail; set it to dlq to dead-letter such records)"
            ) from exc
        log.warning(
            "bad record: dead-lettering",
            extra={"record": where, "stage": stage, "error": f"{type(exc).__name__}: {exc}"},
        )
        if replay:
            # Its partial state changes and emits must not commit: abort, then replay
            # the epoch and dead-letter this record instead of calling user code.
            self._poison[(msg.topic(), msg.partition(), msg.offset())] = (exc, stage)
            raise _Rewind
        self._dead_letter(msg, exc, stage)

    def _dead_letter(self, msg: Any, exc: BaseException, stage: str) -> None:
        self._produce(self._dlq, msg.value(), msg.key(), headers=_error_headers(msg, exc, stage))
        self.metrics.dlq_records += 1

    # -- epochs -------------------------------------------------------------------------

    def _owned_partitions(self) -> list[TopicPartition]:
        return [TopicPartition(t, g) for g in self._kgs for t in self._inputs]

    def _end_epoch(self) -> None:
        """Commit the open epoch (no-op when nothing happened since the last one)."""
        self._commit_now = False
        if self._stop_committing:
            return
        if self._uncommitted == 0 and not any(
            c.dirty for kg in self._kgs.values() for c in kg.caches.values()
        ):
            self._reset_epoch_deadline()  # nothing open: the next epoch starts now
            return
        started = time.monotonic()
        interval = self.settings.checkpoint_interval_ms
        ckpt = max(self._checkpoint + 1, int(time.time() * 1000) // interval)
        producer = self._producer
        writes: dict[int, dict[str, dict[bytes, bytes | None]]] = {}
        for g, kg in self._kgs.items():
            per_store: dict[str, dict[bytes, bytes | None]] = {}
            for name, cache in kg.caches.items():
                changes = cache.drain()
                if not changes:
                    continue
                per_store[name] = changes
                topic = changelog_topic(self.name, name)
                for key, value in changes.items():
                    self._produce(topic, value, key, partition=g)
            if per_store:
                writes[g] = per_store
        tps = self._owned_partitions()
        positions = self._consumer.position(tps) if tps else []
        meta = orjson.dumps({"ckpt": ckpt}).decode()
        offsets = [
            TopicPartition(tp.topic, tp.partition, tp.offset, metadata=meta)
            for tp in positions
            if tp.offset >= 0
        ]
        self._write_barriers_and_checkpoints(ckpt, offsets)
        if self.eos:
            crash_point("before_send_offsets")
            if offsets:
                kafka_call(
                    producer.send_offsets_to_transaction,
                    offsets,
                    self._consumer.consumer_group_metadata(),
                    self.settings.transaction_timeout_ms / 1000,
                    what="send_offsets_to_transaction",
                )
            crash_point("before_commit")
            try:
                kafka_call(producer.commit_transaction, what="commit_transaction")
            except AbortEpoch:
                self._raise_if_undeliverable()
                raise
        else:
            producer.flush()
            self._raise_if_undeliverable()
            if offsets:
                self._consumer.commit(offsets=offsets, asynchronous=False)
        self._consecutive_aborts = 0
        # Success reports are off, so the next changelog offsets come from the broker: only
        # the owner of key group g writes changelog partition g, and all of it is acked.
        assert self._admin is not None
        touched = [
            TopicPartition(changelog_topic(self.name, name), g)
            for g, per_store in writes.items()
            for name in per_store
        ]
        changelog_next = self._admin.end_offsets(touched)
        # Committed: now (and only now) the changes may reach the local databases.
        crash_point("after_commit")
        ckpt_bytes = str(ckpt).encode()
        now_bytes = str(int(time.time() * 1000)).encode()
        for g, per_store in writes.items():
            meta_entries = {META_CHECKPOINT: ckpt_bytes, META_UPDATED_MS: now_bytes}
            for name in per_store:
                nxt = changelog_next.get((changelog_topic(self.name, name), g))
                if nxt is not None:
                    meta_entries[META_CHANGELOG_PREFIX + name.encode()] = str(nxt).encode()
            kg = self._kgs[g]
            kg.db.apply(per_store, meta_entries)
            for cache in kg.caches.values():
                cache.trim(self.settings.state_cache_entries)
        for tp in offsets:
            self._committed[(tp.topic, tp.partition)] = tp.offset
        if self._poison:  # dead-lettered records behind the committed positions are done
            self._poison = {
                k: v for k, v in self._poison.items() if k[2] >= self._committed.get(k[:2], 0)
            }
        self._checkpoint = ckpt
        self._last_epoch_records = self._uncommitted
        self._uncommitted = 0
        if self.eos:
            producer.begin_transaction()
        self._reset_epoch_deadline()
        took = time.monotonic() - started
        if log.isEnabledFor(logging.DEBUG):
            log.debug(
                "epoch committed",
                extra={"checkpoint": ckpt, "records": self._last_epoch_records, "seconds": took},
            )
        m = self.metrics
        m.epochs_committed += 1
        m.last_checkpoint_id = ckpt
        m.commit_seconds_sum += took
        m.commit_seconds_max = max(m.commit_seconds_max, took)
        self._sample_lag(positions)

    def _write_barriers_and_checkpoints(self, ckpt: int, offsets: list[TopicPartition]) -> None:
        by_group: dict[int, dict[str, int]] = {}
        for tp in offsets:
            by_group.setdefault(tp.partition, {})[tp.topic] = tp.offset
        for g in self._kgs:
            writer = f"{self.name}/{g}"
            wm = "-1"  # event time arrives with the watermark issue
            barrier = orjson.dumps({"type": "barrier", "ckpt": ckpt, "writer": writer, "wm": -1})
            headers = [
                ("lockgate-type", b"barrier"),
                ("lockgate-ckpt", str(ckpt).encode()),
                ("lockgate-writer", writer.encode()),
                ("lockgate-wm", wm.encode()),
            ]
            for topic in self._internal_outputs:
                for p in range(self._internal_partitions[topic]):
                    self._produce(topic, barrier, None, partition=p, headers=headers)
            record = {
                "app": self.name,
                "key_group": g,
                "checkpoint": ckpt,
                "instance": self.settings.instance_id,
                "offsets": by_group.get(g, {}),
                "ts": int(time.time() * 1000),
            }
            self._produce(
                CONTROL_TOPIC,
                orjson.dumps(record),
                f"ckpt/{self.name}/{g}".encode(),
                partition=0,
            )

    def _abort_epoch(self, reason: str) -> None:
        """Abort the open epoch: drop uncommitted state, rewind inputs, begin again.

        Raises:
            FatalKafkaError: too many aborts in a row without a commit (a replay loop).
        """
        log.warning("aborting epoch", extra={"reason": reason})
        self._consecutive_aborts += 1
        if self._consecutive_aborts > _MAX_CONSECUTIVE_ABORTS and not reason.startswith("user"):
            raise FatalKafkaError(
                f"{self._consecutive_aborts} epochs aborted in a row without a commit "
                f"(last: {reason}); stopping instead of replaying forever"
            )
        if self.eos:
            kafka_call(self._producer.abort_transaction, what="abort_transaction")
            self._producer.poll(0)  # serve the purge reports of the aborted records now
        self._delivery_error = None  # the replay will produce those records again
        for kg in self._kgs.values():
            kg.discard()
        self._rewind(list(self._kgs))
        self._uncommitted = 0
        self.metrics.epochs_aborted += 1
        if self.eos:
            self._producer.begin_transaction()
        self._reset_epoch_deadline()

    def _rewind(self, groups: list[int]) -> None:
        """Seek the inputs of ``groups`` back to their last committed positions."""
        for g in groups:
            for topic in self._inputs:
                offset = self._committed.get((topic, g))
                if offset is None:
                    continue
                try:
                    self._consumer.seek(TopicPartition(topic, g, offset))
                except KafkaException:
                    # Not fetching yet: re-assigning at the offset has the same effect.
                    tp = TopicPartition(topic, g, offset)
                    self._consumer.incremental_unassign([TopicPartition(topic, g)])
                    self._consumer.incremental_assign([tp])

    def _sample_lag(self, positions: list[TopicPartition]) -> None:
        lag = 0
        for tp in positions:
            try:
                _, high = self._consumer.get_watermark_offsets(tp, cached=True)
            except KafkaException:
                continue
            if high >= 0 and tp.offset >= 0:
                lag += max(0, high - tp.offset)
        self.metrics.consumer_lag = lag

    # -- callbacks ----------------------------------------------------------------------

    def _raise_if_undeliverable(self) -> None:
        """A record failed permanently: replaying the epoch would fail the same way."""
        err, self._delivery_error = self._delivery_error, None
        if err is not None and not err.retriable():
            raise FatalKafkaError(
                f"a record could not be delivered ({err.name()}: {err.str()}); replaying "
                "would fail again, so the instance stops (check the emitted key/value sizes, "
                "topic ACLs, and that compacted outputs get keys)"
            )

    def _on_delivery_error(self, err: KafkaError | None, msg: Any) -> None:
        if err is not None:
            if err.code() in _PURGED:
                return  # our own abort purged it: the replay produces it again
            self._delivery_error = err
            log.warning(
                "delivery failed",
                extra={"topic": msg.topic(), "error": err.name(), "detail": err.str()},
            )

    def _restore_progress(self, new_records: int, remaining: int) -> None:
        self.metrics.restore_records += new_records
        self.metrics.restore_remaining = remaining
        self.metrics.beat()

    def _on_assign(self, consumer: Any, partitions: list[TopicPartition]) -> None:
        try:
            self._assign(consumer, partitions)
        except BaseException as exc:  # noqa: BLE001 - surfaced by the loop after consume()
            self._fatal = exc

    def _assign(self, consumer: Any, partitions: list[TopicPartition]) -> None:
        if not partitions:
            consumer.incremental_assign(partitions)
            return
        groups = sorted({tp.partition for tp in partitions})
        log.info("assigned", extra={"key_groups": groups})
        # Commit what is open first, so the restore below cannot outlive the transaction.
        try:
            self._end_epoch()
        except AbortEpoch as exc:
            self._abort_epoch(str(exc))
        # read_committed: waits until no transaction holds pending offsets for these
        # partitions (KIP-447), so the changelog read next is consistent with them.
        committed = kafka_call(
            consumer.committed,
            partitions,
            self.settings.transaction_timeout_ms / 1000 + 30,
            what="committed offsets",
        )
        self.metrics.restoring = len(groups)
        assert self._restorer is not None
        for tp in committed:
            if tp.error is not None:
                raise FatalKafkaError(f"committed offset of {tp.topic}[{tp.partition}]: {tp.error}")
        for g in groups:
            if g not in self._kgs:
                kg = self._restorer.open(g, self._handles)
                self._kgs[g] = kg
                # Checkpoint ids never go backwards, whoever wrote the last one.
                self._checkpoint = max(self._checkpoint, checkpoint_of(kg.db))
            self.metrics.restoring -= 1
        start = []
        for tp in committed:
            offset = tp.offset if tp.offset >= 0 else -2  # OFFSET_BEGINNING
            self._committed[(tp.topic, tp.partition)] = offset
            start.append(TopicPartition(tp.topic, tp.partition, offset))
        consumer.incremental_assign(start)
        self.metrics.assigned = len(self._kgs)
        self.metrics.restoring = 0

    def _on_revoke(self, consumer: Any, partitions: list[TopicPartition]) -> None:
        groups = sorted({tp.partition for tp in partitions})
        log.info("revoked", extra={"key_groups": groups})
        try:
            try:
                self._end_epoch()
            except AbortEpoch as exc:
                self._abort_epoch(str(exc))
        except BaseException as exc:  # noqa: BLE001 - surfaced by the loop
            self._fatal = self._fatal or exc
        finally:
            self._release(groups)
            consumer.incremental_unassign(partitions)

    def _on_lost(self, consumer: Any, partitions: list[TopicPartition]) -> None:
        groups = sorted({tp.partition for tp in partitions})
        log.warning("partitions lost: aborting the open epoch", extra={"key_groups": groups})
        self._release(groups)  # first: the rewind below must not touch lost partitions
        try:
            if self._uncommitted:
                self._abort_epoch("partitions lost")
        except BaseException as exc:  # noqa: BLE001 - surfaced by the loop
            self._fatal = self._fatal or exc
        finally:
            consumer.incremental_unassign(partitions)

    def _release(self, groups: list[int]) -> None:
        for g in groups:
            kg = self._kgs.pop(g, None)
            if kg is not None:
                kg.close()
            for topic in self._inputs:
                self._committed.pop((topic, g), None)
        gone = set(groups)
        self._poison = {k: v for k, v in self._poison.items() if k[1] not in gone}
        self.metrics.assigned = len(self._kgs)


def run_app(
    app: App, settings: Settings, on_started: Callable[[Runner], None] | None = None
) -> int:
    """Run ``app`` with ``settings`` in this thread; return the exit code."""
    runner = Runner(app, settings)
    if on_started is not None:
        on_started(runner)
    return runner.run()
