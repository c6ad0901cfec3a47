"""One app of a savepoint as the Spark tools read it: :class:`SavedApp`.

:func:`load_saved_app` reads the descriptor and every key group's manifest on the
driver and checks that the key groups agree on each store's kind and codec.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from state.savepoint import SavepointError, SavepointStore, StoreFile, check_savepoint_id

# ------------------------------------------------------------ a saved app


@dataclass(frozen=True)
class SavedApp:
    """One app of a savepoint, as read by :func:`load_saved_app`.

    Attributes:
        savepoint: the savepoint id.
        app: the app's name in it.
        descriptor: the whole ``_savepoint.json``.
        info: the descriptor's entry of the app.
        key_groups: P.
        manifests: key group -> its manifest (every group ``0..P-1``, none failed).
        stores: store name -> ``{"kind", "codec"}``, plus ``operator`` (and
            ``timers``) for a window or interval-join store saved with its operator id
            (a rewrite keeps them).
    """

    savepoint: str
    app: str
    descriptor: dict[str, Any]
    info: dict[str, Any]
    key_groups: int
    manifests: dict[int, dict[str, Any]]
    stores: dict[str, dict[str, str]]

    @property
    def inputs(self) -> list[str]:
        """The app's input topics (the registry's list, else the manifests' offsets)."""
        listed = [str(t) for t in self.info.get("inputs") or ()]
        return listed or sorted(self.manifests[0].get("offsets") or {})

    def cut(self, topic: str) -> dict[int, int]:
        """Key group (= partition of ``topic``) -> the savepoint's offset in ``topic``.

        Raises:
            SavepointError: a key group has no offset for ``topic``.
        """
        out = {}
        for g, m in sorted(self.manifests.items()):
            offset = (m.get("offsets") or {}).get(topic)
            if not isinstance(offset, int):
                raise SavepointError(
                    f"savepoint {self.savepoint}: key group {g} of {self.app!r} has no offset "
                    f"for {topic!r}"
                )
            out[g] = offset
        return out

    def files(self, store: str) -> dict[int, dict[str, Any]]:
        """Key group -> the manifest entry of ``store``'s file (groups that have one)."""
        out = {}
        for g, m in self.manifests.items():
            entry = (m.get("stores") or {}).get(store)
            if entry is not None:
                out[g] = StoreFile.from_dict(entry).to_dict()
        return out


def load_saved_app(location: SavepointStore, savepoint_id: str, app: str) -> SavedApp:
    """Read the descriptor and every key group's manifest of ``app`` in a savepoint.

    Raises:
        SavepointError: no such savepoint or app, a manifest is missing or records a
            failure, or the key groups disagree on a store's kind or codec.
    """
    check_savepoint_id(savepoint_id)
    descriptor = location.read_descriptor(savepoint_id)
    apps = descriptor.get("apps") or {}
    if app not in apps:
        raise SavepointError(
            f"savepoint {savepoint_id} has no app {app!r} (it has "
            f"{', '.join(sorted(apps)) or 'none'})"
        )
    info = dict(apps[app])
    key_groups = info.get("key_groups")
    if not isinstance(key_groups, int) or key_groups < 1:
        raise SavepointError(
            f"savepoint {savepoint_id}: app {app!r} has no valid key_groups ({key_groups!r})"
        )
    committed = {
        m.get("key_group"): dict(m) for m in info.get("manifests") or () if isinstance(m, dict)
    }
    manifests: dict[int, dict[str, Any]] = {}
    for g in range(key_groups):
        manifest = committed.get(g) or location.read_manifest(savepoint_id, app, g)
        if manifest.get("error"):
            raise SavepointError(
                f"savepoint {savepoint_id}: key group {g} of {app!r} failed: {manifest['error']}"
            )
        manifests[g] = manifest
    stores: dict[str, dict[str, str]] = {}
    for g, m in manifests.items():
        for name, entry in sorted((m.get("stores") or {}).items()):
            schema = {"kind": str(entry.get("kind")), "codec": str(entry.get("codec"))}
            schema.update({f: str(entry[f]) for f in ("operator", "timers") if entry.get(f)})
            if stores.setdefault(name, schema) != schema:
                raise SavepointError(
                    f"savepoint {savepoint_id}: store {name!r} of {app!r} is "
                    f"{stores[name]['kind']}/{stores[name]['codec']} in one key group and "
                    f"{schema['kind']}/{schema['codec']} in key group {g}"
                )
    return SavedApp(savepoint_id, app, descriptor, info, key_groups, manifests, stores)
