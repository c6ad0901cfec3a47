"""State snapshots: a faster starting point for a key group assigned to a fresh volume.

Without local state, a key group's restore replays its whole changelog partition (7.2 s per
million keys measured). With ``LOCKGATE_STATE_SNAPSHOT_DIR`` set, :class:`StateSnapshots`

* **takes** a RocksDB checkpoint of a key group's database right after an epoch's commit was
  applied to it (on the loop thread: the database then holds exactly committed state and the
  changelog offsets it covers), at most once per ``LOCKGATE_STATE_SNAPSHOT_INTERVAL_MS`` per
  key group and never while the previous one of that key group is still uploading;
* **uploads** it in a background thread, incrementally
  (``state.rocksdb.snapshots.SnapshotStore``: only files the store lacks, then a manifest),
  deletes the checkpoint's hard links, and keeps the newest
  ``LOCKGATE_STATE_SNAPSHOT_RETAINED`` snapshots;
* **seeds** a key group whose local database is absent with the newest usable snapshot,
  before the restore (``Restorer.open`` calls :meth:`StateSnapshots.seed`), which then
  replays only the changelog after the offsets the snapshot records.

Exactly-once does not depend on snapshots. A snapshot is the database a volume would hold
had the instance been killed when it was taken: a consistent RocksDB image, taken after a
committed epoch was applied, recording in ``__meta`` the next changelog offset of every store.
The restore treats it like any surviving local database: it reads the changelog from those
offsets to the end and applies it (the changelog carries the final value of every key an
epoch changed, tombstones included, so state + tail = the changelog's state = the last
committed state). The guards that protect a local database protect a snapshot, checked before
the download: ahead of the changelog (recreated topic), behind its log start (records
deleted by ``lockgate reset``), or older than 80% of the tombstone retention (compaction may
have dropped a tombstone it would need) — each means "not usable", never "wrong". A snapshot
that is missing a file, altered (size or SHA-256), or whose manifest does not parse is skipped
with a warning; the next older one is tried, then the full changelog restore. Nothing is
committed from a snapshot, and an upload that fails only costs the next restore time.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from confluent_kafka import TopicPartition

from processors._config.settings import Settings
from processors.exceptions import ConfigError
from state.base.store import (
    META_UPDATED_MS,
    KeyGroupStore,
    changelog_offset_of,
    checkpoint_of,
)
from state.cache import changelog_topic
from state.rocksdb.snapshots import (
    SnapshotError,
    SnapshotManifest,
    SnapshotStore,
    remove_tree,
    unusable,
)
from state.rocksdb.store import RocksDBBackend, RocksDBKeyGroupStore

log = logging.getLogger("lockgate.snapshots")

#: Directories under ``<state dir>/<app>/`` holding a checkpoint being uploaded or a snapshot
#: being downloaded (never a key group's name; leftovers are deleted at start).
WORK_PREFIX = ".snapshot-"
#: Snapshots tried, newest first, before a restore falls back to the whole changelog.
MAX_TRIES = 3

Offsets = Callable[[list[TopicPartition]], dict[tuple[str, int], int]]


class OwnedKeyGroup(Protocol):
    """What a snapshot needs of an owned key group (``processors._task.keygroups.KeyGroup``)."""

    @property
    def db(self) -> KeyGroupStore:
        """Its database."""
        ...

    @property
    def caches(self) -> Mapping[str, object]:
        """Its stores (by name)."""
        ...


@dataclass
class SnapshotStats:
    """Counters of one process (logged; read by tests and benchmarks).

    Attributes:
        taken: checkpoints taken.
        uploaded: snapshots whose manifest was written.
        failed: uploads that failed.
        skipped_busy: checkpoints not taken because the previous one was uploading.
        seeded: key groups started from a snapshot.
        fallbacks: key groups whose snapshots were all unusable (full restore).
    """

    taken: int = 0
    uploaded: int = 0
    failed: int = 0
    skipped_busy: int = 0
    seeded: int = 0
    fallbacks: int = 0


@dataclass(frozen=True)
class _Job:
    key_group: int
    directory: Path
    checkpoint: int
    updated_ms: int
    offsets: dict[str, int]


class StateSnapshots:
    """Takes, uploads, prunes and restores the snapshots of an app's key groups.

    :meth:`after_commit` and :meth:`seed` run on the loop thread; uploads run in one
    background thread (daemon), stopped by :meth:`close`.
    """

    def __init__(
        self,
        app: str,
        backend: RocksDBBackend,
        store: SnapshotStore,
        interval_s: float,
        retained: int,
        start_offsets: Offsets,
        end_offsets: Offsets,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """Create the component; deletes work directories a previous run left.

        Args:
            app: the app name.
            backend: the RocksDB backend whose databases are snapshotted.
            store: where snapshots go.
            interval_s: a key group's snapshots are at least this far apart.
            retained: snapshots kept per key group.
            start_offsets: log start offsets of changelog partitions.
            end_offsets: high watermarks of changelog partitions.
            clock: monotonic seconds (tests pass their own).
        """
        self.app = app
        self.store = store
        self.stats = SnapshotStats()
        self._backend = backend
        self._interval_s = interval_s
        self._retained = retained
        self._start_offsets = start_offsets
        self._end_offsets = end_offsets
        self._clock = clock
        self._last: dict[int, float] = {}
        self._busy: set[int] = set()
        self._lock = threading.Lock()
        self._jobs: queue.Queue[_Job | None] = queue.Queue()
        self._thread: threading.Thread | None = None
        self._work = backend.root / app
        if self._work.is_dir():
            for leftover in self._work.glob(WORK_PREFIX + "*"):
                remove_tree(leftover)

    # ------------------------------------------------------------------ taking

    def after_commit(self, kgs: Mapping[int, OwnedKeyGroup], written: Iterable[int]) -> None:
        """After a commit was applied locally: checkpoint the written key groups that are due.

        Args:
            kgs: the owned key groups.
            written: the key groups the commit changed (the others' snapshots are current).
        """
        now = self._clock()
        for g in written:
            kg = kgs.get(g)
            if kg is None or now - self._last.get(g, -self._interval_s) < self._interval_s:
                continue
            db = kg.db
            if not isinstance(db, RocksDBKeyGroupStore):
                continue
            with self._lock:
                if g in self._busy:
                    self.stats.skipped_busy += 1
                    continue
                self._busy.add(g)
            try:
                self._take(g, db, list(kg.caches))
            except Exception as exc:  # noqa: BLE001 - a snapshot never stops processing
                with self._lock:
                    self._busy.discard(g)
                log.warning(
                    "state snapshot failed: not taken",
                    extra={"key_group": g, "error": f"{type(exc).__name__}: {exc}"},
                )
            self._last[g] = now

    def _take(self, g: int, db: RocksDBKeyGroupStore, stores: list[str]) -> None:
        started = time.monotonic()
        directory = self._work / f"{WORK_PREFIX}{g}-{time.time_ns()}"
        db.checkpoint_to(directory)
        raw = db.get_meta(META_UPDATED_MS)
        job = _Job(
            g,
            directory,
            checkpoint_of(db),
            int(raw) if raw else int(time.time() * 1000),
            {name: changelog_offset_of(db, name) for name in stores},
        )
        self.stats.taken += 1
        if log.isEnabledFor(logging.DEBUG):
            log.debug(
                "state checkpoint taken",
                extra={"key_group": g, "seconds": round(time.monotonic() - started, 4)},
            )
        if self._thread is None:
            self._thread = threading.Thread(
                target=self._upload_loop, name="lockgate-snapshot-upload", daemon=True
            )
            self._thread.start()
        self._jobs.put(job)

    def _upload_loop(self) -> None:
        while True:
            job = self._jobs.get()
            if job is None:
                return
            error: Exception | None = None
            try:
                result = self.store.upload(
                    job.directory, job.key_group, job.checkpoint, job.updated_ms, job.offsets
                )
                pruned = self.store.prune(job.key_group, self._retained)
            except Exception as exc:  # noqa: BLE001 - the next snapshot tries again
                error = exc
            finally:
                remove_tree(job.directory)
                with self._lock:  # the key group may snapshot again from here on
                    self._busy.discard(job.key_group)
            if error is not None:
                self.stats.failed += 1
                log.warning(
                    "state snapshot upload failed",
                    extra={"key_group": job.key_group, "error": f"{type(error).__name__}: {error}"},
                )
                continue
            self.stats.uploaded += 1
            log.info(
                "state snapshot uploaded",
                extra={
                    "key_group": job.key_group,
                    "checkpoint": job.checkpoint,
                    "files": len(result.manifest.files),
                    "new_files": result.uploaded_files,
                    "new_bytes": result.uploaded_bytes,
                    "bytes": result.manifest.size,
                    "pruned_files": pruned,
                    "seconds": round(result.seconds, 3),
                },
            )

    def close(self, timeout_s: float = 10.0) -> None:
        """Stop uploading: the upload in flight gets ``timeout_s``, queued ones are dropped.

        An upload cut short writes no manifest (its files are removed by a later prune).
        """
        while True:
            try:
                job = self._jobs.get_nowait()
            except queue.Empty:
                break
            if job is not None:
                remove_tree(job.directory)
        if self._thread is not None:
            self._jobs.put(None)
            self._thread.join(timeout_s)
            self._thread = None

    # ------------------------------------------------------------------ restoring

    def seed(self, index: int, stores: Sequence[str], max_age_ms: int) -> bool:
        """Put the newest usable snapshot in place of key group ``index``'s absent database.

        Does nothing when the key group has a local database (it is reused as it is).
        Never raises for a snapshot problem: the restore then starts from the changelog.

        Args:
            index: the key group.
            stores: the app's stores.
            max_age_ms: the restore's local-state age guard.

        Returns:
            whether a snapshot was put in place.
        """
        path = self._backend.path_of(self.app, index)
        if (path / "CURRENT").exists():
            return False
        started = time.monotonic()
        try:
            candidates = self.store.manifests(index)
        except Exception as exc:  # noqa: BLE001 - an unreachable store is a slower restore
            log.warning(
                "state snapshots unreadable: restoring from the changelog",
                extra={"key_group": index, "error": f"{type(exc).__name__}: {exc}"},
            )
            self.stats.fallbacks += 1
            return False
        if not candidates:
            return False
        topics = {name: changelog_topic(self.app, name) for name in stores}
        tps = [TopicPartition(t, index) for t in topics.values()]
        lows = self._start_offsets(tps)
        highs = self._end_offsets(tps)
        starts = {n: lows.get((t, index), 0) for n, t in topics.items()}
        ends = {n: highs.get((t, index), 0) for n, t in topics.items()}
        now_ms = int(time.time() * 1000)
        tried = 0
        for manifest in candidates:
            reason = unusable(manifest, stores, starts, ends, max_age_ms, now_ms)
            if reason is not None:
                log.warning(
                    "state snapshot not usable: %s",
                    reason,
                    extra={"key_group": index, "manifest": manifest.name},
                )
                continue
            if tried >= MAX_TRIES:
                break
            tried += 1
            if self._put_in_place(manifest, path, started, ends):
                self.stats.seeded += 1
                return True
        self.stats.fallbacks += 1
        log.warning(
            "no usable state snapshot: restoring the whole changelog",
            extra={"key_group": index, "snapshots": len(candidates)},
        )
        return False

    def _put_in_place(
        self, manifest: SnapshotManifest, path: Path, started: float, ends: Mapping[str, int]
    ) -> bool:
        work = self._work / f"{WORK_PREFIX}download-{manifest.key_group}-{time.time_ns()}"
        try:
            self.store.download(manifest, work)
            remove_tree(path)  # an empty or partial directory without a database
            work.rename(path)
        except Exception as exc:  # noqa: BLE001 - a bad snapshot is a slower restore
            remove_tree(work)
            log.warning(
                "state snapshot unusable: %s",
                exc,
                extra={"key_group": manifest.key_group, "manifest": manifest.name},
            )
            return False
        log.info(
            "key group state downloaded from a snapshot",
            extra={
                "key_group": manifest.key_group,
                "manifest": manifest.name,
                "checkpoint": manifest.checkpoint,
                "bytes": manifest.size,
                "files": len(manifest.files),
                "changelog_offsets": manifest.changelog_offsets,
                "tail_records": sum(
                    max(0, ends[n] - o) for n, o in manifest.changelog_offsets.items() if n in ends
                ),
                "seconds": round(time.monotonic() - started, 3),
            },
        )
        return True


def state_snapshots(
    settings: Settings,
    app: str,
    backend: object,
    start_offsets: Offsets,
    end_offsets: Offsets,
) -> StateSnapshots | None:
    """The snapshot component the settings ask for (``None``: off, or not RocksDB).

    Raises:
        ConfigError: the location is invalid or needs a package that is not installed.
    """
    url = settings.state_snapshot_dir
    if not url:
        return None
    if not isinstance(backend, RocksDBBackend):
        log.warning("LOCKGATE_STATE_SNAPSHOT_DIR is ignored: the state backend is not rocksdb")
        return None
    try:
        store = SnapshotStore(url, app)
    except SnapshotError as exc:
        raise ConfigError(f"LOCKGATE_STATE_SNAPSHOT_DIR: {exc}") from exc
    log.info(
        "state snapshots on",
        extra={
            "location": url,
            "interval_ms": settings.state_snapshot_interval_ms,
            "retained": settings.state_snapshot_retained,
        },
    )
    return StateSnapshots(
        app,
        backend,
        store,
        settings.state_snapshot_interval_ms / 1000,
        settings.state_snapshot_retained,
        start_offsets,
        end_offsets,
    )


__all__ = ["SnapshotError", "SnapshotStats", "StateSnapshots", "state_snapshots"]
