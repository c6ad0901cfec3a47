"""The per-record context handed to user code."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

__all__ = ["Context"]

Headers = Sequence[tuple[str, bytes | str]] | dict[str, bytes | str] | None


class Context:
    """What a handler knows about the record it processes, and how it emits.

    One context object is reused for every record (do not keep it). ``emit`` sends a
    record into the open epoch: with exactly-once it becomes visible downstream when
    the epoch commits, together with the state changes and input offsets.
    """

    __slots__ = ("_emit", "_event_time", "_late_ops", "_timers", "message")

    def __init__(self, emit: Callable[..., None], timers: Any = None) -> None:
        self._emit = emit
        self._timers = timers
        self._event_time: int | None = None
        #: Window operators that sent the current record to their late topic.
        self._late_ops: set[str] | None = None
        self.message: Any = None

    @property
    def event_time(self) -> int:
        """Event time of the current record in ms.

        The input's ``timestamp=`` extractor's result, else the record timestamp.
        """
        t = self._event_time
        return self.message.timestamp()[1] if t is None else t

    @property
    def timers(self) -> Any:
        """Keyed timers of the current key (:class:`processors.Timers`).

        Raises:
            processors.exceptions.ConfigError: the app declares no ``@app.on_timer``.
        """
        if self._timers is None:
            from processors.exceptions import ConfigError  # noqa: PLC0415 - error path only

            raise ConfigError(
                "ctx.timers and ctx.watermark need event time or timers: declare "
                "watermarks= on an input, or a timer handler with @app.on_timer"
            )
        return self._timers

    @property
    def watermark(self) -> int:
        """The watermark of the current record's key group (before this record)."""
        return self.timers.watermark  # type: ignore[no-any-return]

    @property
    def topic(self) -> str:
        """Topic of the current record."""
        return self.message.topic()  # type: ignore[no-any-return]

    @property
    def partition(self) -> int:
        """Partition of the current record (its key group)."""
        return self.message.partition()  # type: ignore[no-any-return]

    @property
    def offset(self) -> int:
        """Offset of the current record."""
        return self.message.offset()  # type: ignore[no-any-return]

    @property
    def timestamp(self) -> int:
        """Timestamp of the current record in ms since the epoch (-1 when unknown)."""
        return self.message.timestamp()[1]  # type: ignore[no-any-return]

    @property
    def headers(self) -> list[tuple[str, bytes]]:
        """Headers of the current record."""
        return self.message.headers() or []

    @property
    def raw_key(self) -> bytes | None:
        """The serialized key of the current record."""
        return self.message.key()  # type: ignore[no-any-return]

    def emit(
        self,
        topic: str,
        key: Any,
        value: Any,
        headers: Headers = None,
        timestamp: int | None = None,
    ) -> None:
        """Send ``key``/``value`` to ``topic`` (a declared output) in the open epoch.

        The key is placed with Kafka's murmur2 partitioner, so the same key reaches the
        same partition from Python, Java and Spark. ``timestamp`` (ms) is the output
        record's timestamp (default: the producer's clock).

        Raises:
            processors.exceptions.ConfigError: ``topic`` is not a declared output.
        """
        if timestamp is None:
            self._emit(topic, key, value, headers)
        else:
            self._emit(topic, key, value, headers, timestamp)


def direct_context(emit: Callable[..., None], timers: Any = None) -> Context:
    """Return a :class:`Context` whose ``emit`` *is* ``emit``.

    One Python call less per emitted record than :meth:`Context.emit`, which forwards
    to it. ``emit`` must accept ``(topic, key, value, headers=None, timestamp=None)`` with
    :meth:`Context.emit`'s contract. The object is an instance of a one-off subclass
    of :class:`Context`, so ``isinstance`` checks and every other attribute behave as
    usual.
    """
    # staticmethod: a plain function must not be bound to the context (a bound method,
    # what the runtime passes, would not be either way).
    attrs = {"__slots__": (), "emit": staticmethod(emit), "__doc__": Context.__doc__}
    cls = type("Context", (Context,), attrs)
    cls.__module__ = Context.__module__
    ctx: Context = cls(emit, timers)
    return ctx
