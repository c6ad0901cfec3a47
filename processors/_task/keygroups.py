"""Key groups: the per-partition unit of state and its restore from the changelog.

Also the process-wide budgets of their memory (:class:`StateMemory`) and disk
(:class:`StateCleaner`).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from itertools import islice
from pathlib import Path
from typing import TYPE_CHECKING, Any

from confluent_kafka import Consumer, TopicPartition

from processors._config.settings import Settings
from processors._kafka.clients import PARTITION_EOF
from processors._kafka.errors import Stopping
from processors._kafka.faults import crash_point
from processors.exceptions import FatalKafkaError
from state.base.store import (
    META_CHANGELOG_PREFIX,
    META_UPDATED_MS,
    KeyGroupStore,
    StateBackend,
    changelog_offset_of,
)
from state.cache import DELETED, StoreCache, changelog_topic
from state.codecs import Codec
from state.primitives import StateHandle
from state.rocksdb.memory import RocksDBMemory
from state.rocksdb.store import RocksDBBackend

if TYPE_CHECKING:
    from processors._task.snapshots import StateSnapshots

log = logging.getLogger("lockgate.restore")

#: The changelog's tombstone retention when the topic does not say (Kafka's default).
_DEFAULT_TOMBSTONE_RETENTION_MS = 24 * 3600 * 1000
#: A local DB not updated for this share of the tombstone retention is rebuilt:
#: compaction may have removed tombstones written since.
_MAX_AGE_SHARE = 0.8

#: Memory assumed when neither the setting nor the cgroup gives a limit.
DEFAULT_MEMORY_LIMIT = 2 * 1024**3
#: Shares of the memory limit: RocksDB (block cache + memtables), the read cache. The rest
#: is for Python, the operator chain, librdkafka's buffers and the epoch's dirty entries.
ROCKSDB_SHARE = 0.25
READ_CACHE_SHARE = 0.25
#: Share of the limit that one epoch may fetch (value bytes) before it ends early.
EPOCH_SHARE = 1 / 128
#: Share for the input consumer's and the changelog reader's prefetch queues (each gets
#: this much: librdkafka's queue bound plus the fetch responses in flight).
CONSUMER_SHARE = 0.0625
_MIB = 1024 * 1024
#: A read-cache entry is counted at this many times its encoded key and value, plus
#: :data:`ENTRY_OVERHEAD_BYTES` (the dict slot, the key's bytes object, the decoded value's
#: object headers): an estimate, not a measurement.
ENTRY_SIZE_FACTOR = 2
ENTRY_OVERHEAD_BYTES = 120
#: What an entry is counted at before any was read or written.
_INITIAL_ENTRY_BYTES = 256
#: drained entries sized per drain: all up to this many, else a spread sample of this to
#: twice this many (the rest is extrapolated)
_SIZE_SAMPLE = 512
#: cgroup v2 and v1 files holding the container's memory limit.
_CGROUP_LIMITS = (
    Path("/sys/fs/cgroup/memory.max"),
    Path("/sys/fs/cgroup/memory/memory.limit_in_bytes"),
)


def cgroup_memory_limit(files: Iterable[Path] = _CGROUP_LIMITS) -> int | None:
    """Return the memory limit of this process's cgroup, or ``None`` when unlimited.

    Args:
        files: where to look, first hit wins (cgroup v2, then v1).

    Returns:
        the limit in bytes; ``None`` when no file is readable, says ``max``, or holds
        cgroup v1's "unlimited" (a value near 2**63).
    """
    for path in files:
        try:
            text = path.read_text().strip()
        except OSError:
            continue
        if not text.isdigit():
            return None  # "max"
        value = int(text)
        return None if value >= 2**60 else value
    return None


@dataclass(frozen=True)
class MemoryPlan:
    """How a process's memory limit is split.

    Attributes:
        limit_bytes: the limit the plan was derived from.
        limit_source: ``setting``, ``cgroup`` or ``default``.
        rocksdb_bytes: block cache + memtables of all key-group databases together.
        read_cache_bytes: the read cache of the whole process (estimated sizes).
        consumer_bytes: prefetched input of one consumer (:meth:`fetch_config`).
        epoch_bytes: input value bytes after which an epoch ends before its interval.
    """

    limit_bytes: int
    limit_source: str
    rocksdb_bytes: int
    read_cache_bytes: int
    consumer_bytes: int
    epoch_bytes: int

    def fetch_config(self) -> dict[str, int]:
        """The librdkafka fetch limits that keep a consumer's prefetch within ``consumer_bytes``.

        With librdkafka's defaults a consumer behind a backlog held about the whole input
        (measured: a bare consumer of a 256,000 x 1 KiB topic, 32 partitions, draining at
        20k records/s peaked at 366 MiB RSS; 112 MiB with a 1 MiB queue, 1 MiB fetches and
        64 KiB per partition). An eighth of the share bounds the queue
        (``queued.max.messages.kbytes``), a 32nd each fetch response (1..50 MiB: librdkafka
        refuses a ``fetch.max.bytes`` below ``message.max.bytes``, 1,000,000 by default), a
        quarter of that each partition's part (256 KiB..1 MiB). The input consumer takes
        none of them when the user set any fetch limit (``LOCKGATE_KAFKA__*``) itself.
        """
        fetch = min(50 * _MIB, max(_MIB, self.consumer_bytes // 32))
        return {
            # never above librdkafka's own default (64 MiB): a large limit does not loosen it
            "queued.max.messages.kbytes": min(65536, max(1024, self.consumer_bytes // 8 // 1024)),
            "fetch.max.bytes": fetch,
            "max.partition.fetch.bytes": min(_MIB, max(256 * 1024, fetch // 4)),
        }

    @classmethod
    def of(cls, settings: Settings, cgroup_limit: int | None = None) -> MemoryPlan:
        """Derive the plan from ``settings`` (explicit sizes win over shares of the limit).

        Args:
            settings: the instance's settings.
            cgroup_limit: the cgroup's memory limit (:func:`cgroup_memory_limit`).
        """
        if settings.memory_limit_bytes is not None:
            limit, source = settings.memory_limit_bytes, "setting"
        elif cgroup_limit is not None:
            limit, source = cgroup_limit, "cgroup"
        else:
            limit, source = DEFAULT_MEMORY_LIMIT, "default"
        rocksdb = settings.state_rocksdb_memory_bytes
        if rocksdb is None:
            rocksdb = max(4 * 1024 * 1024, int(limit * ROCKSDB_SHARE))
        cache = settings.state_cache_memory_bytes
        if cache is None:
            cache = int(limit * READ_CACHE_SHARE)
        return cls(
            limit,
            source,
            rocksdb,
            cache,
            consumer_bytes=max(16 * _MIB, int(limit * CONSUMER_SHARE)),
            epoch_bytes=max(_MIB, int(limit * EPOCH_SHARE)),
        )


#: Fetch limits (and librdkafka's alias of one) that, set by the user, replace the plan's.
_USER_FETCH_KEYS = (
    "queued.max.messages.kbytes",
    "fetch.max.bytes",
    "max.partition.fetch.bytes",
    "fetch.message.max.bytes",
)


def with_fetch_limits(conf: dict[str, Any], plan: MemoryPlan) -> dict[str, Any]:
    """Return ``conf`` with ``plan``'s fetch limits, unless it sets one of them already.

    The limits work together (librdkafka caps a fetch at the queue bound only when
    ``fetch.max.bytes`` is its default), so a user's own fetch limit replaces all of
    them. ``fetch.max.bytes`` is raised to ``message.max.bytes`` when that is larger
    (librdkafka refuses the consumer otherwise). The changelog reader never sees the
    user's fetch keys (``processors._kafka.clients._CONSUMER_ONLY``): it always takes the plan's.
    """
    if any(k in conf for k in _USER_FETCH_KEYS):
        return conf
    limits = plan.fetch_config()
    limits["fetch.max.bytes"] = max(
        limits["fetch.max.bytes"], int(conf.get("message.max.bytes", 1_000_000))
    )
    conf.update(limits)
    return conf


class ReadCacheBudget:
    """The read cache's memory in a process, split evenly over the caches registered.

    Every store of every owned key group registers its cache; after a commit each keeps
    what fits in ``total_bytes // caches`` at its estimated entry size (and at most the
    per-cache ceiling its caller passes to ``trim``). A process owning more key groups
    keeps fewer entries per key group, not more memory. One owner thread.

    Attributes:
        total_bytes: the read cache of the whole process.
    """

    def __init__(self, total_bytes: int) -> None:
        """Create a budget of ``total_bytes`` (>= 0); nothing registered."""
        self.total_bytes = total_bytes
        self._caches = 0

    @property
    def per_cache_bytes(self) -> int:
        """The bytes each registered cache may keep (``total_bytes`` while none is)."""
        return self.total_bytes // max(1, self._caches)

    def register(self, count: int) -> None:
        """Account ``count`` more caches (a key group opened)."""
        self._caches += count

    def unregister(self, count: int) -> None:
        """Account ``count`` fewer caches (a key group closed)."""
        self._caches = max(0, self._caches - count)


def _entry_bytes(key: bytes, raw: bytes | None) -> int:
    return ENTRY_SIZE_FACTOR * (len(key) + (len(raw) if raw else 0)) + ENTRY_OVERHEAD_BYTES


class _BudgetedCache(StoreCache):
    """A store cache whose trim also respects the process's :class:`ReadCacheBudget`.

    Entry sizes are estimated from the encoded keys and values it sees anyway (database
    reads, drained writes), averaged with a decay at every trim.
    """

    __slots__ = ("_budget", "_count", "_seen")

    def __init__(self, name: str, codec: Codec, db: KeyGroupStore, budget: ReadCacheBudget) -> None:
        super().__init__(name, codec, db)
        self._budget = budget
        self._seen = _INITIAL_ENTRY_BYTES
        self._count = 1

    def load(self, key: bytes) -> Any:
        """Read ``key`` from the database into the cache (sizing it) and return it."""
        raw = self.db.get(self.name, key)
        value = DELETED if raw is None else self.codec.decode(raw)
        self.values[key] = value
        if raw is not None:  # a miss is usually written next: sized when drained
            self._seen += _entry_bytes(key, raw)
            self._count += 1
        return value

    def drain(self) -> dict[bytes, bytes | None]:
        """Drain (:meth:`StoreCache.drain`), sizing the encoded entries.

        The size estimate is an average, so a drain is sized from an evenly spread sample:
        every entry up to ``_SIZE_SAMPLE``, else every ``n // _SIZE_SAMPLE``-th (``_SIZE_SAMPLE``
        to ``2 * _SIZE_SAMPLE`` entries), scaled to ``n`` (one pass over every entry of a large
        drain cost a few percent of a busy epoch's CPU).
        """
        out = super().drain()
        n = len(out)
        if n:
            sampled = seen = 0
            for key, raw in islice(out.items(), 0, None, max(1, n // _SIZE_SAMPLE)):
                seen += _entry_bytes(key, raw)
                sampled += 1
            self._seen += seen * n // sampled
        self._count += n
        return out

    @property
    def entry_bytes(self) -> int:
        """The estimated memory of one entry."""
        return max(1, self._seen // self._count)

    def trim(self, max_entries: int) -> None:
        """Trim to ``max_entries`` or what fits in this cache's share, whichever is less."""
        size = self.entry_bytes
        super().trim(min(max_entries, self._budget.per_cache_bytes // size))
        if self._count > 1024:  # recent entries weigh more
            self._seen, self._count = self._seen // 2, self._count // 2


class StateMemory:
    """The memory of every key group of a process: RocksDB's shared cache and the read cache.

    Attributes:
        plan: the sizes.
        rocksdb: the shared block cache and write-buffer manager.
        read_cache: the read-cache budget.
    """

    def __init__(self, plan: MemoryPlan) -> None:
        """Create the shared cache, write-buffer manager and read-cache budget of ``plan``."""
        self.plan = plan
        self.rocksdb = RocksDBMemory.for_budget(plan.rocksdb_bytes)
        self.read_cache = ReadCacheBudget(plan.read_cache_bytes)


class StateCleaner:
    """Deletes the local directories of key groups this process no longer owns.

    Kafka Streams' ``state.cleanup.delay.ms``: a key group released (revoked or lost) and
    not assigned back within ``delay_s`` has its directory removed by
    :meth:`sweep`, which the runtime's loop calls. Directories found on disk at the first
    assignment that it did not bring are treated as released then (a previous run's). A
    directory is never removed while its key group is owned or its database is open here
    or in another process (:meth:`state.rocksdb.RocksDBBackend.discard`), and the removal
    renames it to a trash name first (an interrupted delete is finished by the next start).
    One owner thread.
    """

    def __init__(
        self,
        app: str,
        backend: RocksDBBackend,
        delay_s: float,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """Create a cleaner with nothing scheduled.

        Args:
            app: the app name (directories live under ``<state dir>/<app>/``).
            backend: the RocksDB backend that opens the key groups' databases.
            delay_s: how long a released key group's directory is kept (>= 0).
            clock: monotonic seconds (tests pass their own).
        """
        self._app = app
        self._backend = backend
        self._delay_s = delay_s
        self._clock = clock
        self._due: dict[int, float] = {}
        self._adopted = False

    @property
    def pending(self) -> dict[int, float]:
        """Key groups whose directories are scheduled for removal, and when (a copy)."""
        return dict(self._due)

    def adopt(self, owned: Iterable[int]) -> None:
        """Once per process: schedule the directories on disk that ``owned`` lacks.

        Also finishes the deletes a crash interrupted (trash directories). Later calls do
        nothing.
        """
        if self._adopted:
            return
        self._adopted = True
        purged = self._backend.purge_trash(self._app)
        if purged:
            log.info("removed interrupted state deletes", extra={"directories": purged})
        keep = set(owned)
        self.released(g for g in self._backend.key_groups_on_disk(self._app) if g not in keep)

    def released(self, groups: Iterable[int]) -> None:
        """Schedule the directories of ``groups`` for removal after the delay."""
        due = self._clock() + self._delay_s
        for g in groups:
            self._due[g] = due

    def claimed(self, groups: Iterable[int]) -> None:
        """Keep the directories of ``groups``: they are (being) assigned to this process."""
        for g in groups:
            self._due.pop(g, None)

    def sweep(self, owned: Iterable[int], budget_s: float = 1.0) -> list[int]:
        """Remove the directories whose delay passed; return their key groups.

        Args:
            owned: the key groups this process owns now (never removed, unscheduled).
            budget_s: stop after this much time; the rest waits for the next call.
        """
        if not self._due:
            return []
        now = self._clock()
        keep = set(owned)
        started = time.monotonic()
        removed: list[int] = []
        for g, due in sorted(self._due.items(), key=lambda item: item[1]):
            if due > now or time.monotonic() - started > budget_s:
                break
            del self._due[g]
            if g in keep:
                continue
            try:
                done = self._backend.discard(self._app, g)
            except OSError as exc:
                log.warning(
                    "removing a released key group's state failed; retrying after the delay",
                    extra={"key_group": g, "error": str(exc)},
                )
                self._due[g] = now + self._delay_s
                continue
            if done:
                removed.append(g)
                log.info(
                    "released key group's state removed",
                    extra={"key_group": g, "path": str(self._backend.path_of(self._app, g))},
                )
        return removed


class KeyGroup:
    """State of one key group owned by this instance.

    Attributes:
        index: the key group (= partition index of every input topic).
        db: the committed state (local database).
        caches: the epoch cache of each store.
        bindings: (handle, cache) pairs to point the app's handles at this key group.
    """

    __slots__ = ("_budget", "bindings", "caches", "db", "index")

    def __init__(
        self,
        index: int,
        db: KeyGroupStore,
        handles: dict[str, StateHandle],
        budget: ReadCacheBudget | None = None,
    ) -> None:
        """Wrap an open database with a cache per store.

        Args:
            index: the key group.
            db: its open database (closed by :meth:`close`).
            handles: the app's state handles by store name.
            budget: the process's read-cache budget; the caches register with it until
                :meth:`close` (``None``: only the ceiling passed to ``trim`` applies).
        """
        self.index = index
        self.db = db
        self._budget = budget
        if budget is None:
            self.caches = {name: StoreCache(name, h.spec.codec, db) for name, h in handles.items()}
        else:
            self.caches = {
                name: _BudgetedCache(name, h.spec.codec, db, budget) for name, h in handles.items()
            }
            budget.register(len(self.caches))
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
        """Drop the caches, give their budget share back and close the database."""
        self.discard()
        if self._budget is not None:
            self._budget.unregister(len(self.caches))
            self._budget = None
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
                :class:`processors._kafka.errors.Stopping` (it resumes from the applied part).
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
        #: The process's read-cache budget, given to every key group opened (set by the
        #: runtime; ``None``: per-cache ceilings only).
        self.read_budget: ReadCacheBudget | None = None
        #: State snapshots (set by the runtime; ``None``: off): a key group without local
        #: state starts from its newest usable snapshot, then the changelog tail.
        self.snapshots: StateSnapshots | None = None

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
        if self.snapshots is not None:  # only when the local database is absent
            self.snapshots.seed(index, stores, self._max_age_ms)
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
        return KeyGroup(index, db, handles, self.read_budget)

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
