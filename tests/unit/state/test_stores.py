from pathlib import Path

import pytest

from state import MemoryBackend, RocksDBBackend, StateFormatError
from state.base.store import META_FORMAT, changelog_offset_of, checkpoint_of


@pytest.fixture(params=["rocksdb", "memory"])
def backend(request: pytest.FixtureRequest, tmp_path: Path):  # type: ignore[no-untyped-def]
    return RocksDBBackend(tmp_path) if request.param == "rocksdb" else MemoryBackend()


def test_apply_get_items_and_meta(backend) -> None:  # type: ignore[no-untyped-def]
    db = backend.open("app", 3, ["a", "b"])
    assert db.key_group == 3
    db.apply(
        {"a": {b"k1": b"v1", b"k2": b"v2"}, "b": {b"x": b"y"}},
        {b"checkpoint": b"7", b"changelog_offset/a": b"12"},
    )
    db.apply({"a": {b"k1": None}}, {})
    assert db.get("a", b"k1") is None
    assert db.get("a", b"k2") == b"v2"
    assert db.get("b", b"x") == b"y"
    assert list(db.items("a")) == [(b"k2", b"v2")]
    assert checkpoint_of(db) == 7
    assert changelog_offset_of(db, "a") == 12
    assert changelog_offset_of(db, "b") == 0
    db.close()
    db = backend.open("app", 3, ["a", "b", "c"])  # survives reopen, new store added
    assert db.get("a", b"k2") == b"v2"
    assert list(db.items("c")) == []
    db.close()


def test_rocksdb_rejects_unknown_format(tmp_path: Path) -> None:
    backend = RocksDBBackend(tmp_path)
    db = backend.open("app", 0, ["s"])
    db.apply({}, {META_FORMAT: b"99"})
    db.close()
    with pytest.raises(StateFormatError, match="format v99.*delete"):
        backend.open("app", 0, ["s"])


def test_rocksdb_destroy(tmp_path: Path) -> None:
    backend = RocksDBBackend(tmp_path)
    db = backend.open("app", 1, ["s"])
    db.apply({"s": {b"k": b"v"}}, {})
    db.close()
    backend.destroy("app", 1)
    db = backend.open("app", 1, ["s"])
    assert db.get("s", b"k") is None
    db.close()


def test_iter_from_seeks_and_limits(backend) -> None:  # type: ignore[no-untyped-def]
    db = backend.open("app", 0, ["a", "b"])
    db.apply({"a": {b"k1": b"1", b"k3": b"3", b"k5": b"5", b"k7": b"7"}, "b": {b"k2": b"x"}}, {})
    assert list(db.iter_from("a", None, 10)) == [
        (b"k1", b"1"),
        (b"k3", b"3"),
        (b"k5", b"5"),
        (b"k7", b"7"),
    ]
    assert list(db.iter_from("a", b"k3", 2)) == [(b"k3", b"3"), (b"k5", b"5")]  # inclusive
    assert list(db.iter_from("a", b"k4", 10)) == [(b"k5", b"5"), (b"k7", b"7")]
    assert list(db.iter_from("a", b"k3\x00", 1)) == [(b"k5", b"5")]  # just after k3
    assert list(db.iter_from("a", b"k8", 10)) == []
    assert list(db.iter_from("a", None, 0)) == []
    assert list(db.iter_from("b", b"k0", 10)) == [(b"k2", b"x")]  # one store only
    db.apply({"a": {b"k4": b"4", b"k5": None}}, {})  # sees later writes and deletes
    assert list(db.iter_from("a", b"k4", 10)) == [(b"k4", b"4"), (b"k7", b"7")]
    db.close()


def test_iter_from_bytewise_order(backend) -> None:  # type: ignore[no-untyped-def]
    db = backend.open("app", 0, ["a"])
    keys = [b"", b"\x00", b"\x00\x00", b"\x01", b"\x7f", b"\x80", b"\xff", b"\xff\xff"]
    db.apply({"a": {k: b"v" for k in reversed(keys)}}, {})
    assert [k for k, _ in db.iter_from("a", None, 100)] == keys
    assert [k for k, _ in db.iter_from("a", b"\x7f\x00", 100)] == keys[5:]
    db.close()
