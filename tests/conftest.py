"""Session fixtures: one real Kafka broker for the whole run, unique names per test."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.kafka import unique
from tests.support.ports import free_port

ROOT = Path(__file__).resolve().parent.parent
BROKER = ROOT / "docker" / "kafka" / "broker.sh"


def _free_port_pair() -> int:
    """Return a port p such that p and p+1 are free on 127.0.0.1 (tests/support/ports.py)."""
    return free_port(2)


@pytest.fixture(scope="session")
def kafka_bootstrap(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A real single-node Kafka broker (or ``LOCKGATE_TEST_BOOTSTRAP`` when set)."""
    given = os.environ.get("LOCKGATE_TEST_BOOTSTRAP")
    if given:
        yield given
        return
    port = _free_port_pair()
    env = {
        **os.environ,
        "LOCKGATE_KAFKA_PORT": str(port),
        "LOCKGATE_KAFKA_CONTROLLER_PORT": str(port + 1),
        "LOCKGATE_KAFKA_DATA_DIR": str(tmp_path_factory.mktemp("kafka")),
        "LOCKGATE_KAFKA_PYTHON": sys.executable,
    }
    subprocess.run([str(BROKER), "up", "--fresh"], env=env, check=True, stdout=subprocess.DEVNULL)
    try:
        yield f"127.0.0.1:{port}"
    finally:
        subprocess.run([str(BROKER), "down"], env=env, check=False)


@pytest.fixture
def names() -> Names:
    return Names()


class Names:
    """Unique topic and app names for one test."""

    def __call__(self, prefix: str) -> str:
        return unique(prefix)
