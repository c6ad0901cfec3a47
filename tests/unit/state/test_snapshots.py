"""Incremental RocksDB snapshots (state/rocksdb/snapshots.py) and their runtime component.

Real RocksDB databases; the snapshot store is a local directory, or moto's S3 server through
s3fs (skipped without them).
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import TopicPartition

from processors._task.snapshots import WORK_PREFIX, StateSnapshots
from state.base.store import (
    META_CHANGELOG_PREFIX,
    META_CHECKPOINT,
    META_UPDATED_MS,
    changelog_offset_of,
    checkpoint_of,
)
from state.rocksdb.snapshots import SnapshotError, SnapshotStore, unusable
from state.rocksdb.store import RocksDBBackend, RocksDBKeyGroupStore
from tests.support.ports import free_port

APP = "snap-app"


def _commit(db: RocksDBKeyGroupStore, ckpt: int, n: int, offset: int, start: int = 0) -> None:
    writes = {f"k{i}".encode(): f"v{i}-{ckpt}".encode() * 4 for i in range(start, start + n)}
    db.apply(
        {"s": writes},
        {
            META_CHECKPOINT: str(ckpt).encode(),
            META_UPDATED_MS: str(int(time.time() * 1000)).encode(),
            META_CHANGELOG_PREFIX + b"s": str(offset).encode(),
        },
    )


def _snapshot(db: RocksDBKeyGroupStore, store: SnapshotStore, work: Path) -> Any:
    d = work / f"ckpt-{time.time_ns()}"
    db.checkpoint_to(d)
    raw = db.get_meta(META_UPDATED_MS)
    assert raw is not None
    return store.upload(
        d, db.key_group, checkpoint_of(db), int(raw), {"s": changelog_offset_of(db, "s")}
    )


def test_upload_is_incremental_prune_keeps_the_newest_and_download_restores(
    tmp_path: Path,
) -> None:
    db = RocksDBKeyGroupStore(tmp_path / "db", 3, ["s"])
    store = SnapshotStore(str(tmp_path / "snaps"), APP)
    _commit(db, 1, 20_000, 100)
    first = _snapshot(db, store, tmp_path)
    assert first.uploaded_files == len(first.manifest.files)  # everything is new
    _commit(db, 2, 10, 110)
    second = _snapshot(db, store, tmp_path)
    # the big SST of the first snapshot is shared: only the new small files go up
    assert second.uploaded_bytes < first.uploaded_bytes / 10, (first, second)
    shared = {f.digest for f in first.manifest.files} & {f.digest for f in second.manifest.files}
    assert max(f.size for f in first.manifest.files if f.digest in shared) > 100_000
    _commit(db, 3, 10, 120, start=50_000)
    third = _snapshot(db, store, tmp_path)
    removed = store.prune(3, keep=2)
    assert removed >= 1
    names = [m.name for m in store.manifests(3)]
    assert names == [third.manifest.name, second.manifest.name]  # newest first
    # every file a kept manifest names is still there: both download and open
    for m in store.manifests(3):
        dest = tmp_path / f"restored-{m.checkpoint}"
        store.download(m, dest)
        restored = RocksDBKeyGroupStore(dest, 3, ["s"])
        assert checkpoint_of(restored) == m.checkpoint
        assert changelog_offset_of(restored, "s") == m.changelog_offsets["s"]
        assert restored.get("s", b"k5") == b"v5-2" * 4 and restored.get("s", b"k99") == b"v99-1" * 4
        new = restored.get("s", b"k50005")
        assert new == (b"v50005-3" * 4 if m.checkpoint == 3 else None)
        restored.close()
    db.close()
    assert store.remove_all() >= 3  # `lockgate reset`
    assert store.manifests(3) == []


def test_a_missing_or_altered_file_and_a_bad_manifest_are_refused(tmp_path: Path) -> None:
    db = RocksDBKeyGroupStore(tmp_path / "db", 0, ["s"])
    store = SnapshotStore(str(tmp_path / "snaps"), APP)
    _commit(db, 1, 1000, 10)
    m = _snapshot(db, store, tmp_path).manifest
    db.close()
    objects = tmp_path / "snaps" / APP / "0" / "objects"
    victim = max(m.files, key=lambda f: f.size)
    data = (objects / victim.digest).read_bytes()
    (objects / victim.digest).write_bytes(data[:-1] + bytes([data[-1] ^ 1]))
    with pytest.raises(SnapshotError, match="differs"):
        store.download(m, tmp_path / "d1")
    (objects / victim.digest).unlink()
    with pytest.raises(SnapshotError, match="missing"):
        store.download(m, tmp_path / "d2")
    manifests = tmp_path / "snaps" / APP / "0" / "manifests"
    (manifests / "000000000000001-bad.json").write_bytes(b"{not json")
    assert [x.name for x in store.manifests(0)] == [m.name]  # the bad one is skipped
    assert store.prune(0, keep=2) == 1  # and deleted by a prune
    assert not (manifests / "000000000000001-bad.json").exists()


def test_unusable_applies_the_local_state_guards(tmp_path: Path) -> None:
    db = RocksDBKeyGroupStore(tmp_path / "db", 0, ["s"])
    store = SnapshotStore(str(tmp_path / "snaps"), APP)
    _commit(db, 1, 10, 50)
    m = _snapshot(db, store, tmp_path).manifest
    db.close()
    now = int(time.time() * 1000)
    assert unusable(m, ["s"], {"s": 0}, {"s": 60}, 10_000, now) is None
    assert unusable(m, ["s", "t"], {}, {"s": 60}, 10_000, now) is None  # a store added
    assert "no longer" in str(unusable(m, ["t"], {}, {"t": 60}, 10_000, now))
    assert "ahead" in str(unusable(m, ["s"], {"s": 0}, {"s": 40}, 10_000, now))
    assert "deleted" in str(unusable(m, ["s"], {"s": 51}, {"s": 60}, 10_000, now))
    assert "older" in str(unusable(m, ["s"], {"s": 0}, {"s": 60}, 10_000, now + 20_000))


class _KG:
    def __init__(self, db: RocksDBKeyGroupStore) -> None:
        self.db = db
        self.caches: dict[str, object] = {"s": object()}


def _component(tmp_path: Path, ends: dict[tuple[str, int], int]) -> StateSnapshots:
    backend = RocksDBBackend(tmp_path / "state")
    store = SnapshotStore(str(tmp_path / "snaps"), APP)

    def end_offsets(tps: list[TopicPartition]) -> dict[tuple[str, int], int]:
        return {(tp.topic, tp.partition): ends.get((tp.topic, tp.partition), 0) for tp in tps}

    def start_offsets(tps: list[TopicPartition]) -> dict[tuple[str, int], int]:
        return {(tp.topic, tp.partition): 0 for tp in tps}

    return StateSnapshots(APP, backend, store, 0.0, 2, start_offsets, end_offsets)


def _wait_uploaded(snaps: StateSnapshots, count: int) -> None:
    deadline = time.monotonic() + 20
    while snaps.stats.uploaded + snaps.stats.failed < count:
        assert time.monotonic() < deadline, snaps.stats
        time.sleep(0.02)


def test_component_takes_uploads_and_seeds_an_absent_key_group(tmp_path: Path) -> None:
    ends = {(f"{APP}.s.changelog", 1): 300}
    snaps = _component(tmp_path, ends)
    backend = RocksDBBackend(tmp_path / "state")
    db = backend.open(APP, 1, ["s"])
    _commit(db, 7, 5000, 300)
    snaps.after_commit({1: _KG(db)}, [1])
    _wait_uploaded(snaps, 1)
    assert snaps.stats.uploaded == 1, snaps.stats
    assert not list((tmp_path / "state" / APP).glob(WORK_PREFIX + "*"))  # hard links removed
    db.close()
    # present local state is kept as it is
    assert snaps.seed(1, ["s"], 10_000_000) is False
    backend.destroy(APP, 1)  # a fresh volume
    assert snaps.seed(1, ["s"], 10_000_000) is True
    restored = backend.open(APP, 1, ["s"])
    assert checkpoint_of(restored) == 7 and changelog_offset_of(restored, "s") == 300
    assert restored.get("s", b"k4999") == b"v4999-7" * 4
    restored.close()
    # a snapshot beyond the age guard is not used
    backend.destroy(APP, 1)
    assert snaps.seed(1, ["s"], -1) is False
    assert snaps.stats.fallbacks == 1
    snaps.close()


def test_component_falls_back_to_an_older_snapshot_then_to_nothing(tmp_path: Path) -> None:
    ends = {(f"{APP}.s.changelog", 2): 400}
    snaps = _component(tmp_path, ends)
    backend = RocksDBBackend(tmp_path / "state")
    db = backend.open(APP, 2, ["s"])
    _commit(db, 1, 3000, 200)
    snaps.after_commit({2: _KG(db)}, [2])
    _wait_uploaded(snaps, 1)
    _commit(db, 2, 3000, 400, start=3000)
    snaps.after_commit({2: _KG(db)}, [2])
    _wait_uploaded(snaps, 2)
    db.close()
    backend.destroy(APP, 2)
    newest, older = snaps.store.manifests(2)
    objects = tmp_path / "snaps" / APP / "2" / "objects"
    only_newest = {f.digest for f in newest.files} - {f.digest for f in older.files}
    for digest in only_newest:
        (objects / digest).unlink()
    assert snaps.seed(2, ["s"], 10_000_000) is True
    restored = backend.open(APP, 2, ["s"])
    assert checkpoint_of(restored) == 1  # the older one, complete
    restored.close()
    backend.destroy(APP, 2)
    for digest in os.listdir(objects):
        (objects / digest).unlink()
    assert snaps.seed(2, ["s"], 10_000_000) is False
    assert not (tmp_path / "state" / APP / "2").exists()
    assert not list((tmp_path / "state" / APP).glob(WORK_PREFIX + "*"))
    snaps.close()


# ------------------------------------------------------------------ S3 (moto)


@pytest.fixture(scope="module")
def s3_endpoint() -> Iterator[str]:
    pytest.importorskip("s3fs")
    moto_server = pytest.importorskip("moto.server")
    port = free_port()
    server = moto_server.ThreadedMotoServer(ip_address="127.0.0.1", port=port)
    server.start()
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.stop()


def test_snapshots_in_s3(tmp_path: Path, s3_endpoint: str, monkeypatch: pytest.MonkeyPatch) -> None:
    import s3fs  # noqa: PLC0415 - optional

    for name in ("AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_ENDPOINT_URL_S3"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "lockgate")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "lockgate-secret")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    monkeypatch.setenv("AWS_ENDPOINT_URL", s3_endpoint)
    s3fs.S3FileSystem.clear_instance_cache()
    fs = s3fs.S3FileSystem(endpoint_url=s3_endpoint, skip_instance_cache=True)
    if not fs.exists("snaps"):
        fs.mkdir("snaps")
    store = SnapshotStore("s3://snaps/root", APP)
    db = RocksDBKeyGroupStore(tmp_path / "db", 5, ["s"])
    _commit(db, 1, 2000, 10)
    first = _snapshot(db, store, tmp_path)
    _commit(db, 2, 10, 20)
    second = _snapshot(db, store, tmp_path)
    _commit(db, 3, 10, 30, start=10)
    _snapshot(db, store, tmp_path)
    db.close()
    assert second.uploaded_bytes < first.uploaded_bytes
    assert store.prune(5, keep=1) >= 1
    (m,) = store.manifests(5)
    assert m.checkpoint == 3
    store.download(m, tmp_path / "restored")
    restored = RocksDBKeyGroupStore(tmp_path / "restored", 5, ["s"])
    assert restored.get("s", b"k15") == b"v15-3" * 4 and checkpoint_of(restored) == 3
    restored.close()
