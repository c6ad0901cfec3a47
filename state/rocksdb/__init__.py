"""RocksDB state backend (rocksdict, raw mode)."""

from state.rocksdb.store import RocksDBBackend, RocksDBKeyGroupStore

__all__ = ["RocksDBBackend", "RocksDBKeyGroupStore"]
