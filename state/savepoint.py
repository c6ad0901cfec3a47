r"""Savepoints: user-triggered checkpoints exported to durable storage.

A savepoint holds, for every key group ``g`` of an app, the committed state of each
of its stores at the savepoint's cut, and can be restored into a new deployment.
This module is the storage side only: where the files live, their format, the
overlay merge that produces the state at the cut, and the restore compatibility
check. The runtime decides when to export and restore.

Layout under the root (a local path, a ``file://`` URL, or any fsspec URL)::

    <root>/<savepoint id>/_savepoint.json                     savepoint descriptor
    <root>/<savepoint id>/<app>/<key group>/manifest.json     key group manifest
    <root>/<savepoint id>/<app>/<key group>/<store>.<token>.lgs   one file per store

A ``.lgs`` store file (format version 1, integers big-endian)::

    header   b"LGSTATE\0" u32 version
    entries  (u32 key length, key, u32 value length, value)*   strictly increasing keys
    footer   u32 0xFFFFFFFF, u64 entry count, b"LGSTEND\0"

Every file is written under a temporary name in its final directory and renamed into
place (on local disk after an fsync, followed by an fsync of the directory), so a
reader never sees a partial file under a final name. A store file's name carries a
random token of its own export (``<store>.<token>.lgs``; the manifest names the file), so
two exports of one key group never write the same file: a fenced instance still
exporting a savepoint that the key group's new owner exported too cannot replace the file
the committed manifest names (its own manifest is aborted with its transaction). Files of
exports that never committed stay behind until the savepoint is disposed of. Manifests
written before tokens existed name ``<store>.lgs``, which is still read.
"""

from __future__ import annotations

import contextlib
import hashlib
import re
import secrets
import struct
import time
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from operator import itemgetter
from typing import IO, Any

import orjson

from state.errors import SavepointError
from state.locations import open_filesystem

__all__ = [
    "DESCRIPTOR_FILE",
    "DESCRIPTOR_FORMAT",
    "MANIFEST_FILE",
    "STORE_FILE_SUFFIX",
    "STORE_FORMAT_VERSION",
    "SavepointError",
    "SavepointStore",
    "StoreFile",
    "build_descriptor",
    "check_compatible",
    "check_savepoint_id",
    "key_group_manifest",
    "merged_items",
    "ms_to_iso",
    "new_savepoint_id",
    "state_version",
]

#: The savepoint-level descriptor, in ``<root>/<savepoint id>/``.
DESCRIPTOR_FILE = "_savepoint.json"
#: The key group manifest, in ``<root>/<savepoint id>/<app>/<key group>/``.
MANIFEST_FILE = "manifest.json"
#: Suffix of a store file (``<store>.<token>.lgs``, or ``<store>.lgs`` before tokens).
STORE_FILE_SUFFIX = ".lgs"
#: The ``.lgs`` format version written (and the only one read) by this build.
STORE_FORMAT_VERSION = 1

_MAGIC = b"LGSTATE\x00"
_END_MAGIC = b"LGSTEND\x00"
_U32 = struct.Struct(">I")
_HEADER = struct.Struct(">8sI")
_FOOTER = struct.Struct(">IQ8s")
_FOOTER_MARK = 0xFFFFFFFF
_MAX_KEY = _FOOTER_MARK - 1  # a key length of 0xFFFFFFFF marks the footer
_MAX_VALUE = _FOOTER_MARK
#: Bytes buffered before a write, and read per call when hashing (bounds memory use).
_CHUNK = 1 << 20

_ID = re.compile(r"^sp-(\d{8}T\d{6}Z)-[0-9a-f]{6}$")
_ID_TIME = "%Y%m%dT%H%M%SZ"
#: App and store names (the same rule as processors.App), safe as path components.
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,200}$")
_SHA256 = re.compile(r"^[0-9a-f]{64}$")
_TOKEN = re.compile(r"[0-9a-f]{8}")  # of a store file name, secrets.token_hex(4)
# --------------------------------------------------------------------------- ids


def new_savepoint_id(now_ms: int | None = None) -> str:
    """Return a new savepoint id, ``sp-YYYYmmddTHHMMSSZ-<6 hex digits>``.

    Ids sort by creation time (to the second); the random suffix separates savepoints
    taken in the same second.

    Args:
        now_ms: the creation time in ms since the Unix epoch (UTC); the wall clock
            when ``None``.
    """
    ms = time.time_ns() // 1_000_000 if now_ms is None else now_ms
    stamp = datetime.fromtimestamp(ms / 1000, tz=UTC).strftime(_ID_TIME)
    return f"sp-{stamp}-{secrets.token_hex(3)}"


def check_savepoint_id(savepoint_id: str) -> str:
    """Return ``savepoint_id`` when it has the form made by :func:`new_savepoint_id`.

    Ids become path components, so nothing else is accepted (no ``/``, ``..``, ...).

    Raises:
        SavepointError: ``savepoint_id`` is not a string of that form, or its
            timestamp is not a valid date and time.
    """
    match = _ID.match(savepoint_id) if isinstance(savepoint_id, str) else None
    if match is None or match.group(0) != savepoint_id:  # "$" also matches before "\n"
        raise SavepointError(
            f"invalid savepoint id {savepoint_id!r}: expected sp-YYYYmmddTHHMMSSZ-<6 hex "
            "digits>, e.g. sp-20250101T120000Z-a1b2c3"
        )
    try:
        datetime.strptime(match.group(1), _ID_TIME)  # naive: validation only
    except ValueError as exc:
        raise SavepointError(
            f"invalid savepoint id {savepoint_id!r}: bad timestamp ({exc})"
        ) from exc
    return savepoint_id


def _check_name(what: str, name: str) -> None:
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        raise SavepointError(f"invalid {what} name {name!r}: must match {_NAME.pattern}")


def _check_key_group(key_group: int) -> None:
    if isinstance(key_group, bool) or not isinstance(key_group, int) or key_group < 0:
        raise SavepointError(f"invalid key group {key_group!r}: must be an int >= 0")


# ------------------------------------------------------------------ store files


@dataclass(frozen=True)
class StoreFile:
    """What the writer of a store file recorded about it (kept in the manifest).

    Attributes:
        name: the file name, ``<store>.<token>.lgs`` (``<store>.lgs`` before tokens).
        sha256: hex SHA-256 of the whole file (header, entries and footer).
        entries: the number of key/value entries.
        bytes: the file size in bytes.
    """

    name: str
    sha256: str
    entries: int
    bytes: int

    def to_dict(self) -> dict[str, Any]:
        """Return the fields as a JSON-ready dict (the inverse of :meth:`from_dict`)."""
        return {
            "name": self.name,
            "sha256": self.sha256,
            "entries": self.entries,
            "bytes": self.bytes,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> StoreFile:
        """Return the :class:`StoreFile` described by ``data`` (from :meth:`to_dict`).

        Raises:
            SavepointError: a field is missing or has the wrong type or form.
        """
        name, sha, entries, size = (data.get(k) for k in ("name", "sha256", "entries", "bytes"))
        if (
            not isinstance(name, str)
            or not name.endswith(STORE_FILE_SUFFIX)
            or not isinstance(sha, str)
            or not _SHA256.match(sha)
            or not isinstance(entries, int)
            or not isinstance(size, int)
            or not _is_count(entries)
            or not _is_count(size)
        ):
            raise SavepointError(f"malformed store file entry in a manifest: {dict(data)!r}")
        return cls(name=name, sha256=sha, entries=entries, bytes=size)


def _is_count(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


class _Tally:
    """What :func:`_encode_store` has written so far."""

    __slots__ = ("entries", "hash", "size")

    def __init__(self) -> None:
        self.hash = hashlib.sha256()
        self.size = 0
        self.entries = 0


def _encode_store(items: Iterable[tuple[bytes, bytes]], tally: _Tally) -> Iterator[bytes]:
    """Yield the store file of ``items`` in chunks of about ``_CHUNK`` bytes.

    Holds one chunk and the previous key at a time; updates ``tally`` as it goes.
    """
    buf = bytearray(_HEADER.pack(_MAGIC, STORE_FORMAT_VERSION))
    pack = _U32.pack
    prev: bytes | None = None
    entries = 0
    for key, value in items:
        if prev is not None and key <= prev:
            raise ValueError(
                f"store items must be sorted by key without duplicates: {key!r} after {prev!r}"
            )
        if len(key) > _MAX_KEY or len(value) > _MAX_VALUE:
            raise ValueError(f"entry too large for a store file (key {key[:32]!r}...)")
        buf += pack(len(key))
        buf += key
        buf += pack(len(value))
        buf += value
        prev = key
        entries += 1
        if len(buf) >= _CHUNK:
            chunk = bytes(buf)
            buf.clear()
            tally.hash.update(chunk)
            tally.size += len(chunk)
            yield chunk
    buf += _FOOTER.pack(_FOOTER_MARK, entries, _END_MAGIC)
    chunk = bytes(buf)
    tally.hash.update(chunk)
    tally.size += len(chunk)
    tally.entries = entries
    yield chunk


def _read_exact(f: IO[bytes], n: int, where: str) -> bytes:
    data = f.read(n)
    if len(data) != n:
        raise SavepointError(f"{where} is truncated")
    return data


# ---------------------------------------------------------------- overlay merge


def merged_items(
    base: Iterable[tuple[bytes, bytes]], overlay: Mapping[bytes, bytes | None]
) -> Iterator[tuple[bytes, bytes]]:
    """Yield ``base`` with ``overlay`` applied, in key order.

    ``base`` is the committed content of a store in strictly increasing bytewise key
    order, which is what :meth:`state.base.store.KeyGroupStore.items` yields for both
    backends (RocksDB iterates its bytewise comparator's order, the memory backend
    sorts). ``overlay`` holds the open epoch's changes (from
    :meth:`state.cache.StoreCache.drain`): key -> new encoded value, or ``None`` for a
    deletion; its keys need no order. The overlay is snapshotted (sorted) when the
    iteration starts, ``base`` is consumed lazily: memory is O(len(overlay)).

    Raises:
        ValueError: ``base`` is not strictly increasing (raised when reached).
    """
    changes = sorted(overlay.items(), key=itemgetter(0))
    n = len(changes)
    i = 0
    prev: bytes | None = None
    for key, value in base:
        if prev is not None and key <= prev:
            raise ValueError(
                f"base items must be sorted by key without duplicates: {key!r} after {prev!r}"
            )
        prev = key
        while i < n and changes[i][0] < key:
            ckey, cvalue = changes[i]
            i += 1
            if cvalue is not None:
                yield ckey, cvalue
        if i < n and changes[i][0] == key:
            cvalue = changes[i][1]
            i += 1
            if cvalue is not None:
                yield key, cvalue
            continue
        yield key, value
    for ckey, cvalue in changes[i:]:
        if cvalue is not None:
            yield ckey, cvalue


# ------------------------------------------------------------- compatibility


def key_group_manifest(
    savepoint_id: str,
    app: str,
    key_group: int,
    *,
    offsets: Mapping[str, int],
    stores: Mapping[str, Any],
    instance: str,
    checkpoint: int = 0,
    state_version: str | None = None,
    **extra: Any,
) -> dict[str, Any]:
    """Return a complete, restorable key-group manifest written outside the runtime.

    The layout the runtime's own exports have (no alignment in progress, no error):
    ``offsets`` are where the live app starts per input topic, ``stores`` the
    :meth:`StoreFile.to_dict` of each store file with its ``kind`` and ``codec``;
    ``instance`` names the writer; ``extra`` keys are added as they are.
    """
    return {
        "savepoint": savepoint_id,
        "app": app,
        "key_group": key_group,
        "checkpoint": checkpoint,
        "offsets": dict(offsets),
        "align": {},
        "stores": dict(stores),
        "state_version": state_version,
        "error": None,
        "stop": False,
        "instance": instance,
        "ts": int(time.time() * 1000),
        **extra,
    }


def state_version(schemas: Mapping[str, Mapping[str, str]]) -> str:
    """The state version of an app: a short hash of its store schemas.

    Args:
        schemas: store name -> its ``kind`` and ``codec`` (as registered and saved).

    Returns:
        16 hex digits that change when a store's definition does; the runtime records
        it in the registry and in manifests, backfill plans and rewritten savepoints
        carry the same value for the same stores.
    """
    return hashlib.sha256(orjson.dumps(dict(sorted(schemas.items())))).hexdigest()[:16]


def check_compatible(
    saved: Mapping[str, Mapping[str, str]],
    current: Mapping[str, Mapping[str, str]],
    allow_non_restored: bool,
) -> list[str]:
    """Return the stores to restore from a savepoint into the app, sorted by name.

    Both mappings are store name -> ``{"kind": ..., "codec": ...}``: ``saved`` as
    recorded in the savepoint, ``current`` as the app declares them. A store in both
    with the same kind and codec is restored; a store only in the app starts empty.

    Args:
        saved: the stores of the savepoint.
        current: the stores of the app being started.
        allow_non_restored: accept savepoint stores that the app no longer declares
            (their state is dropped).

    Raises:
        SavepointError: a store in both has a different kind or codec, or (without
            ``allow_non_restored``) a saved store is absent from the app; the message
            names every such store.
    """
    problems: list[str] = []
    restore: list[str] = []
    for name in sorted(saved):
        old = saved[name]
        new = current.get(name)
        if new is None:
            if not allow_non_restored:
                problems.append(
                    f"store {name!r} is in the savepoint but the app no longer declares it; "
                    "dropped stores need --allow-non-restored-state"
                )
            continue
        if old.get("kind") != new.get("kind") or old.get("codec") != new.get("codec"):
            problems.append(
                f"store {name!r}: saved as {old.get('kind')}/{old.get('codec')}, the app "
                f"declares {new.get('kind')}/{new.get('codec')}; keep the old definition "
                "or rename the store"
            )
            continue
        restore.append(name)
    if problems:
        raise SavepointError("; ".join(problems))
    return restore


# --------------------------------------------------------------- the store


class SavepointStore:
    """The savepoints under one root location.

    Args:
        url: a local path, a ``file://`` URL (both use the local filesystem
            directly), or any other fsspec URL (``s3://bucket/prefix``,
            ``gs://...``, ``memory://...``), which needs fsspec and the
            filesystem's package installed.

    Raises:
        SavepointError: ``url`` is empty or a malformed ``file://`` URL, or it needs
            fsspec (or a filesystem package) that is not installed.

    Every method validates the savepoint id (:func:`check_savepoint_id`), the app and
    store names (``[A-Za-z0-9][A-Za-z0-9._-]*``) and the key group (an int >= 0)
    before touching a path, raising :class:`SavepointError` otherwise. I/O errors
    surface as :class:`SavepointError` naming the file. Not thread-safe for writes to
    the same file; distinct files may be written concurrently.
    """

    def __init__(self, url: str) -> None:
        self.url = url
        self._fs = open_filesystem(url)

    # paths --------------------------------------------------------------

    @staticmethod
    def _kg_dir(savepoint_id: str, app: str, key_group: int) -> str:
        check_savepoint_id(savepoint_id)
        _check_name("app", app)
        _check_key_group(key_group)
        return f"{savepoint_id}/{app}/{key_group}"

    def _store_rel(
        self, savepoint_id: str, app: str, key_group: int, store: str, token: str
    ) -> str:
        kg_dir = self._kg_dir(savepoint_id, app, key_group)
        _check_name("store", store)
        return f"{kg_dir}/{store}.{token}{STORE_FILE_SUFFIX}"

    def _recorded_rel(
        self, savepoint_id: str, app: str, key_group: int, store: str, expected: StoreFile
    ) -> str:
        """The path of the file a manifest entry names, checked to be ``store``'s.

        Raises:
            SavepointError: the entry names a file of another store (or another place).
        """
        legacy = f"{self._kg_dir(savepoint_id, app, key_group)}/{store}{STORE_FILE_SUFFIX}"
        _check_name("store", store)
        name = expected.name
        token = name[len(store) + 1 : -len(STORE_FILE_SUFFIX)]
        if name == f"{store}{STORE_FILE_SUFFIX}" or (
            name.startswith(f"{store}.")
            and name.endswith(STORE_FILE_SUFFIX)
            and _TOKEN.fullmatch(token) is not None
        ):
            return legacy.rsplit("/", 1)[0] + "/" + name
        raise SavepointError(f"{self._fs.display(legacy)}: the manifest entry is for {name!r}")

    def _write(self, rel: str, chunks: Iterable[bytes]) -> None:
        try:
            self._fs.write_atomic(rel, chunks)
        except OSError as exc:
            raise SavepointError(f"cannot write {self._fs.display(rel)}: {exc}") from exc

    def _read_json(self, rel: str, missing: str) -> dict[str, Any]:
        where = self._fs.display(rel)
        try:
            with self._fs.open_read(rel) as f:
                raw = f.read()
        except FileNotFoundError as exc:
            raise SavepointError(f"{missing} ({where} not found)") from exc
        except OSError as exc:
            raise SavepointError(f"cannot read {where}: {exc}") from exc
        try:
            data = orjson.loads(raw)
        except orjson.JSONDecodeError as exc:
            raise SavepointError(f"{where} is not valid JSON: {exc}") from exc
        if not isinstance(data, dict):
            raise SavepointError(f"{where} does not hold a JSON object")
        return data

    @staticmethod
    def _json(data: dict[str, Any]) -> bytes:
        return orjson.dumps(data, option=orjson.OPT_INDENT_2 | orjson.OPT_SORT_KEYS) + b"\n"

    # store files --------------------------------------------------------

    def write_store(
        self,
        savepoint_id: str,
        app: str,
        key_group: int,
        store: str,
        items: Iterable[tuple[bytes, bytes]],
    ) -> StoreFile:
        """Write the entries of ``store`` to a new ``<store>.<token>.lgs`` and describe it.

        Streams: ``items`` is consumed lazily and at most about 1 MiB of it is held
        at a time; the SHA-256 is computed while writing. The file appears whole under
        its final name, a name no other export uses (see the module docs); on any error
        no file is left under it, and files of earlier exports stay as they were.

        Args:
            savepoint_id: the savepoint.
            app: the app name.
            key_group: the key group.
            store: the store name.
            items: the entries as (key, value) bytes, strictly increasing by key
                (e.g. :func:`merged_items` of the committed items and the epoch's
                changes).

        Returns:
            The description to record in the key group's manifest and to pass to
            :meth:`read_store` on restore.

        Raises:
            SavepointError: invalid id or name, or the file cannot be written.
            ValueError: ``items`` is not strictly increasing by key, or a key or
                value is longer than 2**32 - 2 bytes.
        """
        rel = self._store_rel(savepoint_id, app, key_group, store, secrets.token_hex(4))
        tally = _Tally()
        self._write(rel, _encode_store(items, tally))
        return StoreFile(
            name=rel.rsplit("/", 1)[1],
            sha256=tally.hash.hexdigest(),
            entries=tally.entries,
            bytes=tally.size,
        )

    def verify_store(
        self, savepoint_id: str, app: str, key_group: int, store: str, expected: StoreFile
    ) -> None:
        """Check the file of ``store`` against ``expected`` without yielding entries.

        Lets the runtime check every file of a key group (or of a savepoint) before
        restoring any of it. Reads the file once, in chunks.

        Raises:
            SavepointError: invalid id or name, the file is missing, truncated, has
                another size, checksum or entry count than ``expected``, or a format
                version this build cannot read; the message names the file.
        """
        rel = self._recorded_rel(savepoint_id, app, key_group, store, expected)
        with self._open_store(rel, savepoint_id, app, key_group, store) as f:
            self._verify(f, rel, expected)

    def read_store(
        self, savepoint_id: str, app: str, key_group: int, store: str, expected: StoreFile
    ) -> Iterator[tuple[bytes, bytes]]:
        """Yield the entries of ``store``'s file in key order, after verifying it.

        Names are validated on the call; the file is opened when iteration starts.
        The first ``next()`` reads the whole file once to check its size, SHA-256,
        format version and entry count against ``expected``; only then is it read
        again, from the same open file, and parsed entry by entry. A corrupt or
        truncated file therefore raises before any entry is yielded. Memory use is
        one chunk plus one entry. Close the iterator (or exhaust it) to close the file.

        Raises:
            SavepointError: as :meth:`verify_store`.
        """
        rel = self._recorded_rel(savepoint_id, app, key_group, store, expected)
        return self._iter_store(rel, savepoint_id, app, key_group, store, expected)

    def _iter_store(
        self,
        rel: str,
        savepoint_id: str,
        app: str,
        key_group: int,
        store: str,
        expected: StoreFile,
    ) -> Iterator[tuple[bytes, bytes]]:
        where = self._fs.display(rel)
        with self._open_store(rel, savepoint_id, app, key_group, store) as f:
            self._verify(f, rel, expected)
            try:
                f.seek(_HEADER.size)
                unpack = _U32.unpack
                count = 0
                while True:
                    (klen,) = unpack(_read_exact(f, 4, where))
                    if klen == _FOOTER_MARK:
                        break
                    key = _read_exact(f, klen, where)
                    (vlen,) = unpack(_read_exact(f, 4, where))
                    value = _read_exact(f, vlen, where)
                    count += 1
                    yield key, value
            except OSError as exc:
                raise SavepointError(f"cannot read {where}: {exc}") from exc
            if count != expected.entries:  # only if the file changed since the check
                raise SavepointError(
                    f"{where} changed while it was read: {count} entries, expected "
                    f"{expected.entries}"
                )

    @contextlib.contextmanager
    def _open_store(
        self, rel: str, savepoint_id: str, app: str, key_group: int, store: str
    ) -> Iterator[IO[bytes]]:
        where = self._fs.display(rel)
        try:
            f = self._fs.open_read(rel)
        except FileNotFoundError as exc:
            raise SavepointError(
                f"savepoint {savepoint_id} has no file for store {store!r} of app {app} "
                f"key group {key_group} ({where} not found; was the savepoint complete?)"
            ) from exc
        except OSError as exc:
            raise SavepointError(f"cannot read {where}: {exc}") from exc
        with f:
            yield f

    def _verify(self, f: IO[bytes], rel: str, expected: StoreFile) -> None:
        where = self._fs.display(rel)
        if expected.name != rel.rsplit("/", 1)[1]:
            raise SavepointError(f"{where}: the manifest entry is for {expected.name!r}")
        digest = hashlib.sha256()
        size = 0
        try:
            while chunk := f.read(_CHUNK):
                digest.update(chunk)
                size += len(chunk)
            if size < expected.bytes:
                raise SavepointError(
                    f"{where} is truncated: {size} bytes, the manifest says {expected.bytes}"
                )
            if size != expected.bytes:
                raise SavepointError(
                    f"{where} has {size} bytes, the manifest says {expected.bytes}"
                )
            if digest.hexdigest() != expected.sha256:
                raise SavepointError(
                    f"{where} is corrupt: its SHA-256 is {digest.hexdigest()}, the manifest "
                    f"says {expected.sha256}"
                )
            f.seek(0)
            magic, version = _HEADER.unpack(_read_exact(f, _HEADER.size, where))
            if magic != _MAGIC:
                raise SavepointError(f"{where} is not a lockgate store file")
            if version != STORE_FORMAT_VERSION:
                raise SavepointError(
                    f"{where} has store file format v{version}, this build reads "
                    f"v{STORE_FORMAT_VERSION}: restore it with a newer lockgate"
                )
            if size < _HEADER.size + _FOOTER.size:
                raise SavepointError(f"{where} is truncated")
            f.seek(size - _FOOTER.size)
            mark, entries, end = _FOOTER.unpack(_read_exact(f, _FOOTER.size, where))
        except OSError as exc:
            raise SavepointError(f"cannot read {where}: {exc}") from exc
        if mark != _FOOTER_MARK or end != _END_MAGIC:
            raise SavepointError(f"{where} has no valid footer")
        if entries != expected.entries:
            raise SavepointError(
                f"{where} has {entries} entries, the manifest says {expected.entries}"
            )

    # manifests and descriptors --------------------------------------------

    def write_manifest(
        self, savepoint_id: str, app: str, key_group: int, manifest: dict[str, Any]
    ) -> None:
        """Write the manifest of a key group atomically (replacing an earlier one).

        Its content is the runtime's (e.g. the checkpoint id, offsets and the
        :meth:`StoreFile.to_dict` of each store). Write it after the store files.

        Raises:
            SavepointError: invalid id or name, or the file cannot be written.
            TypeError: ``manifest`` is not JSON-serializable (orjson).
        """
        rel = f"{self._kg_dir(savepoint_id, app, key_group)}/{MANIFEST_FILE}"
        self._write(rel, [self._json(manifest)])

    def read_manifest(self, savepoint_id: str, app: str, key_group: int) -> dict[str, Any]:
        """Return the manifest of a key group.

        Raises:
            SavepointError: invalid id or name, the manifest is missing, unreadable,
                not JSON or not a JSON object.
        """
        rel = f"{self._kg_dir(savepoint_id, app, key_group)}/{MANIFEST_FILE}"
        return self._read_json(
            rel,
            f"savepoint {savepoint_id} has no manifest for app {app} key group {key_group} "
            "(was the savepoint complete?)",
        )

    def write_descriptor(self, savepoint_id: str, descriptor: dict[str, Any]) -> None:
        """Write the savepoint-level descriptor atomically (replacing an earlier one).

        A savepoint is listed by :meth:`list_savepoints` once it has a descriptor,
        so write it last, after every key group's manifest.

        Raises:
            SavepointError: invalid id, or the file cannot be written.
            TypeError: ``descriptor`` is not JSON-serializable (orjson).
        """
        check_savepoint_id(savepoint_id)
        self._write(f"{savepoint_id}/{DESCRIPTOR_FILE}", [self._json(descriptor)])

    def read_descriptor(self, savepoint_id: str) -> dict[str, Any]:
        """Return the descriptor of a savepoint.

        Raises:
            SavepointError: invalid id, the descriptor is missing (no such savepoint,
                or it was never completed), unreadable, not JSON or not an object.
        """
        check_savepoint_id(savepoint_id)
        return self._read_json(
            f"{savepoint_id}/{DESCRIPTOR_FILE}",
            f"savepoint {savepoint_id} has no {DESCRIPTOR_FILE} under {self.url} (it does "
            "not exist or was never completed)",
        )

    # listings -------------------------------------------------------------

    def list_savepoints(self) -> list[str]:
        """Return the ids of the savepoints that have a descriptor, sorted (oldest first).

        Entries of the root that are not savepoint ids are ignored; an empty or
        missing root has none.
        """
        ids = []
        for name in self._fs.listdir(""):
            try:
                check_savepoint_id(name)
            except SavepointError:
                continue
            if self._fs.exists(f"{name}/{DESCRIPTOR_FILE}"):
                ids.append(name)
        return sorted(ids)

    def list_key_groups(self, savepoint_id: str, app: str) -> list[int]:
        """Return the key groups of ``app`` that have a manifest in the savepoint, sorted.

        Empty when the savepoint or app has none (also while a savepoint is written).

        Raises:
            SavepointError: invalid id or app name.
        """
        check_savepoint_id(savepoint_id)
        _check_name("app", app)
        groups = []
        for name in self._fs.listdir(f"{savepoint_id}/{app}"):
            if not name.isascii() or not name.isdigit() or str(int(name)) != name:
                continue
            if self._fs.exists(f"{savepoint_id}/{app}/{name}/{MANIFEST_FILE}"):
                groups.append(int(name))
        return sorted(groups)


# ------------------------------------------------------------ the descriptor

#: Version of the descriptor layout written by :func:`build_descriptor`.
DESCRIPTOR_FORMAT = 1


def ms_to_iso(ms: int | None) -> str | None:
    """Return ``ms`` since the Unix epoch as a UTC ISO 8601 string (ms precision)."""
    if ms is None:
        return None
    dt = datetime.fromtimestamp(ms / 1000, tz=UTC)
    return dt.isoformat(timespec="milliseconds").replace("+00:00", "Z")


def build_descriptor(
    savepoint_id: str,
    checkpoint: int,
    stop: bool,
    created_ms: int,
    requested_ms: int,
    registry: Mapping[str, Mapping[str, Any]],
    manifests: Mapping[str, Mapping[int, Mapping[str, Any]]],
    sources: Iterable[str],
) -> dict[str, Any]:
    """Return the savepoint descriptor (``_savepoint.json``).

    Layout (format 1)::

        {"format": 1, "savepoint": id, "checkpoint": C, "stop": bool,
         "created_ms": ms, "created": iso, "requested_ms": ms,
         "apps": {app: {"key_groups": P, "inputs": [...], "outputs": [...],
                        "internal_outputs": [...], "stores": {name: {kind, codec}},
                        "state_version": str, "source": bool,
                        "manifests": [{"key_group": g, "checkpoint": c,
                                       "offsets": {topic: int}, "align": {...},
                                       "stores": {name: {kind, codec, file, sha256,
                                                         entries, bytes[, operator,
                                                         timers]}},
                                       "ts": ms}, ...]}}}

    Args:
        savepoint_id: the savepoint id.
        checkpoint: the requested checkpoint id C.
        stop: whether the apps halt at the savepoint.
        created_ms: when the savepoint completed.
        requested_ms: when the request was written.
        registry: app -> registration (only the savepoint's apps are read).
        manifests: app -> key group -> manifest record (every key group present).
        sources: the apps that received the request.
    """
    src = set(sources)
    apps: dict[str, Any] = {}
    for app, by_group in manifests.items():
        reg = registry.get(app, {})
        apps[app] = {
            "key_groups": len(by_group),
            "inputs": list(reg.get("inputs") or ()),
            "outputs": list(reg.get("outputs") or ()),
            "internal_outputs": list(reg.get("internal_outputs") or ()),
            "stores": dict(reg.get("stores") or {}),
            "state_version": reg.get("state_version"),
            "source": app in src,
            "manifests": [
                {
                    "key_group": g,
                    "checkpoint": m.get("checkpoint"),
                    "offsets": m.get("offsets") or {},
                    "align": m.get("align") or {},
                    "stores": m.get("stores") or {},
                    "ts": m.get("ts"),
                }
                for g, m in sorted(by_group.items())
            ],
        }
    return {
        "format": DESCRIPTOR_FORMAT,
        "savepoint": savepoint_id,
        "checkpoint": checkpoint,
        "stop": stop,
        "created_ms": created_ms,
        "created": ms_to_iso(created_ms),
        "requested_ms": requested_ms,
        "apps": apps,
    }
