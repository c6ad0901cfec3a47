"""The user API: an :class:`App` with co-partitioned inputs, operator chains and keyed state.

What an app declares is kept in its :class:`~processors._dsl.definition.Definition`; its
operator chains are :class:`~processors._dsl.stream.Stream` objects.
"""

from __future__ import annotations

import dataclasses
import hashlib
import re
import sys
from collections.abc import Callable, Iterable, Mapping
from typing import Any, Literal, TypeVar

from processors._dsl.definition import Definition, Handler, InputDecl, OperatorInfo, bound_output
from processors._dsl.names import APP_PLACEHOLDER, NAME, check_callable, check_topic
from processors._dsl.stream import Stream, with_event_time
from processors._dsl.topics import OutputSpec, TopicConfig
from processors._sinks.iceberg import IcebergOutput
from processors._sinks.postgres import PostgresOutput
from processors._task.time import TimeService, Watermarks
from processors.exceptions import ConfigError
from processors.joins import DEFAULT_RETENTION_MS, GlobalTable, Table
from state.cache import KeyCursor
from state.codecs import JSON, STR, Codec, bind_codec
from state.primitives import (
    AggregatingState,
    Aggregator,
    ListState,
    MapState,
    ReducingState,
    StateHandle,
    StoreSpec,
    ValueState,
)

__all__ = ["App", "OperatorInfo", "OutputSpec", "Stream"]

T = TypeVar("T")
A = TypeVar("A")
R = TypeVar("R")

_ENV_NAME = re.compile(r"^LOCKGATE_[A-Z0-9_]*[A-Z0-9]$")


class App:
    """A lockgate app: one consumer group, co-partitioned inputs, keyed state, outputs.

    Example:
        >>> app = App("running-sum")
        >>> total = app.value_state("total")
        >>> @app.process("numbers", outputs=["sums"])
        ... def handle(key, value, ctx):
        ...     t = (total.value() or 0) + value["v"]
        ...     total.update(t)
        ...     ctx.emit("sums", key, {"sum": t})

    The name is the consumer group id and prefixes internal topics
    (``<app>.<store>.changelog``, ``<app>.dlq``) and per-app late topics
    (``<app>.late``); ``LOCKGATE_APP_NAME`` overrides it (the process calls
    :meth:`run_as`).

    Inputs are declared with :meth:`stream` / :meth:`process` (records run a chain),
    :meth:`table` (records update a versioned table the chains join) and
    :meth:`global_table` (read whole by every instance). All inputs but global tables
    are co-partitioned: key group ``g`` owns partition ``g`` of each, and processes
    their records in timestamp order (docs/joins.md). Each topic is declared once;
    definition mistakes raise :class:`ConfigError` (or :class:`TypeError` for
    arguments of the wrong type) where they are written.

    ``env`` lists the ``LOCKGATE_*`` variables the app's own code reads (e.g.
    ``LOCKGATE_WINDOW_MS``): ``lockgate run`` and ``lockgate config MODULE:APP`` accept
    them, whereas any other ``LOCKGATE_*`` variable that is not a setting stops the
    process (exit code 2).
    """

    def __init__(self, name: str, *, env: Iterable[str] = ()) -> None:
        if not isinstance(name, str) or not NAME.match(name):
            raise ConfigError(f"app name {name!r} must match {NAME.pattern}")
        if isinstance(env, str):
            raise TypeError(f"env must be a list of variable names, e.g. env=[{env!r}]")
        for var in env:
            if not isinstance(var, str) or not _ENV_NAME.match(var):
                raise ConfigError(
                    f"app {name!r}: env={var!r}: declare LOCKGATE_* variable names in upper "
                    "case (other names are never checked)"
                )
        self.name = name
        self.env: frozenset[str] = frozenset(env)
        self.cursor = KeyCursor()
        self._def = Definition(name, self.cursor)
        #: The module that created the app (where ``module:app`` specs look first).
        self.defined_in: str | None = sys._getframe(1).f_globals.get("__name__")  # noqa: SLF001

    # -- definition -------------------------------------------------------------------------

    def _check_input(self, topics: tuple[object, ...]) -> tuple[str, ...]:
        """Return the new input topics, or raise before anything is declared."""
        if topics and callable(topics[0]):
            raise TypeError(
                "the input topic is missing: write @app.process('topic', outputs=[...])"
            )
        if not topics:
            raise ConfigError("stream() needs an input topic")
        checked = tuple(check_topic(t, "input topic") for t in topics)
        for topic in checked:
            if topic in self._def.inputs or topic in self._def.globals:
                raise ConfigError(
                    f"app {self.name!r}: topic {topic!r} is already an input of this app: "
                    "each input topic has one chain, table or global table (use "
                    "app.stream(a, b) for one chain over several topics)"
                )
        if len(set(checked)) != len(checked):
            raise ConfigError(f"app {self.name!r}: input topics {list(checked)!r} repeat a topic")
        return checked

    def stream(
        self,
        *topics: str,
        key: Codec = STR,
        value: Codec = JSON,
        timestamp: Callable[[Any], int] | None = None,
        watermarks: Watermarks | None = None,
    ) -> Stream:
        """Declare input topics and return the operator chain their records run.

        Every input of an app (streams and tables) is co-partitioned: the same
        partition count, keyed alike; key group ``g`` is partition ``g`` of each, so
        their records share keyed state. Within a key group the runtime processes the
        inputs' records in timestamp order (docs/joins.md). ``app.stream(a, b)`` runs
        one chain over both topics (``ctx.topic`` says which); call it once per topic
        for one chain each.

        Event time (docs/event-time.md): ``watermarks`` (e.g.
        ``Watermarks.bounded(5000)``) makes the topics' partitions drive their key
        groups' watermarks; ``timestamp(value)`` gives a record's event time in ms
        (default: the record timestamp). Either one enables event time for the topics.

        Raises:
            ConfigError: a topic is already an input, or the name is illegal.
            TypeError: a topic is not a string, or ``timestamp`` is not callable.
        """
        checked = self._check_input(topics)
        if timestamp is not None:
            check_callable(timestamp, "stream(timestamp=...)")
        if watermarks is not None and not isinstance(watermarks, Watermarks):
            raise TypeError("watermarks= takes a Watermarks (e.g. Watermarks.bounded(5000))")
        stream = Stream(self._def, checked)
        for topic in checked:
            self._def.inputs[topic] = InputDecl(
                topic,
                bind_codec(key, topic, "key"),
                bind_codec(value, topic, "value"),
                stream=stream,
                timestamp=timestamp,
            )
            if timestamp is not None or watermarks is not None:
                self._event_time(topic, watermarks or Watermarks())
        return stream

    def _event_time(self, topic: str, strategy: Watermarks) -> None:
        svc = self._def.time_service()
        svc.strategies[topic] = strategy
        svc._single = False  # noqa: SLF001 - recomputed on first use
        if strategy.idle_ms is not None:
            svc.needs_tick = True

    @property
    def time_service(self) -> TimeService | None:
        """Watermarks and timers, when the app uses event time or timers (else ``None``)."""
        return self._def.time

    def on_timer(self, fn: Callable[[Any, Any], None]) -> Callable[[Any, Any], None]:
        """Decorator: ``fn(key, ctx)`` runs when a timer set with ``ctx.timers`` fires.

        ``ctx.timestamp`` is the timer's time, ``ctx.name`` its name, ``ctx.emit``
        emits, ``ctx.timers`` sets more. Timers are keyed
        state: a timer fires once, in the epoch that commits its deletion and its
        outputs. A timer callback that raises is dead-lettered (a record with the key,
        no value, and ``lockgate-timer-*`` headers) under ``LOCKGATE_ON_ERROR=dlq``.

        Raises:
            ConfigError: a second timer handler.
            TypeError: ``fn`` is not callable.
        """
        check_callable(fn, "@app.on_timer")
        if self._def.on_timer is not None:
            raise ConfigError(f"app {self.name!r} has a timer handler already")
        self._def.on_timer = fn  # type: ignore[assignment]
        self._def.time_service().set_user_handler(lambda raw, t, name, tctx: fn(tctx.key, tctx))
        return fn

    def table(
        self,
        topic: str,
        *,
        key: Codec = STR,
        value: Codec = JSON,
        retention_ms: int = DEFAULT_RETENTION_MS,
        ttl_ms: int | None = None,
        watermarks: Watermarks | None = None,
    ) -> Table:
        """Declare a co-partitioned input topic kept as a versioned table (keyed state).

        Each record is a version of its key at the record's timestamp; a ``None``
        value (tombstone) deletes the key from then on. Join a stream with it as of
        each record's time with :meth:`Stream.join_asof`, or read it in a handler
        (``table.as_of(ctx.timestamp)``, ``table.latest()``) for the current key.
        Versions more than ``retention_ms`` older than a key's newest are dropped
        (the newest of those is kept; a deleted key keeps its deletion). ``ttl_ms``
        (processing time, see docs/state.md) forgets a key not updated for that long,
        deletions included.

        The table's store is named ``table.<topic>`` (a digest for very long names).

        Raises:
            ConfigError: the topic is already an input, or ``retention_ms`` < 0.
        """
        (checked,) = self._check_input((topic,))
        if retention_ms < 0:
            raise ConfigError(f"table {topic!r}: retention_ms must be >= 0")
        store_name = f"table.{checked}"
        if len(store_name) > 150 or not NAME.match(store_name):
            store_name = f"table.{hashlib.sha256(checked.encode()).hexdigest()[:20]}"
        store: ValueState[list[list[Any]]] = self.value_state(store_name, ttl_ms=ttl_ms)
        table = Table(checked, store, retention_ms)
        bound_key = bind_codec(key, checked, "key")
        bound_value = bind_codec(value, checked, "value")
        self._def.inputs[checked] = InputDecl(checked, bound_key, bound_value, table=table)
        if watermarks is not None:
            self._event_time(checked, watermarks)  # its record timestamps hold the watermark
        return table

    def global_table(
        self,
        topic: str,
        *,
        key: Codec = STR,
        value: Codec = JSON,
        retention_ms: int | None = None,
    ) -> GlobalTable:
        """Declare a topic every instance reads whole: read-only reference data.

        Not co-partitioned: any partition count. Every key group reads the latest value
        of any key with ``table.get(key)``. The instance is ready only once it has read
        the topic to its end; new records are applied between batches. Kept in memory.

        With ``retention_ms`` the table is versioned (docs/joins.md): each record is a
        version of its key at its record timestamp, and ``table.get_as_of(key, ts)``
        returns the value as of ``ts`` (e.g. an order's time), exact for times up to
        ``retention_ms`` behind the key's newest version; older versions are dropped.

        Raises:
            ConfigError: the topic is already an input of this app, or ``retention_ms``
                is negative.
        """
        (checked,) = self._check_input((topic,))
        if retention_ms is not None and retention_ms < 0:
            raise ConfigError(f"global table {topic!r}: retention_ms must be >= 0")
        table = GlobalTable(checked, key, value, retention_ms)
        self._def.globals[checked] = table
        return table

    def process(
        self,
        *topics: str,
        outputs: Iterable[str | OutputSpec | TopicConfig] = (),
        key: Codec = STR,
        value: Codec = JSON,
        timestamp: Callable[[Any], int] | None = None,
        watermarks: Watermarks | None = None,
    ) -> Callable[[Handler], Handler]:
        """Decorator: ``fn(key, value, ctx)`` handles every record of the input topic.

        ``timestamp``/``watermarks`` enable event time as in :meth:`stream` (for
        ``ctx.timers.set_event_time``). ``outputs`` lists topic names (string keys,
        JSON values), :class:`OutputSpec` or :class:`TopicConfig` (codecs and topic
        configuration, docs/codecs.md).

        Raises:
            ConfigError: as :meth:`stream`, raised by ``@app.process(...)`` itself.
            TypeError: used without arguments (``@app.process``), ``outputs`` given as
                one string, or the decorated object is not callable.
        """
        self._check_input(topics)
        if isinstance(outputs, str):
            raise TypeError(f"outputs must be a list of topics, e.g. outputs=[{outputs!r}]")
        outputs = list(outputs)
        for out in outputs:
            check_topic(out if isinstance(out, str) else out.topic, "output topic")

        def register(fn: Handler) -> Handler:
            check_callable(fn, "@app.process")
            self._check_input(topics)
            for out in outputs:
                if isinstance(out, OutputSpec):
                    self._def.outputs[out.topic] = bound_output(out)
                elif isinstance(out, TopicConfig):
                    self.output(out)
                else:
                    self.output(out)
            self.stream(
                *topics, key=key, value=value, timestamp=timestamp, watermarks=watermarks
            ).process(fn)
            return fn

        return register

    def output(
        self,
        topic: str | TopicConfig,
        *,
        key: Codec = STR,
        value: Codec = JSON,
        partitions: int | None = None,
        internal: bool = False,
    ) -> OutputSpec:
        """Declare an output topic (created when missing) with its codecs.

        With a :class:`TopicConfig`, its codecs, partitions and topic configuration are
        used (created with it, checked at start: docs/codecs.md).

        Raises:
            ConfigError: ``topic`` is not a legal Kafka topic name, or a
                :class:`TopicConfig` is given with ``key``, ``value`` or ``partitions``
                (they belong in the TopicConfig).
        """
        return self._def.output(
            topic, key=key, value=value, partitions=partitions, internal=internal
        )

    def postgres_output(
        self,
        name: str,
        *,
        dsn: str | Callable[[], str],
        table: str,
        mode: Literal["upsert", "append"] = "upsert",
        key_columns: Iterable[str] = (),
    ) -> PostgresOutput:
        """Declare a Postgres table as an output: ``ctx.emit(name, key, row)`` writes to it.

        Exactly once: the rows of an epoch commit in the table if and only if the epoch
        commits in Kafka (two-phase commit, docs/sinks.md); after any crash the table
        equals what an uninterrupted run would have written. A row is a mapping of column
        to value (mappings and lists go to ``json``/``jsonb`` columns).

        Args:
            name: the name emitted to (not a Kafka topic; unique among the outputs).
            dsn: a libpq connection string or URL, or a function returning one (called
                at the first connection: e.g. ``lambda: os.environ["LOCKGATE_PG_DSN"]``
                with ``env=["LOCKGATE_PG_DSN"]`` on the app).
            table: an existing table, ``"name"`` or ``"schema.name"``.
            mode: ``"upsert"`` (one row per key: ``INSERT ... ON CONFLICT (key_columns)
                DO UPDATE``; emitting ``None`` deletes the key's row) or ``"append"``
                (every row inserted).
            key_columns: upsert's key (a unique constraint of the table). A row without
                them takes them from the record's key (a mapping, or a scalar for one
                key column).

        Raises:
            ConfigError: a bad name, mode, table or key columns, or the name is taken.

        The database needs ``max_prepared_transactions`` > 0 (at least the number of
        key groups an instance owns, per sink, plus a few).
        """
        if not isinstance(name, str) or not NAME.match(name) or ":" in name:
            raise ConfigError(f"postgres output name {name!r} must match {NAME.pattern}")
        if name in self._def.outputs or name in self._def.sinks:
            raise ConfigError(f"output {name!r} is declared twice in app {self.name!r}")
        spec = PostgresOutput(name, dsn, table, mode, tuple(key_columns))
        self._def.sinks[name] = spec
        return spec

    def iceberg_output(
        self,
        name: str,
        *,
        catalog: str | Mapping[str, str] | Callable[[], Any],
        table: str,
        mode: Literal["append"] = "append",
    ) -> IcebergOutput:
        """Declare an Apache Iceberg table as an output: ``ctx.emit(name, key, row)`` appends.

        Exactly once: the rows of an epoch are appended to the table (one snapshot per
        epoch and instance) if and only if the epoch commits in Kafka; after any crash the
        table holds what an uninterrupted run would have appended (two-phase commit of
        Parquet files settled by the epoch token, docs/sinks.md "Iceberg"). A row is a
        mapping of column to value, converted to the table's schema (a missing optional
        column is null).

        Args:
            name: the name emitted to (not a Kafka topic; unique among the outputs).
            catalog: the pyiceberg catalog: its configured name (``.pyiceberg.yaml`` or
                ``PYICEBERG_CATALOG__<NAME>__*``), a mapping of its properties (e.g. a SQL
                catalog ``{"type": "sql", "uri": "sqlite:////data/catalog.db",
                "warehouse": "file:///data/warehouse"}``; the key ``"name"`` names the
                catalog, default ``"default"``), or a function returning a loaded catalog
                (called when the sink first needs it).
            table: an existing unpartitioned table, ``"namespace.name"``.
            mode: ``"append"`` (the only mode: every emitted row is one table row).

        Raises:
            ConfigError: a bad name, mode, table or catalog, or the name is taken.

        Needs the ``iceberg`` extra (``pip install 'lockgate[iceberg]'``: pyiceberg).
        """
        if not isinstance(name, str) or not NAME.match(name) or ":" in name:
            raise ConfigError(f"iceberg output name {name!r} must match {NAME.pattern}")
        if name in self._def.outputs or name in self._def.sinks:
            raise ConfigError(f"output {name!r} is declared twice in app {self.name!r}")
        spec = IcebergOutput(name, catalog, table, mode)
        self._def.sinks[name] = spec
        return spec

    @property
    def sinks(self) -> dict[str, PostgresOutput | IcebergOutput]:
        """Declared outputs outside Kafka (:meth:`postgres_output`, :meth:`iceberg_output`)."""
        return dict(self._def.sinks)

    def value_state(
        self, name: str, *, default: T | None = None, codec: Codec = JSON, ttl_ms: int | None = None
    ) -> ValueState[T]:
        """Declare a value-per-key store."""
        spec = StoreSpec(name, "value", codec, ttl_ms)
        return self._def.add_store(ValueState(spec, self.cursor, default))  # type: ignore[no-any-return]

    def list_state(
        self, name: str, *, codec: Codec = JSON, ttl_ms: int | None = None
    ) -> ListState[Any]:
        """Declare a list-per-key store."""
        return self._def.add_store(  # type: ignore[no-any-return]
            ListState(StoreSpec(name, "list", codec, ttl_ms), self.cursor)
        )

    def map_state(
        self,
        name: str,
        *,
        codec: Codec = JSON,
        ttl_ms: int | None = None,
        entry_ttl: bool = False,
    ) -> MapState[Any]:
        """Declare a map-per-key store.

        Args:
            name: the store name (part of its changelog topic's name).
            codec: how the map is stored.
            ttl_ms: processing-time TTL (see docs/state.md).
            entry_ttl: with ``ttl_ms``, each map entry expires ``ttl_ms`` after its own
                last write; without it the whole map expires after its last write.
        """
        return self._def.add_store(  # type: ignore[no-any-return]
            MapState(StoreSpec(name, "map", codec, ttl_ms, entry_ttl=entry_ttl), self.cursor)
        )

    def reducing_state(
        self,
        name: str,
        reduce: Callable[[T, T], T],
        *,
        codec: Codec = JSON,
        ttl_ms: int | None = None,
    ) -> ReducingState[T]:
        """Declare a store that folds added values with ``reduce``."""
        spec = StoreSpec(name, "reducing", codec, ttl_ms)
        return self._def.add_store(ReducingState(spec, self.cursor, reduce))  # type: ignore[no-any-return]

    def aggregating_state(
        self,
        name: str,
        aggregator: Aggregator[T, A, R],
        *,
        codec: Codec = JSON,
        ttl_ms: int | None = None,
    ) -> AggregatingState[T, A, R]:
        """Declare a store that keeps an aggregator's accumulator per key."""
        spec = StoreSpec(name, "aggregating", codec, ttl_ms)
        return self._def.add_store(  # type: ignore[no-any-return]
            AggregatingState(spec, self.cursor, aggregator)
        )

    # -- read by the runtime ----------------------------------------------------------------

    @property
    def input_topics(self) -> tuple[str, ...]:
        """The co-partitioned input topics, in declaration order (the tie-break order)."""
        if not self._def.inputs:
            raise ConfigError(f"app {self.name!r} has no input: call app.stream() or @app.process")
        return tuple(self._def.inputs)

    @property
    def key_codec(self) -> Codec:
        """Codec of the first input's keys."""
        return self.input_codecs(self.input_topics[0])[0]

    @property
    def value_codec(self) -> Codec:
        """Codec of the first input's values."""
        return self.input_codecs(self.input_topics[0])[1]

    def input_codecs(self, topic: str) -> tuple[Codec, Codec]:
        """(key codec, value codec) of an input topic."""
        spec = self._def.inputs[topic]
        return spec.key, spec.value

    @property
    def subscribed_input(self) -> str:
        """The input whose partitions the consumer group assigns (the first stream).

        Key group ``g`` takes partition ``g`` of every other input with it. The first
        *stream* (not the first declaration) so that adding a table to an app keeps its
        subscription, which a rolling update needs (docs/joins.md).
        """
        for topic, spec in self._def.inputs.items():
            if spec.stream is not None:
                return topic
        return self.input_topics[0]

    @property
    def tables(self) -> dict[str, Table]:
        """Declared (co-partitioned, versioned) tables by topic."""
        return {t: i.table for t, i in self._def.inputs.items() if i.table is not None}

    @property
    def global_tables(self) -> dict[str, GlobalTable]:
        """Declared global tables by topic."""
        return dict(self._def.globals)

    @property
    def operators(self) -> dict[str, OperatorInfo]:
        """The stateful operators (windows, interval joins) by id, in declaration order."""
        return dict(self._def.operators)

    def store_operator(self, store: str) -> OperatorInfo | None:
        """The operator whose state ``store`` holds (``None``: a store of the app's own)."""
        for info in self._def.operators.values():
            if store in info.stores:
                return info
        return None

    @property
    def run_name(self) -> str:
        """The name the app runs under (the name given to :meth:`run_as`, else its own)."""
        return self._def.run_name

    def run_as(self, name: str) -> None:
        """Run the app under ``name`` (``LOCKGATE_APP_NAME``): names its per-app topics.

        The runtime, the operations commands and backfills call it with the name they
        run the app under, before reading :attr:`outputs`; per-app late topics
        (``late_topic=True`` or ``"{app}..."``) are named after it from then on.

        Raises:
            ConfigError: ``name`` is not a legal app name, or a late topic named after
                it is not a legal topic name.
        """
        if not isinstance(name, str) or not NAME.match(name):
            raise ConfigError(f"app name {name!r} must match {NAME.pattern}")
        for topic in self._def.outputs:
            if APP_PLACEHOLDER in topic:
                self._def.run_topic(topic, "late topic", name)
        self._def.running_as = name
        for op in self._def.windows:
            if op.late_template is not None:
                op.late_topic = self._def.run_topic(op.late_template, "late topic")

    @property
    def outputs(self) -> dict[str, OutputSpec]:
        """Declared outputs by topic, per-app late topics named for :attr:`run_name`."""
        out: dict[str, OutputSpec] = {}
        for topic, spec in self._def.outputs.items():
            if APP_PLACEHOLDER in topic:
                topic = self._def.run_topic(topic, "late topic")
                spec = dataclasses.replace(spec, topic=topic)
            out[topic] = spec
        return out

    @property
    def stores(self) -> dict[str, StateHandle]:
        """Declared state handles by store name."""
        return dict(self._def.stores)

    def handler(self) -> Handler:
        """Return the compiled operator chain of the first input (single-input apps)."""
        return self.handlers()[self.input_topics[0]]

    def handlers(self) -> dict[str, Handler]:
        """Return the handler of every input topic: its compiled chain, or its table update.

        Raises:
            ConfigError: no input, only tables (nothing would run), or a chain that
                ends nowhere.
        """
        topics = self.input_topics
        if all(self._def.inputs[t].stream is None for t in topics):
            raise ConfigError(
                f"app {self.name!r} has only tables ({', '.join(topics)}): add a stream "
                "that uses them (app.stream(topic)...join_asof(table))"
            )
        out: dict[str, Handler] = {}
        for topic in topics:
            spec = self._def.inputs[topic]
            if spec.stream is not None:
                out[topic] = spec.stream.compile()
            else:
                assert spec.table is not None
                out[topic] = spec.table.update
        svc = self._def.time
        if svc is None:
            return out
        if any(op.needs_event_time for op in self._def.windows) and not svc.strategies:
            raise ConfigError(
                f"app {self.name!r} has event-time windows but no input with event time: "
                "declare it with app.stream(topic, watermarks=Watermarks.bounded(ms)) "
                "(and timestamp=fn for an event time in the value)"
            )
        inputs = self._def.inputs
        return {t: with_event_time(h, t, inputs[t].timestamp, svc) for t, h in out.items()}
