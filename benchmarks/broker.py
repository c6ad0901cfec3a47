"""The harness's own Kafka broker (docker/kafka/broker.sh on its own port) and admin calls."""

from __future__ import annotations

import os
import re
import subprocess
import time

from confluent_kafka import Consumer, IsolationLevel, KafkaException, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic, OffsetSpec

from benchmarks.common import CACHE, MAIN_PY, ROOT, say

BROKER_SH = ROOT / "docker" / "kafka" / "broker.sh"


def _env(port: int) -> dict[str, str]:
    env = dict(os.environ)
    env.update(
        {
            "LOCKGATE_KAFKA_PORT": str(port),
            "LOCKGATE_KAFKA_CONTROLLER_PORT": str(port + 1),
            "LOCKGATE_KAFKA_DATA_DIR": str(CACHE / f"kafka-{port}"),
            "LOCKGATE_KAFKA_HEAP": "-Xms512m -Xmx1g",
            "LOCKGATE_KAFKA_PYTHON": str(MAIN_PY),
        }
    )
    return env


def up(port: int) -> str:
    """Start a fresh broker on ``port`` (wipes its data dir); return the bootstrap address."""
    say(f"starting a fresh Kafka broker on 127.0.0.1:{port} (controller {port + 1})")
    out = subprocess.run(
        [str(BROKER_SH), "up", "--fresh"],
        env=_env(port),
        check=True,
        stdout=subprocess.PIPE,
        text=True,
        timeout=300,
    )
    return out.stdout.strip().splitlines()[-1]


def down(port: int) -> None:
    """Stop the broker on ``port`` (only the one this harness started: same data dir)."""
    say(f"stopping the Kafka broker on 127.0.0.1:{port}")
    subprocess.run([str(BROKER_SH), "down"], env=_env(port), check=False, timeout=120)


def broker_pid(port: int) -> int | None:
    """Return the broker's pid (for CPU accounting), if known."""
    try:
        return int((CACHE / f"kafka-{port}" / "broker.pid").read_text().strip())
    except (OSError, ValueError):
        return None


def kafka_version() -> str:
    """The Kafka version broker.sh runs (from its pom)."""
    pom = (ROOT / "docker" / "kafka" / "pom.xml").read_text()
    found = re.search(r"<kafka\.version>([^<]+)</kafka\.version>", pom)
    return found.group(1) if found else "?"


class Admin:
    """Thin admin helpers on one AdminClient."""

    def __init__(self, bootstrap: str) -> None:
        self.bootstrap = bootstrap
        self.admin = AdminClient({"bootstrap.servers": bootstrap})
        self._latest = OffsetSpec.latest()

    def create(self, topics: dict[str, int], config: dict[str, str] | None = None) -> None:
        """Create ``topics`` (name -> partitions) and wait until they are visible."""
        new = [NewTopic(t, n, 1, config=config or {}) for t, n in topics.items()]
        for fut in self.admin.create_topics(new, operation_timeout=30).values():
            fut.result(60)
        deadline = time.monotonic() + 60
        while True:
            md = self.admin.list_topics(timeout=10).topics
            if all(t in md and md[t].error is None and md[t].partitions for t in topics):
                return
            if time.monotonic() > deadline:
                raise TimeoutError(f"topics {sorted(topics)} did not appear")
            time.sleep(0.1)

    def topics(self) -> list[str]:
        """Every topic name."""
        return list(self.admin.list_topics(timeout=10).topics)

    def end_offsets(
        self, topic: str, partitions: int, committed: bool = True, timeout: float = 10.0
    ) -> list[int]:
        """Return the read_committed (last stable) or high-watermark end of each partition."""
        level = IsolationLevel.READ_COMMITTED if committed else IsolationLevel.READ_UNCOMMITTED
        req = {TopicPartition(topic, p): self._latest for p in range(partitions)}
        futs = self.admin.list_offsets(req, isolation_level=level, request_timeout=timeout)
        out = [0] * partitions
        for tp, fut in futs.items():
            out[tp.partition] = fut.result().offset
        return out


class GroupOffsets:
    """Reads a consumer group's committed offsets without joining the group (over one
    input topic, or over several with as many partitions each)."""

    def __init__(self, bootstrap: str, group: str, topic: str | list[str], partitions: int) -> None:
        self.consumer = Consumer(
            {
                "bootstrap.servers": bootstrap,
                "group.id": group,
                "enable.auto.commit": False,
                # read_uncommitted: no require_stable, so this returns the last committed
                # offsets at once instead of waiting out an open transaction.
                "isolation.level": "read_uncommitted",
                "log_level": 0,
            }
        )
        topics = [topic] if isinstance(topic, str) else topic
        self.tps = [TopicPartition(t, p) for t in topics for p in range(partitions)]

    def committed(self) -> int:
        """Sum of the committed offsets over the partitions (-1001 counts as 0; -1 when
        the request failed)."""
        try:
            got = self.consumer.committed(self.tps, timeout=5)
        except KafkaException:
            return -1
        return sum(max(0, tp.offset) for tp in got)

    def close(self) -> None:
        """Close the consumer."""
        self.consumer.close()
