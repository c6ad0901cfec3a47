"""Savepoints in the runtime: requests, exports, stop-with-savepoint, restores.

* **Request** — ``lockgate savepoint trigger`` writes ``savepoint-request/<id>`` with
  a checkpoint id ``C`` ahead of every clock to partition 0 of each source app's
  ``<app>.control``; every instance of that app reads it
  (:meth:`SavepointParticipant.poll_requests`).
* **Source key groups** end their next epoch with id ``C`` (or their next id when
  already past it): barriers carry the savepoint id, and right before the commit each
  key group exports the committed state overlaid with the epoch's changes — the state
  at the cut — and its manifest goes into the same transaction.
* **Downstream key groups** take it when the barriers of ``C`` complete their
  alignment: the export is the state at that moment (database + dirty caches), the
  manifest's offsets and alignment snapshot are those *before* the completing barrier,
  so a restore replays the held records and re-completes ``C``. An alignment that was
  not aligned (timeout, held-record bound, or unaligned mode) fails the savepoint
  with a reason in the manifest.
* **Stop-with-savepoint** halts each key group at the savepoint (partition paused;
  nothing after the cut is processed or committed; ``halted`` in its checkpoint
  records, so a new owner keeps it halted) until it is started again with
  ``--from-savepoint``.
* **Restore** (``--from-savepoint ID``): a key group not yet restored from ``ID`` (its
  checkpoint record's ``origin``) is seeded in one transaction: every saved entry and
  a tombstone for every other key goes to the changelog, the offsets and alignment
  snapshot come from the manifest.
* **Operator ids** — window and interval-join stores and timers are numbered by
  declaration order (``window-<n>``, ``w<n>:...``); each of their store entries in a
  manifest names its operator's id (``operator``, and ``timers`` for the owner prefix),
  and a restore gives every operator the state saved under its id
  (:func:`plan_operator_restore`), so reordered declarations keep their state.

:class:`SavepointParticipant` is the runtime's side of these: it follows the requests,
halts key groups at a stop-with-savepoint, lifts the halts of cancelled savepoints, and
seeds key groups from a savepoint. Invariants it owns:

* **a halted key group processes nothing past its cut**: its input partitions are paused
  when it halts (a stop-with-savepoint's completion downstream, or the commit of the
  source epoch that took it), and this component resumes them only when its savepoint
  is cancelled (a new owner keeps them paused: processors/_runtime/rebalance.py);
* **a lifted halt resumes by a rewind**: the cancel's :class:`AbortEpoch` is raised only
  after the whole poll (no request or cancel read with it is lost), and every key group
  goes back to its last commit, so records a halt left unprocessed are read again,
  exactly once;
* **a seeded key group's positions are the savepoint's**: its offsets and alignment move
  to the manifest's, and the records that alignment releases are processed before the
  next fetched record; its seeding chunks commit with the offsets where they were.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from confluent_kafka import Consumer, TopicPartition

from processors._checkpoint.alignment import Snapshot
from processors._checkpoint.input_positions import InputPositions
from processors._checkpoint.keygroup_state import KeyGroupCheckpoints
from processors._checkpoint.savepoint_requests import SavepointRequests
from processors._config.settings import Settings
from processors._kafka.clients import restore_consumer_config
from processors._kafka.errors import AbortEpoch
from processors._kafka.faults import crash_point
from processors._runtime.open_epoch import OpenEpoch
from processors._runtime.savepoint_seeding import SavepointSeeding
from processors._task.keygroups import KeyGroup

__all__ = ["SavepointParticipant"]

log = logging.getLogger("lockgate.savepoint")


class SavepointParticipant:
    """The runtime's side of savepoints: halts, cancels, and where a restore puts positions.

    What savepoints need beyond this is in components:
    :class:`~processors._checkpoint.savepoint_requests.SavepointRequests` (requests,
    cancels, barrier announcements), :class:`~processors._runtime.savepoint_files.SavepointFiles`
    (exports, manifests, a restore's checks and reads) and
    :class:`~processors._runtime.savepoint_seeding.SavepointSeeding` (which key groups a
    restore seeds, in chunks).

    Args:
        settings: the request reader's client settings and the instance id.
        name: the app's name.
        control_topic: the app's control topic (requests are on its partition 0).
        inputs: the input topics (key group ``g`` is partition ``g`` of each).
        requests: the savepoint requests (polled; done once their epoch committed).
        seeding: plans and writes a restore's seeding (its chunks commit through
            :meth:`commit_seed_chunk`).
        marks: the key groups' checkpoint state (halts set and lifted here, the
            checkpoint a seeded key group restored).
        positions: the input positions (a halted partition thawed, a seeded key group's
            offsets and alignment).
        open_epoch: the open epoch (``active``, ``commit_now``, ``released`` and the
            checkpoint reached are raised here).
        key_groups: the owned key groups (read only).
        partitions: the key-group count (known once the topics were checked).
        consumer: the current consumer (created after the runner; paused and resumed).
        call: calls a blocking client API, bounded (the runner's bounded waits).
        end_epoch: commits the open epoch (raises ``AbortEpoch`` when it failed).
        beat: shows liveness (between seeding chunks).
    """

    def __init__(
        self,
        settings: Settings,
        name: str,
        control_topic: str,
        inputs: Sequence[str],
        requests: SavepointRequests,
        seeding: SavepointSeeding,
        marks: KeyGroupCheckpoints,
        positions: InputPositions,
        open_epoch: OpenEpoch,
        key_groups: Mapping[int, KeyGroup],
        partitions: Callable[[], int],
        consumer: Callable[[], Any],
        call: Callable[..., Any],
        end_epoch: Callable[[], None],
        beat: Callable[[], None],
    ) -> None:
        self._settings = settings
        self._name = name
        self._control_topic = control_topic
        self._inputs = inputs
        self._sp_requests = requests
        self._seeding = seeding
        self._marks = marks
        self._positions = positions
        self._open = open_epoch
        self._kgs = key_groups
        self._partitions = partitions
        self._consumer = consumer
        self._call = call
        self._end_epoch = end_epoch
        self._beat = beat

    # -- requests -------------------------------------------------------------------------

    def open_request_reader(self) -> None:
        """Follow partition 0 of this app's control topic for savepoint requests."""
        conf = restore_consumer_config(self._settings, self._name)
        conf["client.id"] = f"{self._name}-{self._settings.instance_id}-requests"
        conf["isolation.level"] = "read_uncommitted"  # requests are plain records

        def start_offset(consumer: Consumer, tp: TopicPartition) -> int | None:
            # A control topic created a moment ago has no leader yet: retried, bounded.
            found = self._call(
                consumer.offsets_for_times, [tp], 10, what="savepoint request offsets", timeout_s=60
            )[0]
            return int(found.offset) if found.offset is not None else None

        self._sp_requests.open(conf, self._control_topic, start_offset)

    def poll_requests(self) -> None:
        """Take a pending savepoint request, lift the halts of cancelled savepoints.

        Raises:
            AbortEpoch: a cancel lifted halts (after the whole read: none of it is lost).
        """
        cancelled, started = self._sp_requests.poll()
        if started:
            self._open.commit_now = True
        lifted = [g for sp_id in cancelled for g in self._lift_halts(sp_id)]
        if lifted:
            raise AbortEpoch(
                f"savepoint(s) {cancelled} cancelled: resuming halted key groups {lifted}"
            )

    def _lift_halts(self, sp_id: str) -> list[int]:
        """Savepoint ``sp_id`` was cancelled: resume the key groups halted at it.

        They resume by a rewind of the open epoch (every key group back to its last
        commit, as after a restart; the caller raises the :class:`AbortEpoch`): a halted
        key group replays from its committed position and alignment, completes the
        savepoint's checkpoint again — now without taking the savepoint — and goes on.
        Records a halt left unprocessed (skipped in the batch, released by the
        completion) come back that way, exactly once.

        Returns:
            The key groups that were halted at ``sp_id`` (none: nothing to rewind).
        """
        lifted: list[int] = self._marks.lift(sp_id)  # an epoch abort keeps them running
        if not lifted:
            return []
        for g in lifted:
            self._positions.thaw(g)
            self._consumer().resume([TopicPartition(t, g) for t in self._inputs])
        self._open.active = True  # the next commit records that they are not halted
        log.warning(
            "savepoint cancelled: key groups resume",
            extra={"key_groups": lifted, "savepoint": sp_id},
        )
        return lifted

    # -- halting --------------------------------------------------------------------------

    def halt(self, g: int, sp_id: str) -> None:
        """Stop processing key group ``g`` at savepoint ``sp_id`` (stop-with-savepoint)."""
        self._marks.halt(g, sp_id)
        parts = [TopicPartition(t, g) for t in self._inputs]
        try:
            self._consumer().pause(parts)
        except Exception as exc:  # noqa: BLE001 - not assigned yet: the assign pauses it
            log.debug("pause failed: %s", exc)
        log.warning(
            "key group halted at a stop-with-savepoint; start the app with "
            f"--from-savepoint {sp_id} to continue from it",
            extra={"key_group": g, "savepoint": sp_id},
        )

    def committed(self, request: dict[str, Any], manifests: dict[int, dict[str, Any]]) -> None:
        """The source epoch carrying a savepoint committed: halt on a stop request."""
        self._sp_requests.done(request)
        if not request.get("stop"):
            return
        for g, manifest in manifests.items():
            if manifest.get("error") is None:
                self.halt(g, str(request["savepoint"]))

    # -- restore --------------------------------------------------------------------------

    def seed(self, g: int) -> bool:
        """Put key group ``g``'s state, offsets and alignment at its savepoint, if it has one.

        The entries are written as epoch writes and committed in chunks
        (processors/_runtime/savepoint_seeding.py); the last part commits with the
        caller's epoch, together with the offsets and alignment moved to the manifest's
        and ``origin``.

        Returns:
            ``True`` when seeded, ``False`` when there is nothing to seed (no savepoint,
            or the key group descends from it already: a restart).

        Raises:
            ConfigError: the savepoint is missing, incomplete or incompatible with the
                app's stores (the message names the store), or a file is corrupt.
            AbortEpoch: a chunk's commit failed (the caller stops; a restart redoes it).
        """
        plan = self._seeding.plan(g, self._partitions())
        if plan is None:
            return False
        entries = self._seeding.write(g, self._kgs[g], plan)
        self._seed_positions(g, plan.manifest, plan.offsets)
        self._seeding.done(g, plan)
        self._open.reached(self._marks.done(g))
        # The last part of the seeding commits with the caller's epoch (not an input
        # record: lockgate_records_in counts input records only).
        self._open.active = True
        log.info(
            "key group seeded from a savepoint",
            extra={"key_group": g, "savepoint": plan.savepoint, "entries": entries},
        )
        return True

    def _seed_positions(self, g: int, manifest: dict[str, Any], offsets: dict[str, int]) -> None:
        """Move key group ``g``'s offsets and alignment to the savepoint's."""
        aligns = manifest.get("align", {})
        snaps = {t: Snapshot.from_json(aligns[t]) if aligns.get(t) else None for t in offsets}
        self._open.released.extend(self._positions.seed(g, offsets, snaps))

    def commit_seed_chunk(self) -> None:
        """Commit the seeding written so far (the offsets stay where they were)."""
        self._open.active = True
        self._end_epoch()
        self._beat()
        crash_point("mid_seed")
