r"""Incremental snapshots of key-group databases in a snapshot store.

A snapshot is a RocksDB checkpoint of one key group's database (taken by the runtime at an
epoch commit boundary, so it holds committed state and, in ``__meta``, the changelog offsets
that state covers) copied to a snapshot store: a local or shared directory, a ``file://``
URL or any fsspec URL (opened like savepoint locations, :mod:`state.savepoint`). Layout::

    <root>/<app>/<key group>/objects/<sha256>         one file's bytes, named by content
    <root>/<app>/<key group>/manifests/<taken ms>-<token>.json

Files are stored by content (SHA-256), so an SST file, which RocksDB never changes, is
uploaded once and shared by every later snapshot that still contains it: a snapshot uploads
only the files the store lacks, plus its manifest. File *names* cannot serve: a database
rebuilt from a snapshot reuses the original's identity and file numbers, so two databases
restored from the same snapshot write different files under the same name.

A manifest is written last and atomically: a snapshot exists once its manifest does.
:meth:`SnapshotStore.prune` deletes the manifests beyond the newest ``keep`` first and then
only the objects no kept manifest names, so a kept manifest never names a deleted object
while its owner alone writes the key group's snapshots. A download checks every file's size
and hash; anything missing or different raises :class:`SnapshotError` and the caller falls
back to an older snapshot or to the changelog.

Why the snapshot never decides exactly-once: it is, byte for byte, the database a volume would
hold had its instance been killed at the moment the checkpoint was taken — a RocksDB
checkpoint is a consistent image of one moment, and the runtime takes it after an epoch's
commit was applied, never mid-batch. The restore already accepts any such database as a
starting point: it reads the offsets the database records about itself and replays the
changelog from there to its end. What a snapshot adds is age, which the same guard as for
local state bounds (:func:`unusable`).
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import secrets
import shutil
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

from state.base.store import FORMAT_VERSION
from state.errors import SavepointError
from state.locations import open_filesystem

__all__ = [
    "MANIFEST_FORMAT",
    "SnapshotError",
    "SnapshotFile",
    "SnapshotManifest",
    "SnapshotStore",
    "unusable",
]

log = logging.getLogger("lockgate.snapshots")

#: The manifest format this build writes and reads.
MANIFEST_FORMAT = 1
_CHUNK = 4 * 1024 * 1024
#: Unreferenced objects younger than this are kept by a prune: another writer's snapshot
#: may be on its way to naming them (its manifest comes last).
ORPHAN_GRACE_S = 3600.0
#: Files downloaded at once.
_DOWNLOAD_THREADS = 4


class SnapshotError(Exception):
    """A snapshot cannot be used or written (bad manifest, missing or altered file)."""


@dataclass(frozen=True)
class SnapshotFile:
    """One file of a snapshot.

    Attributes:
        name: its name in the database directory (``000123.sst``, ``CURRENT``, ...).
        digest: the SHA-256 of its bytes (hex): the object holding them.
        size: its length in bytes.
    """

    name: str
    digest: str
    size: int


@dataclass(frozen=True)
class SnapshotManifest:
    """What a snapshot holds.

    Attributes:
        app: the app.
        key_group: the key group.
        checkpoint: the last checkpoint applied to the database.
        updated_ms: the database's ``updated_ms`` (when it was last complete).
        taken_ms: when the checkpoint was taken (wall clock).
        changelog_offsets: per store, the next changelog offset the state lacks.
        files: the database's files.
        name: the manifest's file name in the store (empty before it is written).
    """

    app: str
    key_group: int
    checkpoint: int
    updated_ms: int
    taken_ms: int
    changelog_offsets: dict[str, int]
    files: tuple[SnapshotFile, ...]
    name: str = ""

    @property
    def size(self) -> int:
        """The bytes of all its files."""
        return sum(f.size for f in self.files)

    def order(self) -> tuple[int, int, int]:
        """Sort key, newest last: changelog progress, then checkpoint, then time.

        Every snapshot of a key group is a prefix of the same changelog history (one owner
        writes it at a time), so more changelog read is newer whatever the clocks say.
        """
        return (sum(self.changelog_offsets.values()), self.checkpoint, self.taken_ms)

    def to_json(self) -> bytes:
        """The manifest as JSON."""
        return orjson.dumps(
            {
                "format": MANIFEST_FORMAT,
                "state_format": FORMAT_VERSION.decode(),
                "app": self.app,
                "key_group": self.key_group,
                "checkpoint": self.checkpoint,
                "updated_ms": self.updated_ms,
                "taken_ms": self.taken_ms,
                "changelog_offsets": self.changelog_offsets,
                "files": [{"name": f.name, "sha256": f.digest, "size": f.size} for f in self.files],
            },
            option=orjson.OPT_SORT_KEYS,
        )

    @classmethod
    def from_json(cls, raw: bytes, name: str) -> SnapshotManifest:
        """Parse and check a manifest.

        Raises:
            SnapshotError: not JSON, another format, or a field missing or of the wrong type.
        """
        try:
            data = orjson.loads(raw)
            if not isinstance(data, dict) or data.get("format") != MANIFEST_FORMAT:
                raise SnapshotError(f"manifest {name}: unknown format")
            if data.get("state_format") != FORMAT_VERSION.decode():
                raise SnapshotError(f"manifest {name}: state format {data.get('state_format')}")
            offsets = data["changelog_offsets"]
            files = tuple(
                SnapshotFile(_check_name(f["name"]), _check_digest(f["sha256"]), _int(f["size"]))
                for f in data["files"]
            )
            if not files or not isinstance(offsets, dict):
                raise SnapshotError(f"manifest {name}: no files")
            return cls(
                app=str(data["app"]),
                key_group=_int(data["key_group"]),
                checkpoint=_int(data["checkpoint"]),
                updated_ms=_int(data["updated_ms"]),
                taken_ms=_int(data["taken_ms"]),
                changelog_offsets={str(k): _int(v) for k, v in offsets.items()},
                files=files,
                name=name,
            )
        except SnapshotError:
            raise
        except (orjson.JSONDecodeError, KeyError, TypeError, ValueError) as exc:
            raise SnapshotError(f"manifest {name}: {type(exc).__name__}: {exc}") from exc


def _int(value: Any) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise ValueError(f"not a count: {value!r}")
    return value


def _check_name(name: Any) -> str:
    if not isinstance(name, str) or not name or "/" in name or name.startswith("."):
        raise ValueError(f"bad file name {name!r}")
    return name


def _check_digest(digest: Any) -> str:
    if (
        not isinstance(digest, str)
        or len(digest) != 64
        or not all(c in "0123456789abcdef" for c in digest)
    ):
        raise ValueError(f"bad sha256 {digest!r}")
    return digest


def unusable(
    manifest: SnapshotManifest,
    stores: Sequence[str],
    starts: Mapping[str, int],
    ends: Mapping[str, int],
    max_age_ms: int,
    now_ms: int,
) -> str | None:
    """Why ``manifest`` must not be a key group's starting point, or ``None`` if it may.

    The same rules as for a local database, checked before anything is downloaded.

    Args:
        manifest: the snapshot.
        stores: the app's stores now.
        starts: per store, its changelog partition's log start offset.
        ends: per store, its changelog partition's high watermark.
        max_age_ms: the local-state age guard (a share of the tombstone retention).
        now_ms: the wall clock.

    Returns:
        the reason, when it is not usable: a store the app no longer has (its column family
        would not open), offsets beyond the changelog's end (the topic was recreated) or
        below its log start (records it has not seen were deleted: ``lockgate reset``), or
        older than the age guard (compaction may have dropped tombstones written since).
    """
    extra = sorted(set(manifest.changelog_offsets) - set(stores))
    if extra:
        return f"it holds stores the app no longer has: {extra}"
    for name in stores:
        offset = manifest.changelog_offsets.get(name, 0)
        if offset > ends.get(name, 0):
            return f"store {name!r} is ahead of its changelog (was the changelog recreated?)"
        if offset < starts.get(name, 0):
            return f"store {name!r} predates records deleted from its changelog (reset?)"
    if now_ms - manifest.updated_ms > max_age_ms:
        return "it is older than the changelog's tombstone retention allows"
    return None


def _sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def _chunks(path: Path) -> Iterator[bytes]:
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            yield chunk


@dataclass
class UploadResult:
    """What one upload did.

    Attributes:
        manifest: the manifest written.
        uploaded_files: files the store lacked (written).
        uploaded_bytes: their bytes.
        seconds: the time it took.
    """

    manifest: SnapshotManifest
    uploaded_files: int = 0
    uploaded_bytes: int = 0
    seconds: float = 0.0


@dataclass
class _DigestCache:
    """Digests of local files by identity: a hard-linked SST is hashed once per process."""

    entries: dict[tuple[int, int, int, int], str] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def digest(self, path: Path, seen: set[tuple[int, int, int, int]]) -> tuple[str, int]:
        st = path.stat()
        key = (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)
        seen.add(key)
        with self.lock:
            known = self.entries.get(key)
        if known is None:
            known = _sha256_of(path)
            with self.lock:
                self.entries[key] = known
        return known, st.st_size

    def keep_only(self, keys: set[tuple[int, int, int, int]]) -> None:
        with self.lock:
            for key in [k for k in self.entries if k not in keys]:
                del self.entries[key]


class SnapshotStore:
    """The snapshots of one app's key groups under a root location.

    Thread-safe for distinct key groups; one writer per key group at a time (the owner).

    Args:
        url: a local path, a ``file://`` URL, or an fsspec URL (needs fsspec and the
            filesystem's package).
        app: the app name.

    Raises:
        SnapshotError: the location is invalid or needs a package that is not installed.
    """

    def __init__(self, url: str, app: str) -> None:
        try:
            self._fs = open_filesystem(url)
        except SavepointError as exc:
            raise SnapshotError(str(exc).replace("savepoint", "snapshot")) from exc
        self.url = url
        self.app = app
        self._digests: dict[int, _DigestCache] = {}

    def _base(self, key_group: int) -> str:
        return f"{self.app}/{key_group}"

    def _object(self, key_group: int, digest: str) -> str:
        return f"{self._base(key_group)}/objects/{digest}"

    def _manifest(self, key_group: int, name: str) -> str:
        return f"{self._base(key_group)}/manifests/{name}"

    def display(self, key_group: int) -> str:
        """Where ``key_group``'s snapshots are (for messages)."""
        return self._fs.display(self._base(key_group))

    # -------------------------------------------------------------------- writing

    def upload(
        self,
        directory: Path,
        key_group: int,
        checkpoint: int,
        updated_ms: int,
        changelog_offsets: Mapping[str, int],
    ) -> UploadResult:
        """Copy a checkpoint directory into the store: the files it lacks, then a manifest.

        Args:
            directory: a RocksDB checkpoint of ``key_group``'s database.
            key_group: the key group.
            checkpoint: the checkpoint id its ``__meta`` records.
            updated_ms: its ``__meta`` ``updated_ms``.
            changelog_offsets: per store, the changelog offset its ``__meta`` records.

        Returns:
            the manifest written and what was uploaded.

        Raises:
            OSError: the store or the directory could not be read or written.
            SavepointError: an I/O error of the store, named.
        """
        started = time.monotonic()
        cache = self._digests.setdefault(key_group, _DigestCache())
        seen: set[tuple[int, int, int, int]] = set()
        files: list[SnapshotFile] = []
        uploaded = uploaded_bytes = 0
        for path in sorted(directory.iterdir()):
            if not path.is_file():
                continue
            digest, size = cache.digest(path, seen)
            files.append(SnapshotFile(path.name, digest, size))
            rel = self._object(key_group, digest)
            if not self._fs.exists(rel):
                self._fs.write_atomic(rel, _chunks(path))
                uploaded += 1
                uploaded_bytes += size
        cache.keep_only(seen)
        taken = int(time.time() * 1000)
        name = f"{taken:015d}-{secrets.token_hex(4)}.json"
        manifest = SnapshotManifest(
            self.app,
            key_group,
            checkpoint,
            updated_ms,
            taken,
            dict(changelog_offsets),
            tuple(files),
            name,
        )
        self._fs.write_atomic(self._manifest(key_group, name), [manifest.to_json()])
        return UploadResult(manifest, uploaded, uploaded_bytes, time.monotonic() - started)

    def prune(self, key_group: int, keep: int, grace_s: float = ORPHAN_GRACE_S) -> int:
        """Keep the newest ``keep`` snapshots of ``key_group``; return the files deleted.

        Manifests go first, then the objects no kept manifest names that a deleted manifest
        named or that are older than ``grace_s`` (left by an interrupted upload). A manifest
        that does not parse is deleted (manifests are written whole, so it never will); one
        that cannot be read (an I/O error) is left alone.
        """
        unparsable: list[str] = []
        manifests = self.manifests(key_group, unparsable)
        for name in unparsable:  # it never becomes readable: warned about once, then gone
            self._fs.remove(self._manifest(key_group, name))
        kept, dropped = manifests[:keep], manifests[keep:]
        if not dropped:
            return len(unparsable)
        for m in dropped:
            self._fs.remove(self._manifest(key_group, m.name))
        named = {f.digest for m in kept for f in m.files}
        dropped_digests = {f.digest for m in dropped for f in m.files}
        removed = len(dropped) + len(unparsable)
        now = time.time()
        for digest in self._fs.listdir(f"{self._base(key_group)}/objects"):
            if digest in named or digest.startswith("."):
                continue
            rel = self._object(key_group, digest)
            if digest not in dropped_digests:
                modified = self._fs.modified(rel)
                if modified is None or now - modified < grace_s:
                    continue
            self._fs.remove(rel)
            removed += 1
        return removed

    def remove_all(self) -> int:
        """Delete every snapshot of the app (each key group's manifests first); return the files.

        Raises:
            OSError: the store could not be listed or a file deleted.
        """
        removed = 0
        for g in self._fs.listdir(self.app):
            if not g.isdigit():
                continue
            for sub in ("manifests", "objects"):
                for name in self._fs.listdir(f"{self.app}/{g}/{sub}"):
                    self._fs.remove(f"{self.app}/{g}/{sub}/{name}")
                    removed += 1
        return removed

    # -------------------------------------------------------------------- reading

    def manifests(
        self, key_group: int, unparsable: list[str] | None = None
    ) -> list[SnapshotManifest]:
        """The readable manifests of ``key_group``, newest first (unreadable ones logged).

        Args:
            key_group: the key group.
            unparsable: when given, receives the names of the manifests that were read but
                do not parse (or belong elsewhere).

        Raises:
            OSError: the store could not be listed.
        """
        out: list[SnapshotManifest] = []
        for name in self._fs.listdir(f"{self._base(key_group)}/manifests"):
            if name.startswith(".") or not name.endswith(".json"):
                continue
            rel = self._manifest(key_group, name)
            try:
                with self._fs.open_read(rel) as f:
                    m = SnapshotManifest.from_json(f.read(), name)
                if m.app != self.app or m.key_group != key_group:
                    raise SnapshotError(f"manifest {name}: of {m.app}/{m.key_group}")
            except FileNotFoundError:
                continue  # pruned meanwhile
            except (SnapshotError, OSError) as exc:
                if isinstance(exc, SnapshotError) and unparsable is not None:
                    unparsable.append(name)
                log.warning(
                    "snapshot manifest unreadable: skipped",
                    extra={
                        "key_group": key_group,
                        "manifest": self._fs.display(rel),
                        "error": str(exc),
                    },
                )
                continue
            out.append(m)
        out.sort(key=SnapshotManifest.order, reverse=True)
        return out

    def download(self, manifest: SnapshotManifest, dest: Path) -> None:
        """Write the snapshot's files into the new directory ``dest``, checking each.

        Raises:
            SnapshotError: a file is missing, or its size or SHA-256 differs.
        """
        dest.mkdir(parents=True)

        def fetch(f: SnapshotFile) -> None:
            rel = self._object(manifest.key_group, f.digest)
            digest = hashlib.sha256()
            size = 0
            try:
                with self._fs.open_read(rel) as src, open(dest / f.name, "xb") as out:
                    while chunk := src.read(_CHUNK):
                        digest.update(chunk)
                        size += len(chunk)
                        out.write(chunk)
                    out.flush()
                    os.fsync(out.fileno())
            except FileNotFoundError as exc:
                raise SnapshotError(f"{self._fs.display(rel)} ({f.name}) is missing") from exc
            except OSError as exc:
                raise SnapshotError(f"{self._fs.display(rel)} ({f.name}): {exc}") from exc
            if size != f.size or digest.hexdigest() != f.digest:
                raise SnapshotError(
                    f"{self._fs.display(rel)} ({f.name}) differs from the manifest "
                    f"({size} bytes, expected {f.size})"
                )

        with ThreadPoolExecutor(_DOWNLOAD_THREADS, thread_name_prefix="lockgate-snapshot") as pool:
            for result in [pool.submit(fetch, f) for f in manifest.files]:
                result.result()
        fd = os.open(dest, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def remove_tree(path: Path) -> None:
    """Delete a directory tree, ignoring a missing one."""
    with contextlib.suppress(FileNotFoundError):
        shutil.rmtree(path)
