"""In-memory key group stores with the same contract as the RocksDB ones.

Nothing survives the process: on restart every key group is restored from its
changelog. Within a process a store survives close/open (like a local disk).
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Iterator, Mapping, Sequence

from state.base.store import FORMAT_VERSION, META, META_FORMAT, Writes

__all__ = ["MemoryBackend", "MemoryKeyGroupStore"]


class MemoryKeyGroupStore:
    """One key group's state held in dicts."""

    def __init__(self, key_group: int, stores: Sequence[str]) -> None:
        self.key_group = key_group
        self._data: dict[str, dict[bytes, bytes]] = {n: {} for n in [*stores, META]}
        self._data[META][META_FORMAT] = FORMAT_VERSION
        self._sorted: dict[str, list[bytes]] = {}  # sorted keys per store, until a write

    def ensure_stores(self, stores: Sequence[str]) -> None:
        """Add empty stores that are not there yet."""
        for name in stores:
            self._data.setdefault(name, {})

    def get(self, store: str, key: bytes) -> bytes | None:
        """Return the committed value of ``key`` in ``store``, or ``None``."""
        return self._data[store].get(key)

    def apply(self, writes: Writes, meta: Mapping[bytes, bytes]) -> None:
        """Write ``writes`` and ``meta`` (atomic: nothing else runs in between)."""
        for store, entries in writes.items():
            self._sorted.pop(store, None)
            data = self._data[store]
            for key, value in entries.items():
                if value is None:
                    data.pop(key, None)
                else:
                    data[key] = value
        self._data[META].update(meta)

    def get_meta(self, key: bytes) -> bytes | None:
        """Return a ``__meta`` entry, or ``None``."""
        return self._data[META].get(key)

    def items(self, store: str) -> Iterator[tuple[bytes, bytes]]:
        """Iterate the entries of ``store`` in key order."""
        yield from sorted(self._data[store].items())

    def iter_from(
        self, store: str, start: bytes | None, limit: int
    ) -> Iterator[tuple[bytes, bytes]]:
        """Iterate at most ``limit`` entries of ``store`` from ``start`` (inclusive) on.

        The sorted key list is kept until the next write to ``store``, so scanning a
        store in steps costs one sort per write, not one per step.
        """
        keys = self._sorted.get(store)
        if keys is None:
            keys = self._sorted[store] = sorted(self._data[store])
        data = self._data[store]
        i = 0 if start is None else bisect_left(keys, start)
        for key in keys[i : i + max(0, limit)]:
            yield key, data[key]

    def close(self) -> None:
        """Nothing to release."""


class MemoryBackend:
    """Keeps key group stores in memory for the life of the process."""

    def __init__(self) -> None:
        self._stores: dict[tuple[str, int], MemoryKeyGroupStore] = {}

    def open(self, app: str, key_group: int, stores: Sequence[str]) -> MemoryKeyGroupStore:
        """Return the store of ``key_group``, creating it when missing."""
        store = self._stores.get((app, key_group))
        if store is None:
            store = self._stores[(app, key_group)] = MemoryKeyGroupStore(key_group, stores)
        store.ensure_stores(stores)
        return store

    def destroy(self, app: str, key_group: int) -> None:
        """Forget the store of ``key_group``."""
        self._stores.pop((app, key_group), None)
