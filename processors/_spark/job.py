"""Run lockgate code on Spark: build a session and ship the code its executors import.

A Spark job (``lockgate backfill --master spark://...``) runs the app's functions in
executor Python processes. Those processes import the app's module and lockgate itself,
so both must be importable there: :func:`code_archive` zips top-level packages found on
``sys.path`` into one archive for ``SparkContext.addPyFile``, and :func:`spark_session`
builds a session and ships such an archive.

pyspark is an optional dependency (the ``spark`` extra): it is imported inside the
functions that need it, so this module imports without it.
"""

from __future__ import annotations

import atexit
import hashlib
import importlib.util
import os
import shutil
import sys
import tempfile
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

#: Fixed timestamp of every archive entry, so equal sources give equal archive bytes.
_EPOCH = (1980, 1, 1, 0, 0, 0)
#: Hosts that mean "this machine" in a ``spark://`` master URL.
_LOOPBACK = {"127.0.0.1", "localhost"}


def _package_roots(name: str) -> list[Path]:
    """Return the source locations of top-level module ``name`` (directories or one file).

    Raises:
        ValueError: ``name`` is dotted or empty, or names a module that cannot be zipped
            (a built-in, frozen or extension module).
        ModuleNotFoundError: ``name`` is not found on ``sys.path``.
    """
    if not name or "." in name or not name.isidentifier():
        raise ValueError(f"not a top-level module name: {name!r}")
    spec = importlib.util.find_spec(name)
    if spec is None:
        raise ModuleNotFoundError(f"module {name!r} is not on sys.path", name=name)
    if spec.submodule_search_locations is not None:
        roots = [Path(p) for p in spec.submodule_search_locations]
        if not roots:
            raise ValueError(f"package {name!r} has no directory to archive")
        return roots
    if spec.origin is None or not spec.origin.endswith(".py"):
        raise ValueError(
            f"module {name!r} ({spec.origin}) is not a pure-Python source file; "
            "only .py modules and packages can be imported from a zip"
        )
    return [Path(spec.origin)]


def _package_files(name: str, root: Path) -> Iterator[tuple[Path, str]]:
    """Yield ``(file, name in archive)`` for the files of package directory ``root``.

    ``__pycache__`` directories and compiled ``.pyc``/``.pyo`` files are skipped.
    """
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if d != "__pycache__")
        base = Path(dirpath)
        for filename in sorted(filenames):
            if filename.endswith((".pyc", ".pyo")):
                continue
            path = base / filename
            yield path, f"{name}/{path.relative_to(root).as_posix()}"


def code_archive(modules: list[str], dest: Path) -> Path:
    """Zip top-level packages/modules found on ``sys.path`` into one importable archive.

    Each name is resolved like ``import name`` would resolve it in this process (an
    editable install included), without executing it. A package's whole directory goes
    into the archive under ``name/`` (without ``__pycache__`` and compiled files); a
    single-file module goes in as ``name.py``. Entries are sorted and carry a fixed
    timestamp, so the same sources always give the same bytes. The result can be given to
    ``SparkContext.addPyFile`` or ``spark.submit.pyFiles``: executors put it on their
    ``sys.path`` and import the packages from it. Only pure-Python code can be imported
    from a zip (extension modules inside a package are archived but will not load).

    Args:
        modules: Top-level module or package names, e.g. ``["processors", "state",
            "examples"]``. Duplicates are archived once.
        dest: Path of the archive to write; must end with ``.zip`` (Spark adds only
            ``.zip``/``.egg``/``.jar`` files to the executors' ``sys.path``). Its parent
            directory must exist; an existing file is replaced.

    Returns:
        ``dest``.

    Raises:
        ValueError: ``modules`` is empty, ``dest`` does not end with ``.zip``, a name is
            not a top-level name, or a module is not pure-Python source, or two names
            would write the same archive entry.
        ModuleNotFoundError: A name is not found on ``sys.path``.
    """
    if not modules:
        raise ValueError("no modules to archive")
    if dest.suffix.lower() != ".zip":
        raise ValueError(f"archive path must end with .zip: {dest}")
    entries: dict[str, Path] = {}
    for name in dict.fromkeys(modules):
        for root in _package_roots(name):
            files = _package_files(name, root) if root.is_dir() else [(root, f"{name}.py")]
            for path, arcname in files:
                if arcname in entries:
                    raise ValueError(f"{arcname} found twice ({entries[arcname]}, {path})")
                entries[arcname] = path
    tmp = dest.with_name(f".{dest.name}.tmp")
    with zipfile.ZipFile(tmp, "w", compression=zipfile.ZIP_DEFLATED) as archive:
        for arcname in sorted(entries):
            info = zipfile.ZipInfo(arcname, date_time=_EPOCH)
            info.compress_type = zipfile.ZIP_DEFLATED
            info.external_attr = 0o644 << 16
            archive.writestr(info, entries[arcname].read_bytes())
    tmp.replace(dest)
    return dest


def is_local_master(master: str) -> bool:
    """Return whether Spark master URL ``master`` runs everything on this machine.

    True for ``local``, ``local[...]``, ``local-cluster[...]`` and ``spark://`` URLs
    whose every host is 127.0.0.1 or localhost.
    """
    if master == "local" or master.startswith(("local[", "local-cluster[")):
        return True
    if not master.startswith("spark://"):
        return False
    # A standalone master URL may list several masters: spark://h1:p1,h2:p2.
    hosts = [urlsplit(f"spark://{part}").hostname for part in master[8:].split(",")]
    return all(host in _LOOPBACK for host in hosts)


def spark_session(
    master: str,
    app_name: str,
    *,
    conf: dict[str, str] | None = None,
    ship: list[str] | None = None,
) -> SparkSession:
    """Build (or get) the SparkSession for a lockgate job on ``master``.

    Defaults, each overridable through ``conf``: the Spark UI is off
    (``spark.ui.enabled=false``); when :func:`is_local_master` holds, the driver binds
    and advertises 127.0.0.1 (``spark.driver.host``, ``spark.driver.bindAddress``) so no
    other address is used. For such masters this function also sets, in ``os.environ``
    and only where not already set, ``SPARK_LOCAL_IP=127.0.0.1`` and
    ``PYSPARK_PYTHON=sys.executable`` (pyspark reads the executors' Python from the
    driver's environment), so the executors run this interpreter and its packages.

    With ``ship``, the named top-level packages are zipped by :func:`code_archive` into a
    fresh temporary directory (removed when this process exits; the archive must outlive
    the session because executors fetch it on demand) and added with
    ``SparkContext.addPyFile``: every executor, and this driver, then imports them from the
    archive. The archive is named after a hash of its contents, so shipping changed code
    into a running context is a new file rather than a name clash.

    Only one SparkContext can exist per process: when one is already active, it is reused
    (``getOrCreate``), and it must be bound to the same ``master``.

    Args:
        master: Spark master URL, e.g. ``local[2]`` or ``spark://127.0.0.1:7077``.
        app_name: Application name shown by the master.
        conf: Extra Spark configuration; wins over the defaults above.
        ship: Top-level module names to make importable on the executors, e.g.
            ``["processors", "state", "examples"]``.

    Returns:
        The session; the caller stops it (``session.stop()``).

    Raises:
        ImportError: pyspark is not installed (``pip install 'lockgate[spark]'``).
        ValueError: An active SparkContext is bound to another master, or ``ship`` names
            something :func:`code_archive` refuses.
        ModuleNotFoundError: A shipped name is not on ``sys.path``.
    """
    try:
        from pyspark.sql import SparkSession
    except ImportError as exc:  # pragma: no cover - depends on the installed extras
        raise ImportError(
            "Spark jobs need pyspark: pip install 'lockgate[spark]'", name=exc.name
        ) from exc

    archive = None
    if ship:
        tmpdir = Path(tempfile.mkdtemp(prefix="lockgate-pyfiles-"))
        atexit.register(shutil.rmtree, tmpdir, ignore_errors=True)
        staged = code_archive(ship, tmpdir / "code.zip")
        digest = hashlib.sha256(staged.read_bytes()).hexdigest()[:16]
        archive = staged.rename(tmpdir / f"lockgate-code-{digest}.zip")

    settings = {"spark.ui.enabled": "false"}
    if is_local_master(master):
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
        os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
        settings["spark.driver.host"] = "127.0.0.1"
        settings["spark.driver.bindAddress"] = "127.0.0.1"
    settings.update(conf or {})
    builder = SparkSession.builder.master(master).appName(app_name)
    for key, value in settings.items():
        builder = builder.config(key, value)
    session = builder.getOrCreate()
    actual = session.sparkContext.master
    if actual != master:
        raise ValueError(
            f"an active SparkContext is bound to {actual!r}, not {master!r}; "
            "stop it first (one SparkContext per process)"
        )
    if archive is not None:
        session.sparkContext.addPyFile(str(archive))
    return session
