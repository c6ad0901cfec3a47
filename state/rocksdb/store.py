"""RocksDB key group databases through rocksdict in raw mode.

Layout: ``<root>/<app>/<key group>/`` is one RocksDB database with one column
family per store and ``__meta``. Raw mode keeps RocksDB's bytewise comparator, so
the files are readable by any RocksDB tool.
"""

from __future__ import annotations

import gc
import shutil
import time
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import rocksdict

from state.base.store import FORMAT_VERSION, META, META_FORMAT, Writes
from state.exceptions import StateFormatError, StateLockedError

__all__ = ["RocksDBBackend", "RocksDBKeyGroupStore"]


def _options() -> Any:
    opts = rocksdict.Options(raw_mode=True)
    opts.create_if_missing(True)
    opts.create_missing_column_families(True)
    opts.set_compression_type(rocksdict.DBCompressionType.lz4())
    return opts


class RocksDBKeyGroupStore:
    """One key group's RocksDB database. Not thread-safe: one owner thread."""

    def __init__(self, path: Path, key_group: int, stores: Sequence[str]) -> None:
        self.key_group = key_group
        self.path = path
        path.mkdir(parents=True, exist_ok=True)
        names = [*stores, META]
        self._db = self._open(path, names)
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
    def _open(path: Path, names: list[str]) -> Any:
        cfs = {n: rocksdict.Options(raw_mode=True) for n in names}
        deadline = time.monotonic() + 10.0
        while True:
            try:
                return rocksdict.Rdict(str(path), _options(), column_families=cfs)
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
    """Opens key group databases under ``root/<app>/<key group>/``."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def path_of(self, app: str, key_group: int) -> Path:
        """Return the directory of ``key_group``'s database."""
        return self.root / app / str(key_group)

    def open(self, app: str, key_group: int, stores: Sequence[str]) -> RocksDBKeyGroupStore:
        """Open (creating when missing) the database of ``key_group``."""
        return RocksDBKeyGroupStore(self.path_of(app, key_group), key_group, stores)

    def destroy(self, app: str, key_group: int) -> None:
        """Delete the local database of ``key_group`` (it must be closed)."""
        shutil.rmtree(self.path_of(app, key_group), ignore_errors=True)
