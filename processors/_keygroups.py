"""Key groups: the per-partition unit of state, and its restore from the changelog."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

from confluent_kafka import Consumer, TopicPartition

from processors._errors import Stopping
from processors._faults import crash_point
from processors._kafka import PARTITION_EOF
from processors.exceptions import FatalKafkaError
from state.base.store import (
    META_CHANGELOG_PREFIX,
    META_UPDATED_MS,
    KeyGroupStore,
    StateBackend,
    changelog_offset_of,
)
from state.cache import StoreCache, changelog_topic
from state.primitives import StateHandle

log = logging.getLogger("lockgate.restore")

#: The changelog's tombstone retention when the topic does not say (Kafka's default).
_DEFAULT_TOMBSTONE_RETENTION_MS = 24 * 3600 * 1000
#: A local DB not updated for this share of the tombstone retention is rebuilt:
#: compaction may have removed tombstones written since.
_MAX_AGE_SHARE = 0.8


class KeyGroup:
    """State of one key group owned by this instance.

    Attributes:
        index: the key group (= partition index of every input topic).
        db: the committed state (local database).
        caches: the epoch cache of each store.
        bindings: (handle, cache) pairs to point the app's handles at this key group.
    """

    __slots__ = ("bindings", "caches", "db", "index")

    def __init__(self, index: int, db: KeyGroupStore, handles: dict[str, StateHandle]) -> None:
        self.index = index
        self.db = db
        self.caches = {name: StoreCache(name, h.spec.codec, db) for name, h in handles.items()}
        self.bindings = [(h, self.caches[name]) for name, h in handles.items()]

    def bind(self) -> None:
        """Make the app's state handles read and write this key group."""
        for handle, cache in self.bindings:
            handle.bind(cache)

    def discard(self) -> None:
        """Drop every uncommitted change (the epoch aborted)."""
        for cache in self.caches.values():
            cache.discard()

    def close(self) -> None:
        """Drop the caches and close the database."""
        self.discard()
        self.db.close()


class Restorer:
    """Brings a key group's local database up to the end of its changelogs.

    Reads changelog partition ``g`` of every store with ``read_committed`` from the
    offset recorded in ``__meta`` up to the last stable offset, applying batches
    atomically together with the new offset, so an interrupted restore resumes.
    """

    def __init__(
        self,
        app: str,
        backend: StateBackend,
        consumer: Consumer,
        end_offsets: Callable[[list[TopicPartition]], dict[tuple[str, int], int]],
        progress: Callable[[int, int], None],
        batch_records: int = 20_000,
        should_stop: Callable[[], bool] = lambda: False,
        stall_timeout_s: float = 90.0,
        tombstone_retention_ms: int | None = None,
    ) -> None:
        """Create a restorer.

        Args:
            app: the app name (changelog topics are named after it).
            backend: where key group databases live.
            consumer: a group-less ``read_committed`` consumer for the changelogs.
            end_offsets: returns the high watermark of changelog partitions.
            progress: called with (records read, records remaining) per batch.
            batch_records: records applied per atomic write.
            should_stop: checked per batch; true stops the restore with
                :class:`processors._errors.Stopping` (it resumes from the applied part).
            stall_timeout_s: a restore that reads nothing new for this long fails
                (an open transaction there lasts at most the transaction timeout).
            tombstone_retention_ms: the changelogs' ``delete.retention.ms``; a local DB
                older than 80% of it is rebuilt from the changelog.
        """
        self._should_stop = should_stop
        self._stall_timeout_s = stall_timeout_s
        retention = (
            _DEFAULT_TOMBSTONE_RETENTION_MS
            if tombstone_retention_ms is None
            else tombstone_retention_ms
        )
        self._max_age_ms = int(retention * _MAX_AGE_SHARE)
        self._app = app
        self._backend = backend
        self._consumer = consumer
        self._end_offsets = end_offsets
        self._progress = progress
        self._batch = batch_records

    def open(self, index: int, handles: dict[str, StateHandle]) -> KeyGroup:
        """Open and restore key group ``index``; blocks until it is up to date.

        The target of each changelog partition is its high watermark, read with
        ``read_committed``: everything committed before the assignment is applied, and a
        transaction still open there (a dead owner's) is waited out (at most the
        transaction timeout), never cut short at the last stable offset — committed
        records of a later owner may already sit behind it.
        """
        stores = list(handles)
        started = time.monotonic()
        db = self._backend.open(self._app, index, stores)
        try:
            return self._restore(db, index, handles, started)
        except BaseException:
            db.close()
            raise

    def _restore(
        self, db: KeyGroupStore, index: int, handles: dict[str, StateHandle], started: float
    ) -> KeyGroup:
        stores = list(handles)
        topics = {name: changelog_topic(self._app, name) for name in stores}
        ends = self._end_offsets([TopicPartition(t, index) for t in topics.values()])
        starts = {name: changelog_offset_of(db, name) for name in stores}
        reason = None
        if any(starts[n] > ends[(topics[n], index)] for n in stores):
            reason = "local state is ahead of the changelog (was the changelog recreated?)"
        else:
            updated = db.get_meta(META_UPDATED_MS)
            if updated is not None and time.time() * 1000 - int(updated) > self._max_age_ms:
                # Compaction may have dropped tombstones written since (delete.retention.ms).
                reason = "local state is older than the changelog's tombstone retention"
        if reason is not None:
            log.warning(
                "%s: rebuilding it from the changelog",
                reason,
                extra={"key_group": index, "path": str(getattr(db, "path", ""))},
            )
            db.close()
            self._backend.destroy(self._app, index)
            db = self._backend.open(self._app, index, stores)
            starts = dict.fromkeys(stores, 0)
        total = 0
        # The age of the local state is the time it was last complete: a restore that
        # stops halfway keeps the older time (tombstones in the unread part may be
        # compacted away meanwhile); a fresh DB is as old as this restore's start.
        if db.get_meta(META_UPDATED_MS) is None:
            db.apply({}, {META_UPDATED_MS: str(int(time.time() * 1000)).encode()})
        for name in stores:
            end = ends[(topics[name], index)]
            if starts[name] < end:
                total += self._replay(db, name, topics[name], index, starts[name], end)
        db.apply({}, {META_UPDATED_MS: str(int(time.time() * 1000)).encode()})
        log.info(
            "key group restored",
            extra={
                "key_group": index,
                "records": total,
                "seconds": round(time.monotonic() - started, 3),
            },
        )
        return KeyGroup(index, db, handles)

    def _replay(
        self, db: KeyGroupStore, store: str, topic: str, index: int, start: int, end: int
    ) -> int:
        consumer = self._consumer
        tp = TopicPartition(topic, index)
        consumer.assign([TopicPartition(topic, index, start)])
        meta_key = META_CHANGELOG_PREFIX + store.encode()
        pending: dict[bytes, bytes | None] = {}
        last = start - 1
        count = 0
        done = False
        progressed = time.monotonic()
        position = start
        try:
            while not done:
                if self._should_stop():
                    raise Stopping(f"restore of {topic}[{index}]")
                msgs: list[Any] = consumer.consume(5000, 0.1)
                for msg in msgs:
                    err = msg.error()
                    if err is not None:
                        if err.code() == PARTITION_EOF:
                            # The LSO, not necessarily the end we need; but every record
                            # below it was read or skipped: also records deleted below the
                            # log start (`lockgate reset` empties changelogs with
                            # delete_records; the consumer's position does not say so).
                            eof = msg.offset()
                            if eof is not None and eof > position:
                                position = eof
                            continue
                        if err.fatal():
                            raise FatalKafkaError(f"changelog {topic}[{index}]: {err}")
                        log.warning("changelog read error (retrying)", extra={"error": str(err)})
                        continue
                    pending[msg.key()] = msg.value()
                    last = msg.offset()
                    count += 1
                    progressed = time.monotonic()  # data, not error events
                if last + 1 >= end:
                    done = True
                elif not msgs:
                    # Aborted records and markers are skipped: the position passes them.
                    now_at = consumer.position([tp])[0].offset
                    if now_at > position:  # skipped aborted records and markers
                        position = now_at
                        progressed = time.monotonic()
                    done = position >= end
                    if not done and time.monotonic() - progressed > self._stall_timeout_s:
                        raise FatalKafkaError(
                            f"restore of changelog {topic}[{index}] made no progress for "
                            f"{self._stall_timeout_s:.0f}s at offset {max(position, last + 1)} "
                            f"of {end} (an open transaction that never ends, or the broker is "
                            "unreachable); the instance stops and restarts the restore"
                        )
                if pending and (done or len(pending) >= self._batch):
                    db.apply(
                        {store: pending},
                        {meta_key: str(last + 1).encode()},
                    )
                    pending = {}
                    crash_point("mid_restore")
                self._progress(len(msgs), max(0, end - last - 1))
        finally:
            consumer.unassign()
        return count
