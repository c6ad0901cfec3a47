"""Running sum throughput with Avro values (schema registry) vs JSON values, same run.

Usage: .venv/bin/python -m benchmarks.avro_vs_json BOOTSTRAP RECORDS [REGISTRY_URL]

Without REGISTRY_URL, starts Apicurio Registry (tests/support/schema_registry.py, built
once under .cache/schema-registry/). Pre-produces RECORDS inputs (8 partitions, 100k keys)
twice, as JSON for examples/running_sum.py and as Avro for
benchmarks/apps/avro_running_sum.py, runs each app alone (exactly-once) and reports
records/s between the first and the last output record's timestamp (startup excluded).
"""

from __future__ import annotations

import os
import sys
import tempfile
import uuid
from collections.abc import Callable
from pathlib import Path

import orjson
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic

from benchmarks.quick_running_sum import run_and_time

ROOT = Path(__file__).resolve().parent.parent


def _produce(bs: str, topic: str, n: int, encode: Callable[[int], bytes]) -> None:
    admin = AdminClient({"bootstrap.servers": bs})
    for fut in admin.create_topics([NewTopic(topic, 8, 1)]).values():
        fut.result(30)
    p = Producer({"bootstrap.servers": bs, "partitioner": "murmur2_random", "linger.ms": 50})
    for i in range(n):
        value = encode(i)
        while True:
            try:
                p.produce(topic, value, f"key-{i % 100000}".encode())
                break
            except BufferError:
                p.poll(0.1)
    p.flush()


def _run(bs: str, spec: str, env: dict[str, str], out: str, n: int) -> float:
    """Run ``spec`` until ``n`` outputs are committed; return records/s (first->last)."""
    got, first, last = run_and_time(bs, env, out, n, spec)
    if got < n or first is None or last is None or last == first:
        raise RuntimeError(f"{spec}: only {got}/{n} outputs arrived")
    return n / ((last - first) / 1000)


def main() -> int:
    if len(sys.argv) not in (3, 4):
        print(__doc__, file=sys.stderr)
        return 2
    bs, n = sys.argv[1], int(sys.argv[2])
    server = None
    if len(sys.argv) == 4:
        url = sys.argv[3]
    else:
        from tests.support.schema_registry import RegistryServer

        server = RegistryServer(Path(tempfile.mkdtemp()) / "registry.log").start()
        url = server.url
        print(f"registry up in {server.startup_seconds:.1f} s at {url}", file=sys.stderr)
    try:
        from confluent_kafka.schema_registry import (
            MessageField,
            SchemaRegistryClient,
            SerializationContext,
        )
        from confluent_kafka.schema_registry.avro import AvroSerializer

        from benchmarks.apps.avro_running_sum import IN_SCHEMA

        rid = uuid.uuid4().hex[:6]
        results = {}
        for kind in ("json", "avro"):
            inp, out = f"avj-{kind}-in-{rid}", f"avj-{kind}-out-{rid}"
            if kind == "json":
                _produce(bs, inp, n, lambda i: orjson.dumps({"v": i % 13, "seq": i}))
                spec = "examples.running_sum:app"
            else:
                ser = AvroSerializer(SchemaRegistryClient({"url": url}), IN_SCHEMA)
                ctx = SerializationContext(inp, MessageField.VALUE)
                _produce(bs, inp, n, lambda i, s=ser, c=ctx: bytes(s({"v": i % 13, "seq": i}, c)))
                spec = "benchmarks.apps.avro_running_sum:app"
            env = {
                **os.environ,
                "LOCKGATE_BOOTSTRAP_SERVERS": bs,
                "LOCKGATE_APP_NAME": f"avj-{kind}-{rid}",
                "LOCKGATE_INPUT_TOPIC": inp,
                "LOCKGATE_OUTPUT_TOPIC": out,
                "LOCKGATE_STATE_DIR": tempfile.mkdtemp(prefix="lockgate-avj-"),
                "LOCKGATE_HTTP_PORT": "0",
            }
            if kind == "avro":
                # declared by the app: App(..., env=["LOCKGATE_SCHEMA_REGISTRY_URL"])
                env["LOCKGATE_SCHEMA_REGISTRY_URL"] = url
            results[kind] = _run(bs, spec, env, out, n)
            print(f"{kind}: {n} records, {results[kind]:,.0f} records/s", flush=True)
        print(f"avro/json: {results['avro'] / results['json']:.2f}")
    finally:
        if server is not None:
            server.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
