"""Keyed state handles, in the style of Flink's keyed state.

A handle is declared once (``app.value_state("total")``) and used inside the
record handler without passing the key: it always reads and writes the state of
the record being processed. Values returned by ``value()``/``get()`` may be
mutated only if the change is then written back (``update``/``put``/``add``);
state changes are visible to later records at once and become durable when the
epoch commits.

TTL (``ttl_ms``) is processing time: an entry not written for ``ttl_ms`` reads as
absent. Expired entries are deleted when next read, and in the background by
:func:`sweep_key_group` (see docs/state.md).
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Generic, Protocol, TypeVar

from state.cache import DELETED, MISSING, KeyCursor, StoreCache
from state.codecs import JSON, Codec
from state.exceptions import StateError

__all__ = [
    "AggregatingState",
    "Aggregator",
    "ListState",
    "MapState",
    "ReducingState",
    "StateHandle",
    "StoreSpec",
    "ValueState",
    "live_value",
    "sweep_expired",
    "sweep_key_group",
]

#: Keys the TTL sweep examines per store, key group and epoch unless told otherwise.
DEFAULT_SWEEP_BUDGET = 1000

_IMMUTABLE = (type(None), int, float, str, bytes, bool, tuple, frozenset)

T = TypeVar("T")
A = TypeVar("A")
R = TypeVar("R")
T_in = TypeVar("T_in", contravariant=True)
R_out = TypeVar("R_out", covariant=True)


@dataclass(frozen=True)
class StoreSpec:
    """The definition of a store: its name (the address of its state), kind, codec, TTL.

    Attributes:
        name: the store name (its changelog is ``<app>.<name>.changelog``).
        kind: ``value``, ``list``, ``map``, ``reducing`` or ``aggregating``.
        codec: encodes the stored values.
        ttl_ms: processing-time TTL in ms, reset by writes; ``None``: no TTL.
        entry_ttl: map state only: every map entry has its own TTL (reset when that
            entry is written) instead of one TTL for the whole map.

    Raises:
        StateError: ``ttl_ms`` is not positive, or ``entry_ttl`` is set without
            ``ttl_ms`` or on a store that is not a map.
    """

    name: str
    kind: str
    codec: Codec = JSON
    ttl_ms: int | None = None
    entry_ttl: bool = False

    def __post_init__(self) -> None:
        if self.ttl_ms is not None and self.ttl_ms <= 0:
            raise StateError(f"store {self.name!r}: ttl_ms must be positive, got {self.ttl_ms}")
        if self.entry_ttl:
            if self.ttl_ms is None:
                raise StateError(f"store {self.name!r}: entry_ttl needs ttl_ms")
            if self.kind != "map":
                raise StateError(
                    f"store {self.name!r}: entry_ttl is for map state, not {self.kind} state"
                )


class _Unbound:
    """Stands in for a cache until the runtime binds a key group."""

    def __getattr__(self, name: str) -> Any:
        raise StateError(
            "keyed state can only be used while a record is processed (inside the handler)"
        )


_UNBOUND: Any = _Unbound()


class StateHandle:
    """Base of every keyed state handle. The runtime binds ``_cache`` per key group."""

    __slots__ = ("_cache", "_cursor", "_ttl", "spec")

    def __init__(self, spec: StoreSpec, cursor: KeyCursor) -> None:
        self.spec = spec
        self._cursor = cursor
        self._cache: StoreCache = _UNBOUND
        self._ttl = spec.ttl_ms

    def bind(self, cache: StoreCache | None) -> None:
        """Point this handle at a key group's cache (``None`` unbinds)."""
        self._cache = _UNBOUND if cache is None else cache

    def _key(self) -> bytes:
        key = self._cursor.key
        if key is None:
            raise StateError(f"state {self.spec.name!r} needs a record key, this record has none")
        return key

    def _read(self) -> Any:
        """Return the stored value of the current key, or DELETED."""
        key = self._key()
        value = self._cache.get(key)
        ttl = self.spec.ttl_ms
        if ttl is None or value is DELETED:
            return value
        expires, inner = value
        if expires <= self._cursor.now_ms:
            self._cache.put(key, DELETED)
            return DELETED
        return inner

    def _write(self, value: Any) -> None:
        ttl = self.spec.ttl_ms
        if ttl is not None and value is not DELETED:
            value = [self._cursor.now_ms + ttl, value]
        self._cache.put(self._key(), value)

    def clear(self) -> None:
        """Delete the current key's state."""
        self._cache.put(self._key(), DELETED)


class ValueState(StateHandle, Generic[T]):
    """One value per key."""

    __slots__ = ("default",)

    def __init__(self, spec: StoreSpec, cursor: KeyCursor, default: T | None = None) -> None:
        super().__init__(spec, cursor)
        self.default = default

    def value(self) -> T | None:
        """Return the current key's value, or the default when there is none."""
        if self._ttl is None:
            key = self._cursor.key
            if key is None:
                self._key()
            cache = self._cache
            value = cache.values.get(key, MISSING)  # type: ignore[arg-type]  # checked above
            if value is MISSING:  # not used this epoch: older generation, then the database
                value = cache.get(key)  # type: ignore[arg-type]  # checked above
        else:
            value = self._read()
        if value is DELETED:
            default = self.default
            # A fresh copy per key: a shared mutable default would leak between keys.
            return default if isinstance(default, _IMMUTABLE) else copy.deepcopy(default)
        return value

    def update(self, value: T) -> None:
        """Set the current key's value."""
        if self._ttl is None:
            key = self._cursor.key
            if key is None:
                self._key()
            self._cache.put(key, value)  # type: ignore[arg-type]  # checked above
        else:
            self._write(value)


class ListState(StateHandle, Generic[T]):
    """A list of values per key."""

    __slots__ = ()

    def get(self) -> list[T]:
        """Return the current key's list (empty when none)."""
        value = self._read()
        return [] if value is DELETED else list(value)

    def add(self, value: T) -> None:
        """Append ``value``."""
        current = self._read()
        if current is DELETED:
            current = []
        current.append(value)  # the cached list is private: get() hands out copies
        self._write(current)

    def add_all(self, values: Iterable[T]) -> None:
        """Append every value of ``values``."""
        current = self._read()
        if current is DELETED:
            current = []
        current.extend(values)
        self._write(current)

    def update(self, values: Iterable[T]) -> None:
        """Replace the list."""
        self._write(list(values))


class MapState(StateHandle, Generic[T]):
    """A map per key. With the JSON codec map keys must be strings.

    The whole map of a key is one stored value (one changelog record per epoch);
    keep maps small (thousands of entries, not millions).

    TTL: by default ``ttl_ms`` applies to the whole map and any write (``put`` or
    ``remove``) renews it. With ``StoreSpec(entry_ttl=True)`` each entry expires
    ``ttl_ms`` after its own last ``put``; reads skip expired entries, writes drop them
    from the stored map, and the map is deleted when its last entry expires. Stored as
    ``[expires_at, {map_key: [expires_at, value]}]``, entries in write order.
    """

    __slots__ = ("_entry_ttl",)

    def __init__(self, spec: StoreSpec, cursor: KeyCursor) -> None:
        super().__init__(spec, cursor)
        self._entry_ttl = spec.entry_ttl

    def _map(self) -> dict[str, T]:
        value = self._read()
        if value is DELETED:
            return {}
        if self._entry_ttl:
            now = self._cursor.now_ms
            return {k: e[1] for k, e in value.items() if e[0] > now}
        return value  # type: ignore[no-any-return]

    def _entries(self) -> dict[str, list[Any]]:
        """Return the stored entries (expired ones included), entry-TTL mode only."""
        value = self._read()
        return {} if value is DELETED else value

    def _live_entry(self, map_key: str) -> list[Any] | None:
        entry: list[Any] | None = self._entries().get(map_key)
        return entry if entry is not None and entry[0] > self._cursor.now_ms else None

    def _store_entries(self, entries: dict[str, list[Any]]) -> None:
        """Drop expired entries from the front (oldest writes) and write the map."""
        now = self._cursor.now_ms
        expired = []
        for map_key, entry in entries.items():
            if entry[0] > now:
                break
            expired.append(map_key)
        for map_key in expired:
            del entries[map_key]
        if not entries:
            self.clear()
            return
        # Entries are in write order, so the last one expires last.
        self._cache.put(self._key(), [next(reversed(entries.values()))[0], entries])

    def get(self, map_key: str, default: T | None = None) -> T | None:
        """Return the value of ``map_key`` for the current key."""
        if self._entry_ttl:
            entry = self._live_entry(map_key)
            return default if entry is None else entry[1]
        return self._map().get(map_key, default)

    def put(self, map_key: str, value: T) -> None:
        """Set ``map_key`` to ``value`` (with entry TTL: renews that entry only)."""
        if self._entry_ttl:
            entries = self._entries()  # the cached dict is private
            entries.pop(map_key, None)  # re-inserted last: entries stay in expiry order
            entries[map_key] = [self._cursor.now_ms + (self.spec.ttl_ms or 0), value]
            self._store_entries(entries)
            return
        current = self._map()  # the cached dict is private: readers get values or snapshots
        current[map_key] = value
        self._write(current)

    def remove(self, map_key: str) -> None:
        """Remove ``map_key`` (no error and no write when absent or expired)."""
        if self._entry_ttl:
            if self._live_entry(map_key) is None:
                return
            entries = self._entries()
            del entries[map_key]
            self._store_entries(entries)
            return
        current = self._map()
        if map_key not in current:
            return
        del current[map_key]
        if current:
            self._write(current)
        else:
            self.clear()

    def contains(self, map_key: str) -> bool:
        """Return whether ``map_key`` is set."""
        if self._entry_ttl:
            return self._live_entry(map_key) is not None
        return map_key in self._map()

    def items(self) -> Iterator[tuple[str, T]]:
        """Iterate the entries (a snapshot: safe to modify the state while iterating)."""
        return iter(list(self._map().items()))

    def keys(self) -> Iterator[str]:
        """Iterate the map keys (a snapshot)."""
        return iter(list(self._map()))

    def values(self) -> Iterator[T]:
        """Iterate the values (a snapshot)."""
        return iter(list(self._map().values()))

    def is_empty(self) -> bool:
        """Return whether the map has no (live) entries."""
        if self._entry_ttl:
            now = self._cursor.now_ms
            return not any(e[0] > now for e in reversed(self._entries().values()))
        return not self._map()


class ReducingState(StateHandle, Generic[T]):
    """Keeps ``reduce(reduce(v1, v2), v3)...`` of the values added for a key."""

    __slots__ = ("reduce",)

    def __init__(self, spec: StoreSpec, cursor: KeyCursor, reduce: Callable[[T, T], T]) -> None:
        super().__init__(spec, cursor)
        self.reduce = reduce

    def get(self) -> T | None:
        """Return the reduced value, or ``None`` when nothing was added."""
        value = self._read()
        return None if value is DELETED else value

    def add(self, value: T) -> None:
        """Fold ``value`` into the state."""
        current = self._read()
        self._write(value if current is DELETED else self.reduce(current, value))


class Aggregator(Protocol[T_in, A, R_out]):
    """Flink's AggregateFunction: an accumulator of type A, inputs T, result R."""

    def create_accumulator(self) -> A:
        """Return a new, empty accumulator."""
        ...

    def add(self, value: T_in, accumulator: A) -> A:
        """Return the accumulator with ``value`` added."""
        ...

    def get_result(self, accumulator: A) -> R_out:
        """Return the result for ``accumulator``."""
        ...


class AggregatingState(StateHandle, Generic[T, A, R]):
    """Keeps an accumulator per key; ``get`` returns the aggregator's result."""

    __slots__ = ("aggregator",)

    def __init__(self, spec: StoreSpec, cursor: KeyCursor, aggregator: Aggregator[T, A, R]):
        super().__init__(spec, cursor)
        self.aggregator = aggregator

    def get(self) -> R | None:
        """Return the aggregate of the values added so far, or ``None``."""
        acc = self._read()
        return None if acc is DELETED else self.aggregator.get_result(acc)

    def add(self, value: T) -> None:
        """Add ``value`` to the accumulator."""
        acc = self._read()
        if acc is DELETED:
            acc = self.aggregator.create_accumulator()
        self._write(self.aggregator.add(value, acc))


# -- TTL background sweep ------------------------------------------------------------------


def live_value(spec: StoreSpec, stored: Any, now_ms: int) -> Any:
    """Return what a handle of ``spec`` reads from ``stored`` at ``now_ms``.

    ``stored`` is a cached value (as :meth:`StoreCache.get` returns it); the result is
    :data:`DELETED` when absent or expired, else the value without its TTL envelope
    (for maps with entry TTL: a new dict of the live entries). Has no side effects.
    """
    if stored is DELETED or spec.ttl_ms is None:
        return stored
    expires, inner = stored
    if expires <= now_ms:
        return DELETED
    if spec.entry_ttl:
        return {k: e[1] for k, e in inner.items() if e[0] > now_ms}
    return inner


def _expires_at(value: Any) -> int | None:
    """Return the expiry of a decoded TTL envelope ``[expires_at, value]``, else None."""
    if type(value) in (list, tuple) and len(value) == 2 and type(value[0]) is int:
        return value[0]
    return None


def _raw_expires_at(raw: bytes, codec: Codec) -> int | None:
    """Return the expiry stored in the encoded envelope ``raw`` (None when unreadable).

    JSON envelopes are written by orjson as ``[<int>,...``: the expiry is parsed from
    the prefix without decoding the value. Other codecs decode the whole value.
    """
    if codec is JSON and raw[:1] == b"[":
        end = raw.find(b",", 1)
        if 1 < end < 22:
            try:
                return int(raw[1:end])
            except ValueError:
                pass
    try:
        return _expires_at(codec.decode(raw))
    except Exception:  # noqa: BLE001 - not an envelope (e.g. written before TTL was set)
        return None


def sweep_expired(cache: StoreCache, spec: StoreSpec, now_ms: int, budget: int) -> int:
    """Turn expired entries of one store into deletes of the open epoch; return how many.

    Examines at most ``budget`` committed entries of ``cache``'s store, in key order,
    from where the previous call stopped (``cache.sweep_cursor``); after the last key
    the next call starts over from the first. Every entry whose TTL envelope expired
    (``expires_at <= now_ms``, the rule reads apply) becomes :data:`DELETED` in the
    cache, so :meth:`StoreCache.drain` yields a tombstone for it and the runtime writes
    it to the changelog and, after the commit, the database, exactly like a user delete.

    The current value wins over the committed one: a key written in the open epoch (or
    written and drained but not applied yet) is judged by its cached value, so a fresh
    value is never deleted, and a key already deleted is not counted again. Entries
    that are not TTL envelopes (written before the store had a TTL) are skipped.

    A no-op returning 0 for a store without TTL or when ``budget <= 0``. Call it while
    the epoch is open (before :meth:`StoreCache.drain`). After an aborted epoch the
    deletes found are gone with the cache; they are found again on the next pass.

    Args:
        cache: the store's epoch cache in one key group.
        spec: the store's definition (its ``ttl_ms`` and codec).
        now_ms: processing time in ms (the same clock as ``KeyCursor.now_ms``).
        budget: the most committed entries to examine in this call.

    Returns:
        The number of entries marked deleted.
    """
    if spec.ttl_ms is None or budget <= 0:
        return 0
    batch = list(cache.db.iter_from(cache.name, cache.sweep_cursor, budget))
    cache.sweep_cursor = batch[-1][0] + b"\x00" if len(batch) == budget else None
    codec = cache.codec
    deleted = 0
    for key, raw in batch:
        cached = cache.peek(key)
        if cached is DELETED:
            continue
        expires = _raw_expires_at(raw, codec) if cached is MISSING else _expires_at(cached)
        if expires is not None and expires <= now_ms:
            cache.put(key, DELETED)
            deleted += 1
    return deleted


def sweep_key_group(
    caches: Mapping[str, StoreCache],
    handles: Mapping[str, StateHandle],
    now_ms: int,
    budget: int = DEFAULT_SWEEP_BUDGET,
) -> int:
    """Run :func:`sweep_expired` on every store with a TTL of one key group.

    The one call the runtime (and the test driver) makes per key group per epoch,
    before draining the caches. Costs at most ``budget`` database entries read per
    store with a TTL; stores without TTL cost nothing.

    Args:
        caches: the key group's caches by store name (``KeyGroup.caches``).
        handles: the app's state handles by store name (``App.stores``).
        now_ms: processing time in ms.
        budget: entries examined per store in this call.

    Returns:
        The number of entries marked deleted, over all stores.
    """
    total = 0
    for name, cache in caches.items():
        handle = handles.get(name)
        if handle is not None and handle.spec.ttl_ms is not None:
            total += sweep_expired(cache, handle.spec, now_ms, budget)
    return total
