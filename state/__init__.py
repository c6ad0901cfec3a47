"""Keyed state for lockgate: state handles, codecs, the epoch cache and backends.

Users declare state through :class:`processors.App` and use the handles here
(:class:`ValueState`, :class:`ListState`, ...). Backends keep one database per
key group: :class:`RocksDBBackend` (default) and :class:`MemoryBackend`.
"""

from state.base.store import KeyGroupStore, StateBackend
from state.codecs import BYTES, JSON, PICKLE, STR, Codec, DecodeError
from state.exceptions import StateError, StateFormatError, StateLockedError
from state.memory.store import MemoryBackend
from state.primitives import (
    AggregatingState,
    Aggregator,
    ListState,
    MapState,
    ReducingState,
    StoreSpec,
    ValueState,
)
from state.rocksdb.store import RocksDBBackend

__all__ = [
    "BYTES",
    "JSON",
    "PICKLE",
    "STR",
    "AggregatingState",
    "Aggregator",
    "Codec",
    "DecodeError",
    "KeyGroupStore",
    "ListState",
    "MapState",
    "MemoryBackend",
    "ReducingState",
    "RocksDBBackend",
    "StateBackend",
    "StateError",
    "StateFormatError",
    "StateLockedError",
    "StoreSpec",
    "ValueState",
]
