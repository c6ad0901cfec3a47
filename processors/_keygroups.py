"""Key groups: the per-partition unit of state, and its restore from the changelog."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

from confluent_kafka import Consumer, TopicPartition

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

#: A local DB not updated for this long is rebuilt: changelog compaction may have removed
#: tombstones written since (topic default delete.retention.ms is 24 h).
_MAX_LOCAL_AGE_MS = 20 * 3600 * 1000


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
    ) -> None:
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
            if updated is not None and time.time() * 1000 - int(updated) > _MAX_LOCAL_AGE_MS:
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
        for name in stores:
            end = ends[(topics[name], index)]
            if starts[name] < end:
                total += self._replay(db, name, topics[name], index, starts[name], end)
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
        try:
            while not done:
                msgs: list[Any] = consumer.consume(5000, 0.1)
                for msg in msgs:
                    err = msg.error()
                    if err is not None:
                        if err.code() == PARTITION_EOF:
                            continue  # the LSO, not necessarily the end we need
                        if err.fatal():
                            raise FatalKafkaError(f"changelog {topic}[{index}]: {err}")
                        log.warning("changelog read error (retrying)", extra={"error": str(err)})
                        continue
                    pending[msg.key()] = msg.value()
                    last = msg.offset()
                    count += 1
                if last + 1 >= end:
                    done = True
                elif not msgs:
                    # Aborted records and markers are skipped: the position passes them.
                    done = consumer.position([tp])[0].offset >= end
                if pending and (done or len(pending) >= self._batch):
                    db.apply(
                        {store: pending},
                        {
                            meta_key: str(last + 1).encode(),
                            META_UPDATED_MS: str(int(time.time() * 1000)).encode(),
                        },
                    )
                    pending = {}
                    crash_point("mid_restore")
                self._progress(len(msgs), max(0, end - last - 1))
        finally:
            consumer.unassign()
        return count
