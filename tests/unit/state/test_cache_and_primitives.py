from typing import Any

import pytest

from state import JSON, MemoryBackend, StateError
from state.cache import DELETED, KeyCursor, StoreCache
from state.primitives import (
    AggregatingState,
    ListState,
    MapState,
    ReducingState,
    StoreSpec,
    ValueState,
)


@pytest.fixture
def env():  # type: ignore[no-untyped-def]
    db = MemoryBackend().open("app", 0, ["s"])
    cursor = KeyCursor()
    cache = StoreCache("s", JSON, db)
    return db, cursor, cache


def test_cache_is_write_back(env) -> None:  # type: ignore[no-untyped-def]
    db, _, cache = env
    cache.put(b"k", {"a": 1})
    assert db.get("s", b"k") is None  # nothing reaches the database before commit
    assert cache.get(b"k") == {"a": 1}
    changes = cache.drain()
    assert changes == {b"k": b'{"a":1}'}
    assert not cache.dirty
    db.apply({"s": changes}, {})
    cache.put(b"k", DELETED)
    assert cache.drain() == {b"k": None}


def test_discard_drops_uncommitted(env) -> None:  # type: ignore[no-untyped-def]
    db, _, cache = env
    db.apply({"s": {b"k": b"1"}}, {})
    cache.put(b"k", 2)
    cache.discard()
    assert cache.get(b"k") == 1


def test_trim_only_when_clean(env) -> None:  # type: ignore[no-untyped-def]
    _, _, cache = env
    for i in range(10):
        cache.get(str(i).encode())
    cache.put(b"x", 1)
    cache.trim(5)
    assert len(cache) == 5  # the five least recently loaded went
    assert b"x" in cache  # dirty: never evicted
    assert cache.drain() == {b"x": b"1"}
    cache.trim(0)
    assert len(cache) == 0


def test_value_state_per_key(env) -> None:  # type: ignore[no-untyped-def]
    _, cursor, cache = env
    st: ValueState[Any] = ValueState(StoreSpec("s", "value"), cursor, default=0)
    st.bind(cache)
    cursor.key = b"a"
    assert st.value() == 0
    st.update(5)
    cursor.key = b"b"
    assert st.value() == 0
    st.update(7)
    cursor.key = b"a"
    assert st.value() == 5
    st.clear()
    assert st.value() == 0


def test_unbound_and_keyless_errors(env) -> None:  # type: ignore[no-untyped-def]
    _, cursor, cache = env
    st: ValueState[Any] = ValueState(StoreSpec("s", "value"), cursor)
    cursor.key = b"a"
    with pytest.raises(StateError, match="inside the handler"):
        st.value()
    st.bind(cache)
    cursor.key = None
    with pytest.raises(StateError, match="needs a record key"):
        st.update(1)


def test_ttl_expires(env) -> None:  # type: ignore[no-untyped-def]
    _, cursor, cache = env
    st: ValueState[Any] = ValueState(StoreSpec("s", "value", ttl_ms=100), cursor)
    st.bind(cache)
    cursor.key = b"a"
    cursor.now_ms = 1000
    st.update("x")
    cursor.now_ms = 1099
    assert st.value() == "x"
    cursor.now_ms = 1100
    assert st.value() is None
    assert cache.get(b"a") is DELETED


def test_list_map_reducing_aggregating(env) -> None:  # type: ignore[no-untyped-def]
    _, cursor, cache = env
    cursor.key = b"k"
    lst: ListState[int] = ListState(StoreSpec("s", "list"), cursor)
    lst.bind(cache)
    lst.add(1)
    lst.add_all([2, 3])
    assert lst.get() == [1, 2, 3]
    lst.update([9])
    assert lst.get() == [9]
    lst.clear()

    mp: MapState[int] = MapState(StoreSpec("s", "map"), cursor)
    mp.bind(cache)
    assert mp.is_empty()
    mp.put("a", 1)
    mp.put("b", 2)
    assert mp.get("a") == 1 and mp.contains("b") and not mp.contains("c")
    assert sorted(mp.items()) == [("a", 1), ("b", 2)]
    mp.remove("a")
    mp.remove("zzz")
    assert list(mp.keys()) == ["b"] and list(mp.values()) == [2]
    mp.remove("b")
    assert mp.is_empty()

    red: ReducingState[int] = ReducingState(StoreSpec("s", "reducing"), cursor, max)
    red.bind(cache)
    assert red.get() is None
    for v in (3, 9, 4):
        red.add(v)
    assert red.get() == 9
    red.clear()

    class Avg:
        def create_accumulator(self) -> list[int]:
            return [0, 0]

        def add(self, value: int, acc: list[int]) -> list[int]:
            return [acc[0] + value, acc[1] + 1]

        def get_result(self, acc: list[int]) -> float:
            return acc[0] / acc[1]

    agg: AggregatingState[int, list[int], float] = AggregatingState(
        StoreSpec("s", "aggregating"), cursor, Avg()
    )
    agg.bind(cache)
    assert agg.get() is None
    for v in (1, 2, 6):
        agg.add(v)
    assert agg.get() == 3.0


def test_mutable_default_is_not_shared_between_keys(env) -> None:  # type: ignore[no-untyped-def]
    _, cursor, cache = env
    st: ValueState[Any] = ValueState(StoreSpec("s", "value"), cursor, default=[])
    st.bind(cache)
    cursor.key = b"a"
    v = st.value()
    v.append(1)
    st.update(v)
    cursor.key = b"b"
    assert st.value() == []
    assert st.default == []


def test_list_and_map_get_are_snapshots(env) -> None:  # type: ignore[no-untyped-def]
    _, cursor, cache = env
    cursor.key = b"k"
    lst: ListState[int] = ListState(StoreSpec("s", "list"), cursor)
    lst.bind(cache)
    lst.add(1)
    snapshot = lst.get()
    lst.add(2)
    assert snapshot == [1] and lst.get() == [1, 2]
    mp: MapState[int] = MapState(StoreSpec("s2", "map"), cursor)
    mp.bind(StoreCache("s2", JSON, MemoryBackend().open("app", 1, ["s2"])))
    mp.put("a", 1)
    items = list(mp.items())
    mp.put("b", 2)
    assert items == [("a", 1)]
    dirty_before = set(mp._cache.dirty)
    mp._cache.dirty.clear()
    mp.remove("zzz")  # absent: no write
    assert not mp._cache.dirty
    mp._cache.dirty |= dirty_before
