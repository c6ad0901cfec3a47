"""A savepoint's files for one app: where they go, what an export writes, what a restore checks.

Owns the savepoint location (``LOCKGATE_SAVEPOINT_DIR``: a directory or an fsspec URL,
opened on first use) and the format of a key group's part of a savepoint (its store
files and its manifest, state/savepoint.py). The runtime decides *when* a key group
exports (the epoch commit for source key groups, an aligned completion downstream,
processors/_runtime/savepoints.py for the protocol) and *what* a restore does with the
entries; this component does the reading and writing and says what is wrong with a
savepoint before anything is changed:

* an export never stops the app: a failure (no location, an I/O error, an earlier
  error carried by the request) is recorded in the manifest, which still goes into the
  epoch's transaction, so the savepoint fails and processing goes on;
* a restore reads the manifest as committed (the savepoint's descriptor), refuses a
  savepoint of another app, another key-group count or a failed key group, and checks
  the stores' kinds and codecs, the operators' mapping and every file's checksum before
  the first entry is written (:meth:`SavepointFiles.seed_plan`).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import orjson

from processors._checkpoint.control_topics import manifest_key
from processors._config.settings import Settings
from processors._dsl.app import App
from processors._runtime.operator_plan import (
    OperatorPlan,
    log_operator_plan,
    plan_operator_restore,
)
from processors._runtime.output import OutputWriter
from processors._task.keygroups import KeyGroup
from processors.exceptions import ConfigError
from state.cache import DELETED, MISSING
from state.savepoint import (
    SavepointError,
    SavepointStore,
    StoreFile,
    check_compatible,
    merged_items,
    state_version,
)

__all__ = ["SavepointFiles", "dirty_overlay"]

log = logging.getLogger("lockgate.savepoint")


def dirty_overlay(kg: KeyGroup) -> dict[str, dict[bytes, bytes | None]]:
    """The open epoch's changes of key group ``kg``, encoded, without draining them.

    Raises:
        Exception: whatever a store codec raises for a value it cannot encode.
    """
    overlay: dict[str, dict[bytes, bytes | None]] = {}
    for name, cache in kg.caches.items():
        changes: dict[bytes, bytes | None] = {}
        for key in cache.dirty:
            value = cache.peek(key)
            if value is MISSING:
                continue
            changes[key] = None if value is DELETED else cache.codec.encode(value)
        overlay[name] = changes
    return overlay


class SavepointFiles:
    """The savepoint files of one app (see the module docs).

    Args:
        name: the name the app runs under (its part of a savepoint).
        app: the app (its stores and operators).
        settings: the instance's settings (the location, the instance id, what a restore
            may leave behind).
        out: where a manifest is produced (into the open epoch transaction).
        control_topic: the app's ``<app>.control`` (manifests go to partition ``g``).
        beat: called after an export (a long export is not a stall).
    """

    def __init__(
        self,
        name: str,
        app: App,
        settings: Settings,
        out: OutputWriter,
        control_topic: str,
        beat: Callable[[], None],
    ) -> None:
        self._name = name
        self._app = app
        self._settings = settings
        self._out = out
        self._control_topic = control_topic
        self._beat = beat
        self._store: SavepointStore | None = None
        self._plan_logged: str | None = None

    def store_schemas(self) -> dict[str, dict[str, str]]:
        """Store name -> kind and codec, as registered and saved."""
        return {
            name: {"kind": h.spec.kind, "codec": h.spec.codec.name}
            for name, h in sorted(self._app.stores.items())
        }

    def state_version(self) -> str:
        """A short hash of the store schemas (changes when a store's definition does)."""
        return state_version(self.store_schemas())

    # -- export ---------------------------------------------------------------------------

    def store(self) -> SavepointStore:
        """Where savepoint files go (``LOCKGATE_SAVEPOINT_DIR``), opened on first use.

        Raises:
            SavepointError: the location is not set for this app's instances.
        """
        if self._store is None:
            url = self._settings.savepoint_dir
            if not url:
                raise SavepointError(
                    "LOCKGATE_SAVEPOINT_DIR is not set for this app's instances: they cannot "
                    "write savepoint files"
                )
            self._store = SavepointStore(url)
        return self._store

    def export(
        self,
        g: int,
        kg: KeyGroup,
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
                location = self.store()
                db = kg.db
                for name, handle in sorted(self._app.stores.items()):
                    items = merged_items(db.items(name), overlay.get(name, {}))
                    written = location.write_store(sp_id, self._name, g, name, items)
                    op = self._app.store_operator(name)
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
            "app": self._name,
            "key_group": g,
            "checkpoint": ckpt,
            "offsets": offsets,
            "align": align,
            "stores": stores,
            "state_version": self.state_version(),
            "error": error,
            "stop": bool(request.get("stop")),
            "instance": self._settings.instance_id,
            "ts": int(time.time() * 1000),
        }
        if error is None:
            try:
                self.store().write_manifest(sp_id, self._name, g, manifest)
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
        self._beat()
        return manifest

    def committed_manifest(self, sp_id: str, g: int, partitions: int) -> dict[str, Any]:
        """Return the committed manifest of key group ``g`` in savepoint ``sp_id``.

        Raises:
            ConfigError: the savepoint, this app in it, or the key group is missing, it
                was taken with another key-group count, or the key group failed.
        """
        location = self.store()
        try:
            descriptor = location.read_descriptor(sp_id)
        except SavepointError as exc:
            raise ConfigError(f"--from-savepoint {sp_id}: {exc}") from exc
        apps = descriptor.get("apps", {})
        if self._name not in apps:
            raise ConfigError(
                f"--from-savepoint {sp_id}: the savepoint has no app {self._name!r} "
                f"(it has {sorted(apps)}); set LOCKGATE_APP_NAME to the saved app's name"
            )
        saved_groups = int(apps[self._name].get("key_groups", -1))
        if saved_groups != partitions:
            raise ConfigError(
                f"--from-savepoint {sp_id}: app {self._name!r} was saved with {saved_groups} "
                f"key groups, its inputs now have {partitions} partitions (changing the "
                "key-group count needs a savepoint rewrite)"
            )
        # The descriptor holds the manifests as committed in the epoch transactions (a
        # manifest file may have been rewritten by a fenced, aborted exporter since).
        committed = [m for m in apps[self._name].get("manifests") or () if m.get("key_group") == g]
        if committed:
            manifest = dict(committed[0])
        else:
            try:
                manifest = location.read_manifest(sp_id, self._name, g)
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

    def seed_plan(
        self, sp_id: str, g: int, manifest: dict[str, Any], inputs: Iterable[str]
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
        if downstream and not manifest.get("stop") and not self._settings.allow_non_stop_restore:
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
                saved_stores, self._app.operators, self._settings.allow_non_restored_state
            )
            saved = {
                name: {
                    "kind": str(saved_stores[old].get("kind")),
                    "codec": str(saved_stores[old].get("codec")),
                }
                for name, old in plan.sources.items()
            }
            restore = check_compatible(
                saved, self.store_schemas(), self._settings.allow_non_restored_state
            )
            location = self.store()
            files: dict[str, StoreFile] = {}
            for name in restore:
                files[name] = StoreFile.from_dict(saved_stores[plan.sources[name]])
                location.verify_store(sp_id, self._name, g, plan.sources[name], files[name])
        except SavepointError as exc:
            raise ConfigError(f"--from-savepoint {sp_id}, key group {g}: {exc}") from exc
        self._log_operator_plan(sp_id, g, plan)
        offsets: dict[str, int] = {}
        for topic in inputs:
            offset = manifest.get("offsets", {}).get(topic)
            if offset is None:
                raise ConfigError(
                    f"--from-savepoint {sp_id}: key group {g} has no offset for input "
                    f"{topic!r} (the savepoint was taken with other inputs)"
                )
            offsets[topic] = int(offset)
        return plan, files, offsets

    def operator_stores(self) -> dict[str, list[str]]:
        """Operator id -> its stores, as registered (see :func:`moved_operator_state`)."""
        return {uid: list(info.stores) for uid, info in self._app.operators.items()}

    def _log_operator_plan(self, sp_id: str, g: int, plan: OperatorPlan) -> None:
        """Say (once per process) how the savepoint's operators map onto the app's."""
        if self._plan_logged != sp_id:
            self._plan_logged = sp_id
            log_operator_plan(sp_id, g, plan, bool(self._app.operators))

    def read_entries(
        self, sp_id: str, g: int, saved_store: str, file: StoreFile
    ) -> Iterator[tuple[bytes, bytes]]:
        """The entries of ``saved_store`` of key group ``g`` (checked by :meth:`seed_plan`)."""
        return self.store().read_store(sp_id, self._name, g, saved_store, file)
