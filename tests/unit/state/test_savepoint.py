import os
import re
import sys
import types
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

import state.locations as locations_mod
import state.savepoint as sp_mod
from state import MemoryBackend, RocksDBBackend
from state.savepoint import (
    SavepointError,
    SavepointStore,
    StoreFile,
    check_compatible,
    check_savepoint_id,
    merged_items,
    new_savepoint_id,
)

SP = "sp-20250102T030405Z-a1b2c3"


@pytest.fixture
def store(tmp_path: Path) -> SavepointStore:
    return SavepointStore(str(tmp_path / "savepoints"))


def _path(tmp_path: Path, *parts: str) -> Path:
    return tmp_path.joinpath("savepoints", *parts)


# ------------------------------------------------------------------ ids


def test_new_savepoint_id_form_and_time() -> None:
    sid = new_savepoint_id(now_ms=1_735_787_045_123)  # 2025-01-02T03:04:05.123Z
    assert sid.startswith("sp-20250102T030405Z-")
    assert check_savepoint_id(sid) == sid
    assert new_savepoint_id(0).startswith("sp-19700101T000000Z-")
    assert check_savepoint_id(new_savepoint_id()) is not None
    assert new_savepoint_id(0) != new_savepoint_id(0)  # random suffix (1 in 16M clash)


@pytest.mark.parametrize(
    "bad",
    [
        "",
        "../x",
        "sp-20250102T030405Z-a1b2c3/../x",
        "sp-20250102T030405Z-a1b2c3\n",
        "sp-20250102T030405Z-A1B2C3",
        "sp-20250102T030405Z-a1b2c",
        "sp-20251340T030405Z-a1b2c3",  # month 13
        "sp-20250102T030405-a1b2c3",
        "/abs/sp-20250102T030405Z-a1b2c3",
        "sp-20250102T030405Z-a1b2c3x",
    ],
)
def test_check_savepoint_id_refuses(bad: str) -> None:
    with pytest.raises(SavepointError, match="invalid savepoint id"):
        check_savepoint_id(bad)


def test_check_savepoint_id_refuses_non_str() -> None:
    with pytest.raises(SavepointError):
        check_savepoint_id(123)  # type: ignore[arg-type]


def test_paths_are_validated_before_any_io(store: SavepointStore, tmp_path: Path) -> None:
    with pytest.raises(SavepointError, match="invalid savepoint id"):
        store.write_store("../x", "app", 0, "s", [])
    with pytest.raises(SavepointError, match="invalid app name"):
        store.write_store(SP, "../app", 0, "s", [])
    with pytest.raises(SavepointError, match="invalid app name"):
        store.write_manifest(SP, "a/b", 0, {})
    with pytest.raises(SavepointError, match="invalid store name"):
        store.write_store(SP, "app", 0, "../s", [])
    with pytest.raises(SavepointError, match="invalid store name"):
        store.write_store(SP, "app", 0, ".hidden", [])
    with pytest.raises(SavepointError, match="invalid key group"):
        store.write_store(SP, "app", -1, "s", [])
    with pytest.raises(SavepointError, match="invalid key group"):
        store.read_manifest(SP, "app", True)
    with pytest.raises(SavepointError, match="invalid savepoint id"):
        store.write_descriptor("..", {})
    with pytest.raises(SavepointError, match="invalid app name"):
        store.list_key_groups(SP, "..")
    assert not (tmp_path / "savepoints").exists()
    assert not (tmp_path / "x").exists()


# ---------------------------------------------------------- store files


def test_round_trip_several_stores(store: SavepointStore, tmp_path: Path) -> None:
    data = {
        "total": [(b"a", b"1"), (b"b", b"22"), (b"c", b"")],
        "binary": sorted(
            [(b"", b"\x00"), (b"\x00", b"\xff" * 300), (b"\xff\xff", b"\x00\x01"), (b"\x7f", b"x")]
        ),
        "empty": [],
    }
    files = {name: store.write_store(SP, "app", 3, name, items) for name, items in data.items()}
    for name, items in data.items():
        sf = files[name]
        assert re.fullmatch(rf"{name}\.[0-9a-f]{{8}}\.lgs", sf.name), sf.name
        assert sf.entries == len(items)
        path = _path(tmp_path, SP, "app", "3", sf.name)
        assert sf.bytes == path.stat().st_size
        assert len(sf.sha256) == 64
        it = store.read_store(SP, "app", 3, name, sf)
        assert isinstance(it, types.GeneratorType)
        assert list(it) == items
        store.verify_store(SP, "app", 3, name, sf)
    assert files["empty"].bytes == 12 + 20  # header + footer
    assert sorted(os.listdir(_path(tmp_path, SP, "app", "3"))) == sorted(
        f.name for f in files.values()
    )


def test_file_url_is_local(tmp_path: Path) -> None:
    store = SavepointStore((tmp_path / "sp dir").as_uri())
    sf = store.write_store(SP, "app", 0, "s", [(b"k", b"v")])
    assert (tmp_path / "sp dir" / SP / "app" / "0" / sf.name).stat().st_size == sf.bytes
    assert list(store.read_store(SP, "app", 0, "s", sf)) == [(b"k", b"v")]
    with pytest.raises(SavepointError, match="file URL"):
        SavepointStore("file://otherhost/x")


def _many(n: int) -> Iterator[tuple[bytes, bytes]]:
    for i in range(n):
        yield f"key-{i:08d}".encode(), i.to_bytes(4, "big") * 3


def test_100k_entries_stream_in_bounded_chunks(
    store: SavepointStore, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Streaming by design: the writer flushes fixed-size chunks to the temporary file
    # while the items are still being produced, and the reader is a generator that
    # reads the file in chunks; neither ever holds the whole state.
    monkeypatch.setattr(sp_mod, "_CHUNK", 64 * 1024)
    kg_dir = _path(tmp_path, SP, "app", "0")
    n = 100_000
    seen_on_disk: list[int] = []

    def produce() -> Iterator[tuple[bytes, bytes]]:
        for i, item in enumerate(_many(n)):
            if i == n // 2:
                tmps = [p for p in kg_dir.iterdir() if p.name.startswith(".big.")]
                assert len(tmps) == 1
                seen_on_disk.append(tmps[0].stat().st_size)
            yield item

    sf = store.write_store(SP, "app", 0, "big", produce())
    assert sf.entries == n
    assert seen_on_disk and seen_on_disk[0] > 64 * 1024  # half the file was already written
    assert seen_on_disk[0] < sf.bytes
    assert [p.name for p in kg_dir.iterdir()] == [sf.name]  # no temporary file left

    reads: list[int] = []
    real_open = locations_mod._LocalFs.open_read

    def spying_open(self: object, rel: str):  # type: ignore[no-untyped-def]
        f = real_open(self, rel)  # type: ignore[arg-type]
        real_read = f.read

        def read(size: int = -1) -> bytes:
            reads.append(size)
            return real_read(size)

        f.read = read  # type: ignore[method-assign]
        return f

    monkeypatch.setattr(locations_mod._LocalFs, "open_read", spying_open)
    it = store.read_store(SP, "app", 0, "big", sf)
    count = 0
    for got, want in zip(it, _many(n), strict=True):
        assert got == want
        count += 1
    assert count == n
    assert reads and all(0 <= size <= 64 * 1024 for size in reads)  # never read(-1)


def _flip_byte(path: Path, offset: int) -> None:
    raw = bytearray(path.read_bytes())
    raw[offset] ^= 0x01
    path.write_bytes(bytes(raw))


@pytest.mark.parametrize("where", ["header", "middle", "footer"])
def test_checksum_mismatch_raises_before_any_item(
    store: SavepointStore, tmp_path: Path, where: str
) -> None:
    sf = store.write_store(SP, "app", 1, "total", _many(1000))
    path = _path(tmp_path, SP, "app", "1", sf.name)
    offset = {"header": 3, "middle": sf.bytes // 2, "footer": sf.bytes - 1}[where]
    _flip_byte(path, offset)
    yielded = []
    with pytest.raises(SavepointError, match=r"total\.[0-9a-f]{8}\.lgs is corrupt: its SHA-256"):
        for item in store.read_store(SP, "app", 1, "total", sf):
            yielded.append(item)
    assert yielded == []
    with pytest.raises(SavepointError, match=r"total\.[0-9a-f]{8}\.lgs is corrupt"):
        store.verify_store(SP, "app", 1, "total", sf)


@pytest.mark.parametrize("cut", [1, 20, 5000])
def test_truncation_raises_before_any_item(store: SavepointStore, tmp_path: Path, cut: int) -> None:
    sf = store.write_store(SP, "app", 1, "total", _many(1000))
    path = _path(tmp_path, SP, "app", "1", sf.name)
    raw = path.read_bytes()
    path.write_bytes(raw[:-cut])
    yielded = []
    with pytest.raises(SavepointError, match=r"total\.[0-9a-f]{8}\.lgs is truncated"):
        for item in store.read_store(SP, "app", 1, "total", sf):
            yielded.append(item)
    assert yielded == []


def test_size_and_entry_count_mismatch(store: SavepointStore, tmp_path: Path) -> None:
    sf = store.write_store(SP, "app", 1, "total", _many(10))
    path = _path(tmp_path, SP, "app", "1", sf.name)
    with pytest.raises(SavepointError, match="has 10 entries, the manifest says 11"):
        next(store.read_store(SP, "app", 1, "total", StoreFile(sf.name, sf.sha256, 11, sf.bytes)))
    with pytest.raises(SavepointError, match="manifest entry is for 'other.lgs'"):
        store.verify_store(SP, "app", 1, "total", StoreFile("other.lgs", sf.sha256, 10, sf.bytes))
    path.write_bytes(path.read_bytes() + b"x")
    with pytest.raises(SavepointError, match=f"has {sf.bytes + 1} bytes, the manifest says"):
        store.verify_store(SP, "app", 1, "total", sf)


def test_unknown_format_version(store: SavepointStore, tmp_path: Path) -> None:
    import hashlib

    sf = store.write_store(SP, "app", 0, "s", [(b"k", b"v")])
    path = _path(tmp_path, SP, "app", "0", sf.name)
    raw = bytearray(path.read_bytes())
    raw[8:12] = (2).to_bytes(4, "big")
    path.write_bytes(bytes(raw))
    forged = StoreFile(sf.name, hashlib.sha256(bytes(raw)).hexdigest(), 1, sf.bytes)
    with pytest.raises(SavepointError, match="format v2, this build reads v1"):
        next(store.read_store(SP, "app", 0, "s", forged))


def test_missing_store_file(store: SavepointStore) -> None:
    sf = StoreFile("total.lgs", "0" * 64, 0, 32)
    it = store.read_store(SP, "app", 7, "total", sf)
    with pytest.raises(SavepointError, match=f"savepoint {SP} has no file for store 'total'.*7"):
        next(it)


def test_read_store_closes_file_when_abandoned(store: SavepointStore) -> None:
    sf = store.write_store(SP, "app", 0, "s", _many(10))
    it = store.read_store(SP, "app", 0, "s", sf)
    assert next(it) == next(_many(1))
    it.close()  # type: ignore[attr-defined]  # a generator: closes the file


def test_overwrite_is_atomic(store: SavepointStore, tmp_path: Path) -> None:
    kg_dir = _path(tmp_path, SP, "app", "2")
    first = store.write_store(SP, "app", 2, "s", [(b"a", b"1"), (b"b", b"2")])

    def failing() -> Iterator[tuple[bytes, bytes]]:
        yield b"a", b"x" * 10
        raise RuntimeError("epoch aborted")

    with pytest.raises(RuntimeError, match="epoch aborted"):
        store.write_store(SP, "app", 2, "s", failing())
    with pytest.raises(ValueError, match="sorted"):
        store.write_store(SP, "app", 2, "s", [(b"b", b"1"), (b"a", b"2")])
    with pytest.raises(ValueError, match="sorted"):
        store.write_store(SP, "app", 2, "s", [(b"a", b"1"), (b"a", b"2")])
    assert os.listdir(kg_dir) == [first.name]  # no temporary files, the old file intact
    assert list(store.read_store(SP, "app", 2, "s", first)) == [(b"a", b"1"), (b"b", b"2")]

    second = store.write_store(SP, "app", 2, "s", [(b"c", b"3")])  # the replayed export
    assert sorted(os.listdir(kg_dir)) == sorted([first.name, second.name])
    assert list(store.read_store(SP, "app", 2, "s", second)) == [(b"c", b"3")]
    assert list(store.read_store(SP, "app", 2, "s", first)) == [(b"a", b"1"), (b"b", b"2")]


def test_a_second_export_of_a_key_group_never_replaces_the_first_ones_file(
    store: SavepointStore,
) -> None:
    """Issue 25, hole 8: a fenced exporter renaming its file after the new owner's export.

    The new owner of a key group exports it and commits a manifest naming its file; the
    fenced previous owner, still exporting the same savepoint, finishes its own file
    afterwards (its manifest is aborted with its transaction). The committed manifest's
    file must still be the new owner's: with one file name per store (before), the late
    rename replaced it and the restore failed its checksum.
    """
    new_owner = store.write_store(SP, "app", 4, "s", [(b"k", b"new")])
    fenced = store.write_store(SP, "app", 4, "s", [(b"k", b"stale"), (b"z", b"1")])
    assert fenced.name != new_owner.name
    store.verify_store(SP, "app", 4, "s", new_owner)
    assert list(store.read_store(SP, "app", 4, "s", new_owner)) == [(b"k", b"new")]


def test_a_manifest_written_before_tokens_is_read(store: SavepointStore, tmp_path: Path) -> None:
    sf = store.write_store(SP, "app", 5, "s", [(b"k", b"v")])
    kg_dir = _path(tmp_path, SP, "app", "5")
    (kg_dir / sf.name).rename(kg_dir / "s.lgs")
    legacy = StoreFile("s.lgs", sf.sha256, sf.entries, sf.bytes)
    assert list(store.read_store(SP, "app", 5, "s", legacy)) == [(b"k", b"v")]
    for other in ("t.lgs", "s.x.lgs", "s.0123456789.lgs", "../s.lgs"):
        with pytest.raises(SavepointError, match="manifest entry is for"):
            store.verify_store(SP, "app", 5, "s", StoreFile(other, sf.sha256, 1, sf.bytes))


def test_store_file_dict_round_trip() -> None:
    sf = StoreFile("s.lgs", "ab" * 32, 3, 100)
    assert StoreFile.from_dict(sf.to_dict()) == sf
    for bad in (
        {},
        {**sf.to_dict(), "sha256": "xyz"},
        {**sf.to_dict(), "entries": -1},
        {**sf.to_dict(), "bytes": True},
        {**sf.to_dict(), "name": "s.txt"},
    ):
        with pytest.raises(SavepointError, match="malformed store file entry"):
            StoreFile.from_dict(bad)


# ---------------------------------------------------- manifests, listings


def test_manifest_and_descriptor_round_trip(store: SavepointStore, tmp_path: Path) -> None:
    sf = store.write_store(SP, "app", 4, "s", [(b"k", b"v")])
    manifest = {"checkpoint": 12, "stores": {"s": sf.to_dict()}, "offsets": {"in": [1, 2]}}
    store.write_manifest(SP, "app", 4, manifest)
    assert store.read_manifest(SP, "app", 4) == manifest
    store.write_manifest(SP, "app", 4, {"checkpoint": 13})  # replaced
    assert store.read_manifest(SP, "app", 4) == {"checkpoint": 13}
    descriptor = {"app": "app", "key_groups": 8, "stores": {"s": {"kind": "value"}}}
    store.write_descriptor(SP, descriptor)
    assert store.read_descriptor(SP) == descriptor
    assert _path(tmp_path, SP, "_savepoint.json").is_file()
    assert _path(tmp_path, SP, "app", "4", "manifest.json").is_file()
    assert [p.name for p in _path(tmp_path, SP).iterdir() if p.name.startswith(".")] == []


def test_missing_and_bad_manifests(store: SavepointStore, tmp_path: Path) -> None:
    with pytest.raises(
        SavepointError,
        match=rf"savepoint {SP} has no manifest for app app key group 3 \(was the savepoint",
    ):
        store.read_manifest(SP, "app", 3)
    with pytest.raises(SavepointError, match=f"savepoint {SP} has no _savepoint.json"):
        store.read_descriptor(SP)
    store.write_manifest(SP, "app", 3, {})
    _path(tmp_path, SP, "app", "3", "manifest.json").write_bytes(b"{not json")
    with pytest.raises(SavepointError, match=r"manifest\.json is not valid JSON"):
        store.read_manifest(SP, "app", 3)
    _path(tmp_path, SP, "app", "3", "manifest.json").write_bytes(b"[1]")
    with pytest.raises(SavepointError, match="does not hold a JSON object"):
        store.read_manifest(SP, "app", 3)


def test_list_savepoints_and_key_groups(store: SavepointStore, tmp_path: Path) -> None:
    assert store.list_savepoints() == []  # the root does not exist yet
    assert store.list_key_groups(SP, "app") == []
    older = "sp-20240101T000000Z-ffffff"
    incomplete = "sp-20260101T000000Z-000000"
    for sid in (SP, older, incomplete):
        store.write_manifest(sid, "app", 0, {})
    store.write_descriptor(SP, {})
    store.write_descriptor(older, {})
    (tmp_path / "savepoints" / "junk").mkdir()
    (tmp_path / "savepoints" / "sp-bad").mkdir()
    (tmp_path / "savepoints" / "notes.txt").write_text("x")
    assert store.list_savepoints() == [older, SP]

    for g in (10, 2, 0):
        store.write_manifest(SP, "app", g, {"g": g})
    store.write_store(SP, "app", 5, "s", [])  # no manifest yet: not listed
    store.write_manifest(SP, "other", 1, {})
    kg_root = _path(tmp_path, SP, "app")
    (kg_root / "07").mkdir()
    (kg_root / "07" / "manifest.json").write_text("{}")
    (kg_root / "x").mkdir()
    assert store.list_key_groups(SP, "app") == [0, 2, 10]
    assert store.list_key_groups(SP, "other") == [1]
    assert store.list_key_groups(SP, "none") == []


# ------------------------------------------------------------ compatibility


def _spec(kind: str, codec: str = "json") -> dict[str, str]:
    return {"kind": kind, "codec": codec}


def test_check_compatible_restores_matching_stores() -> None:
    saved = {"total": _spec("value"), "seen": _spec("map", "pickle")}
    current = {"seen": _spec("map", "pickle"), "total": _spec("value"), "new": _spec("list")}
    assert check_compatible(saved, current, allow_non_restored=False) == ["seen", "total"]
    assert check_compatible({}, current, allow_non_restored=False) == []


def test_check_compatible_refuses_changed_kind_or_codec() -> None:
    with pytest.raises(
        SavepointError,
        match=(
            r"store 'total': saved as value/json, the app declares list/json; keep the old "
            r"definition or rename the store"
        ),
    ):
        check_compatible({"total": _spec("value")}, {"total": _spec("list")}, True)
    with pytest.raises(SavepointError, match="saved as value/json, the app declares value/str"):
        check_compatible({"total": _spec("value")}, {"total": _spec("value", "str")}, True)


def test_check_compatible_dropped_stores() -> None:
    saved = {"old": _spec("value"), "total": _spec("value")}
    current = {"total": _spec("value")}
    with pytest.raises(
        SavepointError, match=r"store 'old' .*dropped stores need --allow-non-restored-state"
    ):
        check_compatible(saved, current, allow_non_restored=False)
    assert check_compatible(saved, current, allow_non_restored=True) == ["total"]


def test_check_compatible_names_every_problem() -> None:
    saved = {"a": _spec("value"), "b": _spec("value"), "c": _spec("map")}
    current = {"b": _spec("list"), "c": _spec("map")}
    with pytest.raises(SavepointError) as info:
        check_compatible(saved, current, allow_non_restored=False)
    assert "'a'" in str(info.value) and "'b'" in str(info.value) and "'c'" not in str(info.value)


# ------------------------------------------------------------ overlay merge

_keys = st.binary(max_size=6)


@given(
    base=st.dictionaries(_keys, st.binary(max_size=4)),
    overlay=st.dictionaries(_keys, st.none() | st.binary(max_size=4)),
)
def test_merged_items_matches_dict_model(
    base: dict[bytes, bytes], overlay: dict[bytes, bytes | None]
) -> None:
    model = dict(base)
    for key, value in overlay.items():
        if value is None:
            model.pop(key, None)
        else:
            model[key] = value
    merged = list(merged_items(iter(sorted(base.items())), overlay))
    assert merged == sorted(model.items())
    keys = [k for k, _ in merged]
    assert keys == sorted(set(keys))  # strictly increasing: valid input for write_store


@given(base=st.dictionaries(_keys, st.binary(max_size=4)))
def test_merged_items_empty_overlay_is_identity(base: dict[bytes, bytes]) -> None:
    items = sorted(base.items())
    assert list(merged_items(items, {})) == items


def test_merged_items_is_lazy_and_checks_order() -> None:
    def base() -> Iterator[tuple[bytes, bytes]]:
        yield b"b", b"1"
        raise AssertionError("read past the first item")

    it = merged_items(base(), {b"a": b"0", b"c": None})
    assert next(it) == (b"a", b"0")
    assert next(it) == (b"b", b"1")
    with pytest.raises(ValueError, match="sorted"):
        list(merged_items([(b"b", b"1"), (b"a", b"2")], {}))
    with pytest.raises(ValueError, match="sorted"):
        list(merged_items([(b"a", b"1"), (b"a", b"2")], {}))


@pytest.mark.parametrize("backend_name", ["rocksdb", "memory"])
def test_export_backend_with_overlay(
    store: SavepointStore, tmp_path: Path, backend_name: str
) -> None:
    backend = RocksDBBackend(tmp_path / "db") if backend_name == "rocksdb" else MemoryBackend()
    db = backend.open("app", 0, ["s"])
    committed = {b"\xff": b"1", b"a": b"2", b"m": b"3", b"\x00": b"4"}
    db.apply({"s": committed}, {})
    overlay: dict[bytes, bytes | None] = {b"m": None, b"b": b"new", b"\xff": b"9"}
    sf = store.write_store(SP, "app", 0, "s", merged_items(db.items("s"), overlay))
    db.close()
    want = sorted({b"\x00": b"4", b"a": b"2", b"b": b"new", b"\xff": b"9"}.items())
    assert list(store.read_store(SP, "app", 0, "s", sf)) == want


# ------------------------------------------------------------------ fsspec


def test_fsspec_missing_gives_install_hint(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "fsspec", None)
    monkeypatch.setitem(sys.modules, "fsspec.core", None)
    with pytest.raises(SavepointError, match="install fsspec and the filesystem's package"):
        SavepointStore("s3://bucket/savepoints")


def test_fsspec_memory_round_trip() -> None:
    fsspec = pytest.importorskip("fsspec")
    root = f"memory://lockgate-test-{uuid.uuid4().hex}/sp"
    store = SavepointStore(root)
    assert store.list_savepoints() == []
    items = [(b"", b""), (b"\x00", b"\xff" * 100), (b"k", b"v")]
    sf = store.write_store(SP, "app", 3, "s", items)
    empty = store.write_store(SP, "app", 3, "e", [])
    sf2 = store.write_store(SP, "app", 3, "s", items[1:])  # a second export, its own file
    assert sf2 != sf
    store.write_manifest(SP, "app", 3, {"stores": {"s": sf2.to_dict(), "e": empty.to_dict()}})
    store.write_descriptor(SP, {"app": "app"})
    assert store.list_savepoints() == [SP]
    assert store.list_key_groups(SP, "app") == [3]
    manifest = store.read_manifest(SP, "app", 3)
    back = StoreFile.from_dict(manifest["stores"]["s"])
    assert list(store.read_store(SP, "app", 3, "s", back)) == items[1:]
    assert list(store.read_store(SP, "app", 3, "e", empty)) == []
    assert list(store.read_store(SP, "app", 3, "s", sf)) == items  # its own file, intact
    with pytest.raises(SavepointError, match=f"{root}/{SP}/app/4/manifest.json not found"):
        store.read_manifest(SP, "app", 4)
    assert store.read_descriptor(SP) == {"app": "app"}
    fs = fsspec.filesystem("memory")
    kg_dir = root.removeprefix("memory:/") + f"/{SP}/app/3"
    assert sorted(p.rsplit("/", 1)[1] for p in fs.ls(kg_dir, detail=False)) == sorted(
        [empty.name, "manifest.json", sf.name, sf2.name]
    )  # no temporary files left; each export its own file
    fs.rm(root.removeprefix("memory:/").rsplit("/", 1)[0], recursive=True)


def test_fsspec_unknown_protocol() -> None:
    pytest.importorskip("fsspec")
    with pytest.raises(SavepointError, match="savepoint location"):
        SavepointStore("nosuchproto-xyz://bucket/x")
