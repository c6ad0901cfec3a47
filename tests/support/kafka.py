"""Test helpers that talk to the real broker: topics, producing inputs, reading outputs."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterable
from typing import Any

import orjson
from confluent_kafka import Consumer, KafkaError, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic


def unique(prefix: str) -> str:
    """Return a topic/app name nobody else uses."""
    return f"{prefix}-{uuid.uuid4().hex[:10]}"


def create_topic(
    bootstrap: str,
    name: str,
    partitions: int,
    config: dict[str, str] | None = None,
    client: dict[str, Any] | None = None,
) -> None:
    """Create ``name`` (RF 1) and wait until the broker lists it.

    ``client``: extra librdkafka settings (e.g. SASL_SSL credentials), here and below.
    """
    admin = AdminClient({"bootstrap.servers": bootstrap, **(client or {})})
    futs = admin.create_topics([NewTopic(name, partitions, 1, config=config or {})])
    for fut in futs.values():
        fut.result(60)  # a loaded broker can take long
    deadline = time.monotonic() + 30
    while name not in admin.list_topics(timeout=10).topics:
        if time.monotonic() > deadline:
            raise TimeoutError(name)
        time.sleep(0.1)


def produce_numbers(
    bootstrap: str,
    topic: str,
    records: Iterable[tuple[str, int, int]],
    client: dict[str, Any] | None = None,
) -> int:
    """Produce running_sum inputs ``(key, v, seq)`` with the murmur2 partitioner."""
    p = Producer(
        {
            **(client or {}),
            "bootstrap.servers": bootstrap,
            "partitioner": "murmur2_random",
            "linger.ms": 10,
            "enable.idempotence": True,  # no reordering on retries
        }
    )
    n = 0
    for key, v, seq in records:
        while True:
            try:
                p.produce(topic, orjson.dumps({"v": v, "seq": seq}), key.encode())
                break
            except BufferError:
                p.poll(0.1)
        n += 1
        if n % 5000 == 0:
            p.poll(0)
    assert p.flush(30) == 0
    return n


def read_all(
    bootstrap: str,
    topic: str,
    expected: int | None = None,
    timeout: float = 60.0,
    idle: float = 3.0,
    isolation: str = "read_committed",
    client: dict[str, Any] | None = None,
) -> list[Any]:
    """Read every record of ``topic`` from the start (read_committed by default).

    Stops when ``expected`` records arrived and no data record (one without a
    ``lockgate-type`` header: idle lockgate writers send barriers every interval) came for
    ``idle`` seconds, or at ``timeout``. Returns confluent_kafka Messages.
    """
    c = Consumer(
        {
            **(client or {}),
            "bootstrap.servers": bootstrap,
            "group.id": unique("reader"),
            "enable.auto.commit": False,
            "auto.offset.reset": "earliest",
            "isolation.level": isolation,
        }
    )
    deadline = time.monotonic() + timeout
    while True:  # the app under test may not have created its output topic yet
        md = c.list_topics(topic, timeout=10).topics[topic]
        if md.error is None and md.partitions:
            break
        if time.monotonic() > deadline:
            c.close()
            return []
        time.sleep(0.2)
    c.assign([TopicPartition(topic, p, 0) for p in md.partitions])
    out: list[Any] = []
    last = time.monotonic()
    try:
        while time.monotonic() < deadline:
            for m in c.consume(1000, 0.5):
                if m.error() is None:
                    out.append(m)
                    if not any(k == "lockgate-type" for k, _ in m.headers() or ()):
                        last = time.monotonic()
                elif m.error().code() != KafkaError._PARTITION_EOF:
                    raise RuntimeError(m.error())
            done = expected is None or len(out) >= expected
            if done and time.monotonic() - last > idle:
                break
    finally:
        c.close()
    return out


def read_inputs(
    bootstrap: str, topic: str, expected: int, client: dict[str, Any] | None = None
) -> list[tuple[str, int, int]]:
    """Read running_sum inputs back as stored: ``(key, v, seq)`` in partition order.

    The exactly-once model is computed from this, not from what a test meant to produce,
    so it reflects the order the app really sees.
    """
    msgs = read_all(bootstrap, topic, expected=expected, idle=0.5, client=client)
    msgs.sort(key=lambda m: (m.partition(), m.offset()))
    out = []
    for m in msgs:
        try:
            value = orjson.loads(m.value())
            out.append((m.key().decode(), value["v"], value["seq"]))
        except (orjson.JSONDecodeError, KeyError, TypeError):
            continue  # bad records (DLQ tests) are not part of the model
    return out
