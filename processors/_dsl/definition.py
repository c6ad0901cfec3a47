"""The registry an app's declarations write into, and the checks they pass on the way.

:class:`~processors._dsl.app.App` is the user's view of an app; its :class:`Definition`
holds what was declared (inputs, tables, outputs, sinks, stores, stateful operators,
the time service) and the rules every declaration is checked against where it is
written: names and topics are legal, an output is declared once as one kind, a store
name is taken once, an operator id is unique (savepoints address operator state by it).
:class:`~processors._dsl.stream.Stream` declares into the same registry.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

from processors._dsl.context import Context
from processors._dsl.names import APP_PLACEHOLDER, NAME, check_topic
from processors._dsl.topics import OutputSpec, TopicConfig
from processors._sinks.iceberg import IcebergOutput
from processors._sinks.postgres import PostgresOutput
from processors._task.time import TIME_STORE, TimeService
from processors.exceptions import ConfigError
from processors.joins import GlobalTable, Table
from processors.windows import WindowOperator
from state.cache import KeyCursor
from state.codecs import JSON, STR, Codec, bind_codec
from state.primitives import StateHandle, StoreSpec, ValueState

__all__ = ["Chain", "Definition", "Handler", "InputDecl", "OperatorInfo", "bound_output"]

T = TypeVar("T")

Handler = Callable[[Any, Any, Context], None]


class Chain(Protocol):
    """An operator chain that an input's records run (a :class:`~processors.Stream`)."""

    def compile(self) -> Handler:
        """The chain as one handler ``fn(key, value, ctx)``."""
        ...


def bound_output(spec: OutputSpec) -> OutputSpec:
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
class InputDecl:
    """A co-partitioned input topic: its records run a chain or update a table."""

    topic: str
    key: Codec
    value: Codec
    stream: Chain | None = None
    table: Table | None = None
    #: ``fn(value) -> ms``: the record's event time (``None``: the record timestamp).
    timestamp: Callable[[Any], int] | None = None


class Definition:
    """What one app declared (see the module docs).

    Args:
        app_name: the app's own name (messages; per-app topics until :attr:`running_as`).
        cursor: the key cursor every state handle of the app reads.
    """

    def __init__(self, app_name: str, cursor: KeyCursor) -> None:
        self.app_name = app_name
        self.cursor = cursor
        self.inputs: dict[str, InputDecl] = {}  # in declaration order
        self.globals: dict[str, GlobalTable] = {}
        self.outputs: dict[str, OutputSpec] = {}
        #: Outputs outside Kafka (exactly-once sinks, processors/_sinks), by name.
        self.sinks: dict[str, PostgresOutput | IcebergOutput] = {}
        self.stores: dict[str, StateHandle] = {}
        self.joins = 0
        self.time: TimeService | None = None
        self.on_timer: Handler | None = None
        self.windows: list[WindowOperator] = []
        #: Stateful operators by id, in declaration order.
        self.operators: dict[str, OperatorInfo] = {}
        #: The name the app runs under, once given (``App.run_as``).
        self.running_as: str | None = None

    @property
    def run_name(self) -> str:
        """The name the app runs under (:attr:`running_as`, else its own)."""
        return self.running_as or self.app_name

    def time_service(self) -> TimeService:
        """The app's watermarks and timers (created, with its store, on first use)."""
        svc = self.time
        if svc is None:
            svc = self.time = TimeService(self.cursor)
            self.stores[TIME_STORE] = svc.handle
        return svc

    def tables(self) -> list[Table]:
        """The versioned tables declared (``App.table``), in declaration order."""
        return [i.table for i in self.inputs.values() if i.table is not None]

    def next_join(self) -> int:
        """A new number for a join or window operator's stores (1, 2, ...)."""
        self.joins += 1
        return self.joins

    def operator_id(self, kind: str, uid: str | None, source: str, what: str) -> str:
        """Return the id of a new ``kind`` operator: ``uid``, or derived from ``source``.

        Raises:
            TypeError: ``uid`` is not a string.
            ConfigError: ``uid`` is illegal, or the id is another operator's already
                (the message names both operators and asks for ``uid=``).
        """
        if uid is not None:
            if not isinstance(uid, str):
                raise TypeError(f"uid must be a string, got {type(uid).__name__}")
            if not NAME.match(uid):
                raise ConfigError(f"app {self.app_name!r}: uid {uid!r} must match {NAME.pattern}")
            op_id = uid
        else:
            op_id = f"{kind}({source})"
        taken = self.operators.get(op_id)
        if taken is not None:
            how = "given" if uid is not None else "derived from what it reads"
            raise ConfigError(
                f"app {self.app_name!r}: {what} would have the operator id {op_id!r} ({how}), "
                f"which {taken.what} has already; savepoints address operator state by id, "
                "so give each of them its own uid= (e.g. .window(..., uid='clicks-per-minute'))"
            )
        return op_id

    def add_operator(self, info: OperatorInfo) -> None:
        """Register a stateful operator under its id."""
        self.operators[info.uid] = info

    def run_topic(self, topic: str, what: str, name: str | None = None) -> str:
        """``topic`` with ``{app}`` replaced by the running name (or ``name``).

        Raises:
            ConfigError: the result is not a legal topic name.
        """
        if APP_PLACEHOLDER not in topic:
            return check_topic(topic, what)
        return check_topic(topic.replace(APP_PLACEHOLDER, name or self.run_name), what)

    def output(
        self,
        topic: str | TopicConfig,
        *,
        key: Codec = STR,
        value: Codec = JSON,
        partitions: int | None = None,
        internal: bool = False,
    ) -> OutputSpec:
        """Declare an output topic with its codecs; the contract is ``App.output``'s."""
        if isinstance(topic, TopicConfig):
            cfg = topic
            check_topic(cfg.topic, "output topic")
            if key is not STR or value is not JSON or partitions is not None:
                raise ConfigError(
                    f"output {cfg.topic!r}: give key=, value= and partitions= to its "
                    "TopicConfig, not next to it"
                )
            spec = OutputSpec(
                cfg.topic, cfg.key, cfg.value, cfg.partitions, internal, topic_config=cfg
            )
            spec = bound_output(spec)
            self.outputs[cfg.topic] = spec
            return spec
        check_topic(topic, "output topic")
        if topic in self.sinks:
            kind = "an Iceberg" if isinstance(self.sinks[topic], IcebergOutput) else "a Postgres"
            raise ConfigError(f"output {topic!r} is already declared as {kind} output")
        spec = bound_output(OutputSpec(topic, key, value, partitions, internal))
        self.outputs[topic] = spec
        return spec

    def add_store(self, handle: StateHandle) -> Any:
        """Register a state handle under its store name; return it.

        Raises:
            ConfigError: the name is illegal or taken.
        """
        name = handle.spec.name
        if not NAME.match(name):
            raise ConfigError(f"store name {name!r} must match {NAME.pattern}")
        if name in self.stores:
            raise ConfigError(f"store {name!r} is declared twice in app {self.app_name!r}")
        self.stores[name] = handle
        return handle

    def value_state(
        self, name: str, *, default: T | None = None, codec: Codec = JSON, ttl_ms: int | None = None
    ) -> ValueState[T]:
        """Declare a value-per-key store (see ``App.value_state``)."""
        spec = StoreSpec(name, "value", codec, ttl_ms)
        return self.add_store(ValueState(spec, self.cursor, default))  # type: ignore[no-any-return]
