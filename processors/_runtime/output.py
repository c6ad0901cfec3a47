"""Producing into the open transaction, and what went wrong doing so.

:class:`OutputWriter` owns everything an instance writes through its producer: the
outputs user code emits (``ctx.emit`` is :meth:`OutputWriter.emit`), the records the
runtime itself writes (changelog, dead letters, barriers, checkpoint and registry
records: :meth:`OutputWriter.produce`) and the epoch's tallies and errors of both:

* ``producer_error`` — the producer refused a record for its own reasons (the
  transaction went abortable, the queue stayed full): not the record's fault, the epoch
  aborts even if user code swallowed the exception;
* ``record_error`` — an output of the record in progress can never be written (too
  large, keyless on a compacted topic): the record is dead-lettered even if user code
  caught it;
* ``codec_error`` — an output codec could not reach a service (a schema registry): the
  instance stops before committing;
* ``delivery_error`` — a delivery report failed: transient ones are replayed, permanent
  ones stop the instance (:meth:`OutputWriter.raise_if_undeliverable`).

The epoch sequence resets the errors and tallies at each commit or abort; the loop
reads them per record. One thread (the loop's) uses it.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from typing import Any

from confluent_kafka import KafkaError, KafkaException

from processors._checkpoint.protocol import record_error_headers
from processors._dsl.context import Headers
from processors._dsl.topics import OutputSpec
from processors._kafka.errors import AbortEpoch, Kind, classify, delivery_is_transient, describe
from processors._sinks import Sinks
from processors.exceptions import ConfigError, FatalKafkaError
from state.codecs import CodecUnavailable

log = logging.getLogger("lockgate.runtime")

_PURGED = {KafkaError._PURGE_QUEUE, KafkaError._PURGE_INFLIGHT}  # noqa: SLF001 - public codes


class RecordRejected(Exception):  # noqa: N818 - names what happened to the record
    """The producer can never write an output of this record (e.g. it is too large).

    Raised from ``ctx.emit`` into user code; the record is dead-lettered (or the app
    stops under ``LOCKGATE_ON_ERROR=fail``) even if user code catches it.
    """


def _header_list(headers: Headers) -> list[tuple[str, bytes | str]]:
    if headers is None:
        return []
    if isinstance(headers, dict):
        return list(headers.items())
    return list(headers)


class OutputWriter:
    """Writes an instance's records into the current producer's open transaction.

    Args:
        app: the app's name (its dead-letter topic is ``<app>.dlq``).
        outputs: the app's declared outputs by topic.
        queue_wait_s: how long a full producer queue is waited for before the epoch
            aborts (the transaction timeout).
        sinks: the app's outputs outside Kafka: an emit to one of their names is buffered
            there for the epoch's end (processors/_sinks).
    """

    def __init__(
        self,
        app: str,
        outputs: Mapping[str, OutputSpec],
        queue_wait_s: float,
        sinks: Sinks | None = None,
    ) -> None:
        self.app = app
        #: Outputs outside Kafka (processors/_sinks), emitted to by name.
        self.sinks = sinks
        self.dlq = f"{app}.dlq"
        #: Output topic -> (key encoder, value encoder).
        self.outputs = {t: (spec.key.encode, spec.value.encode) for t, spec in outputs.items()}
        #: Outputs read by another lockgate app (they get barriers and writer headers).
        self.internal_outputs = [t for t, spec in outputs.items() if spec.internal]
        self.internal_set = frozenset(self.internal_outputs)
        #: Outputs with cleanup.policy=compact (keyless records are refused there).
        self.compacted: set[str] = set()
        #: ``lockgate-writer`` header per key group, and the one of the key group in
        #: progress (put on every record to an internal output).
        self.writer_headers: dict[int, list[tuple[str, bytes | str]]] = {}
        self.writer_header: list[tuple[str, bytes | str]] = []
        self._queue_wait_s = queue_wait_s
        self.producer: Any = None
        self._produce_fast: Any = None
        #: Records emitted and dead-lettered in the open epoch.
        self.records = 0
        self.dead_letters = 0
        self.producer_error: KafkaError | None = None
        self.record_error: BaseException | None = None
        self.codec_error: CodecUnavailable | None = None
        self.delivery_error: KafkaError | None = None

    def use(self, producer: Any) -> None:
        """Write through ``producer`` from now on (a new or replacing one)."""
        self.producer = producer
        self._produce_fast = producer.produce

    def key_group(self, g: int) -> None:
        """Records emitted from now on are key group ``g``'s (its writer header)."""
        self.writer_header = self.writer_headers[g]

    def produce(self, topic: str, value: bytes | None, key: bytes | None, **kw: Any) -> None:
        """Produce a record the runtime writes (changelog, DLQ, barrier, checkpoint).

        Raises:
            AbortEpoch: the transaction went abortable; replaying the epoch may succeed.
            FatalKafkaError: fatal producer state, or a record the runtime itself made
                cannot be written (e.g. a state value above the topic's size limit).
        """
        produce = self.producer.produce
        deadline = 0.0
        while True:
            try:
                produce(topic, value, key, **kw)
                return
            except BufferError:
                # Queue full: let deliveries drain, bounded by the transaction timeout.
                now = time.monotonic()
                deadline = deadline or now + self._queue_wait_s
                if now > deadline:
                    raise AbortEpoch(f"produce to {topic}: the queue stayed full") from None
                self.producer.poll(0.05)
            except KafkaException as exc:
                err = exc.args[0]
                kind = classify(err) if isinstance(err, KafkaError) else Kind.FATAL
                if isinstance(err, KafkaError) and err.code() == KafkaError._STATE:  # noqa: SLF001
                    kind = Kind.ABORT  # the transaction went abortable: produce() has no flags
                if kind is Kind.ABORT or kind is Kind.RETRY:
                    raise AbortEpoch(f"produce to {topic}: {describe(err)}") from exc
                if kind is Kind.RECORD:
                    size = (len(value) if value else 0) + (len(key) if key else 0)
                    raise FatalKafkaError(
                        f"cannot write a {size}-byte record to {topic}: {describe(err)} "
                        "(for a changelog: a state value outgrew the topic's max.message.bytes;"
                        " keep per-key state smaller or raise the topic limit and the "
                        "producer's LOCKGATE_KAFKA__MESSAGE_MAX_BYTES)"
                    ) from exc
                raise FatalKafkaError(f"produce to {topic}: {exc}") from exc

    def dead_letter(self, msg: Any, exc: BaseException, stage: str) -> None:
        """Write input record ``msg`` to the dead-letter topic with why (``stage``, ``exc``)."""
        self.produce(
            self.dlq, msg.value(), msg.key(), headers=record_error_headers(msg, exc, stage)
        )
        self.dead_letters += 1

    def emit(
        self,
        topic: str,
        key: Any,
        value: Any,
        headers: Headers = None,
        timestamp: int | None = None,
    ) -> None:
        """Encode and produce one output of the current record.

        This is ``ctx.emit`` itself (see :func:`processors._dsl.context.direct_context`).

        Raises:
            ConfigError: ``topic`` is not a declared output.
            RecordRejected: the record can never be written (``record_error`` is set).
            CodecUnavailable: an output codec could not reach its service
                (``codec_error`` is set).
            KafkaException: the producer refused it for its own reasons
                (``producer_error`` is set).
        """
        codecs = self.outputs.get(topic)
        if codecs is None:
            if self.sinks is not None and topic in self.sinks:
                # sink hook: a row for the key group in progress (written at the epoch end)
                self.sinks.write(topic, self.writer_header, key, value)
                self.records += 1
                return
            raise ConfigError(f"emit to {topic!r}: not a declared output of app {self.app!r}")
        kenc, venc = codecs
        if topic in self.internal_set:
            # Downstream alignment needs the writer (key group) of every record.
            headers = self.writer_header + _header_list(headers)
        try:
            data = None if value is None else venc(value)
            raw_key = None if key is None else kenc(key)
        except CodecUnavailable as exc:
            self.codec_error = exc
            raise
        if raw_key is None and topic in self.compacted:
            rejected = RecordRejected(
                f"output to {topic} has no key: the topic is compacted "
                "(cleanup.policy=compact), so the broker refuses keyless records"
            )
            self.record_error = rejected
            raise rejected
        produce = self._produce_fast
        deadline = 0.0
        while True:
            try:
                if timestamp is not None:
                    produce(topic, data, raw_key, headers=headers, timestamp=timestamp)
                elif headers is None:
                    produce(topic, data, raw_key)
                else:
                    produce(topic, data, raw_key, headers=headers)
                break
            except BufferError:
                # Queue full: let deliveries drain, bounded by the transaction timeout;
                # past it the epoch aborts (not the record's fault).
                now = time.monotonic()
                deadline = deadline or now + self._queue_wait_s
                if now > deadline:
                    self.producer_error = KafkaError(
                        KafkaError._QUEUE_FULL,  # noqa: SLF001 - public code
                        f"the producer queue stayed full for {self._queue_wait_s:.0f}s",
                    )
                    raise KafkaException(self.producer_error) from None
                self.producer.poll(0.05)
            except KafkaException as exc:
                err = exc.args[0]
                if isinstance(err, KafkaError) and classify(err) is Kind.RECORD:
                    size = (len(data) if data else 0) + (len(raw_key) if raw_key else 0)
                    rejected = RecordRejected(
                        f"output to {topic} ({size} bytes) cannot be written: {describe(err)}"
                    )
                    self.record_error = rejected
                    raise rejected from exc
                # The producer refused for its own reasons (e.g. the transaction went
                # abortable): not the record's fault, even if user code swallows it.
                self.producer_error = err if isinstance(err, KafkaError) else None
                if self.producer_error is None:
                    raise FatalKafkaError(f"produce to {topic}: {exc}") from exc
                raise
        self.records += 1

    def on_delivery(self, err: KafkaError | None, msg: Any) -> None:
        """The producer's delivery report callback: remember a failure (logged)."""
        if err is not None:
            if err.code() in _PURGED:
                return  # our own abort purged it: the replay produces it again
            if self.delivery_error is None or not delivery_is_transient(err):
                self.delivery_error = err
            size = len(msg.value() or b"") + len(msg.key() or b"")
            log.warning(
                "delivery failed",
                extra={
                    "topic": msg.topic(),
                    "partition": msg.partition(),
                    "bytes": size,
                    "error": err.name(),
                    "detail": err.str(),
                },
            )

    def raise_if_undeliverable(self) -> None:
        """A record failed permanently: replaying the epoch would fail the same way.

        Clears ``delivery_error`` (a transient one is replayed).

        Raises:
            FatalKafkaError: a delivery failed for a permanent reason (by error code).
        """
        err, self.delivery_error = self.delivery_error, None
        if err is not None and not delivery_is_transient(err):
            raise FatalKafkaError(
                f"a record could not be delivered ({describe(err)}); replaying would fail "
                "again, so the instance stops (check the emitted key/value sizes against "
                "the topic's max.message.bytes, topic ACLs, and that compacted outputs get "
                "keys)"
            )

    def epoch_done(self) -> None:
        """Start the next epoch's tallies (after a commit or an abort)."""
        self.records = self.dead_letters = 0
