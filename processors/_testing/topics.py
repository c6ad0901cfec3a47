"""Topics for one test on the session broker: the ``lockgate_topics`` fixture's factory."""

from __future__ import annotations

import uuid
from collections.abc import Mapping

from processors._testing.broker import LockgateKafka


def _unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


class TopicFactory:
    """Creates topics for one test (the ``lockgate_topics`` fixture).

    Call it with ``{logical name: partitions}``; it returns ``{logical name: real name}``.
    Real names are the logical ones plus a random suffix (``unique=False`` keeps them), so
    tests sharing the session broker never see each other's records.
    """

    def __init__(self, kafka: LockgateKafka) -> None:
        self._kafka = kafka

    def __call__(
        self,
        topics: Mapping[str, int],
        *,
        config: Mapping[str, str] | None = None,
        unique: bool = True,
    ) -> dict[str, str]:
        """Create the topics; return ``{logical name: real name}``.

        Args:
            topics: partitions per topic.
            config: topic configs for all of them (e.g. ``{"cleanup.policy": "compact"}``).
            unique: add a random suffix to each name.

        Raises:
            RuntimeError: a topic exists already (with ``unique=False``).
        """
        names = {t: _unique(t) if unique else t for t in topics}
        self._kafka.create_topics({names[t]: n for t, n in topics.items()}, config=config)
        return names
