"""One memory budget for every key-group database of a process.

RocksDB's defaults are per database and per column family: a 64 MB memtable (two of
them before writes stall) per column family and an 8 MB (RocksDB >= 8: 32 MB) block cache
per column family, plus index and filter blocks held outside any cache. With one database
per key group and one column family per store, memory grows with the key groups a process
owns, which is what an instance taking over after a node loss does.

:class:`RocksDBMemory` holds what Kafka Streams' ``BoundedMemoryRocksDBConfig`` holds:

- one LRU block cache shared by every database and column family of the process;
- one write-buffer manager whose memtable memory is *charged to that cache*, so data
  blocks, index and filter blocks (``cache_index_and_filter_blocks``) and memtables stay
  under one capacity together;
- a small per-column-family memtable, so many column families do not each reserve 64 MB.

The cache's capacity is a soft bound: RocksDB may exceed it briefly (pinned blocks,
memtables being flushed), by a few MB per database, never in proportion to the data.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import rocksdict

__all__ = ["MIB", "RocksDBMemory"]

MIB = 1024 * 1024
#: The memtable of one column family never exceeds this (RocksDB's default is 64 MB).
_MAX_MEMTABLE = 8 * MIB
#: Nor goes below this.
_MIN_MEMTABLE = 1 * MIB


@dataclass
class RocksDBMemory:
    """The shared block cache and write-buffer manager of one process.

    Create one per process and pass it to every :class:`state.rocksdb.RocksDBBackend`
    that opens databases of that process; the cache and the manager must outlive every
    database opened with them (the backend keeps a reference).

    Attributes:
        cache_bytes: capacity of the shared block cache; memtables are charged to it,
            so this bounds block cache + memtables together (> 0).
        write_buffer_bytes: the write-buffer manager's limit on all memtables of the
            process (<= ``cache_bytes``); reaching it flushes the largest memtable.
        memtable_bytes: ``write_buffer_size`` of each column family.
    """

    cache_bytes: int
    write_buffer_bytes: int
    memtable_bytes: int = field(default=0)
    _cache: Any = field(init=False, repr=False, default=None)
    _manager: Any = field(init=False, repr=False, default=None)

    def __post_init__(self) -> None:
        """Check the sizes and create the cache and the manager.

        Raises:
            ValueError: a size is not positive, or the write buffers exceed the cache.
        """
        if self.cache_bytes <= 0 or self.write_buffer_bytes <= 0:
            raise ValueError(f"RocksDB memory must be positive: {self}")
        if self.write_buffer_bytes > self.cache_bytes:
            raise ValueError(
                f"write buffers ({self.write_buffer_bytes}) are charged to the block cache "
                f"and cannot exceed it ({self.cache_bytes})"
            )
        if self.memtable_bytes <= 0:
            # Several memtables fit in the manager's limit before it forces flushes.
            self.memtable_bytes = max(
                _MIN_MEMTABLE, min(_MAX_MEMTABLE, self.write_buffer_bytes // 8)
            )
        self._cache = rocksdict.Cache(self.cache_bytes)
        # No write stalls: with one database per key group, the database being written
        # may hold none of the memtables over the limit (idle key groups hold them), and a
        # stall would wait for a flush nobody triggers. Over the limit, every write flushes
        # its own database's memtables instead (a soft bound, as in Kafka Streams).
        self._manager = rocksdict.WriteBufferManager.new_write_buffer_manager_with_cache(
            self.write_buffer_bytes, False, self._cache
        )

    @classmethod
    def for_budget(cls, budget_bytes: int) -> RocksDBMemory:
        """Size the cache at ``budget_bytes``, with half of it for memtables.

        Args:
            budget_bytes: what every key-group database of the process may use together
                (>= 4 MiB).

        Raises:
            ValueError: ``budget_bytes`` is below 4 MiB.
        """
        if budget_bytes < 4 * MIB:
            raise ValueError(f"a RocksDB budget of {budget_bytes} bytes is below 4 MiB")
        return cls(cache_bytes=budget_bytes, write_buffer_bytes=budget_bytes // 2)

    def db_options(self) -> Any:
        """Return database options that share this process's write-buffer manager."""
        opts = rocksdict.Options(raw_mode=True)
        opts.set_write_buffer_manager(self._manager)
        self._apply_cf(opts)
        return opts

    def cf_options(self) -> Any:
        """Return column-family options that share this process's block cache."""
        opts = rocksdict.Options(raw_mode=True)
        self._apply_cf(opts)
        return opts

    def _apply_cf(self, opts: Any) -> None:
        table = rocksdict.BlockBasedOptions()
        table.set_block_cache(self._cache)
        # Index and filter blocks live in the cache (bounded) instead of beside it.
        table.set_cache_index_and_filter_blocks(True)
        table.set_pin_l0_filter_and_index_blocks_in_cache(True)
        opts.set_block_based_table_factory(table)
        opts.set_write_buffer_size(self.memtable_bytes)
        opts.set_max_write_buffer_number(2)
        # Arena blocks default to write_buffer_size / 8: keep them small for many CFs.
        opts.set_arena_block_size(max(64 * 1024, self.memtable_bytes // 16))

    def usage(self) -> dict[str, int]:
        """Return the cache's and the memtables' current usage in bytes."""
        return {
            "block_cache_bytes": int(self._cache.get_usage()),
            "block_cache_pinned_bytes": int(self._cache.get_pinned_usage()),
            "memtable_bytes": int(self._manager.get_usage()),
        }
