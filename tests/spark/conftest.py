"""Fixtures of the Spark tier: a shared local SparkSession."""

from __future__ import annotations

from typing import Any

import pytest

from tests.support.spark import local_session


@pytest.fixture(scope="session")
def spark() -> Any:
    """The shared ``local[2]`` SparkSession (stopped when the session ends)."""
    session = local_session()
    yield session
    session.stop()
