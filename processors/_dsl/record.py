"""A record outside Kafka with the accessors of a confluent-kafka ``Message``.

The TestDriver's records and a backfill's archived records: user code (``ctx``) reads
them exactly as it reads a consumed message.
"""

from __future__ import annotations

from typing import Any


class Record:
    """A record with the accessors of a Kafka message (no error, create-time stamps)."""

    __slots__ = ("_headers", "_key", "_offset", "_partition", "_timestamp", "_topic", "_value")

    def __init__(
        self,
        topic: str,
        partition: int,
        offset: int,
        key: bytes | None,
        value: bytes | None,
        timestamp: int,
        headers: Any = None,
    ) -> None:
        self._topic, self._partition, self._offset = topic, partition, offset
        self._key, self._value, self._timestamp = key, value, timestamp
        self._headers = headers

    def topic(self) -> str:
        """The topic."""
        return self._topic

    def partition(self) -> int:
        """The partition (key group)."""
        return self._partition

    def offset(self) -> int:
        """The offset (or the record's position)."""
        return self._offset

    def key(self) -> bytes | None:
        """The raw key."""
        return self._key

    def value(self) -> bytes | None:
        """The raw value."""
        return self._value

    def timestamp(self) -> tuple[int, int]:
        """(create-time type, ms)."""
        return (1, self._timestamp)

    def headers(self) -> Any:
        """The headers."""
        return self._headers

    def error(self) -> None:
        """Such records carry no error."""
        return None
