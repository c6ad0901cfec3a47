"""Savepoints in the runtime: requests, exports, stop-with-savepoint, restores.

* **Request** — ``lockgate savepoint trigger`` writes ``savepoint-request/<id>`` with
  a checkpoint id ``C`` ahead of every clock to partition 0 of each source app's
  ``<app>.control``; every instance of that app reads it (:meth:`_poll_requests`).
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
"""

from __future__ import annotations

import logging
import os
from typing import Any

from confluent_kafka import Consumer, TopicPartition

from processors._checkpoint.alignment import Snapshot
from processors._kafka.clients import restore_consumer_config
from processors._kafka.errors import AbortEpoch
from processors._kafka.faults import crash_point
from processors._runtime.core import RunnerCore
from processors._runtime.operator_plan import (
    OperatorPlan,
    rename_timers,
    savepoint_to_seed,
)
from processors._task.time import TIME_STORE
from state.cache import DELETED
from state.savepoint import (
    StoreFile,
)

log = logging.getLogger("lockgate.savepoint")

#: Entries (or tombstones) of a savepoint restore committed per transaction (the test
#: suite lowers it to drive many chunks).
_SEED_CHUNK = int(os.environ.get("LOCKGATE_TEST_SEED_CHUNK", "50000"))


class SavepointMixin(RunnerCore):
    """Savepoint requests, exports, halts and restores (see the module docs)."""

    # -- requests -------------------------------------------------------------------------

    def _open_request_reader(self) -> None:
        """Follow partition 0 of this app's control topic for savepoint requests."""
        conf = restore_consumer_config(self.settings, self.name)
        conf["client.id"] = f"{self.name}-{self.settings.instance_id}-requests"
        conf["isolation.level"] = "read_uncommitted"  # requests are plain records

        def start_offset(consumer: Consumer, tp: TopicPartition) -> int | None:
            # A control topic created a moment ago has no leader yet: retried, bounded.
            found = self._call(
                consumer.offsets_for_times, [tp], 10, what="savepoint request offsets", timeout_s=60
            )[0]
            return int(found.offset) if found.offset is not None else None

        self._sp_requests.open(conf, self._control_topic, start_offset)

    def _poll_requests(self) -> None:
        """Take a pending savepoint request, lift the halts of cancelled savepoints.

        Raises:
            AbortEpoch: a cancel lifted halts (after the whole read: none of it is lost).
        """
        cancelled, started = self._sp_requests.poll()
        if started:
            self._commit_now = True
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
            for t in self._inputs:
                self._frozen.pop((t, g), None)
            self._consumer.resume([TopicPartition(t, g) for t in self._inputs])
        self._epoch_active = True  # the next commit records that they are not halted
        log.warning(
            "savepoint cancelled: key groups resume",
            extra={"key_groups": lifted, "savepoint": sp_id},
        )
        return lifted

    # -- halting --------------------------------------------------------------------------

    def _halt(self, g: int, sp_id: str) -> None:
        """Stop processing key group ``g`` at savepoint ``sp_id`` (stop-with-savepoint)."""
        self._marks.halt(g, sp_id)
        parts = [TopicPartition(t, g) for t in self._inputs]
        try:
            self._consumer.pause(parts)
        except Exception as exc:  # noqa: BLE001 - not assigned yet: the assign pauses it
            log.debug("pause failed: %s", exc)
        log.warning(
            "key group halted at a stop-with-savepoint; start the app with "
            f"--from-savepoint {sp_id} to continue from it",
            extra={"key_group": g, "savepoint": sp_id},
        )

    def _savepoint_committed(
        self, request: dict[str, Any], manifests: dict[int, dict[str, Any]]
    ) -> None:
        """The source epoch carrying a savepoint committed: halt on a stop request."""
        self._sp_requests.done(request)
        if not request.get("stop"):
            return
        for g, manifest in manifests.items():
            if manifest.get("error") is None:
                self._halt(g, str(request["savepoint"]))

    # -- restore --------------------------------------------------------------------------

    def _end_epoch(self) -> None:  # pragma: no cover - defined by EpochMixin
        raise NotImplementedError

    def _seed_from_savepoint(self, g: int) -> bool:
        """Put key group ``g``'s state, offsets and alignment at savepoint ``--from-savepoint``.

        The entries go into the key group's caches as epoch writes (a tombstone for
        every current key not saved) and are committed in chunks of
        :data:`_SEED_CHUNK` (one transaction per chunk, so a large state never outlives
        the transaction timeout); each chunk's checkpoint record says ``seeding``. The
        last commit also moves the offsets and alignment to the manifest's and records
        ``origin``. Seeding is idempotent: a restore cut short is redone from the start
        by the next owner — also without ``--from-savepoint``, because the checkpoint
        record names the savepoint being seeded. Returns False when the key group
        descends from that savepoint already (a restart), True when seeded.

        Raises:
            ConfigError: the savepoint is missing, incomplete or incompatible with the
                app's stores (the message names the store), or a file is corrupt.
            AbortEpoch: a chunk's commit failed (the caller stops; a restart redoes it).
        """
        sp_id = savepoint_to_seed(
            seeding=self._marks.seeding(g),
            from_savepoint=self.settings.from_savepoint,
            origin=self._marks.origin(g),
            halted=self._marks.halted.get(g),
            resume_halted=self.settings.resume_from_stop_savepoint,
        )
        if sp_id is None:
            self._marks.end_seeding(g)
            return False
        if self._marks.seeding(g) == sp_id and sp_id != self.settings.from_savepoint:
            log.warning(
                "finishing an interrupted restore of this key group from a savepoint",
                extra={"key_group": g, "savepoint": sp_id},
            )
        elif sp_id != self.settings.from_savepoint:
            log.info(
                "resuming a key group halted by a stop-with-savepoint from that savepoint "
                "(LOCKGATE_RESUME_FROM_STOP_SAVEPOINT)",
                extra={"key_group": g, "savepoint": sp_id},
            )
        manifest = self._sp_files.committed_manifest(sp_id, g, self._partitions)
        plan, files, offsets = self._sp_files.seed_plan(sp_id, g, manifest, self._inputs)
        self._marks.start_seeding(g, sp_id)
        entries = self._seed_entries(sp_id, g, plan, files)
        self._seed_positions(g, manifest, offsets)
        self._marks.seeded(g, sp_id, int(manifest.get("checkpoint", 0)))
        self._checkpoint = max(self._checkpoint, self._marks.done(g))
        # The last part of the seeding commits with the caller's epoch (not an input
        # record: lockgate_records_in counts input records only).
        self._epoch_active = True
        log.info(
            "key group seeded from a savepoint",
            extra={"key_group": g, "savepoint": sp_id, "entries": entries},
        )
        return True

    def _seed_entries(
        self, sp_id: str, g: int, plan: OperatorPlan, files: dict[str, StoreFile]
    ) -> int:
        """Write the saved entries (and tombstones for every other key) as epoch writes.

        Commits every :data:`_SEED_CHUNK` writes; returns how many entries were saved.
        """
        kg = self._kgs[g]
        entries = 0
        pending = 0
        for name, cache in kg.caches.items():
            saved_keys: set[bytes] = set()
            if name in files:
                decode = cache.codec.decode
                renames = plan.timers if name == TIME_STORE else None
                for key, raw in self._sp_files.read_entries(
                    sp_id, g, plan.sources[name], files[name]
                ):
                    value = decode(raw)
                    if renames and key[:1] == b"t" and isinstance(value, list):
                        value = rename_timers(value, renames)
                        if not value:
                            continue  # only dropped operators' timers: a tombstone below
                    cache.put(key, value)
                    saved_keys.add(key)
                    entries += 1
                    pending += 1
                    if pending >= _SEED_CHUNK:
                        self._commit_seed_chunk()
                        pending = 0
            for key, _ in kg.db.items(name):  # an iterator over the DB as it was
                if key not in saved_keys:
                    cache.put(key, DELETED)
                    pending += 1
                    if pending >= _SEED_CHUNK:
                        self._commit_seed_chunk()
                        pending = 0
        return entries

    def _seed_positions(self, g: int, manifest: dict[str, Any], offsets: dict[str, int]) -> None:
        """Move key group ``g``'s offsets and alignment to the savepoint's."""
        for topic, offset in offsets.items():
            self._next[(topic, g)] = self._committed[(topic, g)] = offset
            align = manifest.get("align", {}).get(topic)
            if align:
                snap = Snapshot.from_json(align)
                self._aligners[(topic, g)] = self._new_aligner(snap, (topic, g))
                self._align_committed[(topic, g)] = snap
            else:
                self._aligners.pop((topic, g), None)
                self._align_committed.pop((topic, g), None)
        self._share_savepoint_alignment(g)

    def _commit_seed_chunk(self) -> None:
        """Commit the seeding written so far (the offsets stay where they were)."""
        self._epoch_active = True
        self._end_epoch()
        self.metrics.beat()
        crash_point("mid_seed")
