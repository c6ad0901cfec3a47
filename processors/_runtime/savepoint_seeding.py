"""Seeding a key group from a savepoint (``--from-savepoint``): which, from what, and the writes.

A key group not yet restored from the savepoint it should descend from is *seeded*:
every saved entry, and a tombstone for every other key of the local state, goes into
the key group's caches as epoch writes, so they reach the changelog and the local
database through the normal epoch commit. The runtime then moves the key group's
offsets and alignment to the savepoint's and commits them with its next epoch
(processors/_runtime/savepoints.py).

Invariants this component owns:

* **which savepoint** (:func:`processors._runtime.operator_plan.savepoint_to_seed`): a
  restore cut short is finished by the next owner — also without ``--from-savepoint``,
  because the checkpoint record names the savepoint being seeded — and a key group that
  descends from the savepoint already (a restart) is not seeded again;
* **nothing is written before the savepoint is known good**: the manifest as committed,
  the stores' kinds and codecs, the operators' mapping and every file's checksum are
  checked first (:meth:`SavepointFiles.seed_plan`);
* **bounded transactions**: the writes are committed every :data:`SEED_CHUNK` entries
  (a large state never outlives the transaction timeout); each chunk's checkpoint
  record says ``seeding``, so a crash between chunks redoes the whole seeding.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from processors._checkpoint.keygroup_state import KeyGroupCheckpoints
from processors._config.settings import Settings
from processors._runtime.operator_plan import OperatorPlan, rename_timers, savepoint_to_seed
from processors._runtime.savepoint_files import SavepointFiles
from processors._task.keygroups import KeyGroup
from processors._task.time import TIME_STORE
from state.cache import DELETED
from state.savepoint import StoreFile

__all__ = ["SEED_CHUNK", "SavepointSeeding", "SeedPlan"]

log = logging.getLogger("lockgate.savepoint")

#: Entries (or tombstones) of a savepoint restore committed per transaction (the test
#: suite lowers it with LOCKGATE_TEST_SEED_CHUNK to drive many chunks).
SEED_CHUNK = int(os.environ.get("LOCKGATE_TEST_SEED_CHUNK", "50000"))


@dataclass(frozen=True)
class SeedPlan:
    """What one key group is seeded from (every part checked before the first write).

    Attributes:
        savepoint: the savepoint id.
        manifest: the key group's manifest, as committed.
        operators: how the saved operators map onto the app's.
        files: the store files to read, by the app's store name.
        offsets: each input's offset at the savepoint.
    """

    savepoint: str
    manifest: dict[str, Any]
    operators: OperatorPlan
    files: dict[str, StoreFile]
    offsets: dict[str, int]

    @property
    def checkpoint(self) -> int:
        """The checkpoint the savepoint was taken at (the key group's ``done``)."""
        return int(self.manifest.get("checkpoint", 0))


class SavepointSeeding:
    """Plans and writes the seeding of key groups from savepoints (see the module docs).

    Args:
        files: the app's savepoint files.
        marks: the key groups' checkpoint state (``seeding``, ``origin``, halts).
        settings: ``--from-savepoint`` and ``LOCKGATE_RESUME_FROM_STOP_SAVEPOINT``.
        inputs: the app's input topics (each needs an offset in the savepoint).
        commit_chunk: commits the writes so far (one epoch, offsets unchanged).
    """

    def __init__(
        self,
        files: SavepointFiles,
        marks: KeyGroupCheckpoints,
        settings: Settings,
        inputs: Iterable[str],
        commit_chunk: Callable[[], None],
    ) -> None:
        self._files = files
        self._marks = marks
        self._settings = settings
        self._inputs = tuple(inputs)
        self._commit_chunk = commit_chunk

    def plan(self, g: int, partitions: int) -> SeedPlan | None:
        """Decide whether key group ``g`` is seeded, check the savepoint, mark it seeding.

        Returns:
            ``None`` when ``g`` is not to be seeded (no savepoint, or it descends from it
            already); else the checked plan (``g`` is marked seeding from then on).

        Raises:
            ConfigError: the savepoint is missing, incomplete or incompatible with the
                app's stores (the message names the store), or a file is corrupt.
        """
        marks, settings = self._marks, self._settings
        sp_id = savepoint_to_seed(
            seeding=marks.seeding(g),
            from_savepoint=settings.from_savepoint,
            origin=marks.origin(g),
            halted=marks.halted.get(g),
            resume_halted=settings.resume_from_stop_savepoint,
        )
        if sp_id is None:
            marks.end_seeding(g)
            return None
        if marks.seeding(g) == sp_id and sp_id != settings.from_savepoint:
            log.warning(
                "finishing an interrupted restore of this key group from a savepoint",
                extra={"key_group": g, "savepoint": sp_id},
            )
        elif sp_id != settings.from_savepoint:
            log.info(
                "resuming a key group halted by a stop-with-savepoint from that savepoint "
                "(LOCKGATE_RESUME_FROM_STOP_SAVEPOINT)",
                extra={"key_group": g, "savepoint": sp_id},
            )
        manifest = self._files.committed_manifest(sp_id, g, partitions)
        operators, files, offsets = self._files.seed_plan(sp_id, g, manifest, self._inputs)
        marks.start_seeding(g, sp_id)
        return SeedPlan(sp_id, manifest, operators, files, offsets)

    def write(self, g: int, kg: KeyGroup, plan: SeedPlan) -> int:
        """Write the saved entries (and tombstones for every other key) as epoch writes.

        Commits every :data:`SEED_CHUNK` writes; returns how many entries were saved.

        Raises:
            AbortEpoch: a chunk's commit failed (the caller stops; a restart redoes it).
        """
        entries = 0
        pending = 0
        for name, cache in kg.caches.items():
            saved_keys: set[bytes] = set()
            if name in plan.files:
                decode = cache.codec.decode
                renames = plan.operators.timers if name == TIME_STORE else None
                source = plan.operators.sources[name]
                for key, raw in self._files.read_entries(
                    plan.savepoint, g, source, plan.files[name]
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
                    if pending >= SEED_CHUNK:
                        self._commit_chunk()
                        pending = 0
            for key, _ in kg.db.items(name):  # an iterator over the DB as it was
                if key not in saved_keys:
                    cache.put(key, DELETED)
                    pending += 1
                    if pending >= SEED_CHUNK:
                        self._commit_chunk()
                        pending = 0
            # A view built on the cache before (the time service's clock, whose index
            # of live timers StoreCache.put_new relies on) would miss these writes:
            # rebuilt from the seeded state when next used.
            cache.derived = None
        return entries

    def done(self, g: int, plan: SeedPlan) -> None:
        """The key group's positions are at the savepoint's: it descends from it now."""
        self._marks.seeded(g, plan.savepoint, plan.checkpoint)
