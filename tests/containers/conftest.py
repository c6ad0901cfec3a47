"""The plugin's broker for tests/containers only.

The shipped plugin's ``lockgate_kafka`` is session-scoped; here it is package-scoped, so
the broker container is removed when these tests end instead of idling (a JVM with a 512 MB
heap) through the integration and Spark tiers that run after them in ``make test``.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from processors.pytest_plugin import LockgateKafka, kafka_for


@pytest.fixture(scope="package")
def lockgate_kafka(request: pytest.FixtureRequest) -> Iterator[LockgateKafka]:
    yield from kafka_for(request.config)
