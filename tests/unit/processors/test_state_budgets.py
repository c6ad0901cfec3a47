"""Process-wide state budgets: memory plan, read-cache split, released-state cleaner."""

from __future__ import annotations

from pathlib import Path

from confluent_kafka import Consumer

from processors._config.settings import Settings
from processors._task.keygroups import (
    DEFAULT_MEMORY_LIMIT,
    ENTRY_OVERHEAD_BYTES,
    KeyGroup,
    MemoryPlan,
    ReadCacheBudget,
    StateCleaner,
    cgroup_memory_limit,
    with_fetch_limits,
)
from state import JSON, MemoryBackend
from state.cache import KeyCursor
from state.primitives import StateHandle, StoreSpec, ValueState
from state.rocksdb import RocksDBBackend

GIB = 1024**3


def test_memory_plan_from_setting_cgroup_or_default() -> None:
    plan = MemoryPlan.of(Settings(memory_limit_bytes=4 * GIB), cgroup_limit=GIB)
    assert (plan.limit_bytes, plan.limit_source) == (4 * GIB, "setting")
    assert plan.rocksdb_bytes == GIB
    assert plan.read_cache_bytes == GIB
    assert MemoryPlan.of(Settings(), cgroup_limit=GIB).limit_source == "cgroup"
    default = MemoryPlan.of(Settings(), cgroup_limit=None)
    assert (default.limit_bytes, default.limit_source) == (DEFAULT_MEMORY_LIMIT, "default")
    explicit = MemoryPlan.of(
        Settings(state_rocksdb_memory_bytes=64 * 1024**2, state_cache_memory_bytes=1000)
    )
    assert (explicit.rocksdb_bytes, explicit.read_cache_bytes) == (64 * 1024**2, 1000)


def test_fetch_limits_and_epoch_bound_follow_the_limit() -> None:
    mib = 1024**2
    small = MemoryPlan.of(Settings(memory_limit_bytes=256 * mib))
    assert small.consumer_bytes == 16 * mib  # the floor
    assert small.fetch_config() == {
        "queued.max.messages.kbytes": 2048,
        "fetch.max.bytes": mib,  # never below message.max.bytes' default (librdkafka refuses)
        "max.partition.fetch.bytes": 256 * 1024,
    }
    assert small.epoch_bytes == 2 * mib
    default = MemoryPlan.of(Settings(), cgroup_limit=None)
    assert default.fetch_config() == {
        "queued.max.messages.kbytes": 16384,
        "fetch.max.bytes": 4 * mib,
        "max.partition.fetch.bytes": mib,
    }
    assert default.epoch_bytes == 16 * mib
    huge = MemoryPlan.of(Settings(memory_limit_bytes=64 * GIB)).fetch_config()
    assert huge["fetch.max.bytes"] == 50 * mib and huge["max.partition.fetch.bytes"] == mib
    assert huge["queued.max.messages.kbytes"] == 65536  # never looser than librdkafka's own
    # librdkafka accepts every one of them (it refuses e.g. fetch.max.bytes < 1,000,000
    # and a queue above 2,097,151 KiB)
    for limit in (64 * mib, 2 * GIB, 64 * GIB, 1024 * GIB):
        conf = MemoryPlan.of(Settings(memory_limit_bytes=limit)).fetch_config()
        Consumer({"bootstrap.servers": "127.0.0.1:1", "group.id": "g", **conf}).close()


def test_a_users_own_fetch_limit_replaces_the_plans() -> None:
    plan = MemoryPlan.of(Settings(memory_limit_bytes=512 * 1024**2))
    assert with_fetch_limits({"group.id": "g"}, plan) == {"group.id": "g", **plan.fetch_config()}
    for key in ("fetch.max.bytes", "fetch.message.max.bytes", "queued.max.messages.kbytes"):
        assert with_fetch_limits({key: 5_000_000}, plan) == {key: 5_000_000}
    raised = with_fetch_limits({"message.max.bytes": 8_000_000}, plan)
    assert raised["fetch.max.bytes"] == 8_000_000  # librdkafka refuses less
    Consumer({"bootstrap.servers": "127.0.0.1:1", "group.id": "g", **raised}).close()


def test_cgroup_limit_files(tmp_path: Path) -> None:
    v2, v1 = tmp_path / "memory.max", tmp_path / "limit_in_bytes"
    assert cgroup_memory_limit([v2, v1]) is None  # neither exists
    v1.write_text("9223372036854771712\n")  # v1's "unlimited"
    assert cgroup_memory_limit([v2, v1]) is None
    v1.write_text("536870912\n")
    assert cgroup_memory_limit([v2, v1]) == 512 * 1024**2
    v2.write_text("max\n")
    assert cgroup_memory_limit([v2, v1]) is None
    v2.write_text("1073741824\n")
    assert cgroup_memory_limit([v2, v1]) == GIB


def _handles(*names: str) -> dict[str, StateHandle]:
    cursor = KeyCursor()
    return {n: ValueState(StoreSpec(n, "value", JSON), cursor) for n in names}


def test_read_cache_budget_is_split_over_owned_key_groups() -> None:
    backend = MemoryBackend()
    handles = _handles("a", "b")
    dbs = [backend.open("app", g, ["a", "b"]) for g in range(3)]
    value = b'"' + b"x" * 98 + b'"'  # 100 bytes of JSON
    for db in dbs:
        db.apply({"a": {f"k{i:03}".encode(): value for i in range(500)}}, {})
    entry = 2 * (4 + 100) + ENTRY_OVERHEAD_BYTES
    budget = ReadCacheBudget(6 * 200 * entry)
    groups = [KeyGroup(g, dbs[g], handles, budget) for g in range(3)]
    assert budget.per_cache_bytes == 200 * entry  # over 3 key groups x 2 stores
    cache = groups[0].caches["a"]
    for i in range(500):
        cache.get(f"k{i:03}".encode())
    cache.trim(10_000)  # the per-cache ceiling is higher: the budget share wins
    assert 195 <= len(cache) <= 200  # the first estimate (before any read) fades
    cache.trim(50)  # the ceiling is lower: it wins
    assert len(cache) == 50
    groups[1].close()
    groups[2].close()
    assert budget.per_cache_bytes == 600 * entry  # fewer key groups: each keeps more
    groups[1].close()  # idempotent for the budget
    assert budget.per_cache_bytes == 600 * entry


class _Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_cleaner_removes_released_directories_after_the_delay(tmp_path: Path) -> None:
    backend = RocksDBBackend(tmp_path)
    for g in range(4):
        backend.open("app", g, ["s"]).close()
    clock = _Clock()
    cleaner = StateCleaner("app", backend, 10.0, clock)
    (tmp_path / "app" / ".trash-9-1").mkdir()  # an interrupted delete of a previous run
    cleaner.adopt(owned={0, 1})  # 2 and 3 are a previous run's
    assert not (tmp_path / "app" / ".trash-9-1").exists()
    assert sorted(cleaner.pending) == [2, 3]
    cleaner.adopt(owned=set())  # once per process
    assert sorted(cleaner.pending) == [2, 3]
    clock.now += 5
    cleaner.released([1])
    cleaner.claimed([3])  # assigned back: kept
    assert cleaner.sweep(owned={0}) == []  # nothing due yet
    clock.now += 6
    assert cleaner.sweep(owned={0}) == [2]
    clock.now += 5
    db0 = backend.open("app", 0, ["s"])
    cleaner.released([0])
    clock.now += 11
    assert cleaner.sweep(owned={1}) == []  # 1 is owned again; 0 is open
    assert cleaner.pending == {}
    db0.close()
    assert backend.key_groups_on_disk("app") == [0, 1, 3]
