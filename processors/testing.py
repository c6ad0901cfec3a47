"""Test an app in-process, without Kafka: feed records, read emits and state, simulate crashes.

Like Kafka Streams' ``TopologyTestDriver``: the app's own handler, state handles and codecs
run exactly as in production (same epoch cache, same codecs, same TTL sweep), on an
in-memory backend, with the production semantics of epochs:

- :meth:`TestDriver.commit` ends the epoch (TTL sweep, then state and emits become
  committed); :meth:`TestDriver.crash` loses everything since the last commit, like kill -9.
- A record whose user code raises is dead-lettered as in production: the epoch is aborted
  and replayed without it, so its partial state changes and emits vanish while the rest of
  the epoch stays, then the epoch commits. Inspect :attr:`TestDriver.dead_letters`.
- TTL runs on the driver's processing-time clock (:meth:`TestDriver.advance`), not on
  record timestamps, as production runs on the wall clock.

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
    >>> driver.send("a", {"seq": 2})  # user code raises (no "v"): dead-lettered
    []
    >>> driver.dead_letters[0].error
    KeyError('v')
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from processors._config.settings import OnError
from processors._dsl.app import App
from processors._dsl.context import Context, Headers
from processors._dsl.partitioner import key_group
from processors._dsl.record import Record as _Record
from processors._sinks.iceberg import IcebergOutput, IcebergSink
from processors._sinks.postgres import PostgresSink
from processors._task.failures import ReplayPoison, stop_error
from processors._task.keygroups import KeyGroup
from processors.exceptions import ConfigError
from state.base.store import KeyGroupStore
from state.cache import DELETED
from state.codecs import CodecUnavailable
from state.memory.store import MemoryBackend
from state.primitives import DEFAULT_SWEEP_BUDGET, live_value, sweep_key_group

__all__ = ["DeadLetter", "Emitted", "TestDriver"]


@dataclass(frozen=True)
class Emitted:
    """A record the app emitted (decoded back with the output's codecs)."""

    topic: str
    key: Any
    value: Any
    headers: Headers
    #: The record timestamp the emit set (``ctx.emit(..., timestamp=)``), or None.
    timestamp: int | None = field(default=None, repr=False)


@dataclass(frozen=True)
class DeadLetter:
    """An input record that went to the dead-letter topic (``<app>.dlq`` in production).

    Attributes:
        topic: input topic of the record.
        partition: its partition (key group).
        offset: its offset in the driver's numbering.
        key: the key as sent.
        value: the value as sent.
        timestamp: the record timestamp in ms.
        error: the exception user code (or a codec) raised.
        stage: ``process`` (user code) or ``deserialize`` (input codecs).
    """

    topic: str
    partition: int
    offset: int
    key: Any
    value: Any
    timestamp: int
    error: BaseException
    stage: str


class _WatermarkStep:
    """An ``advance_watermark`` call, replayed with its epoch."""

    __slots__ = ("partition", "to_ms")

    def __init__(self, partition: int | None, to_ms: int) -> None:
        self.partition = partition
        self.to_ms = to_ms


def _where(record: _Record) -> str:
    return f"{record.topic()}[{record.partition()}]@{record.offset()}"


class _Failed(Exception):
    """A record made user code (or decoding) raise: abort the epoch."""

    def __init__(self, record: _Record, error: Exception, stage: str) -> None:
        super().__init__(f"{type(error).__name__}: {error}")
        self.record, self.error, self.stage = record, error, stage


class TestDriver:
    """Runs an :class:`App`'s chain in-process over records you send.

    Records go through the input key/value codecs (so encoding bugs show up), are placed
    in key groups with the murmur2 partitioner, and change state in the epoch cache.

    Args:
        app: the app (any number of co-partitioned inputs, tables and global tables).
        partitions: the number of key groups (input partitions).
        clock: processing time in ms (the TTL clock, like the runtime's wall clock);
            default: a clock starting at 0 that only :meth:`advance` moves.
        on_error: ``dlq`` (default, production's default) dead-letters records whose
            user code raises; ``fail`` loses the open epoch and raises
            :class:`processors.exceptions.UserCodeError`, like ``LOCKGATE_ON_ERROR=fail``.
        sweep_budget: entries the TTL sweep examines per store and key group per commit.
        cache_entries: read-cache entries kept per store and key group across commits
            (``LOCKGATE_STATE_CACHE_ENTRIES``).

    Several inputs: name the topic of each record (``send(key, value, topic="orders")``).
    The driver processes records in the order they are sent; the runtime processes a key
    group's inputs in timestamp order, so send them in timestamp order to see what it
    does. Records sent to a global table's topic update it at once (every key group
    sees them).

    Raises:
        processors.exceptions.ConfigError: the app has no input, or a chain that ends
            nowhere.
    """

    __test__ = False  # not a pytest test class

    def __init__(
        self,
        app: App,
        partitions: int = 4,
        *,
        clock: Callable[[], int] | None = None,
        on_error: OnError | str = OnError.DLQ,
        sweep_budget: int = DEFAULT_SWEEP_BUDGET,
        cache_entries: int = 200_000,
    ) -> None:
        self.app = app
        self.partitions = partitions
        self.on_error = OnError(on_error)
        self.sweep_budget = sweep_budget
        self.cache_entries = cache_entries
        self._inputs = app.input_topics
        self._handlers = app.handlers()
        self._globals = app.global_tables
        for table in self._globals.values():
            table.clear()  # a fresh driver, like a fresh process, starts from nothing
        self._outputs = app.outputs
        #: Postgres and Iceberg outputs: emits to them are checked and recorded like topic
        #: emits.
        self._sinks: dict[str, PostgresSink | IcebergSink] = {
            n: IcebergSink(app.name, s)
            if isinstance(s, IcebergOutput)
            else PostgresSink(app.name, s)
            for n, s in app.sinks.items()
        }
        self._backend = MemoryBackend()
        self._handles = app.stores
        self._kgs: dict[int, KeyGroup] = {}
        self._clock = clock
        self._advanced = 0
        self._offsets: dict[tuple[str, int], int] = {}
        self._committed_offsets: dict[tuple[str, int], int] = {}
        self._epoch: list[_Record | _WatermarkStep] = []  # since the last commit
        self._emitted: list[Emitted] = []
        self._committed_emits = 0
        self._dead: list[DeadLetter] = []
        self._committed_dead = 0
        svc = app.time_service
        self._time = svc
        self._ctx = Context(self._emit, None if svc is None else svc.timers)
        if svc is not None:
            svc.emit = self._emit
            svc.on_error = self._timer_failed
            svc.decode_key = app.key_codec.decode
            svc.atomic_epochs = True  # commit() applies an epoch whole; crash() drops it

    # -- clock ------------------------------------------------------------------------------

    @property
    def now_ms(self) -> int:
        """The current processing time in ms (the TTL clock)."""
        return (0 if self._clock is None else self._clock()) + self._advanced

    def advance(self, ms: int) -> None:
        """Move processing time forward by ``ms`` (on top of an injected clock).

        Raises:
            ValueError: ``ms`` is negative.
        """
        if ms < 0:
            raise ValueError(f"the clock does not go backwards (advance({ms}))")
        self._advanced += ms
        if self._time is not None:
            self._tick()

    def _tick(self) -> list[Emitted]:
        """What the runtime does between batches: processing-time timers, idleness."""
        assert self._time is not None
        start = len(self._emitted)
        cursor = self.app.cursor
        cursor.now_ms = now = self.now_ms
        for g in range(self.partitions):  # every key group, as the runtime's are all open
            self._kg(g).bind()
            self._time.tick(now)
        return self._emitted[start:]

    def advance_watermark(self, to_ms: int, partition: int | None = None) -> list[Emitted]:
        """Raise the watermark of one key group (default: all) to ``to_ms``; return what fired.

        The event-time timers it passes fire as they would when records (or upstream
        barriers) moved the watermark there. It never goes back.

        Raises:
            processors.exceptions.ConfigError: the app uses no event time.
        """
        if self._time is None:
            raise ConfigError(f"app {self.app.name!r} uses no event time or timers")
        start = len(self._emitted)
        step = _WatermarkStep(partition, to_ms)
        self._epoch.append(step)  # replayed with the epoch, like an upstream barrier
        self._advance_watermark(step)
        return self._emitted[start:]

    def _advance_watermark(self, step: _WatermarkStep) -> None:
        assert self._time is not None
        self.app.cursor.now_ms = self.now_ms
        parts = range(self.partitions) if step.partition is None else [step.partition]
        for g in parts:
            self._kg(g).bind()
            self._time.advance_to(step.to_ms)

    def watermark(self, partition: int) -> int:
        """The current watermark of key group ``partition`` (``NO_WATERMARK`` before any)."""
        if self._time is None:
            raise ConfigError(f"app {self.app.name!r} uses no event time or timers")
        self._kg(partition).bind()
        return self._time.watermark()

    def _timer_failed(self, raw_key: bytes | None, t: int, name: str, exc: BaseException) -> None:
        """A timer callback raised: as the runtime, dead-letter it (or fail)."""
        stop = stop_error(self.on_error, f"timer {name!r} at {t}", exc)
        if stop is not None:
            self._lose_open_epoch()
            raise stop
        key = None if raw_key is None else self.app.key_codec.decode(raw_key)
        self._dead.append(DeadLetter("", -1, -1, key, None, t, exc, "timer"))

    # -- records ----------------------------------------------------------------------------

    def _kg(self, index: int) -> KeyGroup:
        kg = self._kgs.get(index)
        if kg is None:
            db = self._backend.open(self.app.name, index, list(self._handles))
            kg = self._kgs[index] = KeyGroup(index, db, self._handles)
        return kg

    def _emit(
        self, topic: str, key: Any, value: Any, headers: Headers, timestamp: int | None = None
    ) -> None:
        spec = self._outputs.get(topic)
        if spec is None:
            sink = self._sinks.get(topic)
            if sink is None:
                raise ConfigError(
                    f"emit to {topic!r}: not a declared output of app {self.app.name!r}"
                )
            # A Postgres or Iceberg output: the row is checked as production checks it
            # (SinkRowError) and recorded as an emit to the output's name (no database here).
            sink.operation(key, value)
            self._emitted.append(Emitted(topic, key, value, headers, timestamp))
            return
        # Round-trip through the codecs, as a consumer of the topic would see it.
        k = None if key is None else spec.key.decode(spec.key.encode(key))
        v = None if value is None else spec.value.decode(spec.value.encode(value))
        self._emitted.append(Emitted(topic, k, v, headers, timestamp))

    def send(
        self,
        key: Any,
        value: Any,
        *,
        topic: str | None = None,
        timestamp: int | None = None,
        headers: Any = None,
    ) -> list[Emitted]:
        """Process one input record; return what it emitted.

        A record whose user code raises emits nothing: it is dead-lettered
        (:attr:`dead_letters`), the epoch is replayed without it and committed, as the
        runtime does.

        Args:
            key: the record key (encoded with the input's key codec).
            value: the record value (encoded with the input's value codec; ``None`` is a
                tombstone: for a table, the key is deleted from ``timestamp`` on).
            topic: the input topic (stream, table or global table); required when the
                app has more than one input.
            timestamp: the record timestamp (``ctx.timestamp``) in ms; default: now.
                It is event time (joins use it) and has no effect on TTL.
            headers: the record headers.

        Raises:
            processors.exceptions.UserCodeError: user code raised and ``on_error`` is
                ``fail`` (the open epoch is lost, as after a crash).
            processors.exceptions.ConfigError: ``topic`` is not an input of the app (or
                is missing with several inputs), or user code made a programming error
                the runtime stops on (e.g. an emit to an undeclared output).
        """
        topic = self._topic_of(topic)
        glob = self._globals.get(topic)
        if glob is not None:
            raw_key = None if key is None else glob.key_codec.encode(key)
            glob.apply(
                raw_key,
                None if value is None else glob.value_codec.encode(value),
                self.now_ms if timestamp is None else timestamp,
            )
            return []
        kcodec, vcodec = self.app.input_codecs(topic)
        raw_key = None if key is None else kcodec.encode(key)
        raw_value = None if value is None else vcodec.encode(value)
        index = key_group(raw_key, self.partitions) if raw_key is not None else 0
        ts = self.now_ms if timestamp is None else timestamp
        offset = self._offsets.get((topic, index), 0)
        record = _Record(topic, index, offset, raw_key, raw_value, ts, headers)
        self._offsets[(topic, index)] = offset + 1
        self._epoch.append(record)
        start = len(self._emitted)
        try:
            self._process(record)
        except _Failed as failed:
            self._abort_and_replay(failed)
            return []
        return self._emitted[start:]

    def _topic_of(self, topic: str | None) -> str:
        if topic is None:
            if len(self._inputs) > 1:
                raise ConfigError(
                    f"app {self.app.name!r} reads {', '.join(self._inputs)}: name the topic, "
                    "send(key, value, topic=...)"
                )
            return self._inputs[0]
        if topic not in self._handlers and topic not in self._globals:
            raise ConfigError(
                f"{topic!r} is not an input of app {self.app.name!r} (inputs: "
                f"{', '.join([*self._inputs, *self._globals])})"
            )
        return topic

    def _process(self, record: _Record) -> None:
        """Run one record through the chain; raise :class:`_Failed` when it fails."""
        kg = self._kg(record.partition())
        kg.bind()
        cursor = self.app.cursor
        raw_key, raw_value = record.key(), record.value()
        cursor.key = raw_key
        cursor.now_ms = self.now_ms
        self._ctx.message = record
        kcodec, vcodec = self.app.input_codecs(record.topic())
        try:
            key = None if raw_key is None else kcodec.decode(raw_key)
            value = None if raw_value is None else vcodec.decode(raw_value)
        except CodecUnavailable:
            raise  # as the runtime: a service the codec needs is down, not bad input
        except Exception as exc:  # noqa: BLE001 - any decode failure is bad input
            stop = stop_error(self.on_error, f"record {_where(record)}", exc, "deserialize")
            if stop is not None:
                self._lose_open_epoch()
                raise stop from exc
            self._dead_letter(record, exc, "deserialize")  # no abort: user code did not run
            return
        try:
            self._handlers[record.topic()](key, value, self._ctx)
        except ConfigError:
            raise
        except Exception as exc:  # noqa: BLE001 - user code may raise anything
            raise _Failed(record, exc, "process") from exc

    def _abort_and_replay(self, failed: _Failed) -> None:
        """Production's answer to a failing record: abort, replay without it, commit."""
        stop = stop_error(
            self.on_error, f"record {_where(failed.record)}", failed.error, failed.stage
        )
        if stop is not None:
            self._lose_open_epoch()
            raise stop
        # The records of the open epoch are replayed in order; a record is the key.
        poison: ReplayPoison[int] = ReplayPoison()
        poison.mark(id(failed.record), failed.error, failed.stage)
        while True:
            self._drop_uncommitted()
            try:
                for record in self._epoch:
                    if isinstance(record, _WatermarkStep):
                        self._advance_watermark(record)
                        continue
                    entry = poison.entries.get(id(record))
                    if entry is None:
                        self._process(record)
                    else:
                        self._dead_letter(record, *entry)
            except _Failed as again:  # failed on replay (non-deterministic user code)
                poison.mark(id(again.record), again.error, again.stage)
                continue
            break
        self.commit()

    def _dead_letter(self, record: _Record, error: BaseException, stage: str) -> None:
        kcodec, vcodec = self.app.input_codecs(record.topic())
        raw_key, raw_value = record.key(), record.value()
        try:
            key = None if raw_key is None else kcodec.decode(raw_key)
            value = None if raw_value is None else vcodec.decode(raw_value)
        except Exception:  # noqa: BLE001 - undecodable: keep the bytes
            key, value = raw_key, raw_value
        self._dead.append(
            DeadLetter(
                record.topic(),
                record.partition(),
                record.offset(),
                key,
                value,
                record.timestamp()[1],
                error,
                stage,
            )
        )

    # -- epochs -----------------------------------------------------------------------------

    def commit(self) -> None:
        """End the epoch as the runtime does: TTL sweep, then every change becomes committed.

        The sweep examines up to ``sweep_budget`` entries per store with a TTL in every
        key group the driver has opened, and deletes the expired ones in this epoch.
        """
        now = self.now_ms
        for kg in self._kgs.values():
            sweep_key_group(kg.caches, self._handles, now, self.sweep_budget)
        for kg in self._kgs.values():
            writes = {name: cache.drain() for name, cache in kg.caches.items()}
            kg.db.apply({n: w for n, w in writes.items() if w}, {})
            for cache in kg.caches.values():
                cache.trim(self.cache_entries)
        self._epoch.clear()
        self._committed_offsets = dict(self._offsets)
        self._committed_emits = len(self._emitted)
        self._committed_dead = len(self._dead)

    def _drop_uncommitted(self) -> None:
        """Abort: drop the open epoch's state changes, emits and dead letters."""
        for kg in self._kgs.values():
            kg.discard()
        del self._emitted[self._committed_emits :]
        del self._dead[self._committed_dead :]

    def _lose_open_epoch(self) -> None:
        self._drop_uncommitted()
        self._offsets = dict(self._committed_offsets)
        self._epoch.clear()
        self._kgs.clear()  # a restarted process: fresh caches, sweep cursors from the start

    def crash(self) -> None:
        """Lose everything since the last commit, like kill -9 would.

        Committed state, emits and dead letters stay; input positions go back to the last
        commit (the next records sent take the offsets of the lost ones).
        """
        self._lose_open_epoch()

    # -- inspection -------------------------------------------------------------------------

    @property
    def emitted(self) -> list[Emitted]:
        """Every record emitted and not lost (the committed ones, then the open epoch's)."""
        return list(self._emitted)

    @property
    def dead_letters(self) -> list[DeadLetter]:
        """Every record dead-lettered and not lost, in order."""
        return list(self._dead)

    def key_group_store(self, index: int) -> KeyGroupStore:
        """Return the committed state database of key group ``index``."""
        return self._kg(index).db

    def state(self, store: str, key: Any) -> Any:
        """Return the current (possibly uncommitted) value of ``store`` for ``key``.

        What a handle would read now: ``None`` when absent or expired (TTL on the
        driver's clock); for a map with entry TTL, the live entries. No side effects on
        state (an expired entry is not deleted by looking at it).
        """
        raw_key = self.app.key_codec.encode(key)
        kg = self._kg(key_group(raw_key, self.partitions))
        stored = kg.caches[store].get(raw_key)
        value = live_value(self._handles[store].spec, stored, self.now_ms)
        return None if value is DELETED else value
