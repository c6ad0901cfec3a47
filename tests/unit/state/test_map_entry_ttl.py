"""Map state with per-entry TTL: each map key expires on its own."""

from pathlib import Path
from typing import Any

import pytest

from state import JSON, MemoryBackend, RocksDBBackend, StateError
from state.base.store import KeyGroupStore
from state.cache import DELETED, KeyCursor, StoreCache
from state.primitives import MapState, StoreSpec, live_value, sweep_expired

SPEC = StoreSpec("m", "map", ttl_ms=100, entry_ttl=True)


@pytest.fixture(params=["rocksdb", "memory"])
def db(request: pytest.FixtureRequest, tmp_path: Path):  # type: ignore[no-untyped-def]
    backend = RocksDBBackend(tmp_path) if request.param == "rocksdb" else MemoryBackend()
    store = backend.open("app", 0, ["m"])
    yield store
    store.close()


def _map(db: KeyGroupStore, spec: StoreSpec = SPEC) -> tuple[MapState[Any], KeyCursor, StoreCache]:
    cursor = KeyCursor()
    cache = StoreCache(spec.name, JSON, db)
    mp: MapState[Any] = MapState(spec, cursor)
    mp.bind(cache)
    cursor.key = b"k"
    return mp, cursor, cache


def test_entries_expire_one_by_one(db: KeyGroupStore) -> None:
    mp, cursor, cache = _map(db)
    cursor.now_ms = 0
    mp.put("a", 1)
    cursor.now_ms = 50
    mp.put("b", 2)
    cursor.now_ms = 99
    assert sorted(mp.items()) == [("a", 1), ("b", 2)]
    cursor.now_ms = 100
    assert mp.get("a") is None and mp.get("a", "dflt") == "dflt"
    assert not mp.contains("a") and mp.contains("b")
    assert list(mp.items()) == [("b", 2)]
    assert list(mp.keys()) == ["b"] and list(mp.values()) == [2]
    assert not mp.is_empty()
    cursor.now_ms = 150
    assert mp.is_empty() and list(mp.items()) == []
    assert cache.get(b"k") is DELETED  # the whole map expired with its last entry


def test_writing_an_entry_resets_only_that_entry(db: KeyGroupStore) -> None:
    mp, cursor, _ = _map(db)
    cursor.now_ms = 0
    mp.put("a", 1)
    mp.put("b", 2)
    cursor.now_ms = 60
    mp.put("a", 10)  # a lives until 160, b still until 100
    assert mp.get("b") == 2  # reading does not reset anything
    cursor.now_ms = 100
    assert dict(mp.items()) == {"a": 10}
    cursor.now_ms = 159
    assert mp.get("a") == 10
    cursor.now_ms = 160
    assert mp.is_empty()


def test_writes_prune_expired_entries_from_the_stored_value(db: KeyGroupStore) -> None:
    mp, cursor, cache = _map(db)
    for t, name in enumerate("abcde"):
        cursor.now_ms = t * 30
        mp.put(name, t)
    db.apply({"m": cache.drain()}, {})
    cache.discard()
    cursor.now_ms = 125  # a (100) expired, b (130) alive
    mp.put("f", 5)
    stored = JSON.decode(cache.drain()[b"k"])
    assert stored == [
        225,
        {"b": [130, 1], "c": [160, 2], "d": [190, 3], "e": [220, 4], "f": [225, 5]},
    ]


def test_remove_does_not_extend_the_map(db: KeyGroupStore) -> None:
    mp, cursor, cache = _map(db)
    cursor.now_ms = 0
    mp.put("a", 1)
    cursor.now_ms = 10
    mp.put("b", 2)
    cursor.now_ms = 50
    mp.remove("b")
    mp.remove("zzz")
    assert JSON.decode(cache.drain()[b"k"]) == [100, {"a": [100, 1]}]
    cursor.now_ms = 100
    assert mp.is_empty()
    cursor.now_ms = 0
    mp.put("x", 1)
    cursor.now_ms = 20
    mp.remove("x")  # the last live entry: the map is deleted
    assert cache.drain() == {b"k": None}


def test_remove_of_an_expired_entry_writes_nothing(db: KeyGroupStore) -> None:
    mp, cursor, cache = _map(db)
    cursor.now_ms = 0
    mp.put("a", 1)
    cursor.now_ms = 10
    mp.put("b", 2)
    db.apply({"m": cache.drain()}, {})
    cursor.now_ms = 105
    mp.remove("a")
    assert cache.drain() == {}


def test_sweep_deletes_a_map_once_every_entry_expired(db: KeyGroupStore) -> None:
    mp, cursor, cache = _map(db)
    cursor.now_ms = 0
    mp.put("a", 1)
    cursor.now_ms = 40
    mp.put("b", 2)
    db.apply({"m": cache.drain()}, {})
    sweeper = StoreCache("m", JSON, db)
    assert sweep_expired(sweeper, SPEC, 139, 10) == 0
    assert sweep_expired(sweeper, SPEC, 140, 10) == 1
    assert sweeper.drain() == {b"k": None}


def test_whole_map_ttl_is_unchanged(db: KeyGroupStore) -> None:
    spec = StoreSpec("m", "map", ttl_ms=100)
    mp, cursor, _ = _map(db, spec)
    cursor.now_ms = 0
    mp.put("a", 1)
    cursor.now_ms = 50
    mp.put("b", 2)  # any write keeps the whole map alive
    cursor.now_ms = 120
    assert dict(mp.items()) == {"a": 1, "b": 2}
    cursor.now_ms = 150
    assert mp.is_empty()


def test_live_value_matches_what_handles_read(db: KeyGroupStore) -> None:
    mp, cursor, cache = _map(db)
    cursor.now_ms = 0
    mp.put("a", 1)
    cursor.now_ms = 50
    mp.put("b", 2)
    stored = cache.peek(b"k")
    assert live_value(SPEC, stored, 60) == {"a": 1, "b": 2}
    assert live_value(SPEC, stored, 100) == {"b": 2}
    assert live_value(SPEC, stored, 150) is DELETED
    assert live_value(StoreSpec("v", "value", ttl_ms=5), [10, "x"], 9) == "x"
    assert live_value(StoreSpec("v", "value", ttl_ms=5), [10, "x"], 10) is DELETED
    assert live_value(StoreSpec("v", "value"), "x", 10**12) == "x"


def test_spec_validation() -> None:
    with pytest.raises(StateError, match="entry_ttl needs ttl_ms"):
        StoreSpec("m", "map", entry_ttl=True)
    with pytest.raises(StateError, match="entry_ttl is for map state"):
        StoreSpec("v", "value", ttl_ms=10, entry_ttl=True)
    with pytest.raises(StateError, match="ttl_ms must be positive"):
        StoreSpec("v", "value", ttl_ms=0)
