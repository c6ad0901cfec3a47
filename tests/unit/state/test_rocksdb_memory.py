"""RocksDB: the shared cache and write-buffer manager, and removing released directories."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from state.rocksdb import RocksDBBackend, RocksDBMemory
from state.rocksdb.memory import MIB


def test_databases_share_one_cache_and_memtables_are_charged_to_it(tmp_path: Path) -> None:
    memory = RocksDBMemory.for_budget(64 * MIB)
    backend = RocksDBBackend(tmp_path, memory)
    dbs = [backend.open("app", g, ["a", "b"]) for g in range(3)]
    try:
        for db in dbs:
            db.apply({"a": {f"k{i}".encode(): b"v" * 100 for i in range(5000)}}, {})
        usage = memory.usage()
        assert usage["memtable_bytes"] > 0
        assert usage["block_cache_bytes"] >= usage["memtable_bytes"]  # charged to the cache
        assert dbs[1].get("a", b"k42") == b"v" * 100
    finally:
        for db in dbs:
            db.close()
    # reopened with the defaults: the format is the same
    plain = RocksDBBackend(tmp_path).open("app", 1, ["a", "b"])
    try:
        assert plain.get("a", b"k42") == b"v" * 100
    finally:
        plain.close()


def test_sizes_are_checked() -> None:
    with pytest.raises(ValueError, match="cannot exceed"):
        RocksDBMemory(cache_bytes=8 * MIB, write_buffer_bytes=16 * MIB)
    with pytest.raises(ValueError, match="below 4 MiB"):
        RocksDBMemory.for_budget(MIB)
    assert RocksDBMemory.for_budget(1024 * MIB).memtable_bytes == 8 * MIB  # capped
    assert RocksDBMemory.for_budget(4 * MIB).memtable_bytes == MIB  # floor


def test_discard_never_removes_an_open_database(tmp_path: Path) -> None:
    backend = RocksDBBackend(tmp_path)
    db = backend.open("app", 3, ["s"])
    db.apply({"s": {b"k": b"v"}}, {})
    assert backend.is_open("app", 3)
    assert backend.discard("app", 3) is False
    assert (tmp_path / "app" / "3").is_dir()
    db.close()
    assert not backend.is_open("app", 3)
    assert backend.key_groups_on_disk("app") == [3]
    assert backend.discard("app", 3) is True
    assert backend.key_groups_on_disk("app") == []
    assert list((tmp_path / "app").iterdir()) == []  # no trash left
    assert backend.discard("app", 3) is False  # already gone


def test_discard_skips_a_database_open_in_another_process(tmp_path: Path) -> None:
    RocksDBBackend(tmp_path).open("app", 0, ["s"]).close()
    holder = subprocess.Popen(  # noqa: S603 - the test's own interpreter
        [
            sys.executable,
            "-c",
            textwrap.dedent(
                f"""
                import sys, time
                from pathlib import Path
                from state.rocksdb import RocksDBBackend
                db = RocksDBBackend(Path({str(tmp_path)!r})).open("app", 0, ["s"])
                print("open", flush=True)
                sys.stdin.read()
                db.close()
                """
            ),
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        cwd=Path(__file__).resolve().parents[3],
    )
    try:
        assert holder.stdout is not None
        assert holder.stdout.readline().strip() == b"open"
        assert RocksDBBackend(tmp_path).discard("app", 0) is False
        assert (tmp_path / "app" / "0" / "CURRENT").exists()
    finally:
        assert holder.stdin is not None
        holder.stdin.close()
        holder.wait(30)
    assert RocksDBBackend(tmp_path).discard("app", 0) is True


def test_purge_trash_finishes_an_interrupted_delete(tmp_path: Path) -> None:
    backend = RocksDBBackend(tmp_path)
    backend.open("app", 1, ["s"]).close()
    trash = tmp_path / "app" / ".trash-1-123"
    (tmp_path / "app" / "1").rename(trash)  # a crash right after the rename
    assert backend.key_groups_on_disk("app") == []  # trash is never a key group
    assert backend.purge_trash("app") == 1
    assert not trash.exists()
    assert backend.purge_trash("missing-app") == 0
