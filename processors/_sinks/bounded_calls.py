"""A sink's calls to its database or table, each on one worker thread and bounded in time.

A sink's work around an epoch (prepare, commit, settle, roll back) runs on the sink's one
worker thread, never on the processing loop, so a database that stops answering cannot
hold the loop past the epoch's transaction: the caller waits until the call's deadline
and then gives up (:class:`~processors._sinks.errors.SinkUnavailable`, an ``AbortEpoch``
where the epoch must replay).

Invariants this component owns:

* calls run one at a time, in the order they were made (one worker thread);
* a call that timed out is cancelled: still queued, it never runs; running, it stops at
  its next :meth:`BoundedCalls.live` check, made under the sink's lock before anything
  is changed, so a late call never prepares or commits after its caller gave up;
* the prepare call in flight is known (:attr:`BoundedCalls.prepare_job`) so that an
  aborted epoch cancels it.
"""

from __future__ import annotations

import concurrent.futures
import logging
import threading
import time
from collections.abc import Callable
from typing import Any, TypeVar

from processors._sinks.errors import SinkUnavailable

__all__ = ["BoundedCalls", "Cancelled", "Job"]

log = logging.getLogger("lockgate.sinks")

T = TypeVar("T")

#: A call with less time left than this is not started.
_MIN_LEFT_S = 0.1


class Cancelled(Exception):  # noqa: N818 - control flow on the worker thread
    """The call was cancelled (timed out, or its epoch aborted) or its deadline passed."""


class Job:
    """One bounded call on the worker thread: its absolute deadline and cancel flag.

    ``cancelled`` is set and read under the sink's lock.
    """

    __slots__ = ("cancelled", "deadline")

    def __init__(self, deadline: float) -> None:
        self.deadline = deadline
        self.cancelled = False

    def left(self) -> float:
        """Seconds to the deadline (negative once past)."""
        return self.deadline - time.monotonic()

    def check(self) -> None:
        """Raise :class:`Cancelled` when cancelled or past the deadline."""
        if self.cancelled or self.left() <= 0:
            raise Cancelled


class BoundedCalls:
    """The worker thread of one sink and its bounded calls (see the module docs).

    Args:
        kind: the sink's kind, for messages (``"postgres"``, ``"iceberg"``).
        name: the sink's name (its output name).
        lock: the sink's lock (guards the cancel flags and the sink's own lists).
        passthrough: exceptions a call raises as they are (besides
            :class:`SinkUnavailable`); any other failure becomes :class:`SinkUnavailable`.
        grace_s: how much longer than its deadline the caller waits (for a server-side
            timeout to answer first).
        on_worker_error: called on the worker thread when a call raised (e.g. close a
            session whose transaction the call had open).
        on_timeout: called by the caller after cancelling a call that timed out (e.g.
            unblock the worker stuck on a socket).
        on_error: called by the caller when a call failed with an error that becomes
            :class:`SinkUnavailable` (e.g. forget a cached table).
    """

    def __init__(
        self,
        kind: str,
        name: str,
        lock: threading.Lock,
        *,
        passthrough: tuple[type[BaseException], ...] = (),
        grace_s: float = 0.0,
        on_worker_error: Callable[[], None] | None = None,
        on_timeout: Callable[[], None] | None = None,
        on_error: Callable[[], None] | None = None,
    ) -> None:
        self._kind = kind
        self._label = f"{kind} sink {name!r}"
        self._name = name
        self._lock = lock
        self._passthrough: tuple[type[BaseException], ...] = (SinkUnavailable, *passthrough)
        self._grace_s = grace_s
        self._on_worker_error = on_worker_error
        self._on_timeout = on_timeout
        self._on_error = on_error
        self._worker = concurrent.futures.ThreadPoolExecutor(
            max_workers=1, thread_name_prefix=f"lockgate-sink-{name}"
        )
        #: The prepare call in flight (cancelled when its epoch aborts; under the lock).
        self.prepare_job: Job | None = None
        #: No call starts once the sink is closed.
        self.closed = False

    def live(self, job: Job) -> None:
        """Raise :class:`Cancelled` when ``job`` was cancelled or its deadline passed."""
        with self._lock:
            job.check()

    def cancel_prepare(self) -> None:
        """Cancel the prepare call in flight, if any (the caller holds the lock)."""
        if self.prepare_job is not None:
            self.prepare_job.cancelled = True

    def submit(self, fn: Callable[[], Any]) -> concurrent.futures.Future[Any]:
        """Queue ``fn`` on the worker thread, unbounded (warm-ups, the close)."""
        return self._worker.submit(fn)

    def shutdown(self) -> None:
        """Stop taking calls; what is queued still runs (the thread is a daemon's)."""
        self._worker.shutdown(wait=False)

    def call(
        self,
        fn: Callable[[Job], T],
        deadline: float,
        what: str,
        then: str = "",
        prepare: bool = False,
    ) -> T:
        """Run ``fn(job)`` on the worker thread, by ``deadline``.

        ``then`` ends the error's message (what happens next). A call that times out is
        cancelled (see the module docs).

        Raises:
            SinkUnavailable: closed, no time left, the deadline passed, or the call failed.
            Exception: one of ``passthrough``, as the call raised it.
        """
        left = deadline - time.monotonic()
        if self.closed or left < _MIN_LEFT_S:
            raise SinkUnavailable(
                f"{self._label}: no time left for the {what}{then}"
                + (" (closed)" if self.closed else "")
            )
        job = Job(deadline)
        if prepare:
            with self._lock:
                self.prepare_job = job

        def run() -> T:
            self.live(job)  # queued past its deadline, or cancelled: do nothing
            try:
                return fn(job)
            except BaseException:
                if self._on_worker_error is not None:
                    self._on_worker_error()
                raise

        future = self._worker.submit(run)
        try:
            return future.result(timeout=left + self._grace_s)
        except concurrent.futures.TimeoutError:
            with self._lock:
                job.cancelled = True
            future.cancel()  # still queued: it never runs
            if self._on_timeout is not None:
                self._on_timeout()
            raise SinkUnavailable(
                f"{self._label}: the {what} took longer than the {left:.1f}s it had{then}"
            ) from None
        except self._passthrough:
            raise
        except Cancelled:
            raise SinkUnavailable(f"{self._label}: the {what} ran out of time{then}") from None
        except Exception as exc:
            if self._on_error is not None:
                self._on_error()
            raise SinkUnavailable(
                f"{self._label}: the {what} failed "
                f"({type(exc).__name__}: {str(exc).strip()[:500]}){then}"
            ) from exc
        finally:
            if prepare:
                with self._lock:
                    if self.prepare_job is job and future.done():
                        self.prepare_job = None

    def try_call(self, fn: Callable[[Job], Any], deadline: float, what: str) -> None:
        """:meth:`call`, logging what stays pending instead of raising ``SinkUnavailable``.

        Raises:
            Exception: one of ``passthrough``.
        """
        try:
            self.call(fn, deadline, what)
        except SinkUnavailable as exc:
            log.warning(
                "%s sink: %s left pending (done before the next epoch commits)",
                self._kind,
                what,
                extra={"sink": self._name, "error": str(exc)},
            )
