"""The names of an app definition: apps, stores, operators, topics, late topic templates."""

from __future__ import annotations

import re

from processors.exceptions import ConfigError

__all__ = [
    "APP_PLACEHOLDER",
    "DEFAULT_LATE_TOPIC",
    "NAME",
    "TOPIC",
    "check_callable",
    "check_topic",
]

#: App, store and operator names (``uid=``).
NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,200}$")
#: Kafka's rule for topic names (``org.apache.kafka.common.internals.Topic``).
TOPIC = re.compile(r"^[A-Za-z0-9._-]{1,249}$")
#: In a late topic's name, the name the app runs under (``LOCKGATE_APP_NAME`` or its own).
APP_PLACEHOLDER = "{app}"
#: The late topic of ``window(..., late_topic=True)``: one per app name.
DEFAULT_LATE_TOPIC = APP_PLACEHOLDER + ".late"


def check_topic(topic: object, what: str) -> str:
    """Return ``topic`` if it is a legal Kafka topic name.

    Raises:
        TypeError: ``topic`` is not a string.
        ConfigError: the name is not a legal Kafka topic name.
    """
    if not isinstance(topic, str):
        raise TypeError(f"{what} must be a topic name (str), got {type(topic).__name__}")
    if not TOPIC.match(topic) or topic in (".", ".."):
        raise ConfigError(
            f"{what} {topic!r} is not a legal Kafka topic name (1-249 characters of "
            "A-Z a-z 0-9 . _ -, not '.' or '..')"
        )
    return topic


def check_callable(fn: object, op: str) -> None:
    """Raise :class:`TypeError` unless ``fn`` is callable (``op`` names the operator)."""
    if not callable(fn):
        raise TypeError(f"{op}() needs a callable, got {type(fn).__name__}")
