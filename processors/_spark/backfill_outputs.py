"""Where a backfill task's outputs go: a Kafka transaction or a Parquet file.

:class:`KafkaSink` commits outputs and the job's progress record (``<job>/<key group>``
-> steps done, steps dead-lettered) in one transaction of the producer
``<app>.backfill.<job>.<key group>``; a retried attempt fences the earlier ones
(``init_transactions``) and reads their committed progress (:meth:`KafkaSink.committed_steps`).
:class:`ParquetSink` has no transactions: an attempt writes a temporary file, moved into
place only when the task finished.

A failure that is not the record's fault raises :class:`SinkFailed`: the task fails and
Spark's retry resumes from the last commit.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
import time
from pathlib import Path
from typing import Any

import orjson
from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition

from processors._config.settings import Settings
from processors._kafka.clients import producer_config, restore_consumer_config
from processors._spark.backfill_spec import TaskSpec

__all__ = ["KafkaSink", "ParquetSink", "SinkFailed", "TaskSink"]

_NO_KW: dict[str, Any] = {}


class SinkFailed(BaseException):  # noqa: N818 - escapes user code's except Exception
    """The output failed for a reason that is not the record's.

    The task fails; a retry resumes from the last commit. A BaseException so that user
    code and the step's error handling cannot mistake it for the record's failure.
    """


class TaskSink:
    """Where a task's outputs go: a Kafka transaction or a Parquet file."""

    produced = 0

    def begin(self) -> None:
        """Start a unit of output (a transaction)."""

    def put(
        self,
        topic: str,
        key: bytes | None,
        value: bytes | None,
        headers: list[tuple[str, bytes | str]] | None,
        timestamp: int | None,
    ) -> None:
        """Add one record to the open unit."""
        raise NotImplementedError

    def put_plain(self, topic: str, key: bytes | None, value: bytes | None) -> None:
        """Add one record without headers or timestamp (the common case)."""
        self.put(topic, key, value, None, None)

    def commit(self, steps: int, done: bool, skipped: list[int] | None = None) -> None:
        """Make the open unit durable with the progress ``steps`` (and dead-lettered steps)."""
        raise NotImplementedError

    def abort(self) -> None:
        """Drop the open unit."""
        raise NotImplementedError

    def committed_steps(self) -> tuple[int, list[int]]:
        """Steps a previous attempt committed and the steps it dead-lettered (none: 0)."""
        return 0, []

    def close(self, ok: bool) -> None:
        """Release the sink; ``ok``: the task finished."""


class KafkaSink(TaskSink):
    """Transactional output with the job's progress record in every transaction."""

    def __init__(self, settings: Settings, spec: TaskSpec) -> None:
        self.spec = spec
        self.settings = settings
        self.txn_id = f"{spec.app_name}.backfill.{spec.job}.{spec.key_group}"
        conf = producer_config(settings, spec.app_name, self.txn_id)
        conf["client.id"] = f"{spec.app_name}-backfill-{spec.key_group}"
        self.producer = Producer(conf)
        self._progress_key = f"{spec.job}/{spec.key_group}".encode()
        self._open = False
        self._pending = 0
        self._timeout_s = max(30.0, settings.transaction_timeout_ms / 1000)
        # Fences earlier attempts of this task and aborts their open transaction.
        self.producer.init_transactions(self._timeout_s * 2)

    def committed_steps(self) -> tuple[int, list[int]]:
        """Read the progress this task's earlier attempts committed (after fencing them).

        Reads partition ``key group`` of the progress topic up to its high watermark as
        it was after ``init_transactions``: a read_committed consumer's end is the last
        stable offset, which an open transaction of another job of the same app could
        hold below this task's last commit; waiting for that transaction to end (at most
        its timeout) is what makes the last commit visible.

        Returns:
            (steps committed, steps dead-lettered in them).
        """
        g = self.spec.key_group
        tp = TopicPartition(self.spec.progress_topic, g)
        probe_conf = restore_consumer_config(self.settings, self.spec.app_name)
        probe_conf["isolation.level"] = "read_uncommitted"
        probe = Consumer(probe_conf)
        try:
            low, high = probe.get_watermark_offsets(tp, timeout=30, cached=False)
        finally:
            probe.close()
        if high <= low:
            return 0, []
        conf = restore_consumer_config(self.settings, self.spec.app_name)
        conf["client.id"] = f"{self.spec.app_name}-backfill-progress"
        consumer = Consumer(conf)
        steps, skipped = 0, list[int]()
        deadline = time.monotonic() + 2 * self._timeout_s + 60
        try:
            consumer.assign([TopicPartition(self.spec.progress_topic, g, low)])
            while True:
                if time.monotonic() > deadline:
                    raise TimeoutError(
                        f"progress of key group {g} in {self.spec.progress_topic} did not "
                        f"reach offset {high} (a transaction stays open?)"
                    )
                msg = consumer.poll(1.0)
                if msg is None:
                    continue
                err = msg.error()
                if err is not None:
                    if err.code() == KafkaError._PARTITION_EOF:  # noqa: SLF001 - public code
                        if (msg.offset() or 0) >= high:
                            return steps, skipped
                        continue  # held at the last stable offset: wait
                    raise KafkaException(err)
                raw = msg.value()
                if msg.key() == self._progress_key and raw:
                    progress = orjson.loads(raw)
                    steps = int(progress["steps"])
                    skipped = [int(i) for i in progress.get("skipped", ())]
                if (msg.offset() or 0) >= high - 1:
                    return steps, skipped
        finally:
            consumer.close()

    def begin(self) -> None:
        """Begin a transaction (once per chunk)."""
        if not self._open:
            self.producer.begin_transaction()
            self._open = True

    def put(
        self,
        topic: str,
        key: bytes | None,
        value: bytes | None,
        headers: list[tuple[str, bytes | str]] | None,
        timestamp: int | None,
    ) -> None:
        """Produce one record into the open transaction (waits while the queue is full)."""
        kw: dict[str, Any] = {}
        if headers:
            kw["headers"] = headers
        if timestamp is not None:
            kw["timestamp"] = timestamp
        self._send(topic, key, value, kw)

    def put_plain(self, topic: str, key: bytes | None, value: bytes | None) -> None:
        """Produce one record without headers or timestamp into the open transaction."""
        self._send(topic, key, value, _NO_KW)

    def _send(self, topic: str, key: bytes | None, value: bytes | None, kw: dict[str, Any]) -> None:
        if not self._open:
            self.begin()
        deadline = 0.0
        while True:
            try:
                self.producer.produce(topic, value, key, **kw)
                break
            except BufferError:
                # Queue full: let deliveries drain, bounded by the transaction timeout.
                now = time.monotonic()
                deadline = deadline or now + self._timeout_s
                if now > deadline:
                    raise SinkFailed(
                        f"the producer queue stayed full for {self._timeout_s:.0f}s"
                    ) from None
                self.producer.poll(0.05)
        self._pending += 1

    def commit(self, steps: int, done: bool, skipped: list[int] | None = None) -> None:
        """Commit the open transaction together with the progress record."""
        self.begin()
        progress = orjson.dumps({"steps": steps, "done": done, "skipped": skipped or []})
        # Partition = key group: only this task's transactions hold back its stable offset.
        self.producer.produce(
            self.spec.progress_topic, progress, self._progress_key, partition=self.spec.key_group
        )
        self.producer.commit_transaction(self._timeout_s)
        self._open = False
        self.produced += self._pending
        self._pending = 0

    def abort(self) -> None:
        """Abort the open transaction (outputs since the last commit vanish)."""
        if self._open and self._pending:
            # librdkafka counts a partition as part of the transaction once its
            # AddPartitionsToTxn is *sent* and may send the abort's EndTxn before the
            # coordinator processed it; the coordinator then rejects EndTxn on an Empty
            # transaction with a fatal INVALID_TXN_STATE (librdkafka#4849). A delivered
            # record proves its partition was added: wait for the deliveries first.
            self.producer.flush(self._timeout_s)
        self._pending = 0
        if self._open:
            self.producer.abort_transaction(self._timeout_s)
            self._open = False

    def close(self, ok: bool) -> None:
        """Abort what is open and flush."""
        with contextlib.suppress(KafkaException):
            self.abort()
        self.producer.flush(10)


class ParquetSink(TaskSink):
    """Outputs of one key group into ``<dir>/key_group=<g>/part-0.parquet``.

    Columns: ``topic`` (string), ``key``, ``value`` (binary), ``timestamp`` (int64,
    null when the emit set none), ``headers`` (list of (key, value) structs) and
    ``seq`` (the output's position in the key group's output, from 0).
    """

    _BATCH = 10_000

    def __init__(self, spec: TaskSpec) -> None:
        import pyarrow as pa
        import pyarrow.parquet as pq

        assert spec.output_dir is not None
        self._pa, self._pq = pa, pq
        self.final = Path(spec.output_dir) / f"key_group={spec.key_group}" / "part-0.parquet"
        self.final.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=".part-", suffix=".tmp", dir=self.final.parent)
        os.close(fd)
        self.tmp = Path(tmp)
        header = pa.struct([("key", pa.string()), ("value", pa.binary())])
        self.schema = pa.schema(
            [
                ("topic", pa.string()),
                ("key", pa.binary()),
                ("value", pa.binary()),
                ("timestamp", pa.int64()),
                ("headers", pa.list_(header)),
                ("seq", pa.int64()),
            ]
        )
        self.writer = pq.ParquetWriter(str(self.tmp), self.schema)
        self._open: list[tuple[Any, ...]] = []
        self._ready: list[tuple[Any, ...]] = []

    def put(
        self,
        topic: str,
        key: bytes | None,
        value: bytes | None,
        headers: list[tuple[str, bytes | str]] | None,
        timestamp: int | None,
    ) -> None:
        """Buffer one record in the open unit."""
        hs = None
        if headers:
            hs = [{"key": k, "value": v.encode() if isinstance(v, str) else v} for k, v in headers]
        self._open.append((topic, key, value, timestamp, hs))

    def commit(self, steps: int, done: bool, skipped: list[int] | None = None) -> None:
        """Move the open unit to the file."""
        self._ready.extend(self._open)
        self._open.clear()
        if len(self._ready) >= self._BATCH or done:
            self._flush()

    def _flush(self) -> None:
        if not self._ready:
            return
        start = self.produced
        cols = list(zip(*self._ready, strict=True))
        table = self._pa.Table.from_arrays(
            [
                self._pa.array(cols[0], self._pa.string()),
                self._pa.array(cols[1], self._pa.binary()),
                self._pa.array(cols[2], self._pa.binary()),
                self._pa.array(cols[3], self._pa.int64()),
                self._pa.array(cols[4], self.schema.field("headers").type),
                self._pa.array(range(start, start + len(self._ready)), self._pa.int64()),
            ],
            schema=self.schema,
        )
        self.writer.write_table(table)
        self.produced += len(self._ready)
        self._ready.clear()

    def abort(self) -> None:
        """Drop the open unit."""
        self._open.clear()

    def close(self, ok: bool) -> None:
        """Close the file; move it into place when the task finished."""
        self.writer.close()
        if ok:
            os.replace(self.tmp, self.final)
        else:
            self.tmp.unlink(missing_ok=True)
