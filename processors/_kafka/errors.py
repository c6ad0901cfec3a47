"""Kafka error classification, and bounded calls that apply it.

librdkafka marks errors with flags (``fatal()``, ``txn_requires_abort()``,
``retriable()``), but the flags are not enough on their own: delivery reports carry
``retriable() == False`` even for transient causes, and admin/metadata calls return
leader-epoch or coordinator-load errors after a broker restart without the flag. The
:func:`classify` function decides by flag first, then by error code.

Classes (what the runtime does):

* :attr:`Kind.RETRY` — transient (leader change, coordinator loading, transport,
  timeouts): call again with backoff, up to a deadline;
* :attr:`Kind.ABORT` — the open transaction must be aborted and the epoch replayed;
* :attr:`Kind.RECORD` — this record can never be delivered as it is (too large,
  invalid): attributed to the input record that produced it (dead-letter or stop);
* :attr:`Kind.FATAL` — fenced, unauthorized, or unknown: the instance stops (exit 1).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from enum import Enum
from typing import Any, TypeVar

from confluent_kafka import KafkaError, KafkaException

from processors.exceptions import FatalKafkaError

log = logging.getLogger("lockgate.kafka")

T = TypeVar("T")


class Kind(Enum):
    """What to do about a Kafka error."""

    RETRY = "retry"
    ABORT = "abort"
    RECORD = "record"
    FATAL = "fatal"


#: Transient whatever the flags say: leader moves, coordinator (re)loads, lost
#: connections and timeouts (a broker restart produces all of these).
RETRIABLE_CODES = frozenset(
    {
        KafkaError.FENCED_LEADER_EPOCH,
        KafkaError.UNKNOWN_LEADER_EPOCH,
        KafkaError.LEADER_NOT_AVAILABLE,
        KafkaError.NOT_LEADER_FOR_PARTITION,
        KafkaError.COORDINATOR_LOAD_IN_PROGRESS,
        KafkaError.COORDINATOR_NOT_AVAILABLE,
        KafkaError.NOT_COORDINATOR,
        KafkaError.CONCURRENT_TRANSACTIONS,
        KafkaError.REQUEST_TIMED_OUT,
        KafkaError.NETWORK_EXCEPTION,
        KafkaError.NOT_ENOUGH_REPLICAS,
        KafkaError.NOT_ENOUGH_REPLICAS_AFTER_APPEND,
        KafkaError.KAFKA_STORAGE_ERROR,
        KafkaError.REBALANCE_IN_PROGRESS,
        KafkaError.OFFSET_NOT_AVAILABLE,
        KafkaError._TRANSPORT,  # noqa: SLF001 - public librdkafka codes, underscored names
        KafkaError._TIMED_OUT,  # noqa: SLF001
        KafkaError._ALL_BROKERS_DOWN,  # noqa: SLF001
        KafkaError._WAIT_COORD,  # noqa: SLF001
        KafkaError._RESOLVE,  # noqa: SLF001
        KafkaError._OUTDATED,  # noqa: SLF001
        KafkaError._WAIT_CACHE,  # noqa: SLF001
        KafkaError._PREV_IN_PROGRESS,  # noqa: SLF001
    }
)

#: The record itself cannot be written, however often it is retried.
RECORD_CODES = frozenset(
    {
        KafkaError.MSG_SIZE_TOO_LARGE,
        KafkaError.RECORD_LIST_TOO_LARGE,
        KafkaError.INVALID_RECORD,
        KafkaError.INVALID_MSG,
        KafkaError.INVALID_MSG_SIZE,
    }
)

#: Delivery of a record failed for a reason of the record or its topic: replaying the
#: epoch fails the same way. Every other failed delivery (timeouts, leader moves, and the
#: transaction-level errors of an aborted or fenced transaction such as
#: INVALID_PRODUCER_EPOCH) may succeed on the replay; consecutive aborts are bounded.
_PERMANENT_DELIVERY = RECORD_CODES | {KafkaError.TOPIC_AUTHORIZATION_FAILED}


def classify(err: KafkaError) -> Kind:
    """Return what to do about ``err`` (flags first, then the error code)."""
    if err.fatal():
        return Kind.FATAL
    code = err.code()
    if code in RECORD_CODES:
        return Kind.RECORD
    if err.txn_requires_abort():
        return Kind.ABORT
    if err.retriable() or code in RETRIABLE_CODES:
        return Kind.RETRY
    return Kind.FATAL


def delivery_is_transient(err: KafkaError) -> bool:
    """Whether a failed delivery report may succeed when the epoch is replayed.

    Delivery reports say ``retriable() == False`` even for timeouts and leader
    changes (librdkafka already retried them), so this decides by code: only a record
    the broker can never accept (size, validity) or a topic it may not write is
    permanent.
    """
    return err.code() not in _PERMANENT_DELIVERY


def cause_code(exc: BaseException) -> int | None:
    """Return the Kafka error code behind ``exc`` (its ``KafkaException`` cause), if any."""
    seen: BaseException | None = exc
    while seen is not None:
        if isinstance(seen, KafkaException) and isinstance(seen.args[0], KafkaError):
            return int(seen.args[0].code())
        seen = seen.__cause__
    return None


#: How librdkafka reports that the coordinator bumped our producer epoch (a fence).
FENCED = KafkaError._FENCED  # noqa: SLF001 - public code, underscored name
#: What produce() answers once the producer is in a fatal state (e.g. after that fence).
FATAL_STATE = KafkaError._FATAL  # noqa: SLF001


def describe(err: KafkaError) -> str:
    """Return ``NAME: text`` of a Kafka error."""
    return f"{err.name()}: {err.str()}"


class AbortEpoch(Exception):  # noqa: N818 - control flow, not an error for users
    """The open transaction must be aborted and the inputs rewound (an abortable error)."""


class CallHung(Exception):  # noqa: N818 - control flow
    """A client call did not return within its bound although it was given a timeout.

    librdkafka's ``send_offsets_to_transaction`` can block past its timeout (its
    coordinator-request timeout is never checked, and a cached coordinator that was
    decommissioned after a broker restart is never retried: librdkafka issues #5456 and
    #5511). The caller must abandon the client.
    """


class Stopping(Exception):  # noqa: N818 - control flow
    """A stop was requested while waiting in a bounded call: give up the wait."""


def kafka_call(
    fn: Callable[..., T],
    *args: Any,
    what: str,
    timeout_s: float = 60.0,
    should_stop: Callable[[], bool] | None = None,
    on_wait: Callable[[], None] | None = None,
) -> T:
    """Call a Kafka client API, retrying transient errors until ``timeout_s`` passes.

    Args:
        fn: the client call. When its last positional argument is a number (not a
            bool), it is the call's timeout: each attempt gets no more than the time left
            until ``timeout_s`` (at least 0.1 s).
        *args: positional arguments of ``fn``.
        what: the call's name for logs and errors.
        timeout_s: give up after this long (transient errors included).
        should_stop: checked between attempts; when true, :class:`Stopping` is raised.
        on_wait: called between attempts (e.g. to record liveness).

    Returns:
        What ``fn`` returned.

    Raises:
        AbortEpoch: the error requires aborting the open transaction, or transient errors
            lasted past ``timeout_s`` (the transaction cannot be completed in time).
        FatalKafkaError: fatal (e.g. fenced) or unclassified errors.
        Stopping: ``should_stop()`` became true while retrying.
    """
    deadline = time.monotonic() + timeout_s
    delay = 0.05
    attempt = 0
    last = args[-1] if args else None
    timed = isinstance(last, (int, float)) and not isinstance(last, bool)
    while True:
        attempt += 1
        if timed:
            left = max(0.1, deadline - time.monotonic())
            args = (*args[:-1], min(last, left))  # type: ignore[type-var]
        try:
            return fn(*args)
        except KafkaException as exc:
            err = exc.args[0]
            if not isinstance(err, KafkaError):
                raise FatalKafkaError(f"{what}: {exc}") from exc
            kind = classify(err)
            if kind is Kind.FATAL or kind is Kind.RECORD:
                raise FatalKafkaError(f"{what}: {describe(err)}") from exc
            if kind is Kind.ABORT:
                raise AbortEpoch(f"{what}: {describe(err)}") from exc
            if time.monotonic() + delay > deadline:
                raise AbortEpoch(
                    f"{what}: still failing after {timeout_s:.0f}s ({describe(err)})"
                ) from exc
            log.warning("retrying", extra={"call": what, "error": err.name(), "attempt": attempt})
            if should_stop is not None and should_stop():
                raise Stopping(what) from exc
            if on_wait is not None:
                on_wait()
            time.sleep(delay)
            delay = min(delay * 2, 1.0)
