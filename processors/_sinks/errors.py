"""The errors of the sinks outside Kafka (one home for every sink kind)."""

from __future__ import annotations

from processors._kafka.errors import AbortEpoch
from processors.exceptions import FatalKafkaError

__all__ = ["SinkRowError", "SinkRowsLost", "SinkUnavailable"]


class SinkUnavailable(AbortEpoch):  # noqa: N818 - an AbortEpoch, control flow
    """A sink's database could not take the epoch in time: the epoch aborts and replays."""


class SinkRowsLost(FatalKafkaError):
    """Rows of an epoch that committed in Kafka were rolled back in the database.

    Never expected (only the settle right after an assignment rolls back others'
    transactions, by Kafka's outcome): the instance stops loudly, naming the epoch.
    """


class SinkRowError(ValueError):
    """An emitted row does not fit its sink's declaration (raised into user code)."""
