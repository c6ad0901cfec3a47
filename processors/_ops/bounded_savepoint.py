"""A bounded run's final savepoint: ``lockgate run --until BOUND --savepoint [LOCATION]``.

Flink's stop-with-drain ends with a savepoint; so does a bounded run given
``--savepoint`` (``LOCKGATE_UNTIL_SAVEPOINT``). It is an ordinary savepoint of the app —
the request, the exports and manifests in the epoch transactions, the descriptor — taken
with the machinery of ``lockgate savepoint trigger`` (processors/_ops/savepoints.py,
processors/_runtime/savepoints.py); this component only decides *when* it is requested and
*when* it is complete. Semantics (docs/operations.md, "Bounded runs with a savepoint"):

* **Requested once every key group reached the bound.** An instance whose owned key
  groups reached their ends drains event time, commits, and from then on writes
  ``bounded`` (its end offsets) in their checkpoint records. It does not exit: it keeps
  its key groups and follows the checkpoint catalog. When every key group of the app
  has such a record with ends at or past this instance's own ends, the instance owning
  key group 0 writes one savepoint request (``bounded`` in it) to the app's control
  topic. Every instance takes it for its key groups at its next epoch (a key group
  assigned later, its previous owner gone before taking it, takes it then: the runtime
  re-arms the request). A key group took it when a committed manifest of it exists for
  that key group (read by the waiter, or committed by this instance), not by its
  checkpoint: a key group taken over and drained after the request is past the request's
  checkpoint yet has not taken it.
* **Complete means the descriptor is written.** Each instance waits for the manifests
  of all key groups, writes the descriptor if nobody has, and exits 0 with the id; a
  failed manifest (e.g. an unwritable location), a request that never comes or a
  missing manifest past ``LOCKGATE_UNTIL_SAVEPOINT_TIMEOUT_MS`` cancels the savepoint and
  exits 1 naming the cause. No instance exits 0 before the savepoint it is part of is
  complete.
* **Once per state.** A run whose key groups are exactly where the newest bounded-run
  savepoint of the app left them (same offsets for every key group) takes none: it
  reports that savepoint's id (a restart of a finished run). A run killed during the
  savepoint phase and started again adopts the request still pending (it looks back
  over the timeout in the request partition; the request expires with the timeout); if
  it has expired, a new savepoint is taken and the unfinished one never completes (no
  descriptor: not listed).

The waiting runs on a thread with its own Kafka clients (:class:`~processors._ops.client.Ops`),
so the loop keeps taking the request and serving its key groups meanwhile; the loop sees it
through :class:`~processors._runtime.final_savepoint.FinalSavepoint` (the runtime is below
the operator commands: ``processors/cli.py`` hands it this class).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from confluent_kafka import KafkaException, TopicPartition

from processors._checkpoint.control_topics import (
    CANCEL_PREFIX,
    REQUEST_PARTITION,
    REQUEST_PREFIX,
    control_topic,
    read_partition,
)
from processors._checkpoint.savepoint_requests import SavepointRequests
from processors._config.settings import Settings
from processors._kafka.errors import Stopping
from processors._ops.client import Ops
from processors._ops.errors import OpsError
from processors._ops.savepoint_requests import _ranges, choose_checkpoint, savepoint_request
from processors._ops.savepoints import cancel_savepoint, open_store
from processors._runtime.final_savepoint import Outcome
from processors.exceptions import FatalKafkaError, LockgateError
from state.savepoint import (
    SavepointError,
    SavepointStore,
    build_descriptor,
    new_savepoint_id,
)

__all__ = ["BoundedSavepoint"]

log = logging.getLogger("lockgate.savepoint")

#: How often the catalog is read while waiting for the other key groups.
CATALOG_POLL_S = 1.0
#: Manifests are read from this long before the request was written (clock skew).
MANIFEST_LOOKBACK_MS = 10_000


class _Stopped(Exception):
    """The instance is stopping: stop waiting."""


class BoundedSavepoint:
    """Requests and waits for a bounded run's final savepoint on its own thread.

    Args:
        name: the name the app runs under.
        settings: the instance's settings (``savepoint_dir`` is the savepoint's location).
        inputs: the app's input topics.
        partitions: the app's key-group count.
        ends: this instance's end offset of every input partition.
        requests: the loop's savepoint requests (the bounded request it read is adopted).
    """

    def __init__(
        self,
        name: str,
        settings: Settings,
        inputs: Sequence[str],
        partitions: int,
        ends: Mapping[tuple[str, int], int],
        requests: SavepointRequests,
    ) -> None:
        self._name = name
        self._settings = settings
        self._inputs = tuple(inputs)
        self._partitions = partitions
        self._ends = dict(ends)
        self._requests = requests
        self._timeout_s = settings.until_savepoint_timeout_ms / 1000
        self._stopping = threading.Event()
        #: A pending bounded request found by the look-back at start.
        self._found: dict[str, Any] | None = None
        self._thread = threading.Thread(
            target=self._run, name="lockgate-bounded-savepoint", daemon=True
        )
        #: The key groups the loop owns (a snapshot the loop replaces each iteration).
        self.owned: frozenset[int] = frozenset()
        #: The request of the savepoint this run takes (set once known; the loop re-arms
        #: it for key groups assigned later).
        self.request: dict[str, Any] | None = None
        #: Set once, when the savepoint completed or failed (read by the loop).
        self.result: Outcome | None = None
        #: (savepoint, key group) with a committed manifest: read by the waiter, or
        #: committed by the loop's epoch. Both threads use it: under the lock.
        self._manifests: set[tuple[str, int]] = set()
        #: Savepoints whose committed manifests the waiter has read to the end once:
        #: for them, a key group absent from ``_manifests`` has none (see has_manifest).
        self._caught_up: set[str] = set()
        self._manifests_lock = threading.Lock()

    def start(self) -> None:
        """Start waiting (once)."""
        if not self._thread.is_alive() and self.result is None:
            self._thread.start()

    def close(self) -> None:
        """Stop waiting (the thread ends at its next check; it is a daemon)."""
        self._stopping.set()

    def has_manifest(self, savepoint: str, g: int) -> bool | None:
        """Whether key group ``g`` has a committed manifest of ``savepoint`` (any thread).

        ``None`` (not known yet) until the waiter has read that savepoint's manifests to
        the end once, unless this instance's own epoch committed one.
        """
        with self._manifests_lock:
            if (savepoint, g) in self._manifests:
                return True
            return False if savepoint in self._caught_up else None

    def exported(self, savepoint: str, groups: Iterable[int]) -> None:
        """The loop's epoch exporting ``savepoint`` for ``groups`` committed."""
        self._seen(savepoint, groups)

    def _seen(self, savepoint: str, groups: Iterable[int]) -> None:
        with self._manifests_lock:
            self._manifests.update((savepoint, g) for g in groups)

    def _read_to_end(self, savepoint: str) -> None:
        with self._manifests_lock:
            self._caught_up.add(savepoint)

    # -- the thread -----------------------------------------------------------------------

    def _run(self) -> None:
        try:
            outcome = self._take()
        except (_Stopped, Stopping):
            return
        except (LockgateError, KafkaException, SavepointError, OSError, TypeError) as exc:
            text = str(exc)
            if not text.startswith("bounded run"):
                text = f"bounded run: no savepoint taken: {text}"
            outcome = Outcome(None, text)
        except Exception as exc:  # noqa: BLE001 - the loop must learn of any failure
            log.exception("bounded run savepoint: unexpected error")
            outcome = Outcome(None, f"unexpected error: {exc!r}")
        self.result = outcome

    def _take(self) -> Outcome:
        """Request (or adopt) the savepoint, wait for it, write its descriptor.

        Raises:
            OpsError: the savepoint failed or timed out (it is cancelled first), or the
                location is invalid.
            _Stopped: the instance is stopping.
        """
        ops = Ops(self._settings)
        try:
            store = open_store(self._settings)
            deadline = time.monotonic() + self._timeout_s
            self._found = self._look_back(ops)
            found = self._request_or_reuse(ops, store, deadline)
            if isinstance(found, Outcome):
                return found
            request = self.request = found
            sp_id = str(request["savepoint"])
            try:
                manifests = ops.wait_for_manifests(
                    sp_id,
                    self._manifest_start(ops, int(request.get("requested_ms") or 0)),
                    {self._name: self._partitions},
                    max(1.0, deadline - time.monotonic()),
                    lambda line: log.info("bounded run: %s", line),
                    lambda _app, g: self._seen(sp_id, (g,)),
                    lambda: self._read_to_end(sp_id),
                )
                if sp_id not in store.list_savepoints():
                    descriptor = build_descriptor(
                        sp_id,
                        int(request["checkpoint"]),
                        False,
                        _now_ms(),
                        int(request.get("requested_ms") or 0),
                        ops.registry(),
                        manifests,
                        [self._name],
                    )
                    descriptor["bounded"] = {
                        "until": self._settings.until,
                        "drained": self._settings.until_drain,
                        "written_by": self._settings.instance_id,
                    }
                    store.write_descriptor(sp_id, descriptor)
            except (OpsError, SavepointError, TypeError) as exc:
                self._cancel(ops, sp_id)
                raise OpsError(
                    f"bounded run: {exc} (savepoint {sp_id} is cancelled; run the bounded "
                    "run again to take a new one)"
                ) from exc
            return Outcome(sp_id, None, store.url)
        finally:
            ops.close()

    def _request_or_reuse(
        self, ops: Ops, store: SavepointStore, deadline: float
    ) -> dict[str, Any] | Outcome:
        """Wait until the savepoint's request is known (adopted or written here).

        Returns:
            The request, or an :class:`Outcome` naming the newest bounded-run savepoint
            when every key group is still exactly where it left them.

        Raises:
            OpsError: the timeout passed first (naming the key groups not at the bound).
            _Stopped: the instance is stopping.
        """
        shown = ""
        while True:
            if self._stopping.is_set():
                raise _Stopped
            pending = self._pending_request(store)
            if pending is not None:
                log.info(
                    "bounded run: taking the final savepoint requested",
                    extra={"savepoint": pending["savepoint"]},
                )
                return pending
            try:
                latest = ops.latest_checkpoints(self._name, self._partitions)
            except FatalKafkaError as exc:
                # E.g. a transaction of a killed instance still open there (aborted at
                # its timeout): read again until the deadline.
                log.warning("bounded run: checkpoint catalog not readable: %s", exc)
                latest = {}
            waiting = [g for g in range(self._partitions) if not self._reached(g, latest.get(g))]
            if not waiting:
                same = self._unchanged_since(store, latest)
                if same is not None:
                    log.info(
                        "bounded run: every key group is where the bounded-run savepoint %s "
                        "left it (same offsets): it is the result, no new savepoint is taken",
                        same,
                        extra={"savepoint": same},
                    )
                    return Outcome(same, None, store.url, reused=True)
                if 0 in self.owned:
                    return self._write_request(ops, latest)
                text = "waiting for the savepoint request (written by the owner of key group 0)"
            else:
                text = f"waiting for key group(s) {_ranges(waiting)} to reach the bound"
            if text != shown:
                log.info("bounded run: %s", text)
                shown = text
            if time.monotonic() > deadline:
                raise OpsError(
                    f"bounded run: no savepoint after {self._timeout_s:g}s "
                    f"(LOCKGATE_UNTIL_SAVEPOINT_TIMEOUT_MS): {text}. Every instance of the "
                    "run must reach the same bound (with `now`, resolved by each instance "
                    "when it starts, start them together or use a time or offsets bound)"
                )
            self._stopping.wait(CATALOG_POLL_S)

    def _pending_request(self, store: SavepointStore) -> dict[str, Any] | None:
        """The newest bounded request read, unless cancelled, expired or already complete.

        The loop's reader's (requests written since it started, and in its short
        look-back), else the one :meth:`_look_back` found.
        """
        for request in (self._requests.bounded, self._found):
            if request is None:
                continue
            sp_id = str(request.get("savepoint"))
            if sp_id in self._requests.cancelled or sp_id in store.list_savepoints():
                continue
            if int(request.get("expires_ms") or 0) < _now_ms():
                continue
            return request
        return None

    def _look_back(self, ops: Ops) -> dict[str, Any] | None:
        """The newest bounded request of the last timeout's span not cancelled since.

        An instance killed in the savepoint phase and started again later than the
        request reader's look-back still finds the request the others wait for.
        """
        topic = control_topic(self._name)
        tp = TopicPartition(topic, REQUEST_PARTITION)
        since = _now_ms() - int(self._timeout_s * 1000)
        start = ops.admin.offsets_for_time([tp], since)[(topic, REQUEST_PARTITION)]
        end = ops.admin.end_offsets([tp])[(topic, REQUEST_PARTITION)]
        if start < 0:
            return None
        found: dict[str, Any] | None = None
        cancelled: set[str] = set()
        for key, value, _ in read_partition(
            ops.consumer, topic, REQUEST_PARTITION, start, end, should_stop=self._stopping.is_set
        ):
            if key is None:
                continue
            if key.startswith(CANCEL_PREFIX):
                cancelled.add(key[len(CANCEL_PREFIX) :].decode(errors="replace"))
            elif key.startswith(REQUEST_PREFIX) and isinstance(value, dict):
                if value.get("bounded") and isinstance(value.get("checkpoint"), int):
                    found = value
        if found is None or str(found.get("savepoint")) in cancelled:
            return None
        return found

    def _reached(self, g: int, record: Mapping[str, Any] | None) -> bool:
        """Whether key group ``g``'s latest checkpoint record says it reached our bound."""
        ends = None if record is None else record.get("bounded")
        if not isinstance(ends, dict):
            return False
        for t in self._inputs:
            got = ends.get(t)
            if not isinstance(got, int) or got < self._ends.get((t, g), 0):
                return False
        return True

    def _unchanged_since(
        self, store: SavepointStore, latest: Mapping[int, Mapping[str, Any]]
    ) -> str | None:
        """The newest bounded-run savepoint of this app, if every key group is still at it."""
        for sp_id in reversed(store.list_savepoints()):
            try:
                d = store.read_descriptor(sp_id)
            except SavepointError:
                continue
            info = (d.get("apps") or {}).get(self._name)
            if not d.get("bounded") or not isinstance(info, dict):
                continue
            saved = {m.get("key_group"): m.get("offsets") for m in info.get("manifests") or ()}
            same = len(saved) == self._partitions and all(
                saved.get(g) == (latest.get(g) or {}).get("offsets")
                for g in range(self._partitions)
            )
            return sp_id if same else None
        return None

    def _write_request(self, ops: Ops, latest: Mapping[int, Mapping[str, Any]]) -> dict[str, Any]:
        """Write the savepoint request to partition 0 of the app's control topic."""
        now = _now_ms()
        checkpoint = choose_checkpoint(
            now,
            [int(r["checkpoint"]) for r in latest.values() if isinstance(r.get("checkpoint"), int)],
        )
        sp_id = new_savepoint_id(now)
        request = savepoint_request(
            sp_id, checkpoint, False, [self._name], now, wait_ms=int(self._timeout_s * 1000)
        )
        request["bounded"] = {"until": self._settings.until}
        ops.write_requests([self._name], request)
        log.info(
            "bounded run: every key group reached the bound; savepoint requested",
            extra={"savepoint": sp_id, "checkpoint": checkpoint},
        )
        return request

    def _manifest_start(self, ops: Ops, requested_ms: int) -> dict[tuple[str, int], int]:
        """Where the manifests of a request written at ``requested_ms`` can start."""
        topic = control_topic(self._name)
        tps = [TopicPartition(topic, g) for g in range(self._partitions)]
        at = ops.admin.offsets_for_time(tps, max(0, requested_ms - MANIFEST_LOOKBACK_MS))
        ends = ops.end_offsets({self._name: self._partitions})
        return {tp: (off if off >= 0 else ends[tp]) for tp, off in at.items()}

    def _cancel(self, ops: Ops, sp_id: str) -> None:
        """Cancel a failed savepoint (no instance takes it any more); best effort."""
        try:
            cancel_savepoint(ops, sp_id, [self._name])
        except (LockgateError, KafkaException) as exc:
            log.warning("could not cancel savepoint %s: %s", sp_id, exc)


def _now_ms() -> int:
    return time.time_ns() // 1_000_000
