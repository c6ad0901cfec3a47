"""Operator chains: what an input's records run, from the input to the outputs.

A :class:`Stream` is built by ``App.stream``/``App.process`` and grows by its methods
(``map``, ``filter``, ``flat_map``, ``process``, ``key_by``, ``join_asof``,
``interval_join``, ``window``, ``to``); :meth:`Stream.compile` turns it into one handler
``fn(key, value, ctx)`` that the runtime calls per record. Its stateful operators
(windows, interval joins) declare their stores, operator ids and outputs in the app's
:class:`~processors._dsl.definition.Definition` where they are written.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from processors._checkpoint.protocol import EVENT_TIME, WRITER
from processors._dsl.context import Context
from processors._dsl.definition import Definition, Handler, OperatorInfo
from processors._dsl.names import DEFAULT_LATE_TOPIC, check_callable, check_topic
from processors._dsl.topics import OutputSpec, TopicConfig
from processors._task.time import TimeService
from processors.exceptions import ConfigError
from processors.joins import IntervalJoin, Table
from processors.windows import Assigner, WindowedStream, WindowOperator
from state.codecs import BYTES, JSON, STR, Codec
from state.primitives import ValueState

__all__ = ["Stream", "with_event_time"]

_TERMINAL = ("process", "key_by", "interval_left", "interval_right", "window")


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
        self,
        definition: Definition,
        topics: tuple[str, ...] = (),
        what: str = "",
        source: str = "",
    ) -> None:
        self._def = definition
        self._topics = topics
        self._what = what or f"the stream of {', '.join(repr(t) for t in topics)}"
        #: What derived operator ids say the stream is: its input topics, or the id of
        #: the operator whose results it carries.
        self._source = source or ",".join(topics)
        self._ops: list[tuple[str, Any]] = []
        self._compiled: Handler | None = None

    def _add(self, kind: str, arg: Any) -> Stream:
        if kind not in ("to", "key_by", "join_asof", "interval_left", "interval_right", "window"):
            check_callable(arg, kind)
        self._check_open(kind)
        self._ops.append((kind, arg))
        return self

    def _check_open(self, kind: str) -> None:
        """Raise if the chain already ended (a terminal operator was added)."""
        if self._ops and self._ops[-1][0] in _TERMINAL:
            last = self._ops[-1][0]
            last = "interval_join" if last.startswith("interval_") else last
            raise ConfigError(
                f"app {self._def.app_name!r}: .{kind}() after .{last}() would never run: {last}() "
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
        check_callable(fn, "key_by")
        check_topic(topic, "repartition topic")
        self._add("key_by", (fn, topic, self._def))
        self._def.output(topic, key=key, value=value, partitions=partitions, internal=True)
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
        if not isinstance(table, Table) or table not in self._def.tables():
            raise ConfigError(
                f"app {self._def.app_name!r}: join_asof() needs a table of this app "
                "(declare it with app.table(topic))"
            )
        if how not in ("left", "inner"):
            raise ConfigError(f"join_asof(how={how!r}): use 'left' or 'inner'")
        if combine is not None:
            check_callable(combine, "join_asof")
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
        if not isinstance(other, Stream) or other._def is not self._def or other is self:
            raise ConfigError("interval_join() needs another input stream of the same app")
        if not self._topics or not other._topics:
            raise ConfigError("interval_join() joins two input streams (app.stream(topic))")
        if lower_ms > upper_ms:
            raise ConfigError(f"interval_join: lower_ms {lower_ms} > upper_ms {upper_ms}")
        if max_per_key < 1 or grace_ms < 0:
            raise ConfigError("interval_join: max_per_key must be >= 1 and grace_ms >= 0")
        if combine is not None:
            check_callable(combine, "interval_join")
        self._check_open("interval_join")  # both, before anything is declared
        other._check_open("interval_join")
        what = f"the interval join of {self._what} and {other._what}"
        op_id = self._def.operator_id("interval_join", uid, f"{self._source},{other._source}", what)
        name = f"interval-join-{self._def.next_join()}"
        left: ValueState[list[Any]] = self._def.value_state(f"{name}.left")
        right: ValueState[list[list[Any]]] = self._def.value_state(f"{name}.right")
        join = IntervalJoin(left, right, lower_ms, upper_ms, grace_ms, max_per_key)
        self._def.add_operator(
            OperatorInfo(
                op_id,
                "interval_join",
                (f"{name}.left", f"{name}.right"),
                None,
                uid is not None,
                what,
            )
        )
        joined = Stream(self._def, (), what, source=op_id)
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
            self._def.run_topic(late_topic, "late topic")
        self._check_open("window")
        what = f"the window of {self._what}"
        op_id = self._def.operator_id("window", uid, self._source, what)
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
        self._def.operator_id("window", op_id if given else None, self._source, what)
        n = self._def.next_join()
        op = WindowOperator(
            n,
            assigner,
            agg,
            lateness,
            late_topic,
            store=self._def.value_state(f"window-{n}", codec=codec),
            time=self._def.time_service(),
        )
        if late_topic is not None:
            op.late_topic = self._def.run_topic(late_topic, "late topic")
        self._def.add_operator(
            OperatorInfo(op_id, "window", (f"window-{n}",), op.prefix, given, what)
        )
        results = Stream(self._def, (), f"the window results of {self._what}", source=op_id)
        self._add("window", (op, results))
        self._def.windows.append(op)
        if late_topic is not None:
            # Declared by its template: App.outputs names it for the app's running name.
            spec = OutputSpec(late_topic, BYTES, BYTES, None, False)
            self._def.outputs[late_topic] = spec
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
            check_topic(topic.topic, "output topic")
            self._add("to", topic.topic)
            self._def.output(topic, **kw)
            return self
        check_topic(topic, "output topic")
        self._add("to", topic)
        self._def.output(topic, key=key, value=value, **kw)
        return self

    def compile(self) -> Handler:
        """Return one handler ``(key, value, ctx)`` that runs the whole chain.

        Raises:
            ConfigError: the chain is empty, or ends without ``to()`` or ``process()``
                (its records would go nowhere).
        """
        if self._compiled is not None:
            return self._compiled
        where = f"app {self._def.app_name!r}: {self._what}"
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
        select, topic, definition = arg
        svc = definition.time
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


def with_event_time(
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
