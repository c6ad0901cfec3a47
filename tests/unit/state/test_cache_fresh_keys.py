"""A key created and deleted within one epoch leaves no write (StoreCache.put_new/delete).

The time service creates a timer with ``put_new`` when its index of live timers says the
timer is absent, and deletes it with ``delete`` when it fires. A timer set and fired in
one epoch must then reach neither the changelog nor the database, and every other
sequence must drain exactly what plain ``put`` drains.
"""

from __future__ import annotations

import random

import pytest

from state import JSON, MemoryBackend
from state.base.store import KeyGroupStore
from state.cache import DELETED, StoreCache


@pytest.fixture
def cache() -> StoreCache:
    return StoreCache("s", JSON, MemoryBackend().open("app", 0, ["s"]))


def commit(cache: StoreCache) -> dict[bytes, bytes | None]:
    changes = cache.drain()
    cache.db.apply({"s": changes}, {})
    return changes


def test_created_and_deleted_in_one_epoch_drains_nothing(cache: StoreCache) -> None:
    cache.put_new(b"t1", ["a"])
    cache.put(b"t1", ["a", "b"])  # an update keeps it fresh
    cache.delete(b"t1")
    assert not cache.dirty and not cache.fresh
    assert cache.get(b"t1") is DELETED
    assert commit(cache) == {}
    assert cache.db.get("s", b"t1") is None


def test_created_in_one_epoch_deleted_in_the_next_writes_a_tombstone(cache: StoreCache) -> None:
    cache.put_new(b"t1", ["a"])
    assert commit(cache) == {b"t1": b'["a"]'}
    cache.delete(b"t1")
    assert commit(cache) == {b"t1": None}
    assert cache.db.get("s", b"t1") is None


def test_deleted_then_created_again_in_one_epoch_is_not_fresh(cache: StoreCache) -> None:
    """The committed value must still be tombstoned: the key existed at the epoch's start."""
    cache.put_new(b"t1", ["a"])
    commit(cache)
    cache.delete(b"t1")  # fired
    cache.put_new(b"t1", ["b"])  # set again: absent now, but not at the epoch's start
    assert b"t1" not in cache.fresh
    cache.delete(b"t1")  # fired again
    assert commit(cache) == {b"t1": None}
    assert cache.db.get("s", b"t1") is None


def test_created_deleted_created_in_one_epoch_writes_the_last_value(cache: StoreCache) -> None:
    cache.put_new(b"t1", ["a"])
    cache.delete(b"t1")
    cache.put_new(b"t1", ["b"])
    assert commit(cache) == {b"t1": b'["b"]'}
    assert cache.db.get("s", b"t1") == b'["b"]'


def test_discard_forgets_fresh_keys(cache: StoreCache) -> None:
    cache.put(b"t1", ["committed"])
    commit(cache)
    cache.put_new(b"t2", ["a"])
    cache.discard()
    assert not cache.fresh
    cache.put(b"t2", ["c"])  # a replay writes it with plain put: not fresh
    cache.delete(b"t2")
    assert commit(cache) == {b"t2": None}


@pytest.mark.parametrize("seed", range(20))
def test_random_sequences_end_in_the_same_database_as_plain_puts(seed: int) -> None:
    """put_new/delete against put(DELETED): same reads, same database after each commit,
    never more drained entries (aborts included)."""
    rnd = random.Random(seed)
    fast = StoreCache("s", JSON, MemoryBackend().open("a", 0, ["s"]))
    plain = StoreCache("s", JSON, MemoryBackend().open("b", 0, ["s"]))
    keys = [f"t{i}".encode() for i in range(6)]
    for _ in range(400):
        key = rnd.choice(keys)
        op = rnd.random()
        present = fast.get(key) is not DELETED
        assert present == (plain.get(key) is not DELETED)
        if op < 0.45:
            value = [rnd.randrange(100)]
            if present:
                fast.put(key, value)
            else:
                fast.put_new(key, value)  # the caller's guarantee: absent now
            plain.put(key, value)
        elif op < 0.85:
            if present:
                fast.delete(key)
                plain.put(key, DELETED)
        elif op < 0.95:
            a, b = commit(fast), commit(plain)
            assert len(a) <= len(b)
            assert {k: v for k, v in a.items() if v is not None} == {
                k: v for k, v in b.items() if v is not None
            }
            assert _items(fast.db) == _items(plain.db)
        else:
            fast.discard()
            plain.discard()
    commit(fast)
    commit(plain)
    assert _items(fast.db) == _items(plain.db)


def _items(db: KeyGroupStore) -> dict[bytes, bytes]:
    return dict(db.items("s"))
