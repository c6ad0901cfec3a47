"""Rescaling: copy an input topic into a topic with another partition count.

A lockgate app's key-group count is its inputs' partition count, so running it on P'
key groups needs inputs with P' partitions. :func:`copy_topic_repartitioned` makes
such a copy of an input for a savepoint taken with ``--stop``: every record goes to
the partition Kafka's murmur2 partitioner gives its key among P' (the placement
:func:`state.spark.rewrite_savepoint` gives the state), and the records before the
savepoint's cut are written before every record after it, so that one offset per
target partition separates "in the savepoint" from "after it". ``lockgate savepoint
rescale`` (``processors/_spark/cli_options.py``) copies the inputs, then rewrites the
savepoint with those offsets.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Generator, Mapping
from contextlib import closing
from typing import Any

from confluent_kafka import (
    TIMESTAMP_NOT_AVAILABLE,
    Consumer,
    IsolationLevel,
    KafkaError,
    KafkaException,
    Producer,
    TopicPartition,
)
from confluent_kafka.admin import (  # type: ignore[attr-defined]  # re-exported in cimpl
    AdminClient,
    NewTopic,
    OffsetSpec,
)

from processors._config.log_setup import librdkafka_logger
from processors._config.settings import Settings
from processors._dsl.partitioner import key_group
from processors._kafka.clients import (
    PARTITION_EOF,
    admin_config,
    producer_config,
    restore_consumer_config,
)
from processors._ops.catalog import OpsError

__all__ = ["RescaleError", "copy_topic_repartitioned"]

log = logging.getLogger("lockgate.rescale")

_CLIENT = "lockgate-rescale"
#: Records fetched per consume() call.
_BATCH = 1000
#: A source partition whose buffer holds this many records is paused (bounds memory).
_MAX_BUFFERED = 5000
_EARLIEST: Any = OffsetSpec.earliest()  # type: ignore[no-untyped-call]
_LATEST: Any = OffsetSpec.latest()  # type: ignore[no-untyped-call]


class RescaleError(OpsError):
    """A rescale step cannot run or failed.

    ``exit_code`` is 2 for usage problems (a missing or non-empty topic, offsets that
    do not fit the topic) and 1 for failures while copying.
    """


# ------------------------------------------------------------------ clients


def _configs(connection: Settings | str, target: str) -> tuple[dict[str, Any], ...]:
    """(admin, consumer, producer) configurations for ``connection``."""
    if isinstance(connection, Settings):
        admin = admin_config(connection)
        consumer = restore_consumer_config(connection, _CLIENT)
        producer = producer_config(connection, _CLIENT, f"{_CLIENT}.{target}")
    else:
        base = {"bootstrap.servers": connection}
        admin = {**base, "allow.auto.create.topics": False}
        consumer = {
            **base,
            "group.id": f"{_CLIENT}.restore",  # required by librdkafka; never committed
            "enable.auto.commit": False,
            "enable.auto.offset.store": False,
            "isolation.level": "read_committed",
            "enable.partition.eof": True,
            "auto.offset.reset": "earliest",
        }
        producer = {
            **base,
            "partitioner": "murmur2_random",
            "linger.ms": 5,
            "compression.type": "lz4",
            "enable.idempotence": True,
            "transactional.id": f"{_CLIENT}.{target}",
        }
    consumer["client.id"] = f"{_CLIENT}-reader"
    consumer["logger"] = librdkafka_logger("consumer")
    producer["client.id"] = f"{_CLIENT}-writer"
    producer["acks"] = "all"
    producer["logger"] = librdkafka_logger("producer")
    admin["logger"] = librdkafka_logger("admin")
    return admin, consumer, producer


def _list_offsets(
    admin: AdminClient, topic: str, partitions: int, spec: Any, committed: bool = False
) -> dict[int, int]:
    req = {TopicPartition(topic, p): spec for p in range(partitions)}
    kw: dict[str, Any] = {"request_timeout": 30}
    if committed:
        kw["isolation_level"] = IsolationLevel.READ_COMMITTED
    try:
        futs = admin.list_offsets(req, **kw)
        return {tp.partition: int(fut.result().offset) for tp, fut in futs.items()}
    except KafkaException as exc:
        raise RescaleError(f"cannot read the offsets of {topic}: {exc}") from exc


def _partition_info(admin: AdminClient, topic: str) -> tuple[int, int] | None:
    """(partition count, replication factor) of ``topic``, ``None`` when it is missing."""
    md = admin.list_topics(topic=topic, timeout=30).topics.get(topic)
    if md is None or md.error is not None or not md.partitions:
        return None
    return len(md.partitions), len(md.partitions[0].replicas)


def _create_topic(admin: AdminClient, topic: str, partitions: int, replication: int) -> None:
    fut = admin.create_topics([NewTopic(topic, partitions, replication)])[topic]
    try:
        fut.result(60)
    except KafkaException as exc:
        raise RescaleError(f"cannot create topic {topic}: {exc}") from exc
    deadline = time.monotonic() + 60
    while True:
        md = admin.list_topics(topic=topic, timeout=30).topics.get(topic)
        if md is not None and md.error is None and len(md.partitions) == partitions:
            if all(p.leader >= 0 for p in md.partitions.values()):
                return
        if time.monotonic() > deadline:
            raise RescaleError(f"topic {topic} has no leaders 60 s after its creation")
        time.sleep(0.2)


# ------------------------------------------------------------------ reading


def _read_merged(
    consumer: Consumer,
    topic: str,
    ranges: Mapping[int, tuple[int, int]],
    stall_timeout_s: float,
) -> Generator[Any, None, None]:
    """Yield the committed records of ``topic`` in ``[start, end)`` of each partition.

    Each partition's records come in offset order; across partitions the record with
    the earliest timestamp goes first (a k-way merge), so an event-time app reading a
    merged partition sees its times about as ordered as in the sources. At most about
    ``_MAX_BUFFERED`` records per partition are held (a partition further ahead is
    paused).

    Raises:
        RescaleError: a partition gave nothing for ``stall_timeout_s`` while records
            below its end were still expected, or the consumer failed.
    """
    todo = {p: (start, end) for p, (start, end) in ranges.items() if start < end}
    if not todo:
        return
    consumer.assign([TopicPartition(topic, p, start) for p, (start, _) in todo.items()])
    buffers: dict[int, deque[Any]] = {p: deque() for p in todo}
    reading = set(todo)  # partitions not read up to their end yet
    paused: set[int] = set()
    last_record = time.monotonic()
    try:
        while reading or any(buffers.values()):
            starving = [p for p in reading if not buffers[p]]
            if not starving:
                p = min(
                    (p for p, b in buffers.items() if b),
                    key=lambda p: (buffers[p][0].timestamp()[1], p),
                )
                yield buffers[p].popleft()
                if p in paused and len(buffers[p]) < _MAX_BUFFERED // 2:
                    consumer.resume([TopicPartition(topic, p)])
                    paused.discard(p)
                continue
            for p in [p for p in paused if not buffers[p]]:  # never starve a paused one
                consumer.resume([TopicPartition(topic, p)])
                paused.discard(p)
            for msg in consumer.consume(_BATCH, 0.5):
                p = int(msg.partition() or 0)
                offset = int(msg.offset() or 0)
                err = msg.error()
                if err is not None:
                    if err.code() == PARTITION_EOF:
                        if p in reading and offset >= todo[p][1]:
                            reading.discard(p)
                        continue
                    if err.fatal() or not err.retriable():
                        raise RescaleError(f"reading {topic} partition {p}: {err}")
                    continue
                if p not in reading:
                    continue
                end = todo[p][1]
                if offset >= end:
                    reading.discard(p)
                    continue
                buffers[p].append(msg)
                last_record = time.monotonic()
                if offset == end - 1:
                    reading.discard(p)
                if len(buffers[p]) >= _MAX_BUFFERED and p not in paused:
                    consumer.pause([TopicPartition(topic, p)])
                    paused.add(p)
            if time.monotonic() - last_record > stall_timeout_s:
                waiting = sorted(p for p in reading if not buffers[p])
                raise RescaleError(
                    f"no records from {topic} partition(s) {waiting} for {stall_timeout_s:g}s "
                    "although their end was not reached (is the broker reachable?)"
                )
    finally:
        consumer.unassign()


# ------------------------------------------------------------------ copying


class _Writer:
    """The transactional producer of one copy and what it delivered."""

    def __init__(self, conf: dict[str, Any], target: str, partitions: int) -> None:
        self.target = target
        self.partitions = partitions
        self.producer = Producer(conf)
        self.producer.init_transactions(60)
        self.failures: list[str] = []
        #: target partition -> the highest offset delivered so far
        self.last: dict[int, int] = {}
        self.in_transaction = False
        self.committed = 0
        self.pending = 0

    def _delivered(self, err: KafkaError | None, msg: Any) -> None:
        if err is not None:
            self.failures.append(f"partition {msg.partition()}: {err}")
            return
        p = msg.partition()
        if msg.offset() > self.last.get(p, -1):
            self.last[p] = msg.offset()

    def write(self, msg: Any) -> None:
        if not self.in_transaction:
            self.producer.begin_transaction()
            self.in_transaction = True
        key = msg.key()
        kw: dict[str, Any] = {"on_delivery": self._delivered}
        if key is not None:
            kw["partition"] = key_group(key, self.partitions)
        ts_type, ts = msg.timestamp()
        if ts_type != TIMESTAMP_NOT_AVAILABLE:
            kw["timestamp"] = ts
        headers = msg.headers()
        if headers:
            kw["headers"] = headers
        while True:
            try:
                self.producer.produce(self.target, msg.value(), key, **kw)
                break
            except BufferError:
                self.producer.poll(0.1)
        self.pending += 1

    def commit(self) -> None:
        """Commit the open transaction (if any) after every record of it was delivered.

        Raises:
            RescaleError: a record was not delivered (the transaction is aborted).
        """
        if not self.in_transaction:
            return
        left = self.producer.flush(120)
        if left or self.failures:
            problems = self.failures[:5] or [f"{left} record(s) not delivered within 120 s"]
            raise RescaleError(f"writing {self.target}: " + "; ".join(problems))
        self.producer.commit_transaction(120)
        self.in_transaction = False
        self.committed += self.pending
        self.pending = 0

    def abort(self) -> None:
        if self.in_transaction:
            try:
                self.producer.abort_transaction(60)
            except KafkaException as exc:
                log.warning("abort failed", extra={"error": str(exc)})
            self.in_transaction = False


def copy_topic_repartitioned(
    connection: Settings | str,
    source_topic: str,
    target_topic: str,
    partitions: int,
    cut: Mapping[int, int],
    *,
    chunk_records: int = 20_000,
    progress_every_s: float = 5.0,
    stall_timeout_s: float = 60.0,
    replication_factor: int | None = None,
) -> dict[int, int]:
    """Copy ``source_topic`` into ``target_topic`` with ``partitions`` partitions, exactly once.

    Reads the committed records (``read_committed``) of every source partition up to
    its last stable offset when the copy starts, and writes each with its key, value,
    timestamp and headers to partition ``key_group(key, partitions)`` (Kafka's murmur2
    placement, ``murmur2_random``: keyless records go to a random partition) with a
    transactional producer, in transactions of ``chunk_records`` records. First every
    record before ``cut`` (the savepoint's offset of each source partition), then
    every record from it on: the returned offset of each target partition separates
    the two. Within a source partition records keep their order (so each key's
    records keep theirs); across source partitions they are merged by timestamp.

    The producers of the source must have stopped writing it (switch them to the
    target after the copy): records committed to the source after the copy started
    are not copied, and the copy then fails at its end saying so.

    Args:
        connection: the lockgate settings (bootstrap servers, security) or just the
            bootstrap servers.
        source_topic: the topic to copy (P partitions).
        target_topic: the copy; created with ``partitions`` partitions (and the
            source's replication factor) when missing, else it must have
            ``partitions`` partitions and never have held a record.
        partitions: P', the target's partition count.
        cut: source partition -> the savepoint's offset (the next record to process);
            every partition ``0..P-1`` of the source.
        chunk_records: records per transaction.
        progress_every_s: log the progress (logger ``lockgate.rescale``) this often.
        stall_timeout_s: fail when no record arrives for this long while some are due.
        replication_factor: of a created target (default: the source's).

    Returns:
        Target partition -> cut offset, for every partition ``0..P'-1``: a consumer
        starting there reads exactly the records at or after the source's cut.

    Raises:
        RescaleError: exit code 2 when the source is missing, equal to the target,
            ``cut`` does not fit its partitions, or the target exists with another
            partition count or holds records; exit code 1 when the copy fails (the
            target then holds part of the copy: delete it before a new attempt) or
            the source grew during the copy; exit code 2 as well when a source record
            is not in the partition murmur2 gives its key (producers not using
            murmur2), found while copying.
    """
    if isinstance(partitions, bool) or not isinstance(partitions, int) or partitions < 1:
        raise RescaleError(f"partitions must be an int >= 1, got {partitions!r}", 2)
    if chunk_records < 1:
        raise RescaleError(f"chunk_records must be >= 1, got {chunk_records}", 2)
    if source_topic == target_topic:
        raise RescaleError(f"cannot copy {source_topic} into itself: name a new topic", 2)
    admin_conf, consumer_conf, producer_conf = _configs(connection, target_topic)
    admin = AdminClient(admin_conf)
    found = _partition_info(admin, source_topic)
    if found is None:
        raise RescaleError(f"source topic {source_topic} does not exist", 2)
    p_src, replication = found
    if sorted(cut) != list(range(p_src)):
        raise RescaleError(
            f"the cut names partitions {sorted(cut)} but {source_topic} has {p_src} "
            f"partitions (0..{p_src - 1}): is it the topic the savepoint was taken on?",
            2,
        )
    target = _partition_info(admin, target_topic)
    if target is not None:
        if target[0] != partitions:
            raise RescaleError(
                f"target topic {target_topic} has {target[0]} partitions, not {partitions}", 2
            )
        used = {
            p: o
            for p, o in _list_offsets(admin, target_topic, partitions, _LATEST).items()
            if o > 0
        }
        if used:
            raise RescaleError(
                f"target topic {target_topic} already holds records (end offsets {used}): "
                "copy into a new, empty topic (delete and recreate it after a failed copy)",
                2,
            )
    low = _list_offsets(admin, source_topic, p_src, _EARLIEST)
    high = _list_offsets(admin, source_topic, p_src, _LATEST)
    end = _list_offsets(admin, source_topic, p_src, _LATEST, committed=True)
    for p in range(p_src):
        if cut[p] > high[p]:
            raise RescaleError(
                f"the cut of {source_topic} partition {p} is {cut[p]}, past its end "
                f"{high[p]}: is it the topic the savepoint was taken on?",
                2,
            )
        if cut[p] > end[p]:
            raise RescaleError(
                f"{source_topic} partition {p} has a transaction open at offset {end[p]}, "
                f"before the savepoint's cut {cut[p]}: wait until its producer commits or "
                "aborts it",
                2,
            )
    if target is None:
        _create_topic(admin, target_topic, partitions, replication_factor or replication)
        log.info("created topic", extra={"topic": target_topic, "partitions": partitions})
    before = {p: (min(low[p], cut[p]), cut[p]) for p in range(p_src)}
    after = {p: (max(low[p], cut[p]), end[p]) for p in range(p_src)}
    total = sum(e - s for s, e in before.values()) + sum(e - s for s, e in after.values())
    log.info(
        "copying",
        extra={
            "source": source_topic,
            "target": target_topic,
            "partitions": partitions,
            "records_at_most": total,
        },
    )
    consumer = Consumer(consumer_conf)
    writer = _Writer(producer_conf, target_topic, partitions)
    copied = 0
    shown = time.monotonic()
    cuts: dict[int, int] = {}
    try:
        for phase, ranges in (("before the cut", before), ("after the cut", after)):
            with closing(_read_merged(consumer, source_topic, ranges, stall_timeout_s)) as stream:
                for msg in stream:
                    key = msg.key()
                    if key is not None and key_group(key, p_src) != msg.partition():
                        raise RescaleError(
                            f"{source_topic} partition {msg.partition()} offset {msg.offset()} "
                            f"has key {key[:64]!r}, which murmur2 places in partition "
                            f"{key_group(key, p_src)}: the source's producers do not partition "
                            "by murmur2 of the key (partitioner=murmur2_random), which lockgate "
                            "and a rescale need",
                            2,
                        )
                    writer.write(msg)
                    copied += 1
                    if writer.pending >= chunk_records:
                        writer.commit()
                    now = time.monotonic()
                    if now - shown >= progress_every_s:
                        shown = now
                        log.info(
                            f"copied {copied} of at most {total} records "
                            f"({source_topic} -> {target_topic}, {phase})",
                            extra={"copied": copied},
                        )
            writer.commit()
            if phase == "before the cut":  # everything below these offsets is before it
                cuts = {p: writer.last.get(p, -1) + 1 for p in range(partitions)}
    except BaseException as exc:
        writer.abort()
        if isinstance(exc, RescaleError | KafkaException):
            code = exc.exit_code if isinstance(exc, RescaleError) else 1
            raise RescaleError(
                f"copying {source_topic} to {target_topic} failed after {writer.committed} "
                f"committed records: {exc}; {target_topic} holds part of the copy: delete "
                "it before trying again",
                code,
            ) from exc
        raise
    finally:
        consumer.close()
        writer.producer.flush(10)
    log.info(
        f"copied {copied} records ({source_topic} -> {target_topic})",
        extra={"copied": copied, "cut": {str(p): o for p, o in cuts.items()}},
    )
    grown = {
        p: o
        for p, o in _list_offsets(admin, source_topic, p_src, _LATEST, committed=True).items()
        if o > end[p]
    }
    if grown:
        raise RescaleError(
            f"records were written to {source_topic} during the copy (partition -> new end "
            f"offset: {grown}, copied up to {dict(end)}): they are not in {target_topic}. "
            "Stop the producers of the source, delete the target and copy again"
        )
    return cuts
