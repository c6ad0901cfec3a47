"""The user API: an :class:`App` with co-partitioned inputs, operator chains and keyed state."""

from __future__ import annotations

import dataclasses
import hashlib
import re
import sys
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, TypeVar

from processors._checkpoint.protocol import EVENT_TIME, WRITER
from processors._dsl.context import Context
from processors._dsl.topics import OutputSpec, TopicConfig
from processors._sinks.iceberg import IcebergOutput
from processors._sinks.postgres import PostgresOutput
from processors._task.time import TIME_STORE, TimeService, Watermarks
from processors.exceptions import ConfigError
from processors.joins import DEFAULT_RETENTION_MS, GlobalTable, IntervalJoin, Table
from processors.windows import Assigner, WindowedStream, WindowOperator
from state.cache import KeyCursor
from state.codecs import BYTES, JSON, STR, Codec, bind_codec
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

Handler = Callable[[Any, Any, Context], None]
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,200}$")
#: Kafka's rule for topic names (``org.apache.kafka.common.internals.Topic``).
_TOPIC = re.compile(r"^[A-Za-z0-9._-]{1,249}$")
_TERMINAL = ("process", "key_by", "interval_left", "interval_right", "window")
_ENV_NAME = re.compile(r"^LOCKGATE_[A-Z0-9_]*[A-Z0-9]$")
#: In a late topic's name, the name the app runs under (``LOCKGATE_APP_NAME`` or its own).
APP_PLACEHOLDER = "{app}"
#: The late topic of ``window(..., late_topic=True)``: one per app name.
DEFAULT_LATE_TOPIC = APP_PLACEHOLDER + ".late"


def _check_topic(topic: object, what: str) -> str:
    """Return ``topic`` if it is a legal Kafka topic name.

    Raises:
        TypeError: ``topic`` is not a string.
        ConfigError: the name is not a legal Kafka topic name.
    """
    if not isinstance(topic, str):
        raise TypeError(f"{what} must be a topic name (str), got {type(topic).__name__}")
    if not _TOPIC.match(topic) or topic in (".", ".."):
        raise ConfigError(
            f"{what} {topic!r} is not a legal Kafka topic name (1-249 characters of "
            "A-Z a-z 0-9 . _ -, not '.' or '..')"
        )
    return topic


def _check_callable(fn: object, op: str) -> None:
    if not callable(fn):
        raise TypeError(f"{op}() needs a callable, got {type(fn).__name__}")


def _bound_output(spec: OutputSpec) -> OutputSpec:
    """``spec`` with its codecs bound to its topic (:func:`state.codecs.bind_codec`)."""
    key = bind_codec(spec.key, spec.topic, "key")
    value = bind_codec(spec.value, spec.topic, "value")
    if key is spec.key and value is spec.value:
        return spec
    return dataclasses.replace(spec, key=key, value=value)


@dataclass(frozen=True)
class OperatorInfo:
    """A stateful operator of an app (a window or an interval join) and its stable id.

    The id, not the declaration order, says which operator a savepoint's state belongs
    to: the stores and timers of an operator are numbered by declaration order
    (``window-<n>``, ``interval-join-<n>.left``/``.right``, timers ``w<n>:...``), and a
    restore maps the saved numbering onto the app's by id (docs/event-time.md).

    Attributes:
        uid: the id: given with ``uid=``, or derived from the operator's kind and what
            it is attached to (``window(<input topics>)``, ``window(<upstream id>)``,
            ``interval_join(<left topics>,<right topics>)``).
        kind: ``"window"`` or ``"interval_join"``.
        stores: the operator's stores, by their names in this app.
        timers: the owner prefix of its timers (``w<n>``); ``None``: it has none.
        given: the id was given with ``uid=`` (not derived).
        what: the operator in words, for messages.
    """

    uid: str
    kind: str
    stores: tuple[str, ...]
    timers: str | None
    given: bool
    what: str

    def store_fields(self) -> dict[str, str]:
        """The fields a savepoint manifest adds to each of its stores' entries."""
        fields = {"operator": self.uid}
        if self.timers is not None:
            fields["timers"] = self.timers
        return fields


@dataclass
class _Input:
    """A co-partitioned input topic: its records run a chain or update a table."""

    topic: str
    key: Codec
    value: Codec
    stream: Stream | None = None
    table: Table | None = None
    #: ``fn(value) -> ms``: the record's event time (``None``: the record timestamp).
    timestamp: Callable[[Any], int] | None = None


class Stream:
    """An operator chain from the app's input to its outputs.

    Operators are applied per record in the order they are added. ``map``,
    ``filter`` and ``flat_map`` work on values; ``process`` gets the key, the
    value and the :class:`Context` (state, emit, record metadata); ``to`` sends
    the values that reach it to a topic with the record's key.

    ``process`` is terminal: it returns nothing to pass on, so adding any operator
    after it raises :class:`ConfigError` (emit from the handler with ``ctx.emit``).
    Operators that are not given a callable raise :class:`TypeError`.
    """

    def __init__(
        self, app: App, topics: tuple[str, ...] = (), what: str = "", source: str = ""
    ) -> None:
        self._app = app
        self._topics = topics
        self._what = what or f"the stream of {', '.join(repr(t) for t in topics)}"
        #: What derived operator ids say the stream is: its input topics, or the id of
        #: the operator whose results it carries.
        self._source = source or ",".join(topics)
        self._ops: list[tuple[str, Any]] = []
        self._compiled: Handler | None = None

    def _add(self, kind: str, arg: Any) -> Stream:
        if kind not in ("to", "key_by", "join_asof", "interval_left", "interval_right", "window"):
            _check_callable(arg, kind)
        self._check_open(kind)
        self._ops.append((kind, arg))
        return self

    def _check_open(self, kind: str) -> None:
        """Raise if the chain already ended (a terminal operator was added)."""
        if self._ops and self._ops[-1][0] in _TERMINAL:
            last = self._ops[-1][0]
            last = "interval_join" if last.startswith("interval_") else last
            raise ConfigError(
                f"app {self._app.name!r}: .{kind}() after .{last}() would never run: {last}() "
                "is terminal (process() emits with ctx.emit; key_by() hands the records to the "
                "next app through its repartition topic); put map/filter/flat_map/to "
                f"before {last}()"
            )

    def map(self, fn: Callable[[Any], Any]) -> Stream:
        """Replace each value with ``fn(value)``."""
        return self._add("map", fn)

    def filter(self, predicate: Callable[[Any], bool]) -> Stream:
        """Keep only the values for which ``predicate(value)`` is true."""
        return self._add("filter", predicate)

    def flat_map(self, fn: Callable[[Any], Iterable[Any]]) -> Stream:
        """Replace each value with zero or more values."""
        return self._add("flat_map", fn)

    def process(self, fn: Handler) -> Stream:
        """Call ``fn(key, value, ctx)``; it emits with ``ctx.emit``. Terminal: see the class."""
        return self._add("process", fn)

    def key_by(
        self,
        fn: Callable[[Any], Any],
        topic: str,
        *,
        key: Codec = STR,
        value: Codec = JSON,
        partitions: int | None = None,
    ) -> Stream:
        """Re-key: send each value to the repartition topic ``topic`` keyed by ``fn(value)``.

        ``topic`` is declared an internal output (barriers flow through it), placed with
        the murmur2 partitioner, so the next stage — another :class:`App` reading
        ``topic``, with its own consumer group and key groups — sees every key in one
        key group, and its checkpoints align on this app's barriers. Terminal: the chain
        of this app ends here.

        Raises:
            ConfigError: after a terminal operator, or ``topic`` is not a legal name.
            TypeError: ``fn`` is not callable.
        """
        _check_callable(fn, "key_by")
        _check_topic(topic, "repartition topic")
        self._add("key_by", (fn, topic, self._app))
        self._app.output(topic, key=key, value=value, partitions=partitions, internal=True)
        return self

    def join_asof(
        self,
        table: Table,
        *,
        how: str = "left",
        combine: Callable[[Any, Any], Any] | None = None,
    ) -> Stream:
        """Join each value with ``table``'s value of the same key as of the record's timestamp.

        The table's version with the greatest timestamp at or before the record's
        (``None``: no version then, or deleted). ``how="left"`` passes every record on,
        ``how="inner"`` only those with a value. The value passed on is
        ``combine(value, table_value)``, or the pair ``(value, table_value)``.

        Raises:
            ConfigError: ``table`` is not a table of this app, or ``how`` is unknown.
        """
        if not isinstance(table, Table) or table not in self._app._tables():  # noqa: SLF001 - same module
            raise ConfigError(
                f"app {self._app.name!r}: join_asof() needs a table of this app "
                "(declare it with app.table(topic))"
            )
        if how not in ("left", "inner"):
            raise ConfigError(f"join_asof(how={how!r}): use 'left' or 'inner'")
        if combine is not None:
            _check_callable(combine, "join_asof")
        return self._add("join_asof", (table, how == "inner", combine))

    def interval_join(
        self,
        other: Stream,
        *,
        lower_ms: int,
        upper_ms: int,
        combine: Callable[[Any, Any], Any] | None = None,
        grace_ms: int = 0,
        max_per_key: int = 1000,
        uid: str | None = None,
    ) -> Stream:
        """Join this stream with ``other`` on the key, within a time interval.

        A record of this stream at ``t`` matches every record of ``other`` with the same
        key and a timestamp in ``[t + lower_ms, t + upper_ms]``, whichever comes first;
        each match passes ``combine(left, right)`` (or the pair) to the returned stream.
        Both sides are kept per key (in keyed state, at most ``max_per_key`` records per
        side) until no record within ``grace_ms`` of the key's newest timestamp can match
        them. Terminal for both streams: continue with the returned one.

        ``uid`` is the join's stable id in savepoints (as Flink's ``uid()``); by default
        ``interval_join(<this stream's topics>,<other's topics>)``. See
        :class:`OperatorInfo`.

        Raises:
            ConfigError: ``other`` is not another input stream of this app, the
                interval is empty (``lower_ms > upper_ms``), or the id is illegal or
                taken by another operator of the app.
        """
        if not isinstance(other, Stream) or other._app is not self._app or other is self:
            raise ConfigError("interval_join() needs another input stream of the same app")
        if not self._topics or not other._topics:
            raise ConfigError("interval_join() joins two input streams (app.stream(topic))")
        if lower_ms > upper_ms:
            raise ConfigError(f"interval_join: lower_ms {lower_ms} > upper_ms {upper_ms}")
        if max_per_key < 1 or grace_ms < 0:
            raise ConfigError("interval_join: max_per_key must be >= 1 and grace_ms >= 0")
        if combine is not None:
            _check_callable(combine, "interval_join")
        self._check_open("interval_join")  # both, before anything is declared
        other._check_open("interval_join")
        what = f"the interval join of {self._what} and {other._what}"
        op_id = self._app._operator_id(  # noqa: SLF001 - same module
            "interval_join", uid, f"{self._source},{other._source}", what
        )
        name = f"interval-join-{self._app._next_join()}"  # noqa: SLF001 - same module
        left: ValueState[list[Any]] = self._app.value_state(f"{name}.left")
        right: ValueState[list[list[Any]]] = self._app.value_state(f"{name}.right")
        join = IntervalJoin(left, right, lower_ms, upper_ms, grace_ms, max_per_key)
        self._app._add_operator(  # noqa: SLF001 - same module
            OperatorInfo(
                op_id,
                "interval_join",
                (f"{name}.left", f"{name}.right"),
                None,
                uid is not None,
                what,
            )
        )
        joined = Stream(self._app, (), what, source=op_id)
        self._add("interval_left", (join, joined, combine))
        other._add("interval_right", (join, joined, combine))
        return joined

    def window(
        self,
        assigner: Assigner,
        *,
        allowed_lateness_ms: int = 0,
        late_topic: str | bool | None = None,
        codec: Codec = JSON,
        uid: str | None = None,
    ) -> WindowedStream[Stream]:
        """Cut this stream into per-key windows (docs/event-time.md).

        ``assigner`` is :class:`~processors.windows.Tumbling`, ``Sliding``, ``Session``
        (event time: the app's inputs declare ``watermarks=``), ``Count`` or ``Global``.
        Finish with ``.aggregate(...)``, ``.reduce(...)``, ``.count()`` or
        ``.process(...)``, which return the stream of window results. Time windows fire
        when the key group's watermark passes their end; records arriving up to
        ``allowed_lateness_ms`` after that update the result (emitted again); records
        later than that go unchanged to the late topic (declared as an output with
        bytes codecs) with headers naming the window and the watermark. ``late_topic``:
        ``True`` names it per app, ``<app>.late`` with the name the app runs under
        (``LOCKGATE_APP_NAME``, else its own), like the app's other topics, so two
        deployments of one code never share it; a name is used as given, ``{app}`` in
        it replaced by that name (``"{app}.late-clicks"``); ``None`` (the default) or
        ``False`` drops late records. ``codec`` stores the accumulators. Terminal for
        this stream.

        ``uid`` is the window operator's stable id in savepoints (as Flink's ``uid()``):
        a restore gives each operator the state saved under its id, whatever the order
        of the declarations. By default ``window(<input topics>)``, or
        ``window(<upstream id>)`` for a window over window or join results (see
        :class:`OperatorInfo`).

        Raises:
            ConfigError: after a terminal operator, a negative lateness, an illegal
                late topic name, or an id that is illegal or taken by another operator
                of the app.
        """
        if allowed_lateness_ms < 0:
            raise ConfigError(f"window: allowed_lateness_ms must be >= 0 ({allowed_lateness_ms})")
        if late_topic is True:
            late_topic = DEFAULT_LATE_TOPIC
        elif late_topic is False:
            late_topic = None
        if late_topic is not None:
            if not isinstance(late_topic, str):
                raise TypeError(
                    "late_topic must be a topic name, True or None, got "
                    f"{type(late_topic).__name__}"
                )
            self._app._run_topic(late_topic, "late topic")  # noqa: SLF001 - same module
        self._check_open("window")
        what = f"the window of {self._what}"
        op_id = self._app._operator_id("window", uid, self._source, what)  # noqa: SLF001
        return WindowedStream(
            self, assigner, allowed_lateness_ms, late_topic, codec, (op_id, uid is not None)
        )

    def _window(
        self,
        assigner: Assigner,
        agg: Any,
        lateness: int,
        late_topic: str | None,
        codec: Codec,
        uid: tuple[str, bool],
    ) -> Stream:
        """Add the window operator; return the stream of its results.

        ``uid`` is the operator's id and whether the user gave it (checked again: another
        operator may have taken it since :meth:`window`).
        """
        self._check_open("window")
        op_id, given = uid
        what = f"the window of {self._what}"
        self._app._operator_id("window", op_id if given else None, self._source, what)  # noqa: SLF001
        n = self._app._next_join()  # noqa: SLF001 - same module
        op = WindowOperator(
            n,
            assigner,
            agg,
            lateness,
            late_topic,
            store=self._app.value_state(f"window-{n}", codec=codec),
            time=self._app._time_service(),  # noqa: SLF001 - same module
        )
        if late_topic is not None:
            op.late_topic = self._app._run_topic(late_topic, "late topic")  # noqa: SLF001
        self._app._add_operator(  # noqa: SLF001 - same module
            OperatorInfo(op_id, "window", (f"window-{n}",), op.prefix, given, what)
        )
        results = Stream(self._app, (), f"the window results of {self._what}", source=op_id)
        self._add("window", (op, results))
        self._app._def.windows.append(op)  # noqa: SLF001 - same module
        if late_topic is not None:
            # Declared by its template: App.outputs names it for the app's running name.
            spec = OutputSpec(late_topic, BYTES, BYTES, None, False)
            self._app._def.outputs[late_topic] = spec  # noqa: SLF001 - same module
        return results

    def to(
        self, topic: str | TopicConfig, *, key: Codec = STR, value: Codec = JSON, **kw: Any
    ) -> Stream:
        """Send the values that reach this point to ``topic`` with the record's key.

        ``topic`` may be a :class:`TopicConfig` (its codecs and configuration; ``key``,
        ``value`` and ``partitions`` are then not given).

        Raises:
            ConfigError: after :meth:`process`, or ``topic`` is not a legal topic name
                (nothing is declared then).
        """
        if isinstance(topic, TopicConfig):
            _check_topic(topic.topic, "output topic")
            self._add("to", topic.topic)
            self._app.output(topic, **kw)
            return self
        _check_topic(topic, "output topic")
        self._add("to", topic)
        self._app.output(topic, key=key, value=value, **kw)
        return self

    def compile(self) -> Handler:
        """Return one handler ``(key, value, ctx)`` that runs the whole chain.

        Raises:
            ConfigError: the chain is empty, or ends without ``to()`` or ``process()``
                (its records would go nowhere).
        """
        if self._compiled is not None:
            return self._compiled
        where = f"app {self._app.name!r}: {self._what}"
        if not self._ops:
            raise ConfigError(f"{where} has no operators: add .process(fn) or .to(topic)")
        if not any(kind in ("to", *_TERMINAL) for kind, _ in self._ops):
            raise ConfigError(
                f"{where} ends without .to(), .key_by(), .process() or a join: its records "
                "would go nowhere"
            )
        step: Callable[[Any, Any, Context], None] = lambda k, v, c: None  # noqa: E731
        for kind, arg in reversed(self._ops):
            step = _compose(kind, arg, step)
        self._compiled = step
        return step


def _compose(kind: str, arg: Any, nxt: Callable[[Any, Any, Context], None]) -> Handler:
    if kind == "map":
        return lambda k, v, c: nxt(k, arg(v), c)
    if kind == "filter":

        def filtered(k: Any, v: Any, c: Context) -> None:
            if arg(v):
                nxt(k, v, c)

        return filtered
    if kind == "flat_map":

        def flat(k: Any, v: Any, c: Context) -> None:
            for item in arg(v):
                nxt(k, item, c)

        return flat
    if kind == "process":
        return arg  # type: ignore[no-any-return]
    if kind == "key_by":
        select, topic, app = arg
        svc = app.time_service
        if svc is not None and svc.strategies:
            # The next app's default event time is this record's (a header, not the
            # record timestamp: old event times would meet the topic's retention).
            def rekey_timed(k: Any, v: Any, c: Context) -> None:
                c.emit(topic, select(v), v, [(EVENT_TIME, str(c.event_time))])

            return rekey_timed

        def rekey(k: Any, v: Any, c: Context) -> None:
            c.emit(topic, select(v), v)

        return rekey
    if kind == "join_asof":
        table, inner, combine = arg

        def asof(k: Any, v: Any, c: Context) -> None:
            found = table.as_of(c.timestamp)
            if found is None and inner:
                return
            nxt(k, combine(v, found) if combine is not None else (v, found), c)

        return asof
    if kind in ("interval_left", "interval_right"):
        join, joined, combine = arg
        side = join.on_left if kind == "interval_left" else join.on_right
        step = joined.compile()  # raises now if the joined stream goes nowhere

        def interval(k: Any, v: Any, c: Context) -> None:
            for lv, rv in side(v, c.timestamp):
                step(k, combine(lv, rv) if combine is not None else (lv, rv), c)

        return interval
    if kind == "window":
        op, results = arg
        op.nxt = results.compile()  # raises now if the results go nowhere
        return op.on_record  # type: ignore[no-any-return]
    if kind == "to":

        def sink(k: Any, v: Any, c: Context) -> None:
            c.emit(arg, k, v)
            nxt(k, v, c)

        return sink
    raise AssertionError(kind)


def _event_time_of(ts: Any) -> int:
    if isinstance(ts, bool) or not isinstance(ts, (int, float)) or ts < 0:
        raise ValueError(f"event time must be a non-negative number of ms, got {ts!r}")
    return int(ts)


def _timed(
    step: Handler, topic: str, extract: Callable[[Any], int] | None, svc: TimeService
) -> Handler:
    """Wrap an input's handler: event time before the chain, the watermark after it."""
    observe = svc.observe
    if topic not in svc.strategies:

        def untimed(k: Any, v: Any, c: Context) -> None:
            c._event_time = c.message.timestamp()[1]  # noqa: SLF001 - same package
            c._late_ops = None  # noqa: SLF001 - same package
            step(k, v, c)

        return untimed

    def timed(k: Any, v: Any, c: Context) -> None:
        msg = c.message
        ts = extract(v) if extract is not None else msg.timestamp()[1]
        internal = False
        headers = msg.headers()
        if headers:  # written by another lockgate app? (its key_by sends its event time)
            for name, raw in headers:
                if name == EVENT_TIME:
                    if extract is None:
                        ts = int(raw)
                elif name == WRITER:
                    internal = True
        if type(ts) is not int or ts < 0:
            ts = _event_time_of(ts)
        c._event_time = ts  # noqa: SLF001 - same package
        c._late_ops = None  # noqa: SLF001 - same package
        step(k, v, c)
        observe(topic, ts, internal)

    return timed


@dataclass
class _Definition:
    inputs: dict[str, _Input] = field(default_factory=dict)  # in declaration order
    globals: dict[str, GlobalTable] = field(default_factory=dict)
    outputs: dict[str, OutputSpec] = field(default_factory=dict)
    #: Outputs outside Kafka (exactly-once sinks, processors/_sinks), by name.
    sinks: dict[str, PostgresOutput | IcebergOutput] = field(default_factory=dict)
    stores: dict[str, StateHandle] = field(default_factory=dict)
    joins: int = 0
    time: TimeService | None = None
    on_timer: Handler | None = None
    windows: list[WindowOperator] = field(default_factory=list)
    #: Stateful operators by id, in declaration order.
    operators: dict[str, OperatorInfo] = field(default_factory=dict)


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
        if not isinstance(name, str) or not _NAME.match(name):
            raise ConfigError(f"app name {name!r} must match {_NAME.pattern}")
        if isinstance(env, str):
            raise TypeError(f"env must be a list of variable names, e.g. env=[{env!r}]")
        for var in env:
            if not isinstance(var, str) or not _ENV_NAME.match(var):
                raise ConfigError(
                    f"app {name!r}: env={var!r}: declare LOCKGATE_* variable names in upper "
                    "case (other names are never checked)"
                )
        self.name = name
        self._run_name: str | None = None
        self.env: frozenset[str] = frozenset(env)
        self.cursor = KeyCursor()
        self._def = _Definition()
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
        checked = tuple(_check_topic(t, "input topic") for t in topics)
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
            _check_callable(timestamp, "stream(timestamp=...)")
        if watermarks is not None and not isinstance(watermarks, Watermarks):
            raise TypeError("watermarks= takes a Watermarks (e.g. Watermarks.bounded(5000))")
        stream = Stream(self, checked)
        for topic in checked:
            self._def.inputs[topic] = _Input(
                topic,
                bind_codec(key, topic, "key"),
                bind_codec(value, topic, "value"),
                stream=stream,
                timestamp=timestamp,
            )
            if timestamp is not None or watermarks is not None:
                self._event_time(topic, watermarks or Watermarks())
        return stream

    def _time_service(self) -> TimeService:
        """The app's watermarks and timers (created, with its store, on first use)."""
        svc = self._def.time
        if svc is None:
            svc = self._def.time = TimeService(self.cursor)
            self._def.stores[TIME_STORE] = svc.handle
        return svc

    def _event_time(self, topic: str, strategy: Watermarks) -> None:
        svc = self._time_service()
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
        _check_callable(fn, "@app.on_timer")
        if self._def.on_timer is not None:
            raise ConfigError(f"app {self.name!r} has a timer handler already")
        self._def.on_timer = fn  # type: ignore[assignment]
        self._time_service().set_user_handler(lambda raw, t, name, tctx: fn(tctx.key, tctx))
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
        if len(store_name) > 150 or not _NAME.match(store_name):
            store_name = f"table.{hashlib.sha256(checked.encode()).hexdigest()[:20]}"
        store: ValueState[list[list[Any]]] = self.value_state(store_name, ttl_ms=ttl_ms)
        table = Table(checked, store, retention_ms)
        bound_key = bind_codec(key, checked, "key")
        bound_value = bind_codec(value, checked, "value")
        self._def.inputs[checked] = _Input(checked, bound_key, bound_value, table=table)
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
            _check_topic(out if isinstance(out, str) else out.topic, "output topic")

        def register(fn: Handler) -> Handler:
            _check_callable(fn, "@app.process")
            self._check_input(topics)
            for out in outputs:
                if isinstance(out, OutputSpec):
                    self._def.outputs[out.topic] = _bound_output(out)
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
        if isinstance(topic, TopicConfig):
            cfg = topic
            _check_topic(cfg.topic, "output topic")
            if key is not STR or value is not JSON or partitions is not None:
                raise ConfigError(
                    f"output {cfg.topic!r}: give key=, value= and partitions= to its "
                    "TopicConfig, not next to it"
                )
            spec = OutputSpec(
                cfg.topic, cfg.key, cfg.value, cfg.partitions, internal, topic_config=cfg
            )
            spec = _bound_output(spec)
            self._def.outputs[cfg.topic] = spec
            return spec
        _check_topic(topic, "output topic")
        if topic in self._def.sinks:
            kind = (
                "an Iceberg" if isinstance(self._def.sinks[topic], IcebergOutput) else "a Postgres"
            )
            raise ConfigError(f"output {topic!r} is already declared as {kind} output")
        spec = _bound_output(OutputSpec(topic, key, value, partitions, internal))
        self._def.outputs[topic] = spec
        return spec

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
        if not isinstance(name, str) or not _NAME.match(name) or ":" in name:
            raise ConfigError(f"postgres output name {name!r} must match {_NAME.pattern}")
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
        if not isinstance(name, str) or not _NAME.match(name) or ":" in name:
            raise ConfigError(f"iceberg output name {name!r} must match {_NAME.pattern}")
        if name in self._def.outputs or name in self._def.sinks:
            raise ConfigError(f"output {name!r} is declared twice in app {self.name!r}")
        spec = IcebergOutput(name, catalog, table, mode)
        self._def.sinks[name] = spec
        return spec

    @property
    def sinks(self) -> dict[str, PostgresOutput | IcebergOutput]:
        """Declared outputs outside Kafka (:meth:`postgres_output`, :meth:`iceberg_output`)."""
        return dict(self._def.sinks)

    def _add(self, handle: StateHandle) -> Any:
        name = handle.spec.name
        if not _NAME.match(name):
            raise ConfigError(f"store name {name!r} must match {_NAME.pattern}")
        if name in self._def.stores:
            raise ConfigError(f"store {name!r} is declared twice in app {self.name!r}")
        self._def.stores[name] = handle
        return handle

    def value_state(
        self, name: str, *, default: T | None = None, codec: Codec = JSON, ttl_ms: int | None = None
    ) -> ValueState[T]:
        """Declare a value-per-key store."""
        spec = StoreSpec(name, "value", codec, ttl_ms)
        return self._add(ValueState(spec, self.cursor, default))  # type: ignore[no-any-return]

    def list_state(
        self, name: str, *, codec: Codec = JSON, ttl_ms: int | None = None
    ) -> ListState[Any]:
        """Declare a list-per-key store."""
        return self._add(  # type: ignore[no-any-return]
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
        return self._add(  # type: ignore[no-any-return]
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
        return self._add(ReducingState(spec, self.cursor, reduce))  # type: ignore[no-any-return]

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
        return self._add(  # type: ignore[no-any-return]
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

    def _tables(self) -> list[Table]:
        return [i.table for i in self._def.inputs.values() if i.table is not None]

    def _next_join(self) -> int:
        self._def.joins += 1
        return self._def.joins

    def _operator_id(self, kind: str, uid: str | None, source: str, what: str) -> str:
        """Return the id of a new ``kind`` operator: ``uid``, or derived from ``source``.

        Raises:
            TypeError: ``uid`` is not a string.
            ConfigError: ``uid`` is illegal, or the id is another operator's already
                (the message names both operators and asks for ``uid=``).
        """
        if uid is not None:
            if not isinstance(uid, str):
                raise TypeError(f"uid must be a string, got {type(uid).__name__}")
            if not _NAME.match(uid):
                raise ConfigError(f"app {self.name!r}: uid {uid!r} must match {_NAME.pattern}")
            op_id = uid
        else:
            op_id = f"{kind}({source})"
        taken = self._def.operators.get(op_id)
        if taken is not None:
            how = "given" if uid is not None else "derived from what it reads"
            raise ConfigError(
                f"app {self.name!r}: {what} would have the operator id {op_id!r} ({how}), "
                f"which {taken.what} has already; savepoints address operator state by id, "
                "so give each of them its own uid= (e.g. .window(..., uid='clicks-per-minute'))"
            )
        return op_id

    def _add_operator(self, info: OperatorInfo) -> None:
        self._def.operators[info.uid] = info

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
        return self._run_name or self.name

    def run_as(self, name: str) -> None:
        """Run the app under ``name`` (``LOCKGATE_APP_NAME``): names its per-app topics.

        The runtime, the operations commands and backfills call it with the name they
        run the app under, before reading :attr:`outputs`; per-app late topics
        (``late_topic=True`` or ``"{app}..."``) are named after it from then on.

        Raises:
            ConfigError: ``name`` is not a legal app name, or a late topic named after
                it is not a legal topic name.
        """
        if not isinstance(name, str) or not _NAME.match(name):
            raise ConfigError(f"app name {name!r} must match {_NAME.pattern}")
        for topic in self._def.outputs:
            if APP_PLACEHOLDER in topic:
                self._run_topic(topic, "late topic", name)
        self._run_name = name
        for op in self._def.windows:
            if op.late_template is not None:
                op.late_topic = self._run_topic(op.late_template, "late topic")

    def _run_topic(self, topic: str, what: str, name: str | None = None) -> str:
        """``topic`` with ``{app}`` replaced by the running name (or ``name``).

        Raises:
            ConfigError: the result is not a legal topic name.
        """
        if APP_PLACEHOLDER not in topic:
            return _check_topic(topic, what)
        return _check_topic(topic.replace(APP_PLACEHOLDER, name or self.run_name), what)

    @property
    def outputs(self) -> dict[str, OutputSpec]:
        """Declared outputs by topic, per-app late topics named for :attr:`run_name`."""
        out: dict[str, OutputSpec] = {}
        for topic, spec in self._def.outputs.items():
            if APP_PLACEHOLDER in topic:
                topic = self._run_topic(topic, "late topic")
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
        return {t: _timed(h, t, self._def.inputs[t].timestamp, svc) for t, h in out.items()}
