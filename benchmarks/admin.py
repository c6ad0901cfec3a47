"""Admin calls on a broker: topics, end offsets, a group's committed offsets."""

from __future__ import annotations

import time

from confluent_kafka import Consumer, IsolationLevel, KafkaException, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic, OffsetSpec


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


def group_formed(admin: Admin, group: str, members: int) -> bool:
    """Whether consumer group ``group`` is stable with ``members`` members, each holding
    partitions (a failed or slow answer counts as not formed)."""
    try:
        fut = admin.admin.describe_consumer_groups([group], request_timeout=2)[group]
        desc = fut.result(3)
    except Exception:  # noqa: BLE001 - ask again at the next sample
        return False
    if str(desc.state).rsplit(".", 1)[-1].upper() != "STABLE" or len(desc.members) != members:
        return False
    return all(m.assignment is not None and m.assignment.topic_partitions for m in desc.members)


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


def delete_topics(admin: Admin, tag: str) -> None:
    """Delete every topic whose name contains ``tag`` (this run's topics only)."""
    doomed = [t for t in admin.topics() if tag in t]
    if not doomed:
        return
    for fut in admin.admin.delete_topics(doomed, operation_timeout=30).values():
        try:
            fut.result(60)
        except Exception:  # noqa: BLE001, S110 - best effort
            pass
