"""RocksDB state backend (rocksdict, raw mode)."""

from state.rocksdb.memory import RocksDBMemory
from state.rocksdb.store import RocksDBBackend, RocksDBKeyGroupStore

__all__ = ["RocksDBBackend", "RocksDBKeyGroupStore", "RocksDBMemory"]
