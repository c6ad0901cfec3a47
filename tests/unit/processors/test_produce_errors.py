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
from processors._config.settings import load_settings
from processors._kafka.errors import AbortEpoch
from processors._runtime.core import RecordRejected
from processors._runtime.runner import Runner
from processors.exceptions import FatalKafkaError


@pytest.fixture
def runner(monkeypatch: pytest.MonkeyPatch, tmp_path: Any) -> Iterator[Runner]:
    monkeypatch.setenv("LOCKGATE_BOOTSTRAP_SERVERS", "127.0.0.1:1")
    monkeypatch.setenv("LOCKGATE_STATE_DIR", str(tmp_path))
    monkeypatch.setenv("LOCKGATE_CHECKPOINT_INTERVAL_MS", "500")
    monkeypatch.setenv("LOCKGATE_TRANSACTION_TIMEOUT_MS", "1000")
    app = App("produce-errors")

    @app.process("in", outputs=["out"])
    def handle(key: Any, value: Any, ctx: Any) -> None:  # pragma: no cover - not run
        ctx.emit("out", key, value)

    r = Runner(app, load_settings())
    yield r
    if r._producer is not None:
        r._producer.purge()
        r._producer.flush(0)


def _use(runner: Runner, **conf: Any) -> None:
    producer = Producer({"bootstrap.servers": "127.0.0.1:1", "log_level": 0, **conf})
    runner._producer = producer
    runner._produce_fast = producer.produce


def test_a_full_queue_during_emit_is_a_producer_error_not_the_records(runner: Runner) -> None:
    _use(runner, **{"queue.buffering.max.messages": 1})
    runner._emit("out", "k", {"v": 1}, None)  # fills the queue (nothing can drain it)
    with pytest.raises(KafkaException) as info:
        runner._emit("out", "k", {"v": 2}, None)
    assert info.value.args[0].code() == KafkaError._QUEUE_FULL
    # The loop turns this into an epoch abort (not a dead letter): the bookkeeping is set.
    assert runner._producer_error is not None
    assert runner._record_error is None


def test_an_output_above_the_size_limit_is_the_records_fault(runner: Runner) -> None:
    _use(runner, **{"message.max.bytes": 1000})
    with pytest.raises(RecordRejected, match="MSG_SIZE_TOO_LARGE"):
        runner._emit("out", "k", {"blob": "x" * 5000}, None)
    assert isinstance(runner._record_error, RecordRejected)
    assert runner._producer_error is None


def test_a_runtime_record_above_the_size_limit_stops_naming_its_size(runner: Runner) -> None:
    _use(runner, **{"message.max.bytes": 1000})
    with pytest.raises(FatalKafkaError, match=r"cannot write a 5001-byte record to app\.s"):
        runner._produce("app.s.changelog", b"x" * 5000, b"k", partition=0)


def test_produce_outside_a_transaction_state_aborts_the_epoch(runner: Runner) -> None:
    # A transactional producer refuses produce() with _STATE (no flags) when it is not in
    # a transaction: the runtime sees this when the transaction went abortable.
    _use(runner, **{"transactional.id": "produce-errors-test"})
    with pytest.raises(AbortEpoch, match="_STATE"):
        runner._produce("app.dlq", b"v", b"k")
