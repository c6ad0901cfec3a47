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

import hashlib
import logging
import os
import time
from typing import Any

import orjson
from confluent_kafka import Consumer, TopicPartition

from processors._checkpoint.alignment import Snapshot
from processors._checkpoint.control_topics import manifest_key
from processors._kafka.clients import restore_consumer_config
from processors._kafka.errors import AbortEpoch
from processors._kafka.faults import crash_point
from processors._runtime.core import RunnerCore
from processors._runtime.operator_plan import (
    OperatorPlan,
    log_operator_plan,
    plan_operator_restore,
    rename_timers,
    savepoint_to_seed,
)
from processors._task.time import TIME_STORE
from processors.exceptions import ConfigError
from state.cache import DELETED, MISSING
from state.savepoint import (
    SavepointError,
    SavepointStore,
    StoreFile,
    check_compatible,
    merged_items,
)

log = logging.getLogger("lockgate.savepoint")

#: Entries (or tombstones) of a savepoint restore committed per transaction (the test
#: suite lowers it to drive many chunks).
_SEED_CHUNK = int(os.environ.get("LOCKGATE_TEST_SEED_CHUNK", "50000"))


class SavepointMixin(RunnerCore):
    """Savepoint requests, exports, halts and restores (see the module docs)."""

    _sp_location: SavepointStore | None = None
    _sp_plan_logged: str | None = None

    def _store_schemas(self) -> dict[str, dict[str, str]]:
        """Store name -> kind and codec, as registered and saved."""
        return {
            name: {"kind": h.spec.kind, "codec": h.spec.codec.name}
            for name, h in sorted(self._handles.items())
        }

    def _state_version(self) -> str:
        """A short hash of the store schemas (changes when a store's definition does)."""
        return hashlib.sha256(orjson.dumps(self._store_schemas())).hexdigest()[:16]

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

    # -- export ---------------------------------------------------------------------------

    def _savepoints(self) -> SavepointStore:
        if self._sp_location is None:
            url = self.settings.savepoint_dir
            if not url:
                raise SavepointError(
                    "LOCKGATE_SAVEPOINT_DIR is not set for this app's instances: they cannot "
                    "write savepoint files"
                )
            self._sp_location = SavepointStore(url)
        return self._sp_location

    def _dirty_overlay(self, g: int) -> dict[str, dict[bytes, bytes | None]]:
        """The open epoch's changes of key group ``g``, encoded, without draining them."""
        overlay: dict[str, dict[bytes, bytes | None]] = {}
        for name, cache in self._kgs[g].caches.items():
            changes: dict[bytes, bytes | None] = {}
            for key in cache.dirty:
                value = cache.peek(key)
                if value is MISSING:
                    continue
                changes[key] = None if value is DELETED else cache.codec.encode(value)
            overlay[name] = changes
        return overlay

    def _export(
        self,
        g: int,
        request: dict[str, Any],
        ckpt: int,
        offsets: dict[str, int],
        align: dict[str, Any],
        overlay: dict[str, dict[bytes, bytes | None]],
        error: str | None = None,
    ) -> dict[str, Any]:
        """Export key group ``g`` and produce its manifest into the open transaction.

        A failure (no savepoint dir, I/O error, an earlier error) is recorded in the
        manifest instead of stopping the app: the savepoint fails, processing goes on.
        """
        sp_id = str(request["savepoint"])
        error = error or request.get("error")
        stores: dict[str, Any] = {}
        started = time.monotonic()
        if error is None:
            try:
                location = self._savepoints()
                db = self._kgs[g].db
                for name, handle in sorted(self._handles.items()):
                    items = merged_items(db.items(name), overlay.get(name, {}))
                    written = location.write_store(sp_id, self.name, g, name, items)
                    op = self.app.store_operator(name)
                    stores[name] = {
                        "kind": handle.spec.kind,
                        "codec": handle.spec.codec.name,
                        **(op.store_fields() if op is not None else {}),
                        **written.to_dict(),
                    }
            except (SavepointError, OSError) as exc:
                error = str(exc)
        manifest: dict[str, Any] = {
            "savepoint": sp_id,
            "app": self.name,
            "key_group": g,
            "checkpoint": ckpt,
            "offsets": offsets,
            "align": align,
            "stores": stores,
            "state_version": self._state_version(),
            "error": error,
            "stop": bool(request.get("stop")),
            "instance": self.settings.instance_id,
            "ts": int(time.time() * 1000),
        }
        if error is None:
            try:
                self._savepoints().write_manifest(sp_id, self.name, g, manifest)
            except SavepointError as exc:
                manifest["error"] = error = str(exc)
        if error is not None:
            log.error(
                "savepoint failed", extra={"savepoint": sp_id, "key_group": g, "error": error}
            )
        else:
            log.info(
                "savepoint exported",
                extra={
                    "savepoint": sp_id,
                    "key_group": g,
                    "checkpoint": ckpt,
                    "seconds": round(time.monotonic() - started, 3),
                },
            )
        self._out.produce(
            self._control_topic, orjson.dumps(manifest), manifest_key(sp_id, g), partition=g
        )
        self.metrics.beat()
        return manifest

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

    def _savepoint_manifest(self, sp_id: str, g: int) -> dict[str, Any]:
        """Return the committed manifest of key group ``g`` in savepoint ``sp_id``.

        Raises:
            ConfigError: the savepoint, this app in it, or the key group is missing, it
                was taken with another key-group count, or the key group failed.
        """
        location = self._savepoints()
        try:
            descriptor = location.read_descriptor(sp_id)
        except SavepointError as exc:
            raise ConfigError(f"--from-savepoint {sp_id}: {exc}") from exc
        apps = descriptor.get("apps", {})
        if self.name not in apps:
            raise ConfigError(
                f"--from-savepoint {sp_id}: the savepoint has no app {self.name!r} "
                f"(it has {sorted(apps)}); set LOCKGATE_APP_NAME to the saved app's name"
            )
        saved_groups = int(apps[self.name].get("key_groups", -1))
        if saved_groups != self._partitions:
            raise ConfigError(
                f"--from-savepoint {sp_id}: app {self.name!r} was saved with {saved_groups} "
                f"key groups, its inputs now have {self._partitions} partitions (changing the "
                "key-group count needs a savepoint rewrite)"
            )
        # The descriptor holds the manifests as committed in the epoch transactions (a
        # manifest file may have been rewritten by a fenced, aborted exporter since).
        committed = [m for m in apps[self.name].get("manifests") or () if m.get("key_group") == g]
        if committed:
            manifest = dict(committed[0])
        else:
            try:
                manifest = location.read_manifest(sp_id, self.name, g)
            except SavepointError as exc:
                raise ConfigError(f"--from-savepoint {sp_id}: {exc}") from exc
        if manifest.get("error"):
            raise ConfigError(
                f"--from-savepoint {sp_id}: key group {g} failed that savepoint: "
                f"{manifest['error']}"
            )
        # Whether it was a stop-with-savepoint is the savepoint's (the committed manifests
        # in the descriptor do not repeat it).
        manifest["stop"] = bool(manifest.get("stop") or descriptor.get("stop"))
        return manifest

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
        manifest = self._savepoint_manifest(sp_id, g)
        plan, files, offsets = self._seed_plan(sp_id, g, manifest)
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

    def _seed_plan(
        self, sp_id: str, g: int, manifest: dict[str, Any]
    ) -> tuple[OperatorPlan, dict[str, StoreFile], dict[str, int]]:
        """Check that key group ``g`` can be seeded from ``manifest``; say from what.

        Returns:
            How saved operators map onto the app's, the store files to read (by the
            app's store name; their checksums verified) and each input's offset.

        Raises:
            ConfigError: a pipeline restore from a savepoint taken without ``--stop``
                (unless allowed), incompatible stores or operators, a corrupt file, or
                an input without an offset in the savepoint.
        """
        downstream = any(manifest.get("align", {}).values())
        if downstream and not manifest.get("stop") and not self.settings.allow_non_stop_restore:
            raise ConfigError(
                f"--from-savepoint {sp_id}: key group {g} reads internal topics and the "
                "savepoint was taken without --stop. Restoring a pipeline from it counts "
                "the upstream's records written after the savepoint twice in this app (the "
                "old run's, still in the internal topic, and the restored upstream's). Take "
                "a stop-with-savepoint for a pipeline restore (lockgate savepoint trigger "
                "--pipeline ... --stop); to restore only this app while its upstream keeps "
                "running, set LOCKGATE_ALLOW_NON_STOP_RESTORE=true"
            )
        saved_stores: dict[str, Any] = manifest.get("stores", {})
        try:
            plan = plan_operator_restore(
                saved_stores, self.app.operators, self.settings.allow_non_restored_state
            )
            saved = {
                name: {
                    "kind": str(saved_stores[old].get("kind")),
                    "codec": str(saved_stores[old].get("codec")),
                }
                for name, old in plan.sources.items()
            }
            restore = check_compatible(
                saved, self._store_schemas(), self.settings.allow_non_restored_state
            )
            location = self._savepoints()
            files: dict[str, StoreFile] = {}
            for name in restore:
                files[name] = StoreFile.from_dict(saved_stores[plan.sources[name]])
                location.verify_store(sp_id, self.name, g, plan.sources[name], files[name])
        except SavepointError as exc:
            raise ConfigError(f"--from-savepoint {sp_id}, key group {g}: {exc}") from exc
        self._log_operator_plan(sp_id, g, plan)
        offsets: dict[str, int] = {}
        for topic in self._inputs:
            offset = manifest.get("offsets", {}).get(topic)
            if offset is None:
                raise ConfigError(
                    f"--from-savepoint {sp_id}: key group {g} has no offset for input "
                    f"{topic!r} (the savepoint was taken with other inputs)"
                )
            offsets[topic] = int(offset)
        return plan, files, offsets

    def _seed_entries(
        self, sp_id: str, g: int, plan: OperatorPlan, files: dict[str, StoreFile]
    ) -> int:
        """Write the saved entries (and tombstones for every other key) as epoch writes.

        Commits every :data:`_SEED_CHUNK` writes; returns how many entries were saved.
        """
        location = self._savepoints()
        kg = self._kgs[g]
        entries = 0
        pending = 0
        for name, cache in kg.caches.items():
            saved_keys: set[bytes] = set()
            if name in files:
                decode = cache.codec.decode
                renames = plan.timers if name == TIME_STORE else None
                for key, raw in location.read_store(
                    sp_id, self.name, g, plan.sources[name], files[name]
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

    def _operator_stores(self) -> dict[str, list[str]]:
        """Operator id -> its stores, as registered (see :func:`moved_operator_state`)."""
        return {uid: list(info.stores) for uid, info in self.app.operators.items()}

    def _log_operator_plan(self, sp_id: str, g: int, plan: OperatorPlan) -> None:
        """Say (once per process) how the savepoint's operators map onto the app's."""
        if self._sp_plan_logged != sp_id:
            self._sp_plan_logged = sp_id
            log_operator_plan(sp_id, g, plan, bool(self.app.operators))

    def _commit_seed_chunk(self) -> None:
        """Commit the seeding written so far (the offsets stay where they were)."""
        self._epoch_active = True
        self._end_epoch()
        self.metrics.beat()
        crash_point("mid_seed")
