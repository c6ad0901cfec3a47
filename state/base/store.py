"""The bytes-level contract of a key group's local state database.

A key group (partition index ``g`` of the app's inputs) is the unit that moves
between instances, so each key group has its own database with one column per
store plus ``__meta``. The epoch cache (:mod:`state.cache`) sits on top and is the
only writer: it applies one committed epoch at a time with :meth:`KeyGroupStore.apply`.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from typing import Protocol

#: store name -> key -> new value bytes, or ``None`` to delete the key.
Writes = Mapping[str, Mapping[bytes, bytes | None]]

META = "__meta"
FORMAT_VERSION = b"1"
META_FORMAT = b"format_version"
META_CHECKPOINT = b"checkpoint"
META_CHANGELOG_PREFIX = b"changelog_offset/"
#: Wall-clock ms of the last write (changelog tombstones expire from compacted topics).
META_UPDATED_MS = b"updated_ms"


class KeyGroupStore(Protocol):
    """The committed state of one key group.

    Contract: the database always holds the state of one committed checkpoint; writes
    reach it only through :meth:`apply`, which is atomic across stores and ``__meta``
    (all of a batch survives a crash, or none of it).
    """

    key_group: int

    def get(self, store: str, key: bytes) -> bytes | None:
        """Return the committed value of ``key`` in ``store``, or ``None``."""
        ...

    def apply(self, writes: Writes, meta: Mapping[bytes, bytes]) -> None:
        """Atomically write ``writes`` and the ``meta`` entries (durable on return)."""
        ...

    def get_meta(self, key: bytes) -> bytes | None:
        """Return a ``__meta`` entry, or ``None``."""
        ...

    def items(self, store: str) -> Iterator[tuple[bytes, bytes]]:
        """Iterate the committed entries of ``store`` in key order."""
        ...

    def iter_from(
        self, store: str, start: bytes | None, limit: int
    ) -> Iterator[tuple[bytes, bytes]]:
        r"""Iterate at most ``limit`` committed entries of ``store`` from ``start`` on.

        Keys come in bytewise order, starting with ``start`` itself when present
        (``None`` starts at the first key); ``start + b"\x00"`` is the first key after
        ``start``. Consume the iterator before the next :meth:`apply`: what it yields
        after a write is unspecified.
        """
        ...

    def close(self) -> None:
        """Release the database (and its lock). Idempotent."""
        ...


class StateBackend(Protocol):
    """Opens key group databases for an app."""

    def open(self, app: str, key_group: int, stores: Sequence[str]) -> KeyGroupStore:
        """Open (creating when missing) the database of ``key_group``.

        Raises:
            state.exceptions.StateFormatError: the database has a format this build
                cannot read.
        """
        ...

    def destroy(self, app: str, key_group: int) -> None:
        """Delete the local database of ``key_group`` (it must be closed)."""
        ...


def checkpoint_of(store: KeyGroupStore) -> int:
    """Return the last checkpoint id applied to ``store`` (0 when none)."""
    raw = store.get_meta(META_CHECKPOINT)
    return int(raw) if raw else 0


def changelog_offset_of(store: KeyGroupStore, name: str) -> int:
    """Return the next changelog offset to read for store ``name`` (0 when none)."""
    raw = store.get_meta(META_CHANGELOG_PREFIX + name.encode())
    return int(raw) if raw else 0
