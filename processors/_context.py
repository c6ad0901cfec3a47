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

    __slots__ = ("_emit", "message")

    def __init__(self, emit: Callable[[str, Any, Any, Headers], None]) -> None:
        self._emit = emit
        self.message: Any = None

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

    def emit(self, topic: str, key: Any, value: Any, headers: Headers = None) -> None:
        """Send ``key``/``value`` to ``topic`` (a declared output) in the open epoch.

        The key is placed with Kafka's murmur2 partitioner, so the same key reaches the
        same partition from Python, Java and Spark.

        Raises:
            processors.exceptions.ConfigError: ``topic`` is not a declared output.
        """
        self._emit(topic, key, value, headers)
