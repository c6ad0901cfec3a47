"""The epoch cache: a write-back layer between state primitives and the database.

Reads go cache -> database. Writes only touch the cache and mark the key dirty.
At the end of an epoch :meth:`StoreCache.drain` hands the final value of every
dirty key to the runtime (for the changelog and, after the Kafka transaction has
committed, for :meth:`state.base.KeyGroupStore.apply`). Nothing reaches the
database before its epoch committed, so aborting an epoch is :meth:`discard`.
"""

from __future__ import annotations

from typing import Any, Final

from state.base.store import KeyGroupStore
from state.codecs import Codec

__all__ = ["DELETED", "MISSING", "KeyCursor", "StoreCache", "changelog_topic"]


class _Sentinel:
    __slots__ = ("_name",)

    def __init__(self, name: str) -> None:
        self._name = name

    def __repr__(self) -> str:
        return self._name


#: Not in the cache: read the database.
MISSING: Final[Any] = _Sentinel("MISSING")
#: Deleted (a tombstone) in the current epoch, or absent from the database.
DELETED: Final[Any] = _Sentinel("DELETED")


def changelog_topic(app: str, store: str) -> str:
    """Return the changelog topic of ``store`` in ``app`` (compacted, P partitions)."""
    return f"{app}.{store}.changelog"


class KeyCursor:
    """The record being processed, shared by all state handles of a runtime.

    Attributes:
        key: serialized key of the current record (the state key), or ``None``.
        now_ms: wall-clock time of the current batch in ms (for TTL).
    """

    __slots__ = ("key", "now_ms")

    def __init__(self) -> None:
        self.key: bytes | None = None
        self.now_ms: int = 0


class StoreCache:
    """The epoch cache of one store in one key group. One owner thread.

    Attributes:
        values: key -> decoded value, or :data:`DELETED`.
        dirty: keys written in the open epoch.
    """

    __slots__ = ("codec", "db", "dirty", "name", "values")

    def __init__(self, name: str, codec: Codec, db: KeyGroupStore) -> None:
        self.name = name
        self.codec = codec
        self.db = db
        self.values: dict[bytes, Any] = {}
        self.dirty: set[bytes] = set()

    def load(self, key: bytes) -> Any:
        """Read ``key`` from the database into the cache and return it (or DELETED)."""
        raw = self.db.get(self.name, key)
        value = DELETED if raw is None else self.codec.decode(raw)
        self.values[key] = value
        return value

    def get(self, key: bytes) -> Any:
        """Return the current value of ``key`` (or DELETED)."""
        value = self.values.get(key, MISSING)
        if value is MISSING:
            value = self.load(key)
        return value

    def put(self, key: bytes, value: Any) -> None:
        """Set ``key`` to ``value`` (DELETED deletes it) in the open epoch."""
        self.values[key] = value
        self.dirty.add(key)

    def drain(self) -> dict[bytes, bytes | None]:
        """Return the encoded final value of every dirty key and clear the dirty set.

        ``None`` marks a deletion. The cache keeps the values, so reads stay correct
        while the epoch commits.
        """
        encode = self.codec.encode
        values = self.values
        out: dict[bytes, bytes | None] = {}
        for key in self.dirty:
            value = values[key]
            out[key] = None if value is DELETED else encode(value)
        self.dirty.clear()
        return out

    def discard(self) -> None:
        """Forget everything cached, dirty or not (used when an epoch aborts)."""
        self.values.clear()
        self.dirty.clear()

    def trim(self, max_entries: int) -> None:
        """Drop the read cache when it holds more than ``max_entries`` (only when clean)."""
        if not self.dirty and len(self.values) > max_entries:
            self.values.clear()
