"""Joins between co-partitioned inputs, and global (broadcast) tables.

* :class:`Table` — a co-partitioned input kept as a *versioned* table in keyed state: every
  record is a version ``(timestamp, value)`` of its key (``None`` = deleted). A stream
  joins it *as of* each record's timestamp (:meth:`processors.Stream.join_asof`): the
  version with the greatest timestamp at or before the record's, so the result does not
  depend on which input the runtime happened to read first. Versions older than
  ``retention_ms`` behind the newest one of the key are dropped, keeping the newest of
  them (it still answers lookups at later times); a deleted key keeps one deletion
  (so a late, older record does not bring it back) until the table's ``ttl_ms``.
* :class:`IntervalJoin` — stream–stream join on record timestamps
  (:meth:`processors.Stream.interval_join`): a left record at ``t`` matches every right
  record of the same key with a timestamp in ``[t + lower_ms, t + upper_ms]``, whichever
  arrives first. Both sides are buffered per key in keyed state and purged once they can
  no longer match.
* :class:`GlobalTable` — a topic every instance reads whole (reference data, rules,
  feature flags): read-only from every key group, in memory. Declared with
  ``retention_ms`` it is *versioned* like :class:`Table` (Kafka Streams' versioned
  stores): every record is a version of its key at its record timestamp, and
  :meth:`GlobalTable.get_as_of` looks a key up as of a time, without co-partitioning.

All state lives in ordinary keyed stores, so it is checkpointed, restored and savepointed
like any other store, exactly once.
"""

from __future__ import annotations

import bisect
from typing import Any

from processors.exceptions import ConfigError
from state.codecs import JSON, STR, Codec
from state.primitives import ValueState

__all__ = ["GlobalTable", "IntervalJoin", "Table", "insert_version", "version_at"]

#: Default retention of table versions behind the newest version of a key: one day.
DEFAULT_RETENTION_MS = 86_400_000


def insert_version(
    versions: list[list[Any]], ts: int, value: Any, retention_ms: int
) -> list[list[Any]]:
    """Return ``versions`` with ``[ts, value]`` added, older versions pruned.

    ``versions`` is sorted by timestamp; a version with the same timestamp is replaced
    (the later record wins). Versions more than ``retention_ms`` older than the newest
    are dropped, except the newest of them (it is the answer for lookups up to the
    next version). Deletions are versions like any other and are never dropped on their
    own: a late record with an older timestamp must not bring a deleted key back.

    Contract: the result is sorted, has unique timestamps, and
    ``version_at(result, t) == version_at(all versions ever inserted, t)`` for every
    ``t >= newest - retention_ms``.
    """
    i = bisect.bisect_left(versions, ts, key=_stamp)
    if i < len(versions) and versions[i][0] == ts:
        versions[i] = [ts, value]
    else:
        versions.insert(i, [ts, value])
    cutoff = versions[-1][0] - retention_ms
    # Keep the newest version at or before the cutoff, and everything after it.
    first = bisect.bisect_right(versions, cutoff, key=_stamp) - 1
    if first > 0:
        del versions[:first]
    return versions


def version_at(versions: list[list[Any]], ts: int) -> Any:
    """The value of the newest version at or before ``ts`` (``None``: none, or deleted)."""
    i = bisect.bisect_right(versions, ts, key=_stamp)
    return versions[i - 1][1] if i else None


def _stamp(version: list[Any]) -> int:
    return version[0]  # type: ignore[no-any-return]


class Table:
    """A co-partitioned input topic kept as a versioned table (see the module docs).

    Created by :meth:`processors.App.table`. Lookups see the current record's key.
    """

    def __init__(self, topic: str, store: ValueState[list[list[Any]]], retention_ms: int) -> None:
        self.topic = topic
        self.retention_ms = retention_ms
        self._store = store

    def update(self, key: Any, value: Any, ctx: Any) -> None:
        """Record ``value`` (``None``: deleted) as the key's version at the record's timestamp.

        The handler of the table's input topic.
        """
        versions = self._store.value() or []
        self._store.update(insert_version(versions, ctx.timestamp, value, self.retention_ms))

    def as_of(self, ts: int) -> Any:
        """The current key's value as of ``ts`` (``None``: no version then, or deleted)."""
        versions = self._store.value()
        return version_at(versions, ts) if versions else None

    def latest(self) -> Any:
        """The current key's newest value (``None``: none, or deleted)."""
        versions = self._store.value()
        return versions[-1][1] if versions else None


class IntervalJoin:
    """Buffers both sides of a stream–stream interval join per key (see the module docs).

    A record at ``t`` advances the key's time to ``max(time, t)`` (kept in state with the
    buffers, so a late record does not move it back while anything is buffered; once both
    sides are purged the key's state goes, and a later late record starts afresh); a
    buffered left record at ``l`` is dropped once ``l + upper_ms < time - grace_ms`` and
    a right record at ``r`` once ``r - lower_ms < time - grace_ms``: no record within
    ``grace_ms`` of the key's newest can match them any more. At most ``max_per_key``
    records per side and key are kept (the oldest go first).

    State: the left store holds ``[time, left records]``, the right store the right
    records; records are ``[timestamp, value]`` in arrival order.
    """

    def __init__(
        self,
        left: ValueState[list[Any]],
        right: ValueState[list[list[Any]]],
        lower_ms: int,
        upper_ms: int,
        grace_ms: int,
        max_per_key: int,
    ) -> None:
        if lower_ms > upper_ms:
            raise ValueError(f"interval join: lower_ms {lower_ms} > upper_ms {upper_ms}")
        self._left = left
        self._right = right
        self.lower_ms = lower_ms
        self.upper_ms = upper_ms
        self.grace_ms = grace_ms
        self.max_per_key = max_per_key

    def _load(self, ts: int) -> tuple[int, list[list[Any]], list[list[Any]]]:
        stored = self._left.value()
        time, lefts = (stored[0], stored[1]) if stored else (ts, [])
        return max(time, ts), lefts, self._right.value() or []

    def on_left(self, value: Any, ts: int) -> list[tuple[Any, Any]]:
        """Buffer a left record; return ``(left, right)`` for every match buffered."""
        time, lefts, rights = self._load(ts)
        lo, hi = ts + self.lower_ms, ts + self.upper_ms
        matches = [(value, r[1]) for r in rights if lo <= r[0] <= hi]
        lefts.append([ts, value])
        self._store(time, lefts, rights)
        return matches

    def on_right(self, value: Any, ts: int) -> list[tuple[Any, Any]]:
        """Buffer a right record; return ``(left, right)`` for every match buffered."""
        time, lefts, rights = self._load(ts)
        lo, hi = ts - self.upper_ms, ts - self.lower_ms
        matches = [(lv[1], value) for lv in lefts if lo <= lv[0] <= hi]
        rights.append([ts, value])
        self._store(time, lefts, rights)
        return matches

    def _store(self, time: int, lefts: list[list[Any]], rights: list[list[Any]]) -> None:
        horizon = time - self.grace_ms
        lefts = [e for e in lefts if e[0] + self.upper_ms >= horizon][-self.max_per_key :]
        rights = [e for e in rights if e[0] - self.lower_ms >= horizon][-self.max_per_key :]
        if lefts or rights:
            self._left.update([time, lefts])
        else:
            self._left.clear()  # nothing can match any more: the key's time goes too
        if rights:
            self._right.update(rights)
        else:
            self._right.clear()


class GlobalTable:
    """A topic every instance reads whole: read-only reference data, in memory.

    Created by :meth:`processors.App.global_table`. The runtime loads it to the end
    before the instance reports ready and keeps applying its new records between
    batches, on the loop's thread (handlers never see a half-applied record). Kept in
    memory: meant for reference data that fits in it.

    Plain (``retention_ms`` None): :meth:`get` returns the value of the key's last record
    read. Versioned (``retention_ms`` given): every record is a version of its key at its
    record timestamp (a ``None`` value deletes the key from that time on), kept as
    :func:`insert_version` keeps a :class:`Table`'s: versions more than ``retention_ms``
    older than the key's newest are dropped, except the newest of them. :meth:`get`
    then returns the value of the newest version *by timestamp* (a record that arrives
    late with an older timestamp does not replace it), and :meth:`get_as_of` the value
    as of a time: lookups at ``t >= newest - retention_ms`` of the key are exact; older
    ones may answer ``default`` because their versions were dropped.
    """

    def __init__(
        self, topic: str, key: Codec = STR, value: Codec = JSON, retention_ms: int | None = None
    ) -> None:
        if retention_ms is not None and retention_ms < 0:
            raise ValueError(f"global table {topic!r}: retention_ms must be >= 0")
        self.topic = topic
        self.key_codec = key
        self.value_codec = value
        self.retention_ms = retention_ms
        self._data: dict[Any, Any] = {}
        #: Versioned: key -> ``[[timestamp, value or None], ...]`` sorted by timestamp.
        self._versions: dict[Any, list[list[Any]]] = {}

    @property
    def versioned(self) -> bool:
        """Whether the table keeps versions (declared with ``retention_ms``)."""
        return self.retention_ms is not None

    def get(self, key: Any, default: Any = None) -> Any:
        """The latest value of ``key`` (``default`` when absent or deleted).

        Versioned: the value of the version with the greatest timestamp.
        """
        if self.retention_ms is None:
            return self._data.get(key, default)
        versions = self._versions.get(key)
        latest = versions[-1][1] if versions else None
        return default if latest is None else latest

    def get_as_of(self, key: Any, timestamp: int, default: Any = None) -> Any:
        """The value of ``key`` as of ``timestamp`` (ms): its newest version at or before it.

        Returns ``default`` when the key had no version then, was deleted then, or the
        versions of that time were dropped (older than ``retention_ms`` behind the
        key's newest version).

        Raises:
            ConfigError: the table is not versioned (declare it with ``retention_ms``).
        """
        if self.retention_ms is None:
            raise ConfigError(
                f"global table {self.topic!r} keeps no versions: declare it with "
                "app.global_table(..., retention_ms=...) to look keys up as of a time"
            )
        versions = self._versions.get(key)
        value = version_at(versions, timestamp) if versions else None
        return default if value is None else value

    def __contains__(self, key: object) -> bool:
        return self.get(key, _ABSENT) is not _ABSENT

    def __len__(self) -> int:
        if self.retention_ms is None:
            return len(self._data)
        return sum(1 for v in self._versions.values() if v and v[-1][1] is not None)

    def items(self) -> list[tuple[Any, Any]]:
        """A snapshot of every (key, latest value), deleted keys left out."""
        if self.retention_ms is None:
            return list(self._data.items())
        return [(k, v[-1][1]) for k, v in self._versions.items() if v and v[-1][1] is not None]

    def apply(self, raw_key: bytes | None, raw_value: bytes | None, timestamp: int = 0) -> None:
        """Apply one record of the topic (a ``None`` value deletes the key).

        Args:
            raw_key: The record's key bytes.
            raw_value: The record's value bytes, None for a tombstone.
            timestamp: The record's timestamp in ms (a versioned table's version time).

        Raises:
            Exception: whatever the codecs raise on an undecodable record.
        """
        key = None if raw_key is None else self.key_codec.decode(raw_key)
        value = None if raw_value is None else self.value_codec.decode(raw_value)
        if self.retention_ms is not None:
            versions = self._versions.setdefault(key, [])
            insert_version(versions, timestamp, value, self.retention_ms)
        elif value is None:
            self._data.pop(key, None)
        else:
            self._data[key] = value

    def clear(self) -> None:
        """Forget everything (before a reload)."""
        self._data.clear()
        self._versions.clear()


#: Marks a missing key in :meth:`GlobalTable.__contains__`.
_ABSENT = object()
