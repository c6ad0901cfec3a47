"""What one instance knows of savepoints before it takes them: requests, cancels, barriers.

A savepoint reaches an instance in one of two ways (docs/architecture.md, "Savepoints"):

* **as a request** (source key groups): ``lockgate savepoint trigger`` writes
  ``savepoint-request/<id>`` to partition 0 of ``<app>.control``; this component follows
  that partition (:meth:`SavepointRequests.open`, :meth:`SavepointRequests.poll`) and
  hands the runtime one request at a time (:attr:`SavepointRequests.current`);
* **in a barrier** (downstream key groups): a barrier names the savepoint, the apps it is
  for and whether it stops them; the runtime notes them here
  (:meth:`SavepointRequests.announced`) and asks for them when the barrier's checkpoint
  completes (:meth:`SavepointRequests.request_for`).

``savepoint-cancel/<id>`` records (and cancels noted in the registry at start) make an id
cancelled for the life of the process.

Invariants this component owns:

* one request is in progress at a time, and requests are taken in the order they were
  read; a request read twice (the start-up lookback) is queued once;
* a cancelled id is never taken: it is dropped from the queue and from
  :attr:`SavepointRequests.current`, and later requests and barriers for it are ignored;
* a key group takes a savepoint at most once in a process, at the first checkpoint id it
  was announced with (:meth:`SavepointRequests.take_once`).

What a cancel does to halted key groups (resume them, rewind the epoch) is the runtime's:
:meth:`SavepointRequests.poll` only reports the ids cancelled.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Callable, Iterable
from typing import Any

import orjson
from confluent_kafka import Consumer, TopicPartition

from processors._checkpoint.control_topics import (
    CANCEL_PREFIX,
    REQUEST_PARTITION,
    REQUEST_PREFIX,
)

__all__ = ["SavepointRequests"]

log = logging.getLogger("lockgate.savepoint")

#: How far back a starting instance looks for savepoint requests it may have missed.
REQUEST_LOOKBACK_MS = 60_000
#: The request partition is read at most this often (a poll is one non-blocking consume).
POLL_INTERVAL_S = 0.25


class SavepointRequests:
    """Savepoint requests, cancels and barrier announcements of one runtime instance.

    Created empty; :meth:`open` starts following the request partition (an instance that
    never opens it still takes savepoints announced by barriers).
    """

    def __init__(self) -> None:
        #: The request this instance's source key groups take at their next epoch end.
        self.current: dict[str, Any] | None = None
        #: Savepoint ids cancelled (``lockgate savepoint cancel`` or a failed ``--stop``).
        self.cancelled: set[str] = set()
        self._queue: deque[dict[str, Any]] = deque()
        self._seen: set[str] = set()
        self._consumer: Any = None
        self._next_poll = 0.0
        #: Per savepoint id announced by a barrier: (stop, the apps it is for).
        self._announced: dict[str, tuple[bool, tuple[str, ...]]] = {}
        self._not_ours: set[str] = set()
        self._taken: dict[tuple[int, str], int] = {}
        #: The last unexpired request of a bounded run's final savepoint read (its
        #: ``bounded`` field set; processors/_runtime/bounded_savepoint.py). Written by the
        #: loop thread, read by the bounded run's savepoint thread (one reference swap).
        self.bounded: dict[str, Any] | None = None

    # -- the request partition ------------------------------------------------------------

    def open(
        self,
        conf: dict[str, Any],
        control_topic: str,
        start_offset: Callable[[Consumer, TopicPartition], int | None],
    ) -> None:
        """Follow partition 0 of ``control_topic`` from :data:`REQUEST_LOOKBACK_MS` ago.

        Args:
            conf: the consumer's configuration (read uncommitted: requests are plain
                records).
            control_topic: the app's ``<app>.control``.
            start_offset: given the consumer and the partition with the look-back time as
                its offset, the first offset written since then (``None`` or a negative
                value: nothing was, follow the end). It is the caller's bounded,
                retried ``offsets_for_times``.
        """
        consumer = Consumer(conf)
        since = int(time.time() * 1000) - REQUEST_LOOKBACK_MS
        found = start_offset(consumer, TopicPartition(control_topic, REQUEST_PARTITION, since))
        start = found if found is not None and found >= 0 else -1  # -1: OFFSET_END
        consumer.assign([TopicPartition(control_topic, REQUEST_PARTITION, start)])
        self._consumer = consumer

    def poll(self) -> tuple[list[str], bool]:
        """Read what arrived on the request partition (at most every 250 ms, never blocks).

        Returns:
            The savepoint ids cancelled by this read (in the order read), and whether a
            request became :attr:`current` (the caller ends its epoch early to take it).
        """
        now = time.monotonic()
        if self._consumer is None or now < self._next_poll:
            return [], False
        self._next_poll = now + POLL_INTERVAL_S
        cancelled: list[str] = []
        for msg in self._consumer.consume(100, 0):
            key = msg.key()
            if msg.error() is not None or key is None:
                continue
            if key.startswith(CANCEL_PREFIX):
                sp_id = key[len(CANCEL_PREFIX) :].decode(errors="replace")
                if self.cancel(sp_id):
                    cancelled.append(sp_id)
            elif key.startswith(REQUEST_PREFIX):
                self._queue_request(key, msg.value())
        started = self.current is None and bool(self._queue)
        if started:
            # One savepoint at a time, in the order they were requested: a second trigger
            # waits for the first to be taken (or to expire, or to be cancelled).
            self.current = self._queue.popleft()
        return cancelled, started

    def _queue_request(self, key: bytes, value: bytes | None) -> None:
        try:
            request = orjson.loads(value or b"")
            sp_id = str(request["savepoint"])
            int(request["checkpoint"])
        except (orjson.JSONDecodeError, KeyError, TypeError, ValueError):
            log.warning("ignoring a malformed savepoint request", extra={"key": key})
            return
        if sp_id in self._seen or sp_id in self.cancelled:
            return
        self._seen.add(sp_id)
        if int(request.get("expires_ms", 0)) < time.time() * 1000:
            log.info("savepoint request expired", extra={"savepoint": sp_id})
            return
        log.info(
            "savepoint requested", extra={"savepoint": sp_id, "checkpoint": request["checkpoint"]}
        )
        self._queue.append(request)
        if request.get("bounded"):
            self.bounded = request

    def close(self) -> None:
        """Close the request reader (best effort: on the way out)."""
        if self._consumer is not None:
            try:
                self._consumer.close()
            except Exception as exc:  # noqa: BLE001 - best effort on the way out
                log.debug("savepoint request reader close failed: %s", exc)

    # -- cancels, expiry, completion --------------------------------------------------------

    def cancel(self, sp_id: str) -> bool:
        """Cancel ``sp_id`` for the rest of the process; ``False`` if it was already."""
        if sp_id in self.cancelled:
            return False
        self.cancelled.add(sp_id)
        if self.current is not None and self.current.get("savepoint") == sp_id:
            self.current = None
        kept = [r for r in self._queue if r.get("savepoint") != sp_id]
        self._queue.clear()
        self._queue.extend(kept)
        return True

    def note_cancelled(self, ids: Iterable[str]) -> None:
        """Savepoints found cancelled at start (the registry's cancel records)."""
        self.cancelled.update(ids)

    def current_unexpired(self, now_ms: int) -> dict[str, Any] | None:
        """The request in progress, dropped (and logged) once past its ``expires_ms``."""
        request = self.current
        if request is not None and int(request.get("expires_ms", 0)) < now_ms:
            log.warning("savepoint request expired", extra={"savepoint": request["savepoint"]})
            self.current = None
        return self.current

    def rearm(self, request: dict[str, Any]) -> bool:
        """Make ``request`` current again, for key groups that have not taken it yet.

        For a bounded run's final savepoint: key groups this instance was assigned after
        its epoch carrying the savepoint committed (their previous owner died before
        taking it) take it at the next epoch; key groups that took it already (a
        committed manifest of it) are skipped (the runtime's rule). It may be re-armed
        again once the epoch carrying it committed (:meth:`done`). Nothing happens while
        another request is in progress or queued, or when the savepoint was cancelled.

        Returns:
            Whether it became :attr:`current`.
        """
        sp_id = str(request.get("savepoint"))
        if (
            self.current is not None
            or sp_id in self.cancelled
            or any(r.get("savepoint") == sp_id for r in self._queue)
        ):
            return False
        self._seen.add(sp_id)
        self.current = request
        return True

    def done(self, request: dict[str, Any]) -> None:
        """The epoch carrying ``request`` committed: the next queued one may start."""
        if self.current is request:
            self.current = None

    # -- downstream: savepoints announced by barriers ---------------------------------------

    def announced(self, sp_id: str, stop: bool, apps: Iterable[str]) -> None:
        """A barrier for this app announced ``sp_id`` (taken when its checkpoint completes)."""
        self._announced[sp_id] = (stop, tuple(apps))

    def not_ours(self, sp_id: str) -> bool:
        """A barrier carries ``sp_id`` for other apps; ``True`` the first time (to log it)."""
        if sp_id in self._not_ours:
            return False
        self._not_ours.add(sp_id)
        return True

    def request_for(self, sp_id: str) -> dict[str, Any]:
        """The request a downstream key group exports ``sp_id`` under (as barriers said)."""
        stop, apps = self._announced.get(sp_id, (False, ()))
        return {"savepoint": sp_id, "stop": stop, "apps": apps}

    def take_once(self, g: int, sp_id: str, ckpt: int) -> bool:
        """Whether key group ``g`` takes ``sp_id`` at checkpoint ``ckpt``.

        The first checkpoint a key group completes ``sp_id`` at is the one it is taken at
        in this process: the same savepoint announced again at a later id (upstream apps
        that took it at different ids) is not taken twice; a replay completing the same
        id again is.
        """
        return self._taken.setdefault((g, sp_id), ckpt) == ckpt
