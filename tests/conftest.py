"""Session fixtures: one real Kafka broker for the whole run, unique names per test."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.security.support import REGISTRY_TOPIC, SecureKafka
from tests.support.kafka import create_topic, unique
from tests.support.ports import free_port
from tests.support.postgres import PostgresServer, PostgresUnavailable

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


@pytest.fixture(scope="session")
def secure_kafka(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SecureKafka]:
    """A single-node broker whose only client listener is SASL_SSL, ACLs enforced.

    Started by ``docker/kafka/broker.sh`` with ``LOCKGATE_KAFKA_SECURITY=sasl_ssl`` (the
    StandardAuthorizer, nothing allowed without an ACL); tests create their own principals
    and ACLs through the admin, a super user (tests/security/support.py, docs/security.md).
    """
    port = _free_port_pair()
    data_dir = tmp_path_factory.mktemp("kafka-sasl-ssl")
    env = {
        **os.environ,
        "LOCKGATE_KAFKA_SECURITY": "sasl_ssl",
        "LOCKGATE_KAFKA_PORT": str(port),
        "LOCKGATE_KAFKA_CONTROLLER_PORT": str(port + 1),
        "LOCKGATE_KAFKA_DATA_DIR": str(data_dir),
        "LOCKGATE_KAFKA_PYTHON": sys.executable,
    }
    subprocess.run([str(BROKER), "up", "--fresh"], env=env, check=True, stdout=subprocess.DEVNULL)
    try:
        admin_conf = json.loads((data_dir / "security" / "admin.json").read_text())
        # Shared by every app of the cluster: the operator creates it once (docs/security.md).
        create_topic(
            f"127.0.0.1:{port}", REGISTRY_TOPIC, 1, {"cleanup.policy": "compact"}, admin_conf
        )
        yield SecureKafka(f"127.0.0.1:{port}", admin_conf, data_dir / "security" / "ca.pem")
    finally:
        subprocess.run([str(BROKER), "down"], env=env, check=False)


@pytest.fixture
def names() -> Names:
    return Names()


class Names:
    """Unique topic and app names for one test."""

    def __call__(self, prefix: str) -> str:
        return unique(prefix)


@pytest.fixture(scope="session")
def postgres() -> Iterator[PostgresServer]:
    """A real PostgreSQL server for the session (tests/support/postgres.py).

    Debian's postgresql-15 is installed when missing and root; skips when neither.
    """
    try:
        server = PostgresServer().start()
    except PostgresUnavailable as exc:
        pytest.skip(str(exc))
    print(f"\npostgres up at {server.dsn} in {server.startup_seconds:.1f} s", file=sys.stderr)
    try:
        yield server
    finally:
        server.destroy()
