"""Where savepoints and state snapshots are kept: a local directory or any fsspec URL.

:func:`open_filesystem` opens a location (a path, ``file:///...`` or ``s3://...``,
``gs://...``, ``abfs://...`` through fsspec and the URL's filesystem package) as a
:class:`Filesystem`: the few operations on paths relative to the location's root that
savepoints (state/savepoint.py) and state snapshots (state/rocksdb/snapshots.py) need.
Writes are atomic (a reader sees the whole file or none of it; on local disks fsync'ed
and renamed); a filesystem's own errors surface as :class:`OSError` or, for a location
that cannot be used at all, :class:`~state.errors.SavepointError`.
"""

from __future__ import annotations

import contextlib
import importlib
import os
import secrets
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import IO, Any, Protocol
from urllib.parse import unquote, urlsplit

from state.errors import SavepointError

__all__ = ["Filesystem", "open_filesystem"]

_INSTALL_HINT = "install fsspec and the filesystem's package, e.g. s3fs"


class Filesystem(Protocol):
    """The few file operations savepoints and state snapshots need, relative to a root."""

    def display(self, rel: str) -> str:
        """``rel`` as a user should see it in a message (the full path or URL)."""

    def write_atomic(self, rel: str, chunks: Iterable[bytes]) -> None:
        """Write ``chunks`` to ``rel``: readers see the whole file or none of it."""

    def open_read(self, rel: str) -> IO[bytes]:
        """Open ``rel`` for reading (``FileNotFoundError`` when it does not exist)."""

    def listdir(self, rel: str) -> list[str]:
        """The names in directory ``rel`` (empty when it does not exist)."""

    def exists(self, rel: str) -> bool:
        """Whether file ``rel`` exists."""

    def remove(self, rel: str) -> None:
        """Delete file ``rel`` (no error when it is gone already)."""

    def modified(self, rel: str) -> float | None:
        """Unix seconds of ``rel``'s last change (``None``: missing, or the store has none)."""


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class _LocalFs:
    """The local filesystem, with fsync'ed atomic renames."""

    def __init__(self, root: Path) -> None:
        self._root = root

    def display(self, rel: str) -> str:
        return str(self._root / rel)

    def _makedirs(self, path: Path) -> None:
        missing: list[Path] = []
        while not path.is_dir():
            missing.append(path)
            if path.parent == path:
                break
            path = path.parent
        for d in reversed(missing):
            with contextlib.suppress(FileExistsError):
                d.mkdir()
            _fsync_dir(d.parent)  # make the new directory entry durable

    def write_atomic(self, rel: str, chunks: Iterable[bytes]) -> None:
        path = self._root / rel
        self._makedirs(path.parent)
        tmp = path.parent / f".{path.name}.tmp-{secrets.token_hex(4)}"
        try:
            with open(tmp, "xb") as f:
                for chunk in chunks:
                    f.write(chunk)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, path)
        except BaseException:
            with contextlib.suppress(OSError):
                tmp.unlink()
            raise
        _fsync_dir(path.parent)

    def open_read(self, rel: str) -> IO[bytes]:
        return open(self._root / rel, "rb")  # the caller closes it

    def listdir(self, rel: str) -> list[str]:
        try:
            return os.listdir(self._root / rel)
        except (FileNotFoundError, NotADirectoryError):
            return []

    def exists(self, rel: str) -> bool:
        return (self._root / rel).is_file()

    def remove(self, rel: str) -> None:
        with contextlib.suppress(FileNotFoundError):
            (self._root / rel).unlink()

    def modified(self, rel: str) -> float | None:
        try:
            return (self._root / rel).stat().st_mtime
        except FileNotFoundError:
            return None


class _ChunkError(Exception):
    """An error raised by the data being written (not by the filesystem): re-raised as is."""

    def __init__(self, exc: Exception) -> None:
        super().__init__(str(exc))
        self.exc = exc


def _guarded(chunks: Iterable[bytes]) -> Iterator[bytes]:
    """``chunks``, with their own errors carried as :class:`_ChunkError`."""
    it = iter(chunks)
    while True:
        try:
            chunk = next(it)
        except StopIteration:
            return
        except Exception as exc:
            raise _ChunkError(exc) from exc
        yield chunk


@contextlib.contextmanager
def _as_os_error() -> Iterator[None]:
    """Filesystem packages' own errors as :class:`OSError`.

    A remote filesystem raises more than ``OSError``: s3fs lets botocore's
    ``EndpointConnectionError`` through when the store is unreachable, and other packages
    their HTTP clients' errors. The store turns ``OSError`` into :class:`SavepointError`
    (a failed savepoint, recorded in the key group's manifest); anything else would end the
    app. Errors of the data being written (:class:`_ChunkError`) stay as they are.
    """
    try:
        yield
    except _ChunkError as exc:
        raise exc.exc from None
    except OSError:
        raise
    except Exception as exc:
        raise OSError(f"{type(exc).__name__}: {exc}") from exc


class _OsErrorFile:
    """A file of a remote filesystem whose calls raise :class:`OSError` on I/O errors."""

    def __init__(self, f: Any) -> None:
        self._f = f

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._f, name)
        if not callable(attr):
            return attr

        def call(*args: Any, **kwargs: Any) -> Any:
            with _as_os_error():
                return attr(*args, **kwargs)

        return call

    def __enter__(self) -> _OsErrorFile:
        return self

    def __exit__(self, *exc: object) -> None:
        with _as_os_error():
            self._f.close()


class _FsspecFs:
    """Any fsspec filesystem (object stores, ``memory://``, ...).

    Every operation raises the filesystem package's own errors as :class:`OSError`
    (:func:`_as_os_error`).
    """

    def __init__(self, url: str) -> None:
        try:
            core = importlib.import_module("fsspec.core")
        except ImportError as exc:
            raise SavepointError(
                f"savepoint location {url!r} needs fsspec: {_INSTALL_HINT}"
            ) from exc
        try:
            fs, root = core.url_to_fs(url)
        except ImportError as exc:  # fsspec knows the protocol, its package is missing
            raise SavepointError(f"savepoint location {url!r}: {exc} ({_INSTALL_HINT})") from exc
        except ValueError as exc:  # unknown protocol
            raise SavepointError(f"savepoint location {url!r}: {exc}") from exc
        self._fs: Any = fs
        self._root: str = str(root).rstrip("/")
        self._url = url.rstrip("/")

    def _path(self, rel: str) -> str:
        return f"{self._root}/{rel}"

    def display(self, rel: str) -> str:
        return f"{self._url}/{rel}"

    def write_atomic(self, rel: str, chunks: Iterable[bytes]) -> None:
        path = self._path(rel)
        parent, name = path.rsplit("/", 1)
        tmp = f"{parent}/.{name}.tmp-{secrets.token_hex(4)}"
        with _as_os_error():
            self._fs.makedirs(parent, exist_ok=True)
            try:
                with self._fs.open(tmp, "wb") as f:
                    for chunk in _guarded(chunks):
                        f.write(chunk)
                self._fs.mv(tmp, path)  # the object appears whole under its final name
            except BaseException:
                with contextlib.suppress(Exception):
                    self._fs.rm(tmp)
                raise

    def open_read(self, rel: str) -> IO[bytes]:
        with _as_os_error():
            f: IO[bytes] = _OsErrorFile(self._fs.open(self._path(rel), "rb"))  # type: ignore[assignment]
        return f

    def listdir(self, rel: str) -> list[str]:
        path = self._path(rel)
        with contextlib.suppress(Exception):
            self._fs.invalidate_cache(path)
        try:
            with _as_os_error():
                entries = self._fs.ls(path, detail=False)
        except (FileNotFoundError, NotADirectoryError):
            return []
        return [str(e).rstrip("/").rsplit("/", 1)[-1] for e in entries]

    def exists(self, rel: str) -> bool:
        with _as_os_error():
            return bool(self._fs.exists(self._path(rel)))

    def remove(self, rel: str) -> None:
        try:
            with _as_os_error():
                self._fs.rm(self._path(rel))
        except FileNotFoundError:
            pass

    def modified(self, rel: str) -> float | None:
        """The object's modification time (s since the epoch), ``None`` when not known."""
        try:
            with _as_os_error():
                info = self._fs.info(self._path(rel))
        except FileNotFoundError:
            return None
        for key in ("mtime", "LastModified", "last_modified", "created"):
            value = info.get(key)
            if isinstance(value, (int, float)):
                return float(value)
            if hasattr(value, "timestamp"):
                return float(value.timestamp())
        return None


def open_filesystem(url: str) -> Filesystem:
    """Open a location: a local path, a ``file://`` URL, or any fsspec URL (``s3://``...).

    Shared by savepoints (:class:`SavepointStore`) and state snapshots
    (``state/rocksdb/snapshots.py``).

    Raises:
        SavepointError: an invalid location, or fsspec (or the URL's filesystem
            package) is not installed.
    """
    if not isinstance(url, str) or not url:
        raise SavepointError(f"invalid savepoint location {url!r}")
    if "://" not in url:
        return _LocalFs(Path(url))
    parts = urlsplit(url)
    if parts.scheme.lower() == "file":
        if parts.netloc not in ("", "localhost") or not parts.path:
            raise SavepointError(f"invalid file URL {url!r}: use file:///absolute/path")
        return _LocalFs(Path(unquote(parts.path)))
    return _FsspecFs(url)
