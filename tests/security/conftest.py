"""The security tier's session broker: SASL_SSL (SCRAM-SHA-512) with ACLs enforced.

One broker for the tier, started by ``docker/kafka/broker.sh`` with
``LOCKGATE_KAFKA_SECURITY=sasl_ssl`` (the StandardAuthorizer, nothing allowed without an
ACL). Tests create their own principals and ACLs through the admin (a super user).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.security.support import REGISTRY_TOPIC, SecureKafka
from tests.support.kafka import create_topic
from tests.support.ports import free_port

ROOT = Path(__file__).resolve().parents[2]
BROKER = ROOT / "docker" / "kafka" / "broker.sh"


@pytest.fixture(scope="session")
def secure_kafka(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SecureKafka]:
    """A single-node broker whose only client listener is SASL_SSL, ACLs enforced."""
    port = free_port(2)
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
