"""An Iceberg warehouse for tests, and the independent checker of examples/iceberg_sink.py.

The warehouse is pyiceberg's SQL catalog on a SQLite file (under a test's tmp dir) with the
data either in a local-filesystem directory there or in a bucket of an S3 API server
(tests/support/s3_server.py: a SeaweedFS server, over HTTP). The model is computed from
the input as stored in Kafka (``read_inputs``: per key in partition order), never from the app: per
key the running total of ``v``. The table must hold exactly one row per input ``seq`` (none
missing, none twice) with the key's running total at that record; no prepare marker may be
left, and every data file under the table's data directory must be in the table (no file of
an aborted epoch left behind).
"""

from __future__ import annotations

import sqlite3
import threading
import time
from collections import Counter
from pathlib import Path
from typing import TYPE_CHECKING, Any

from examples.iceberg_sink import create_table

if TYPE_CHECKING:
    from tests.support.s3_server import S3Server


class Warehouse:
    """A SQL catalog on SQLite under ``root``; the warehouse a directory there, or
    ``s3://<bucket>/warehouse`` on ``s3`` (the bucket is created).

    ``properties`` are the catalog's (with the S3 server's FileIO properties, credentials
    included: the checker's own access, not the app's).
    """

    def __init__(self, root: Path, s3: S3Server | None = None, bucket: str = "") -> None:
        root.mkdir(parents=True, exist_ok=True)
        self.db = root / "catalog.db"
        self.s3 = s3
        self.dir = root / "warehouse"
        if s3 is None:
            self.dir.mkdir(exist_ok=True)
            warehouse = f"file://{self.dir}"
        else:
            s3.create_bucket(bucket)
            warehouse = f"s3://{bucket}/warehouse"
        self.properties = {"type": "sql", "uri": f"sqlite:///{self.db}", "warehouse": warehouse}
        if s3 is not None:
            self.properties |= s3.file_io_properties()

    def files(self, location: str, subdir: str, suffix: str) -> list[str]:
        """The names of the files ending in ``suffix`` under ``<location>/<subdir>`` (any
        depth), listed from the file store itself (not through the table)."""
        if location.startswith("s3://"):
            assert self.s3 is not None
            fs = self.s3.fs()
            base = f"{location.removeprefix('s3://').rstrip('/')}/{subdir}"
            return sorted(p.rpartition("/")[2] for p in fs.find(base) if p.endswith(suffix))
        base_dir = Path(location.removeprefix("file://")) / subdir
        return sorted(p.name for p in base_dir.rglob(f"*{suffix}"))

    def catalog(self) -> Any:
        from pyiceberg.catalog import load_catalog

        return load_catalog("default", **self.properties)

    def create(self, table: str) -> None:
        create_table(self.properties, table)

    def rows(self, table: str) -> list[dict[str, Any]]:
        """Every row of ``table`` as of now (an empty list while it has no snapshot)."""
        rows: list[dict[str, Any]] = self.catalog().load_table(table).scan().to_arrow().to_pylist()
        return rows

    def count(self, table: str) -> int:
        """Distinct ``seq`` in the table (-1 while the catalog is locked)."""
        try:
            return len({r["seq"] for r in self.rows(table)})
        except Exception:  # noqa: BLE001 - locked by a test's outage
            return -1

    def markers(self, table: str) -> list[str]:
        """The prepare markers left in ``table``'s location (settled ones are deleted)."""
        try:
            return self.files(self.catalog().load_table(table).location(), "lockgate", ".json")
        except Exception:  # noqa: BLE001 - locked by a test's outage
            return ["?"]

    def lock_catalog(self, seconds: float) -> threading.Thread:
        """Hold an exclusive lock on the catalog's SQLite file for ``seconds`` (an outage)."""
        held = threading.Event()

        def hold() -> None:
            conn = sqlite3.connect(self.db, timeout=30, isolation_level=None)
            try:
                conn.execute("BEGIN EXCLUSIVE")
                held.set()
                time.sleep(seconds)
                conn.execute("ROLLBACK")
            finally:
                conn.close()

        thread = threading.Thread(target=hold, daemon=True)
        thread.start()
        assert held.wait(30), "could not lock the catalog"
        return thread


def expected_events(inputs: list[tuple[str, int, int]]) -> dict[int, tuple[str, int, int]]:
    """seq -> (key, v, total) of an uninterrupted run."""
    events: dict[int, tuple[str, int, int]] = {}
    sums: dict[str, int] = {}
    for key, v, seq in inputs:
        sums[key] = sums.get(key, 0) + v
        events[seq] = (key, v, sums[key])
    return events


def check_table(wh: Warehouse, table: str, inputs: list[tuple[str, int, int]]) -> list[str]:
    """The differences between the table and the model (``[]``: exact)."""
    events = expected_events(inputs)
    problems: list[str] = []
    tbl = wh.catalog().load_table(table)
    rows = tbl.scan().to_arrow().to_pylist()
    seen = Counter(r["seq"] for r in rows)
    dup = sorted(s for s, n in seen.items() if n > 1)
    if dup:
        problems.append(f"{len(dup)} events written more than once, e.g. seq {dup[:5]}")
    missing = sorted(set(events) - set(seen))
    if missing:
        problems.append(f"{len(missing)} events missing, e.g. seq {missing[:5]}")
    extra = sorted(set(seen) - set(events))
    if extra:
        problems.append(f"{len(extra)} events of no input, e.g. seq {extra[:5]}")
    wrong = [
        r for r in rows if r["seq"] in events and (r["key"], r["v"], r["total"]) != events[r["seq"]]
    ]
    if wrong:
        problems.append(f"{len(wrong)} events differ from the model, e.g. {wrong[0]}")
    markers = wh.files(tbl.location(), "lockgate", ".json")
    if markers:
        problems.append(f"{len(markers)} prepare markers left, e.g. {markers[:3]}")
    in_table = {f.file.file_path.rpartition("/")[2] for f in tbl.scan().plan_files()}
    on_disk = set(wh.files(tbl.location(), "data", ".parquet"))
    orphans = sorted(on_disk - in_table)
    if orphans:
        problems.append(f"{len(orphans)} data files not in the table, e.g. {orphans[:3]}")
    return problems
