"""TransactionalProducer.send_offsets: only an explicit success counts (no broker here).

The watchdog thread's outcome is handed to the caller; a failure that happens while the
thread handles a Kafka error must not read as success (the commit would go ahead without
the offsets). The component's behaviour against a real broker is covered by the chaos
tests; this pins the thread's contract with a stand-in producer.
"""

from __future__ import annotations

from typing import Any

import pytest
from confluent_kafka import KafkaError, KafkaException

from processors._checkpoint import txn as txn_module
from processors._checkpoint.txn import TransactionalProducer
from processors._kafka.errors import cause_code


class _Producer:
    def __init__(self, outcome: BaseException | None) -> None:
        self.outcome = outcome
        self.calls = 0

    def send_offsets_to_transaction(self, offsets: Any, metadata: Any, timeout: float) -> None:
        self.calls += 1
        if self.outcome is not None:
            raise self.outcome


def _component(producer: _Producer) -> TransactionalProducer:
    txn = TransactionalProducer({}, timeout_s=2.0)
    txn.producer = producer
    txn.is_open = True
    return txn


def test_success_is_returned_once() -> None:
    producer = _Producer(None)
    _component(producer).send_offsets([], object())
    assert producer.calls == 1


def test_a_definite_kafka_error_is_raised_with_its_cause() -> None:
    """The caller tells a fence on the transaction timeout from one by another instance by
    the error code of the exception's cause (a slow record is dead-lettered on the first,
    the instance stops on the second)."""
    err = KafkaError(KafkaError._FENCED, "fenced", fatal=True)  # noqa: SLF001
    txn = _component(_Producer(KafkaException(err)))
    txn.began_at -= 10  # older than the transaction timeout: the coordinator's abort
    with pytest.raises(Exception, match="send_offsets_to_transaction") as raised:
        txn.send_offsets([], object())
    assert cause_code(raised.value) == KafkaError._FENCED  # noqa: SLF001
    assert txn.timed_out_fence(raised.value) and not txn.fenced_by_other(raised.value)


def test_a_failure_while_handling_a_kafka_error_is_not_success(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def broken(*_: Any) -> KafkaError:
        raise RuntimeError("the handler itself failed")

    monkeypatch.setattr(txn_module, "_error_of", broken)
    err = KafkaError(KafkaError._TIMED_OUT, "slow", retriable=True)  # noqa: SLF001
    with pytest.raises(RuntimeError, match="the handler itself failed"):
        _component(_Producer(KafkaException(err))).send_offsets([], object())
