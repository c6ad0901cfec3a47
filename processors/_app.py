"""The user API: an :class:`App` with one input stream, an operator chain and keyed state."""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, TypeVar

from processors._context import Context
from processors.exceptions import ConfigError
from state.cache import KeyCursor
from state.codecs import JSON, STR, Codec
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

__all__ = ["App", "OutputSpec", "Stream"]

T = TypeVar("T")
A = TypeVar("A")
R = TypeVar("R")

Handler = Callable[[Any, Any, Context], None]
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,200}$")
#: Kafka's rule for topic names (``org.apache.kafka.common.internals.Topic``).
_TOPIC = re.compile(r"^[A-Za-z0-9._-]{1,249}$")
_TERMINAL = ("process", "key_by")
_ENV_NAME = re.compile(r"^LOCKGATE_[A-Z0-9_]*[A-Z0-9]$")


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


@dataclass(frozen=True)
class OutputSpec:
    """A declared output topic and the codecs of its records.

    Attributes:
        partitions: partition count used when lockgate creates the topic (``None``:
            the input's partition count).
        internal: read by another lockgate app: barrier records are written to it
            at every epoch end (DESIGN 6.2).
    """

    topic: str
    key: Codec = STR
    value: Codec = JSON
    partitions: int | None = None
    internal: bool = False


@dataclass
class _Source:
    topics: tuple[str, ...]
    key: Codec
    value: Codec


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

    def __init__(self, app: App) -> None:
        self._app = app
        self._ops: list[tuple[str, Any]] = []

    def _add(self, kind: str, arg: Any) -> Stream:
        if kind not in ("to", "key_by"):
            _check_callable(arg, kind)
        if self._ops and self._ops[-1][0] in _TERMINAL:
            last = self._ops[-1][0]
            raise ConfigError(
                f"app {self._app.name!r}: .{kind}() after .{last}() would never run: {last}() "
                "is terminal (process() emits with ctx.emit; key_by() hands the records to the "
                "next app through its repartition topic); put map/filter/flat_map/to "
                f"before {last}()"
            )
        self._ops.append((kind, arg))
        return self

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
        self._add("key_by", (fn, topic))
        self._app.output(topic, key=key, value=value, partitions=partitions, internal=True)
        return self

    def to(self, topic: str, *, key: Codec = STR, value: Codec = JSON, **kw: Any) -> Stream:
        """Send the values that reach this point to ``topic`` with the record's key.

        Raises:
            ConfigError: after :meth:`process`, or ``topic`` is not a legal topic name
                (nothing is declared then).
        """
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
        where = f"app {self._app.name!r}: the stream of {self._app.input_topics[0]!r}"
        if not self._ops:
            raise ConfigError(f"{where} has no operators: add .process(fn) or .to(topic)")
        if not any(kind in ("to", "process", "key_by") for kind, _ in self._ops):
            raise ConfigError(
                f"{where} ends without .to(), .key_by() or .process(): its records would go nowhere"
            )
        step: Callable[[Any, Any, Context], None] = lambda k, v, c: None  # noqa: E731
        for kind, arg in reversed(self._ops):
            step = _compose(kind, arg, step)
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
        select, topic = arg

        def rekey(k: Any, v: Any, c: Context) -> None:
            c.emit(topic, select(v), v)

        return rekey
    if kind == "to":

        def sink(k: Any, v: Any, c: Context) -> None:
            c.emit(arg, k, v)
            nxt(k, v, c)

        return sink
    raise AssertionError(kind)


@dataclass
class _Definition:
    source: _Source | None = None
    stream: Stream | None = None
    outputs: dict[str, OutputSpec] = field(default_factory=dict)
    stores: dict[str, StateHandle] = field(default_factory=dict)


class App:
    """A lockgate app: one consumer group, one input stream, keyed state, outputs.

    Example:
        >>> app = App("running-sum")
        >>> total = app.value_state("total")
        >>> @app.process("numbers", outputs=["sums"])
        ... def handle(key, value, ctx):
        ...     t = (total.value() or 0) + value["v"]
        ...     total.update(t)
        ...     ctx.emit("sums", key, {"sum": t})

    The name is the consumer group id and prefixes internal topics
    (``<app>.<store>.changelog``, ``<app>.dlq``); ``LOCKGATE_APP_NAME`` overrides it.

    An app has exactly one input topic and one operator chain, defined once with
    :meth:`stream` or :meth:`process`; definition mistakes raise :class:`ConfigError`
    (or :class:`TypeError` for arguments of the wrong type) where they are written.

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
        self.env: frozenset[str] = frozenset(env)
        self.cursor = KeyCursor()
        self._def = _Definition()

    # -- definition -------------------------------------------------------------------------

    def _check_input(self, topics: tuple[object, ...]) -> str:
        """Return the one input topic, or raise before anything is declared."""
        if topics and callable(topics[0]):
            raise TypeError(
                "the input topic is missing: write @app.process('topic', outputs=[...])"
            )
        if self._def.source is not None:
            raise ConfigError(
                f"app {self.name!r} already has an input stream (topic "
                f"{self._def.source.topics[0]!r}): an app has one input and one chain, "
                "defined once with app.stream() or @app.process; use another App for "
                "another pipeline"
            )
        if not topics:
            raise ConfigError("stream() needs an input topic")
        if len(topics) > 1:
            raise ConfigError(
                f"app {self.name!r}: {len(topics)} input topics {list(topics)!r}: multi-input "
                "apps are not supported yet (co-partitioned assignment is not implemented); "
                "use one input topic per app and chain apps through a topic"
            )
        return _check_topic(topics[0], "input topic")

    def stream(self, *topics: str, key: Codec = STR, value: Codec = JSON) -> Stream:
        """Declare the input topic and return its operator chain.

        Raises:
            ConfigError: the app already has an input, more than one topic is given
                (multi-input apps are not supported yet), or the name is illegal.
            TypeError: a topic is not a string.
        """
        topic = self._check_input(topics)
        self._def.source = _Source((topic,), key, value)
        self._def.stream = Stream(self)
        return self._def.stream

    def process(
        self,
        *topics: str,
        outputs: Iterable[str | OutputSpec] = (),
        key: Codec = STR,
        value: Codec = JSON,
    ) -> Callable[[Handler], Handler]:
        """Decorator: ``fn(key, value, ctx)`` handles every record of the input topic.

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
            _check_topic(out.topic if isinstance(out, OutputSpec) else out, "output topic")

        def register(fn: Handler) -> Handler:
            _check_callable(fn, "@app.process")
            self._check_input(topics)
            for out in outputs:
                if isinstance(out, OutputSpec):
                    self._def.outputs[out.topic] = out
                else:
                    self.output(out)
            self.stream(*topics, key=key, value=value).process(fn)
            return fn

        return register

    def output(
        self,
        topic: str,
        *,
        key: Codec = STR,
        value: Codec = JSON,
        partitions: int | None = None,
        internal: bool = False,
    ) -> OutputSpec:
        """Declare an output topic (created when missing) with its codecs.

        Raises:
            ConfigError: ``topic`` is not a legal Kafka topic name.
        """
        _check_topic(topic, "output topic")
        spec = OutputSpec(topic, key, value, partitions, internal)
        self._def.outputs[topic] = spec
        return spec

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
        """The input topics."""
        return self._source().topics

    @property
    def key_codec(self) -> Codec:
        """Codec of input keys."""
        return self._source().key

    @property
    def value_codec(self) -> Codec:
        """Codec of input values."""
        return self._source().value

    @property
    def outputs(self) -> dict[str, OutputSpec]:
        """Declared outputs by topic."""
        return dict(self._def.outputs)

    @property
    def stores(self) -> dict[str, StateHandle]:
        """Declared state handles by store name."""
        return dict(self._def.stores)

    def handler(self) -> Handler:
        """Return the compiled operator chain."""
        if self._def.stream is None:
            raise ConfigError(f"app {self.name!r} has no input: call app.stream() or @app.process")
        return self._def.stream.compile()

    def _source(self) -> _Source:
        if self._def.source is None:
            raise ConfigError(f"app {self.name!r} has no input: call app.stream() or @app.process")
        return self._def.source
