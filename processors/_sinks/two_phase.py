"""The epoch bookkeeping every two-phase sink shares (Postgres, Iceberg).

A two-phase sink buffers the open epoch's rows per key group, *prepares* them before the
Kafka commit (a prepared transaction, a data file with its marker), and after the Kafka
outcome either *commits* what it prepared or *rolls it back*. A key group taken over is
*settled* by the token of its committed offsets. What differs between sinks is how a
prepare and the finishing of pending work talk to their store (:meth:`TwoPhaseSink._prepare`,
:meth:`TwoPhaseSink._finish`); what they share is here:

- ``_rows``: the open epoch's rows per key group;
- ``_prepared``: what the epoch being committed prepared;
- ``_to_commit``: prepared work whose epoch committed in Kafka, not finished yet;
- ``_to_rollback``: prepared work of aborted epochs, not rolled back yet;
- ``_settle``: key groups taken over, with their committed token, not settled yet.

Invariants this class owns:

- :meth:`TwoPhaseSink.prepare` returns only when ``_to_commit`` and ``_settle`` are empty
  (its subclass's ``_prepare`` finishes pending work first and raises when it cannot), so
  a Kafka commit never moves a key group's token past an unresolved epoch;
- rows of key groups not owned any more are dropped before a prepare (their new owner
  replays them), and so are their settles;
- an abort cancels the prepare in flight before it moves what was prepared to
  ``_to_rollback``, so a late prepare never leaves work nobody rolls back;
- the lists move under ``_lock`` (a worker call that outlived its deadline may still
  run), and every call to the store runs on ``_calls``' worker thread, bounded.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Mapping
from typing import Any, Generic, TypeVar

from processors._sinks.bounded_calls import BoundedCalls, Job

__all__ = ["TwoPhaseSink"]

log = logging.getLogger("lockgate.sinks")

#: What a key group's buffered rows are (a list, or a dict per key for upserts).
RowsT = TypeVar("RowsT")
#: One unit of prepared work (a prepared transaction's id, a data file).
PartT = TypeVar("PartT")


class TwoPhaseSink(Generic[RowsT, PartT]):
    """The shared protocol of a two-phase sink (see the module docs).

    Subclasses set :attr:`kind`, create ``self._calls`` (a :class:`BoundedCalls` on
    ``self._lock``) after calling ``__init__``, and implement :meth:`_prepare` and
    :meth:`_finish`.

    Args:
        name: the sink's name (its output name), for log lines.
    """

    #: The sink's kind, for log lines (``"postgres"``, ``"iceberg"``).
    kind = "sink"
    #: Exceptions that an abort or a close logs instead of raising (a commit of an
    #: earlier epoch that failed for good is reported by the next prepare or tidy).
    logged_at_abort: tuple[type[BaseException], ...] = ()

    def __init__(self, name: str) -> None:
        self._sink_name = name
        self._rows: dict[int, RowsT] = {}
        self._prepared: list[PartT] = []
        self._to_commit: list[PartT] = []
        self._to_rollback: list[PartT] = []
        self._settle: dict[int, str | None] = {}
        #: Guards the lists: a worker call that outlived its deadline may still run.
        self._lock = threading.Lock()
        self._calls: BoundedCalls

    # -- what a subclass implements -------------------------------------------------------

    def _prepare(self, token: str, rows: dict[int, RowsT], job: Job) -> None:
        """On the worker: finish pending work, then prepare ``rows`` under ``token``.

        Raises:
            Exception: anything; the epoch aborts (see :meth:`BoundedCalls.call`).
        """
        raise NotImplementedError

    def _finish(self, job: Job) -> Any:
        """On the worker: commit ``_to_commit``, roll back ``_to_rollback``, settle."""
        raise NotImplementedError

    def _forget_owned(self, owned: set[int]) -> None:
        """Drop per key group state of key groups not in ``owned`` (under the lock)."""

    def _settling(self, g: int) -> None:
        """Key group ``g`` is about to be settled (under the lock)."""

    def _left_at_stop(self) -> tuple[str, dict[str, Any]] | None:
        """What :meth:`close` could not finish: a log message and its extras, or None."""
        return None

    def _closing(self) -> None:
        """Called by :meth:`close` after the last bounded call (queue final work here)."""

    # -- the protocol -----------------------------------------------------------------------

    def has_prepared(self) -> bool:
        """Whether the epoch being committed prepared work here."""
        with self._lock:
            return bool(self._prepared)

    def has_pending(self) -> bool:
        """Whether settled work (commits, rollbacks, settles) waits for the store."""
        with self._lock:
            return bool(self._to_commit or self._to_rollback or self._settle)

    def prepare(self, token: str, owned: set[int], deadline: float) -> None:
        """Finish pending work, then prepare each owned key group's rows, by ``deadline``.

        Raises:
            SinkUnavailable: the store failed or was too slow: the epoch aborts and is
                replayed.
            Exception: one of the subclass's pass-through errors (see its docs).
        """
        for g in [g for g in self._rows if g not in owned]:
            del self._rows[g]  # revoked or lost: the new owner replays them
        self._forget_settles(owned)
        if not self._rows and not self.has_pending():
            return
        rows, self._rows = self._rows, {}
        self._calls.call(
            lambda job: self._prepare(token, rows, job),
            deadline,
            "prepare",
            "; the epoch is replayed",
            prepare=True,
        )

    def commit(self, deadline: float) -> None:
        """The epoch committed in Kafka: finish what it prepared (what fails stays pending).

        Raises:
            Exception: one of the subclass's pass-through errors (see its docs).
        """
        with self._lock:
            self._to_commit.extend(self._prepared)
            self._prepared.clear()
        if self.has_pending():
            self._calls.try_call(self._finish, deadline, "commit")

    def abort(self, deadline: float) -> None:
        """The epoch aborted: drop its rows, roll back what it prepared.

        A prepare still running on the worker (its call timed out) is cancelled first: it
        prepares nothing more, and what it prepared is rolled back. Errors in
        :attr:`logged_at_abort` are logged, not raised.
        """
        self._rows.clear()
        with self._lock:
            self._calls.cancel_prepare()
            self._to_rollback.extend(self._prepared)
            self._prepared.clear()
        if self.has_pending():
            try:
                self._calls.try_call(self._finish, deadline, "rollback")
            except self.logged_at_abort as exc:
                # Not this epoch's: a commit of an earlier one. Raised again by the next
                # prepare or tidy (the commit stays pending).
                log.error("%s sink: %s", self.kind, exc, extra={"sink": self._sink_name})

    def settle(self, tokens: Mapping[int, str | None], deadline: float) -> None:
        """Key groups were assigned with these committed tokens: settle them, bounded.

        What fails stays pending for :meth:`tidy` and :meth:`prepare`.
        """
        with self._lock:
            for g, token in tokens.items():
                self._rows.pop(g, None)  # anything buffered for them predates the assignment
                self._settle[g] = token
                self._settling(g)
        self._calls.try_call(self._finish, deadline, "settle")

    def tidy(self, owned: set[int], deadline: float) -> None:
        """Finish pending work, bounded.

        Args:
            owned: every key group this instance owns (settles of others are dropped).
            deadline: ``time.monotonic()`` by which to stop.
        """
        self._forget_settles(owned)
        if self.has_pending():
            self._calls.try_call(self._finish, deadline, "settle")

    def close(self, deadline: float) -> None:
        """A clean stop: finish pending commits by ``deadline``, then close.

        What is still pending then is logged: it stays prepared, and the next owner of
        its key groups finishes it (by the token in the committed offsets). Errors in
        :attr:`logged_at_abort` are logged, not raised.
        """
        if self._calls.closed:
            return
        if self.has_pending():
            try:
                self._calls.try_call(self._finish, deadline, "commit at stop")
            except self.logged_at_abort as exc:
                log.error("%s sink: %s", self.kind, exc, extra={"sink": self._sink_name})
        with self._lock:
            left = self._left_at_stop()
            self._calls.closed = True
            self._calls.cancel_prepare()
        if left is not None:
            message, extra = left
            log.error(message, extra={"sink": self._sink_name, **extra})
        self._closing()
        self._calls.shutdown()

    def _forget_settles(self, owned: set[int]) -> None:
        """Drop the settles of key groups not owned any more (their new owner settles)."""
        with self._lock:
            for g in [g for g in self._settle if g not in owned]:
                del self._settle[g]
            self._forget_owned(owned)
