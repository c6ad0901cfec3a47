"""The transactional producer: one ``transactional.id`` and librdkafka's call contract.

librdkafka 2.16's transactional API (``rdkafka.h``, ``rdkafka_txnmgr.c``) has three
**resumable** calls: ``init_transactions``, ``commit_transaction`` and
``abort_transaction``. When one returns a retriable error (a timeout: "retry call to
resume") the call is still in progress inside the client; calling the *same* API again
resumes it and reports its real outcome, and every other transactional call meanwhile
fails with ``_CONFLICT``. ``send_offsets_to_transaction`` is retriable but not resumable,
and can wait past its timeout (librdkafka #5456, #5511).

:class:`TransactionalProducer` owns that state machine, so nobody else has to guess it
from error texts:

- ``pending`` names the resumable call in progress (or ``None``); whether a transaction
  ``is_open``; when it began (the coordinator aborts it ``transaction.timeout.ms`` later);
- every wait is cut into slices of at most :data:`SLICE_S`, so a stop request (SIGTERM)
  is seen within a slice, and every retry gets only the time left before its deadline;
- :meth:`commit` ends in exactly one of: committed (returns), definitely not committed
  (:class:`~processors._kafka.errors.AbortEpoch` or a fatal error), or
  :class:`CommitOutcomeUnknown` — the request may have reached the coordinator and no
  answer came in time. The caller must then :meth:`replace` the producer (the new one's
  ``init_transactions`` completes or aborts the old transaction on the coordinator) and
  read the group's committed offsets to learn which it was (KIP-447 stable offsets);
- a producer with a call pending is never used again (no abort on it): it is abandoned,
  never destroyed (librdkafka may wait in, or abort on, the destruction of a handle with
  a call in progress), and the process exits without destructors (``Runner.run``).
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from confluent_kafka import KafkaError, KafkaException, Producer, TopicPartition

from processors._kafka.errors import (
    FATAL_STATE,
    FENCED,
    AbortEpoch,
    CallHung,
    Kind,
    Stopping,
    cause_code,
    classify,
    describe,
)
from processors._kafka.faults import late_commit, unsent_commit
from processors.exceptions import FatalKafkaError

log = logging.getLogger("lockgate.runtime")

#: The longest single blocking client call: a stop request is seen within this.
SLICE_S = 1.0
#: How long past its deadline a call that may ignore its timeout (send_offsets) may run
#: before its producer is abandoned.
WATCHDOG_MARGIN_S = 10.0


#: Replaced producers are kept, never destroyed: past this many, the process restarts.
MAX_ABANDONED = 32
#: The consumer's close on the way out (then it is abandoned: ``Runner._close``).
CONSUMER_CLOSE_S = 10.0
#: The producer's final flush on the way out.
PRODUCER_FLUSH_S = 10.0
#: Leaving the group on a scale-down (the StatefulSet read, 3 s, and the revoke, 10 s).
LEAVE_GROUP_S = 13.0


def stop_budget_s(transaction_timeout_s: float, leave_group: bool) -> float:
    """The longest a stop takes, from SIGTERM to the process's exit, in seconds.

    The parts, in order (docs/operations.md, "Stopping"):

    1. the batch in progress: records stop being processed when the epoch budget, half
       the transaction timeout, is spent (one record slower than that is the app's own),
       or the epoch commit running when the stop came (its own deadline);
    2. the final transactional work -- produce, ``send_offsets_to_transaction``, the
       commit, and, for a commit that gets no answer, the replacement producer's
       ``init_transactions`` and the committed-offsets read (or an abort). Parts 1 and 2
       end together by one deadline, 1.5 x the transaction timeout plus
       :data:`WATCHDOG_MARGIN_S` after the stop request
       (``TransactionalProducer.stop_by``). What is unfinished then is left to the
       coordinator and the next owner: exact either way;
    3. leaving the group on a scale-down (:data:`LEAVE_GROUP_S`, when enabled);
    4. the consumer's close (:data:`CONSUMER_CLOSE_S`) and the producer's flush
       (:data:`PRODUCER_FLUSH_S`).
    """
    leave = LEAVE_GROUP_S if leave_group else 0.0
    return (
        transaction_timeout_s / 2
        + transaction_timeout_s
        + WATCHDOG_MARGIN_S
        + leave
        + CONSUMER_CLOSE_S
        + PRODUCER_FLUSH_S
    )


class CommitOutcomeUnknown(Exception):  # noqa: N818 - an outcome, not an error for users
    """``commit_transaction`` was sent, and no definite answer came before the deadline.

    The transaction may have committed on the coordinator. Never process the epoch
    again on this alone: replace the producer and read the committed offsets.
    """


_Blocked = Callable[[str, float], contextlib.AbstractContextManager[Any]]


class TransactionalProducer:
    """One transactional producer at a time, replaced when it cannot go on.

    Args:
        config: the producer configuration (``transactional.id`` included).
        timeout_s: the budget of one transactional call (the transaction timeout).
        should_stop: polled between slices; true means "give up waiting"
            (:class:`~processors._kafka.errors.Stopping`). Default: never.
        beat: called between slices (liveness). Default: nothing.
        blocked: ``blocked(what, bound)`` context manager shown on /livez while a call
            waits (a wait is not a stall until its bound). Default: shows nothing.
    """

    def __init__(
        self,
        config: dict[str, Any],
        *,
        timeout_s: float,
        should_stop: Callable[[], bool] = lambda: False,
        beat: Callable[[], None] = lambda: None,
        blocked: _Blocked | None = None,
    ) -> None:
        self._config = config
        self.timeout_s = timeout_s
        self._should_stop = should_stop
        self._beat = beat
        self._blocked: _Blocked = blocked or _not_shown
        self.producer: Any = None
        #: The resumable call in progress on ``producer`` (its name), if any.
        self.pending: str | None = None
        self.is_open = False
        #: When the open transaction (or the idle time before it) began.
        self.began_at = time.monotonic()
        #: Producers abandoned with a call pending or hung (referenced, never destroyed).
        self.abandoned: list[Any] = []
        #: Producers created so far (1 after start).
        self.generation = 0
        #: Once set (``time.monotonic()``), no wait of this component lasts past it: the
        #: stop sequence's share of the stop budget (a commit still unanswered then has an
        #: unknown outcome; a replacement not initialised then raises ``Stopping``).
        self.stop_by: float | None = None

    def stop_within_budget(self, stop_requested_at: float) -> None:
        """Make every wait end by the stop budget's transactional deadline.

        That is 1.5 x the transaction timeout plus :data:`WATCHDOG_MARGIN_S` after the
        stop request (parts 1 and 2 of :func:`stop_budget_s`).
        """
        self.stop_by = stop_requested_at + 1.5 * self.timeout_s + WATCHDOG_MARGIN_S

    def _cap(self, deadline: float) -> float:
        return deadline if self.stop_by is None else min(deadline, self.stop_by)

    # -- life cycle -------------------------------------------------------------------

    def start(self, deadline: float | None = None) -> None:
        """Create the producer and complete ``init_transactions`` (fences older ones).

        Resumes the call until it completes: the producer is never used before (e.g.
        while the broker is unreachable).

        Args:
            deadline: give up at this ``time.monotonic()`` (default: wait until done or
                a stop request).

        Raises:
            Stopping: a stop was requested, or ``deadline`` passed, while waiting.
            FatalKafkaError: fenced or misconfigured.
        """
        self.producer = Producer(self._config)
        self.generation += 1
        self.pending = None
        self.is_open = False
        attempt = 0
        while True:
            attempt += 1
            if self.stop_by is not None:
                deadline = self.stop_by if deadline is None else min(deadline, self.stop_by)
            until = time.monotonic() + self.timeout_s
            if deadline is not None:
                until = min(until, deadline)
            try:
                self._resume("init_transactions", self.producer.init_transactions, until)
                break
            except _Unfinished as exc:
                log.warning(
                    "init_transactions not complete yet; resuming it",
                    extra={"attempt": attempt, "error": str(exc)},
                )
                if self._should_stop() or (deadline is not None and time.monotonic() >= deadline):
                    raise Stopping("init_transactions") from None
        self.began_at = time.monotonic()

    def replace(self, why: str, deadline: float | None = None) -> None:
        """Abandon the producer and start a new one with the same ``transactional.id``.

        The new producer's ``init_transactions`` fences the old one and ends its
        transaction on the coordinator: a transaction whose commit reached it is
        completed as committed, any other is aborted.
        """
        log.warning("replacing the transactional producer: %s", why)
        old = self.producer
        if old is not None and self.pending is None:
            with contextlib.suppress(Exception):
                old.flush(0)  # serve the delivery reports it holds (no wait)
        if old is not None and old not in self.abandoned:
            self.abandoned.append(old)
        if len(self.abandoned) > MAX_ABANDONED:
            raise FatalKafkaError(
                f"{len(self.abandoned)} transactional producers replaced in this process "
                f"(last: {why}); restarting to release them"
            )
        self.start(deadline)

    def begin(self) -> None:
        """Begin a transaction unless one is open."""
        if self.is_open:
            return
        assert self.pending is None, f"begin while {self.pending} is pending"
        self.producer.begin_transaction()
        self.is_open = True
        self.began_at = time.monotonic()

    def idle(self) -> None:
        """Nothing is open and nothing was produced: restart the transaction's clock."""
        self.began_at = time.monotonic()

    # -- ending a transaction -----------------------------------------------------------

    def send_offsets(self, offsets: list[TopicPartition], group_metadata: Any) -> None:
        """Add the consumed offsets to the open transaction.

        Run in a helper thread: librdkafka may wait past the timeout given (#5456,
        #5511). Retriable errors are retried with the same offsets until the deadline.

        Raises:
            CallHung: the call did not return in time; the producer was abandoned and
                replaced (the transaction is aborted by the new one).
            AbortEpoch: the transaction must be aborted (nothing committed).
            FatalKafkaError: fenced or fatal.
            Stopping: a stop was requested while retrying.
        """
        what = "send_offsets_to_transaction"
        deadline = self._cap(time.monotonic() + self.timeout_s)
        assert self.pending is None, f"send_offsets while {self.pending} is pending"
        result: dict[str, BaseException | bool] = {}
        producer = self.producer

        def attempt() -> None:
            try:
                result["ok"] = attempts()
            except BaseException as exc:  # noqa: BLE001 - handed to the caller: never lost
                result["error"] = exc

        def attempts() -> bool:
            delay = 0.05
            while True:
                left = deadline - time.monotonic()
                try:
                    producer.send_offsets_to_transaction(offsets, group_metadata, max(left, 0.1))
                    return True
                except KafkaException as exc:
                    err = _error_of(exc, what)
                    kind = classify(err)
                    if kind is not Kind.RETRY:
                        raise _definite(err, what, exc) from exc  # its cause: the error code
                    if time.monotonic() + delay > deadline:
                        raise AbortEpoch(
                            f"{what}: still failing after {self.timeout_s:.0f}s ({describe(err)})"
                        ) from None
                    if self._should_stop():
                        raise Stopping(what) from None
                    time.sleep(delay)
                    delay = min(delay * 2, 1.0)

        bound = self.timeout_s + WATCHDOG_MARGIN_S
        if self.stop_by is not None:
            bound = max(0.5, min(bound, self.stop_by - time.monotonic()))
        worker = threading.Thread(target=attempt, name=f"lockgate-{what}", daemon=True)
        with self._blocked(what, bound + 5):
            worker.start()
            worker.join(bound)
        if worker.is_alive():
            self.abandoned.append(producer)  # never touched again
            self.producer = None
            self.is_open = False
            self.replace(f"{what} did not return within {bound:.0f}s")
            raise CallHung(f"{what} did not return within {bound:.0f}s")
        error = result.get("error")
        if isinstance(error, BaseException):
            raise error
        if result.get("ok") is not True:  # only an explicit success counts
            raise AbortEpoch(f"{what}: the call ended without a result")

    def commit(self, final: bool = False) -> None:
        """Commit the open transaction, resuming the call until it has an outcome.

        A stop request does not cut the wait (the deadline does: the transaction timeout,
        or ``stop_by``). Only success is taken as an outcome: librdkafka reports an
        abortable error when EndTxn(commit) failed *locally*, although it may have
        succeeded on the coordinator (``rd_kafka_txn_handle_EndTxn``), and a fence of a
        transaction older than its timeout does not say which came first.

        Args:
            final: the final commit after a stop request (for fault injection only).

        Raises:
            CommitOutcomeUnknown: no success within the deadline, or any failure but a
                fence by another live instance: learn the outcome from the broker (its
                ``__cause__`` is the last error, if any).
            FatalKafkaError: another live instance with our transactional id fenced
                this one (never re-initialise then).
        """
        assert self.pending is None, f"commit while {self.pending} is pending"
        deadline = self._cap(time.monotonic() + self.timeout_s)
        call = late_commit(unsent_commit(self.producer.commit_transaction), final)
        try:
            self._resume("commit_transaction", call, deadline, honour_stop=False)
        except _Unfinished as exc:
            raise CommitOutcomeUnknown(str(exc)) from None
        except AbortEpoch as exc:
            raise CommitOutcomeUnknown(
                f"{exc} (the commit may have reached the coordinator)"
            ) from exc
        except FatalKafkaError as exc:
            if self.fenced_by_other(exc):
                raise
            raise CommitOutcomeUnknown(
                f"{exc} (the commit may have reached the coordinator)"
            ) from exc
        self.is_open = False

    def abort(self, deadline: float | None = None) -> bool:
        """Abort the open transaction; replace the producer when it cannot.

        A producer with a call pending (a commit without an answer), or whose abort
        cannot complete within the timeout, or that is in a state it cannot leave, is
        replaced: the new producer's ``init_transactions`` ends the transaction.

        Returns:
            True when the coordinator had already aborted the transaction on its timeout
            (a fence of a transaction older than the timeout).

        Args:
            deadline: no wait (the abort, a replacement's initialisation) lasts past
                this ``time.monotonic()`` (default: the transaction timeout, ``stop_by``).

        Raises:
            FatalKafkaError: another live instance fenced this one (not our own
                transaction timing out).
            Stopping: a stop was requested, or the deadline passed, while a replacement
                initialised.
        """
        if not self.is_open:
            return False
        if self.pending is not None:
            self.replace(f"{self.pending} is still pending: it cannot be aborted on", deadline)
            return False
        until = self._cap(time.monotonic() + self.timeout_s)
        if deadline is not None:
            until = min(until, deadline)
        try:
            self._resume("abort_transaction", self.producer.abort_transaction, until)
            self.producer.poll(0)  # serve the purge reports of the aborted records now
            self.is_open = False
        except _Unfinished as exc:
            self.replace(f"abort did not complete ({exc})", deadline)
        except AbortEpoch as exc:
            self.replace(f"abort failed ({exc})", deadline)
        except FatalKafkaError as exc:
            if self.fenced_by_other(exc):
                raise
            timed_out = self.timed_out_fence(exc)
            self.replace(f"abort failed ({exc})", deadline)
            return timed_out
        return False

    def fenced_by_other(self, exc: BaseException) -> bool:
        """Whether ``exc`` is a fence by another live instance with our transactional id.

        A fence (``_FENCED``/``_FATAL``) of a transaction younger than the transaction
        timeout cannot be the coordinator aborting ours on its timeout: someone else
        initialised our id. Never re-initialise then, or the two fence each other back
        and forth.
        """
        return (
            cause_code(exc) in (FENCED, FATAL_STATE)
            and time.monotonic() - self.began_at < self.timeout_s
        )

    def timed_out_fence(self, exc: BaseException) -> bool:
        """Whether ``exc`` is the coordinator aborting our transaction on its timeout."""
        return (
            cause_code(exc) in (FENCED, FATAL_STATE)
            and time.monotonic() - self.began_at >= self.timeout_s
        )

    # -- the resumable-call loop ----------------------------------------------------------

    def _resume(
        self, what: str, fn: Callable[[float], Any], deadline: float, honour_stop: bool = True
    ) -> None:
        """Call resumable ``fn`` in slices until it completes, fails definitely or times out.

        ``honour_stop``: a stop request ends the wait (else only the deadline does).

        Raises:
            _Unfinished: still retriable at ``deadline`` (or a stop request): ``what``
                stays pending.
            AbortEpoch: the transaction must be aborted (the call ended).
            FatalKafkaError: fatal or unclassified (the call ended).
        """
        self.pending = what
        last = "no answer yet"
        with self._blocked(what, deadline - time.monotonic() + WATCHDOG_MARGIN_S):
            while True:
                left = deadline - time.monotonic()
                try:
                    fn(min(SLICE_S, max(left, 0.05)))
                    self.pending = None
                    return
                except KafkaException as exc:
                    err = _error_of(exc, what)
                    if classify(err) is not Kind.RETRY:
                        self.pending = None
                        raise _definite(err, what, exc) from exc
                    last = describe(err)
                self._beat()
                if time.monotonic() >= deadline:
                    raise _Unfinished(f"{what}: no outcome within the deadline ({last})")
                if honour_stop and self._should_stop():
                    raise _Unfinished(f"{what}: stop requested while waiting ({last})")


_MAY_HAVE_COMMITTED = "the commit may have reached the coordinator"


class _Unfinished(Exception):  # noqa: N818 - internal control flow
    """A resumable call is still in progress (retriable) at its deadline."""


def _error_of(exc: KafkaException, what: str) -> KafkaError:
    err = exc.args[0] if exc.args else None
    if not isinstance(err, KafkaError):
        raise FatalKafkaError(f"{what}: {exc}") from exc
    return err


def _definite(err: KafkaError, what: str, exc: KafkaException) -> Exception:
    """The exception for a non-retriable error of a transactional call."""
    if classify(err) is Kind.ABORT:
        abort = AbortEpoch(f"{what}: {describe(err)}")
        abort.__cause__ = exc
        return abort
    fatal = FatalKafkaError(f"{what}: {describe(err)}")
    fatal.__cause__ = exc
    return fatal


def _not_shown(what: str, bound: float) -> contextlib.AbstractContextManager[Any]:
    """A ``blocked`` that shows nothing (tools without a health server)."""
    return contextlib.nullcontext()
