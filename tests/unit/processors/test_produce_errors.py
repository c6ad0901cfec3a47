"""How the runtime classifies producer refusals (real librdkafka producers, no broker).

A refusal that is not the record's fault (full queue, abortable transaction state) must
abort the epoch, never dead-letter the record; a record that can never be written is
attributed to the record (emit) or stops with its size named (runtime records).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from confluent_kafka import KafkaError, KafkaException, Producer

from processors import App
from processors._kafka.errors import AbortEpoch
from processors._runtime.output import OutputWriter, RecordRejected
from processors.exceptions import FatalKafkaError


@pytest.fixture
def writer() -> Iterator[OutputWriter]:
    app = App("produce-errors")

    @app.process("in", outputs=["out"])
    def handle(key: Any, value: Any, ctx: Any) -> None:  # pragma: no cover - not run
        ctx.emit("out", key, value)

    w = OutputWriter(app.name, app.outputs, queue_wait_s=1.0)
    yield w
    if w.producer is not None:
        w.producer.purge()
        w.producer.flush(0)


def _use(writer: OutputWriter, **conf: Any) -> None:
    writer.use(Producer({"bootstrap.servers": "127.0.0.1:1", "log_level": 0, **conf}))


def test_a_full_queue_during_emit_is_a_producer_error_not_the_records(writer: OutputWriter) -> None:
    _use(writer, **{"queue.buffering.max.messages": 1})
    writer.emit("out", "k", {"v": 1}, None)  # fills the queue (nothing can drain it)
    with pytest.raises(KafkaException) as info:
        writer.emit("out", "k", {"v": 2}, None)
    assert info.value.args[0].code() == KafkaError._QUEUE_FULL
    # The loop turns this into an epoch abort (not a dead letter): the bookkeeping is set.
    assert writer.producer_error is not None
    assert writer.record_error is None


def test_an_output_above_the_size_limit_is_the_records_fault(writer: OutputWriter) -> None:
    _use(writer, **{"message.max.bytes": 1000})
    with pytest.raises(RecordRejected, match="MSG_SIZE_TOO_LARGE"):
        writer.emit("out", "k", {"blob": "x" * 5000}, None)
    assert isinstance(writer.record_error, RecordRejected)
    assert writer.producer_error is None


def test_a_runtime_record_above_the_size_limit_stops_naming_its_size(writer: OutputWriter) -> None:
    _use(writer, **{"message.max.bytes": 1000})
    with pytest.raises(FatalKafkaError, match=r"cannot write a 5001-byte record to app\.s"):
        writer.produce("app.s.changelog", b"x" * 5000, b"k", partition=0)


def test_produce_outside_a_transaction_state_aborts_the_epoch(writer: OutputWriter) -> None:
    # A transactional producer refuses produce() with _STATE (no flags) when it is not in
    # a transaction: the runtime sees this when the transaction went abortable.
    _use(writer, **{"transactional.id": "produce-errors-test"})
    with pytest.raises(AbortEpoch, match="_STATE"):
        writer.produce("app.dlq", b"v", b"k")
