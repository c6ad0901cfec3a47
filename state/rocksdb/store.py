"""RocksDB key group databases through rocksdict in raw mode.

Layout: ``<root>/<app>/<key group>/`` is one RocksDB database with one column
family per store and ``__meta``. Raw mode keeps RocksDB's bytewise comparator, so
the files are readable by any RocksDB tool.

With a :class:`state.rocksdb.memory.RocksDBMemory`, every database of the backend shares
one block cache and one write-buffer manager (bounded memory); without one, each database
and column family uses RocksDB's defaults. A released key group's directory is removed
with :meth:`RocksDBBackend.discard`: renamed to a trash name first, so a crash mid-delete
never leaves a half-deleted database under a key group's name.
"""

from __future__ import annotations

import errno
import fcntl
import gc
import os
import shutil
import time
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import rocksdict

from state.base.store import FORMAT_VERSION, META, META_FORMAT, Writes
from state.exceptions import StateFormatError, StateLockedError
from state.rocksdb.memory import RocksDBMemory

__all__ = ["TRASH_PREFIX", "RocksDBBackend", "RocksDBKeyGroupStore"]

#: Directories under ``<root>/<app>/`` being deleted (never a key group's name).
TRASH_PREFIX = ".trash-"


def _options(memory: RocksDBMemory | None = None) -> Any:
    opts = rocksdict.Options(raw_mode=True) if memory is None else memory.db_options()
    opts.create_if_missing(True)
    opts.create_missing_column_families(True)
    opts.set_compression_type(rocksdict.DBCompressionType.lz4())
    return opts


class RocksDBKeyGroupStore:
    """One key group's RocksDB database. Not thread-safe: one owner thread."""

    def __init__(
        self,
        path: Path,
        key_group: int,
        stores: Sequence[str],
        memory: RocksDBMemory | None = None,
    ) -> None:
        """Open (creating when missing) the database at ``path``.

        Args:
            path: the database directory.
            key_group: the key group it holds.
            stores: the column families besides ``__meta``.
            memory: the process's shared cache and write-buffer manager; ``None`` uses
                RocksDB's defaults per database and column family.

        Raises:
            StateLockedError: another process (or an unreleased handle) holds the lock.
            StateFormatError: the database has another state format version.
        """
        self.key_group = key_group
        self.path = path
        path.mkdir(parents=True, exist_ok=True)
        names = [*stores, META]
        self._db = self._open(path, names, memory)
        self._cf = {n: self._db.get_column_family(n) for n in names}
        self._handles = {n: self._db.get_column_family_handle(n) for n in names}
        self._write_opts = rocksdict.WriteOptions()
        self._write_opts.sync = False
        version = self._cf[META].get(META_FORMAT)
        if version is None:
            self._cf[META].put(META_FORMAT, FORMAT_VERSION)
        elif version != FORMAT_VERSION:
            self.close()
            raise StateFormatError(
                f"the state in {path} has format v{version.decode()}, this build reads "
                f"v{FORMAT_VERSION.decode()}: restore from a savepoint, or delete {path} "
                "to rebuild it from the changelog"
            )

    @staticmethod
    def _open(path: Path, names: list[str], memory: RocksDBMemory | None) -> Any:
        cfs = {
            n: rocksdict.Options(raw_mode=True) if memory is None else memory.cf_options()
            for n in names
        }
        deadline = time.monotonic() + 10.0
        while True:
            try:
                return rocksdict.Rdict(str(path), _options(memory), column_families=cfs)
            except Exception as exc:  # rocksdict raises plain Exception
                if "lock" not in str(exc).lower():
                    raise
                if time.monotonic() > deadline:
                    raise StateLockedError(
                        f"{path} is locked by another process or handle: {exc}"
                    ) from exc
                gc.collect()  # a dropped handle in this process releases on collection
                time.sleep(0.2)

    def get(self, store: str, key: bytes) -> bytes | None:
        """Return the committed value of ``key`` in ``store``, or ``None``."""
        value: bytes | None = self._cf[store].get(key)
        return value

    def apply(self, writes: Writes, meta: Mapping[bytes, bytes]) -> None:
        """Atomically write ``writes`` and ``meta`` in one WriteBatch."""
        batch = rocksdict.WriteBatch(raw_mode=True)
        for store, entries in writes.items():
            handle = self._handles[store]
            for key, value in entries.items():
                if value is None:
                    batch.delete(key, handle)
                else:
                    batch.put(key, value, handle)
        meta_handle = self._handles[META]
        for key, value in meta.items():
            batch.put(key, value, meta_handle)
        self._db.write(batch, self._write_opts)

    def get_meta(self, key: bytes) -> bytes | None:
        """Return a ``__meta`` entry, or ``None``."""
        value: bytes | None = self._cf[META].get(key)
        return value

    def items(self, store: str) -> Iterator[tuple[bytes, bytes]]:
        """Iterate the committed entries of ``store`` in key order."""
        yield from self._cf[store].items()

    def iter_from(
        self, store: str, start: bytes | None, limit: int
    ) -> Iterator[tuple[bytes, bytes]]:
        """Iterate at most ``limit`` entries of ``store`` from ``start`` (inclusive) on.

        Seeks a raw iterator: rocksdict 0.3.29 ignores ``ReadOptions``'
        ``set_iterate_lower_bound``, so the bound is a seek, not a read option.
        """
        if limit <= 0:
            return
        it = self._cf[store].iter()
        if start is None:
            it.seek_to_first()
        else:
            it.seek(start)
        while limit and it.valid():
            yield it.key(), it.value()
            limit -= 1
            it.next()

    def checkpoint_to(self, dest: Path) -> None:
        """Write a RocksDB checkpoint of the database to ``dest`` (which must not exist).

        The memtables are flushed first; the SST files are hard links (same filesystem)
        and the few mutable files (``MANIFEST``, ``CURRENT``, the WAL) copies. The result is
        a complete database: the state at this moment, ``__meta`` included.
        """
        rocksdict.Checkpoint(self._db).create_checkpoint(str(dest))

    def close(self) -> None:
        """Flush and release the database and its lock. Idempotent."""
        db = getattr(self, "_db", None)
        if db is None:
            return
        self._cf.clear()
        self._handles.clear()
        try:
            db.flush_wal(True)
        finally:
            db.close()
            self._db = None
            del db
            gc.collect()


class RocksDBBackend:
    """Opens key group databases under ``root/<app>/<key group>/``.

    Attributes:
        root: the state directory.
        memory: the shared cache and write-buffer manager of every database this backend
            opens (``None``: RocksDB's defaults per database).
    """

    def __init__(self, root: Path, memory: RocksDBMemory | None = None) -> None:
        """Create a backend; nothing is opened yet.

        Args:
            root: the state directory.
            memory: see :attr:`memory`; keep one per process.
        """
        self.root = root
        self.memory = memory
        self._open: dict[Path, RocksDBKeyGroupStore] = {}

    def path_of(self, app: str, key_group: int) -> Path:
        """Return the directory of ``key_group``'s database."""
        return self.root / app / str(key_group)

    def open(self, app: str, key_group: int, stores: Sequence[str]) -> RocksDBKeyGroupStore:
        """Open (creating when missing) the database of ``key_group``."""
        path = self.path_of(app, key_group)
        db = RocksDBKeyGroupStore(path, key_group, stores, self.memory)
        self._open[path] = db
        return db

    def is_open(self, app: str, key_group: int) -> bool:
        """Whether this backend has ``key_group``'s database open (not closed since)."""
        db = self._open.get(self.path_of(app, key_group))
        if db is None:
            return False
        if getattr(db, "_db", None) is None:  # closed by its owner
            del self._open[db.path]
            return False
        return True

    def destroy(self, app: str, key_group: int) -> None:
        """Delete the local database of ``key_group`` (it must be closed)."""
        self._open.pop(self.path_of(app, key_group), None)
        shutil.rmtree(self.path_of(app, key_group), ignore_errors=True)

    def key_groups_on_disk(self, app: str) -> list[int]:
        """Return the key groups of ``app`` that have a directory, in order."""
        base = self.root / app
        if not base.is_dir():
            return []
        return sorted(int(p.name) for p in base.iterdir() if p.name.isdigit() and p.is_dir())

    def discard(self, app: str, key_group: int) -> bool:
        """Remove the directory of ``key_group``, which nobody may have open.

        The directory is renamed to a trash name (``.trash-<g>-<ns>``, atomic, while
        holding its RocksDB lock) and then deleted: a crash mid-delete leaves only trash
        (:meth:`purge_trash`), never a partial database under the key group's name, and
        a process that opens the key group meanwhile creates a fresh database.

        Returns:
            whether the directory was removed (``False``: missing, or open here or in
            another process; nothing was changed).
        """
        path = self.path_of(app, key_group)
        if self.is_open(app, key_group) or not path.is_dir():
            return False
        lock = path / "LOCK"
        fd = None
        if lock.exists():
            fd = os.open(lock, os.O_RDWR)
            try:
                fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError as exc:
                os.close(fd)
                if exc.errno in (errno.EACCES, errno.EAGAIN):
                    return False  # another process has it open
                raise
        try:
            trash = path.with_name(f"{TRASH_PREFIX}{key_group}-{time.time_ns()}")
            path.rename(trash)
        finally:
            if fd is not None:
                os.close(fd)  # releases the lock (it moved with the directory)
        shutil.rmtree(trash, ignore_errors=True)
        return True

    def purge_trash(self, app: str) -> int:
        """Delete what an interrupted :meth:`discard` left; return how many directories."""
        base = self.root / app
        if not base.is_dir():
            return 0
        count = 0
        for p in base.iterdir():
            if p.name.startswith(TRASH_PREFIX):
                shutil.rmtree(p, ignore_errors=True)
                count += 1
        return count
