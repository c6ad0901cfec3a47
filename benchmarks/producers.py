"""The Kafka producer that writes the benchmarks' inputs."""

from __future__ import annotations

from confluent_kafka import Producer


def input_producer(bootstrap: str) -> Producer:
    """An idempotent, lz4-compressing producer with large batches (murmur2 partitioner)."""
    return Producer(
        {
            "bootstrap.servers": bootstrap,
            "partitioner": "murmur2_random",
            "linger.ms": 50,
            "batch.size": 1_000_000,
            "compression.type": "lz4",
            "enable.idempotence": True,
            "queue.buffering.max.messages": 1_000_000,
        }
    )
