"""The epoch cache keeps the most recently used entries when it trims (no cliff)."""

from pathlib import Path
from typing import Any

import pytest

from state import JSON, MemoryBackend, RocksDBBackend
from state.cache import DELETED, StoreCache


class CountingDB:
    """A real in-memory key group store that counts reads (not a mock: it stores data)."""

    def __init__(self) -> None:
        self.inner = MemoryBackend().open("app", 0, ["s"])
        self.reads = 0

    def get(self, store: str, key: bytes) -> bytes | None:
        self.reads += 1
        return self.inner.get(store, key)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


def _keys(n: int) -> list[bytes]:
    return [f"k{i:05d}".encode() for i in range(n)]


def test_trim_keeps_at_most_max_entries_and_never_clears_everything() -> None:
    db = CountingDB()
    db.inner.apply({"s": {k: b"1" for k in _keys(100)}}, {})
    cache = StoreCache("s", JSON, db)  # type: ignore[arg-type]
    for k in _keys(100):
        assert cache.get(k) == 1
    cache.trim(60)
    assert len(cache) == 60  # the overflow only, not the whole cache
    reads = db.reads
    hits = sum(1 for k in _keys(100) if k in cache)
    assert hits == 60
    assert db.reads == reads  # membership tests do not read the database


def test_trim_keeps_recently_used_entries() -> None:
    db = CountingDB()
    db.inner.apply({"s": {k: b"1" for k in _keys(1000)}}, {})
    cache = StoreCache("s", JSON, db)  # type: ignore[arg-type]
    hot = _keys(10)
    stream = iter(_keys(1000)[10:])
    for k in _keys(60):
        cache.get(k)
    cache.trim(30)
    for _ in range(8):  # each epoch: 15 keys never seen again, then the hot keys
        for _ in range(15):
            cache.get(next(stream))
        for k in hot:
            cache.get(k)
        cache.trim(30)
        assert len(cache) == 30
    reads = db.reads
    for k in hot:
        assert cache.get(k) == 1
    assert db.reads == reads  # every hot key survived the trims
    # The oldest stream keys went first: the last epoch's are all still there.
    assert sum(1 for k in _keys(1000)[10 + 7 * 15 : 10 + 8 * 15] if k in cache) == 15
    assert sum(1 for k in _keys(1000)[10:40] if k in cache) == 0


def test_trim_never_evicts_dirty_entries() -> None:
    db = CountingDB()
    cache = StoreCache("s", JSON, db)  # type: ignore[arg-type]
    for i, k in enumerate(_keys(20)):
        cache.put(k, i)
    for k in _keys(40)[20:]:
        cache.get(k)
    cache.trim(5)
    assert all(k in cache for k in _keys(20))  # dirty: kept although over the limit
    assert len(cache) == 20
    assert cache.drain() == {k: str(i).encode() for i, k in enumerate(_keys(20))}
    cache.trim(5)
    assert len(cache) == 5


def test_trim_to_zero_and_values_stay_correct_after_many_trims() -> None:
    db = CountingDB()
    cache = StoreCache("s", JSON, db)  # type: ignore[arg-type]
    model: dict[bytes, Any] = {}
    for epoch in range(30):
        for i in range(epoch, epoch + 15):
            k = f"k{i % 23}".encode()
            current = cache.get(k)
            new = (0 if current is DELETED else current) + 1
            if i % 7 == 0:
                cache.put(k, DELETED)
                model.pop(k, None)
            else:
                cache.put(k, new)
                model[k] = new
        db.inner.apply({"s": cache.drain()}, {})
        cache.trim(epoch % 9)
        assert len(cache) <= epoch % 9
    for i in range(23):
        k = f"k{i}".encode()
        assert cache.get(k) == model.get(k, DELETED)
    cache.trim(0)
    assert len(cache) == 0


def test_discard_forgets_both_generations() -> None:
    db = CountingDB()
    db.inner.apply({"s": {b"a": b"1", b"b": b"2"}}, {})
    cache = StoreCache("s", JSON, db)  # type: ignore[arg-type]
    cache.get(b"a")
    cache.trim(1)
    cache.get(b"b")
    cache.put(b"a", 5)
    cache.discard()
    assert len(cache) == 0
    assert cache.get(b"a") == 1


@pytest.mark.parametrize("backend", ["rocksdb", "memory"])
def test_cache_over_real_backends(backend: str, tmp_path: Path) -> None:
    b = RocksDBBackend(tmp_path) if backend == "rocksdb" else MemoryBackend()
    db = b.open("app", 0, ["s"])
    db.apply({"s": {k: b'"v"' for k in _keys(30)}}, {})
    cache = StoreCache("s", JSON, db)
    for k in _keys(30):
        assert cache.get(k) == "v"
    cache.put(b"k00000", "w")
    db.apply({"s": cache.drain()}, {})
    cache.trim(10)
    assert len(cache) == 10
    assert cache.get(b"k00000") == "w"
    db.close()


def test_value_state_reads_the_old_generation_without_the_database() -> None:
    from state.cache import KeyCursor
    from state.primitives import StoreSpec, ValueState

    db = CountingDB()
    db.inner.apply({"s": {b"a": b"1", b"b": b"2"}}, {})
    cache = StoreCache("s", JSON, db)  # type: ignore[arg-type]
    cursor = KeyCursor()
    st: ValueState[int] = ValueState(StoreSpec("s", "value"), cursor)
    st.bind(cache)
    cursor.key = b"a"
    assert st.value() == 1
    cursor.key = b"b"
    assert st.value() == 2
    cache.trim(1)  # a (older) goes, b moves to the old generation
    reads = db.reads
    assert st.value() == 2
    assert db.reads == reads
    cursor.key = b"a"
    assert st.value() == 1
    assert db.reads == reads + 1
