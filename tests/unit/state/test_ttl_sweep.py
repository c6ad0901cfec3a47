"""The TTL sweep: expired state never read again leaves the database and the changelog."""

from pathlib import Path
from typing import Any

import pytest

from state import JSON, PICKLE, Codec, MemoryBackend, RocksDBBackend
from state.base.store import KeyGroupStore
from state.cache import DELETED, KeyCursor, StoreCache
from state.primitives import (
    DEFAULT_SWEEP_BUDGET,
    ListState,
    StoreSpec,
    ValueState,
    sweep_expired,
    sweep_key_group,
)


@pytest.fixture(params=["rocksdb", "memory"])
def db(request: pytest.FixtureRequest, tmp_path: Path):  # type: ignore[no-untyped-def]
    backend = RocksDBBackend(tmp_path) if request.param == "rocksdb" else MemoryBackend()
    store = backend.open("app", 0, ["s", "plain"])
    yield store
    store.close()


def _write(
    db: KeyGroupStore, spec: StoreSpec, at_ms: int, items: dict[bytes, Any], codec: Codec = JSON
) -> None:
    """Commit ``items`` as written by a handle at processing time ``at_ms``."""
    cursor = KeyCursor()
    cache = StoreCache(spec.name, codec, db)
    st: ValueState[Any] = ValueState(spec, cursor)
    st.bind(cache)
    cursor.now_ms = at_ms
    for key, value in items.items():
        cursor.key = key
        st.update(value)
    db.apply({spec.name: cache.drain()}, {})


SPEC = StoreSpec("s", "value", ttl_ms=100)


def test_sweep_turns_expired_entries_into_tombstones(db: KeyGroupStore) -> None:
    _write(db, SPEC, 1000, {b"old1": 1, b"old2": 2})  # expire at 1100
    _write(db, SPEC, 1050, {b"new": 3})  # expires at 1150
    cache = StoreCache("s", JSON, db)
    assert sweep_expired(cache, SPEC, 1099, 100) == 0
    assert cache.drain() == {}
    assert sweep_expired(cache, SPEC, 1100, 100) == 2
    changes = cache.drain()
    assert changes == {b"old1": None, b"old2": None}  # exactly like user deletes
    db.apply({"s": changes}, {})
    assert [k for k, _ in db.iter_from("s", None, 10)] == [b"new"]
    assert db.get("s", b"old1") is None
    assert sweep_expired(cache, SPEC, 1149, 100) == 0
    assert sweep_expired(cache, SPEC, 1150, 100) == 1


def test_sweep_is_bounded_resumes_and_wraps(db: KeyGroupStore) -> None:
    keys = [f"k{i:02d}".encode() for i in range(10)]
    _write(db, SPEC, 0, dict.fromkeys(keys, 0))
    cache = StoreCache("s", JSON, db)
    found = []
    for _ in range(4):
        before = set(cache.dirty)
        found.append(sweep_expired(cache, SPEC, 500, 3))
        assert len(cache.dirty - before) == found[-1]
    assert found == [3, 3, 3, 1]
    assert cache.sweep_cursor is None  # reached the end: the next call starts over
    changes = cache.drain()
    assert changes == dict.fromkeys(keys)
    db.apply({"s": changes}, {})
    _write(db, SPEC, 1000, {b"k05": 5})  # the only entry left is fresh
    assert sweep_expired(cache, SPEC, 1001, 3) == 0
    assert cache.sweep_cursor is None


def test_sweep_cursor_survives_inserts_and_deletes(db: KeyGroupStore) -> None:
    _write(db, SPEC, 0, {b"a": 0, b"c": 0, b"e": 0, b"g": 0})
    cache = StoreCache("s", JSON, db)
    assert sweep_expired(cache, SPEC, 500, 2) == 2  # a, c
    assert cache.sweep_cursor == b"c\x00"
    db.apply({"s": cache.drain()}, {})
    _write(db, SPEC, 0, {b"b": 0, b"d": 0})  # b is behind the cursor, d ahead
    assert sweep_expired(cache, SPEC, 500, 2) == 2  # d, e
    assert cache.drain() == {b"d": None, b"e": None}


def test_sweep_leaves_keys_rewritten_in_the_open_epoch(db: KeyGroupStore) -> None:
    _write(db, SPEC, 0, {b"a": 1, b"b": 2, b"c": 3})  # all expired at 500
    cache = StoreCache("s", JSON, db)
    cursor = KeyCursor()
    st: ValueState[Any] = ValueState(SPEC, cursor)
    st.bind(cache)
    cursor.now_ms = 500
    cursor.key = b"a"
    st.update(10)  # fresh value, dirty
    cursor.key = b"b"
    assert st.value() is None  # read as expired: already a tombstone in this epoch
    assert sweep_expired(cache, SPEC, 500, 10) == 1  # c only
    assert cache.drain() == {b"a": b"[600,10]", b"b": None, b"c": None}


def test_sweep_trusts_the_cache_between_drain_and_apply(db: KeyGroupStore) -> None:
    _write(db, SPEC, 0, {b"a": 1})
    cache = StoreCache("s", JSON, db)
    cursor = KeyCursor()
    st: ValueState[Any] = ValueState(SPEC, cursor)
    st.bind(cache)
    cursor.now_ms, cursor.key = 500, b"a"
    st.update(2)
    drained = cache.drain()  # committed in Kafka, not yet in the database
    assert sweep_expired(cache, SPEC, 500, 10) == 0  # the cached value is fresh
    db.apply({"s": drained}, {})
    assert db.get("s", b"a") == b"[600,2]"


def test_sweep_ignores_stores_without_ttl_and_zero_budget(db: KeyGroupStore) -> None:
    plain = StoreSpec("plain", "value")
    db.apply({"plain": {b"a": b"1"}}, {})
    cache = StoreCache("plain", JSON, db)
    assert sweep_expired(cache, plain, 10**15, 10) == 0
    _write(db, SPEC, 0, {b"a": 1})
    ttl_cache = StoreCache("s", JSON, db)
    assert sweep_expired(ttl_cache, SPEC, 10**15, 0) == 0
    assert ttl_cache.sweep_cursor is None and not ttl_cache.dirty


def test_sweep_with_a_non_json_codec_and_lists(db: KeyGroupStore) -> None:
    spec = StoreSpec("s", "list", PICKLE, ttl_ms=10)
    cache = StoreCache("s", PICKLE, db)
    cursor = KeyCursor()
    lst: ListState[int] = ListState(spec, cursor)
    lst.bind(cache)
    cursor.now_ms, cursor.key = 0, b"x"
    lst.add(1)
    cursor.now_ms, cursor.key = 5, b"y"
    lst.add(2)
    db.apply({"s": cache.drain()}, {})
    assert sweep_expired(cache, spec, 10, 10) == 1
    assert cache.drain() == {b"x": None}


def test_sweep_key_group_sweeps_every_ttl_store(db: KeyGroupStore) -> None:
    cursor = KeyCursor()
    handles = {
        "s": ValueState(SPEC, cursor),
        "plain": ValueState(StoreSpec("plain", "value"), cursor),
    }
    _write(db, SPEC, 0, {b"a": 1, b"b": 2})
    db.apply({"plain": {b"a": b"1"}}, {})
    caches = {name: StoreCache(name, JSON, db) for name in handles}
    assert sweep_key_group(caches, handles, 1000, DEFAULT_SWEEP_BUDGET) == 2
    assert caches["s"].drain() == {b"a": None, b"b": None}
    assert caches["plain"].drain() == {}


def test_expired_then_swept_reads_stay_absent(db: KeyGroupStore) -> None:
    _write(db, SPEC, 0, {b"a": 1})
    cache = StoreCache("s", JSON, db)
    sweep_expired(cache, SPEC, 100, 10)
    assert cache.get(b"a") is DELETED
    db.apply({"s": cache.drain()}, {})
    cache.discard()
    assert cache.get(b"a") is DELETED
