"""Test an app in-process, without Kafka: feed records, read emits and state, simulate crashes.

Like Kafka Streams' ``TopologyTestDriver``: the app's own handler, state handles and codecs
run exactly as in production (same epoch cache, same codecs), on an in-memory backend.

Example:
    >>> from processors.testing import TestDriver
    >>> from examples.running_sum import app
    >>> driver = TestDriver(app)
    >>> driver.send("a", {"v": 2, "seq": 0})
    [Emitted(topic='sums', key='a', value={'sum': 2, 'count': 1, 'seq': 0}, headers=None)]
    >>> driver.commit()              # epoch boundary: state becomes durable
    >>> driver.send("a", {"v": 5, "seq": 1})[0].value["sum"]
    7
    >>> driver.crash()               # uncommitted changes are lost, like after kill -9
    >>> driver.send("a", {"v": 5, "seq": 1})[0].value["sum"]
    7
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from processors._app import App
from processors._context import Context, Headers
from processors._keygroups import KeyGroup
from processors._partitioner import key_group
from processors.exceptions import ConfigError
from state.cache import DELETED
from state.memory.store import MemoryBackend

__all__ = ["Emitted", "TestDriver"]


@dataclass(frozen=True)
class Emitted:
    """A record the app emitted (decoded back with the output's codecs)."""

    topic: str
    key: Any
    value: Any
    headers: Headers


class _Record:
    """The record as the context sees it (the accessors of a Kafka message)."""

    __slots__ = ("_headers", "_key", "_offset", "_partition", "_timestamp", "_topic")

    def __init__(
        self, topic: str, partition: int, offset: int, key: bytes | None, ts: int, headers: Any
    ) -> None:
        self._topic, self._partition, self._offset = topic, partition, offset
        self._key, self._timestamp, self._headers = key, ts, headers

    def topic(self) -> str:
        return self._topic

    def partition(self) -> int:
        return self._partition

    def offset(self) -> int:
        return self._offset

    def key(self) -> bytes | None:
        return self._key

    def timestamp(self) -> tuple[int, int]:
        return (1, self._timestamp)

    def headers(self) -> Any:
        return self._headers


class TestDriver:
    """Runs an :class:`App`'s chain in-process over records you send.

    Records go through the input key/value codecs (so encoding bugs show up), are placed
    in key groups with the murmur2 partitioner, and change state in the epoch cache;
    :meth:`commit` ends the epoch, :meth:`crash` drops everything since the last commit.
    """

    __test__ = False  # not a pytest test class

    def __init__(self, app: App, partitions: int = 4) -> None:
        self.app = app
        self.partitions = partitions
        self._handler = app.handler()
        self._outputs = app.outputs
        self._backend = MemoryBackend()
        self._handles = app.stores
        self._kgs: dict[int, KeyGroup] = {}
        self._offsets = [0] * partitions
        self._emitted: list[Emitted] = []
        self._ctx = Context(self._emit)

    def _kg(self, index: int) -> KeyGroup:
        kg = self._kgs.get(index)
        if kg is None:
            db = self._backend.open(self.app.name, index, list(self._handles))
            kg = self._kgs[index] = KeyGroup(index, db, self._handles)
        return kg

    def _emit(self, topic: str, key: Any, value: Any, headers: Headers) -> None:
        spec = self._outputs.get(topic)
        if spec is None:
            raise ConfigError(f"emit to {topic!r}: not a declared output of app {self.app.name!r}")
        # Round-trip through the codecs, as a consumer of the topic would see it.
        k = None if key is None else spec.key.decode(spec.key.encode(key))
        v = None if value is None else spec.value.decode(spec.value.encode(value))
        self._emitted.append(Emitted(topic, k, v, headers))

    def send(
        self, key: Any, value: Any, *, timestamp: int = 0, headers: Any = None
    ) -> list[Emitted]:
        """Process one input record; return what it emitted.

        Raises:
            Exception: whatever the user code raises (in production it would go to the DLQ).
        """
        kcodec, vcodec = self.app.key_codec, self.app.value_codec
        raw_key = None if key is None else kcodec.encode(key)
        raw_value = None if value is None else vcodec.encode(value)
        index = key_group(raw_key, self.partitions) if raw_key is not None else 0
        kg = self._kg(index)
        kg.bind()
        record = _Record(
            self.app.input_topics[0], index, self._offsets[index], raw_key, timestamp, headers
        )
        self._offsets[index] += 1
        self.app.cursor.key = raw_key
        self.app.cursor.now_ms = timestamp
        self._ctx.message = record
        start = len(self._emitted)
        self._handler(
            None if raw_key is None else kcodec.decode(raw_key),
            None if raw_value is None else vcodec.decode(raw_value),
            self._ctx,
        )
        return self._emitted[start:]

    def commit(self) -> None:
        """End the epoch: every change so far becomes committed state."""
        for kg in self._kgs.values():
            writes = {name: cache.drain() for name, cache in kg.caches.items()}
            kg.db.apply({n: w for n, w in writes.items() if w}, {})

    def crash(self) -> None:
        """Lose everything since the last commit (state and emits), like kill -9 would."""
        for kg in self._kgs.values():
            kg.discard()
        self._emitted.clear()

    @property
    def emitted(self) -> list[Emitted]:
        """Every record emitted since the start (or the last crash)."""
        return list(self._emitted)

    def state(self, store: str, key: Any) -> Any:
        """Return the current (possibly uncommitted) value of ``store`` for ``key``."""
        raw_key = self.app.key_codec.encode(key)
        kg = self._kg(key_group(raw_key, self.partitions))
        value = kg.caches[store].get(raw_key)
        if value is DELETED:
            return None
        return value[1] if self._handles[store].spec.ttl_ms is not None else value
