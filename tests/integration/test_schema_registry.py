"""The Schema Registry codecs against a real registry (Apicurio, Confluent-compatible API).

The registry is built once from Maven Central and started for the session
(tests/support/schema_registry.py); its start-up time is printed. The second test runs
tests/integration/apps/avro_sum.py as a process on the real broker: Avro records produced
with confluent-kafka's AvroSerializer in, Avro out, a compatible version 2 produced while
it runs, a record with an unknown schema id dead-lettered with the reason, Avro keys.
"""

from __future__ import annotations

import struct
import time
from pathlib import Path

import orjson
import pytest

pytest.importorskip("confluent_kafka.schema_registry.avro")

from confluent_kafka import Producer  # noqa: E402
from confluent_kafka.schema_registry import (  # noqa: E402
    MessageField,
    SchemaRegistryClient,
    SerializationContext,
)
from confluent_kafka.schema_registry.avro import AvroDeserializer, AvroSerializer  # noqa: E402

from state.codecs import DecodeError  # noqa: E402
from state.schema_registry import Avro, SchemaRegistry  # noqa: E402
from tests.integration._util import app_env  # noqa: E402
from tests.support.kafka import create_topic, read_all, unique  # noqa: E402
from tests.support.procs import AppProcess  # noqa: E402
from tests.support.schema_registry import RegistryServer  # noqa: E402

APP = "tests.integration.apps.avro_sum:app"


def _amount(version: int) -> str:
    fields: list[dict[str, object]] = [{"name": "amount", "type": "long"}]
    if version == 2:
        fields.append({"name": "note", "type": "string", "default": ""})
    record = {"type": "record", "name": "Amount", "namespace": "lockgate.test", "fields": fields}
    return orjson.dumps(record).decode()


def test_avro_codecs_against_a_real_registry(schema_registry: RegistryServer) -> None:
    print(f"registry start-up: {schema_registry.startup_seconds:.1f} s")
    topic = unique("payments")
    registry = SchemaRegistry(schema_registry.url)
    client = SchemaRegistryClient({"url": schema_registry.url})
    value_ctx = SerializationContext(topic, MessageField.VALUE)

    reader = Avro(registry).bind(topic, "value")  # decode-only: the writer schema
    v1 = Avro(registry, _amount(1)).bind(topic, "value")
    first = v1.encode({"amount": 1})
    # confluent-kafka's own serializer, with a compatible version 2 (field with default).
    second = AvroSerializer(client, _amount(2))({"amount": 2, "note": "v2"}, value_ctx)
    assert struct.unpack(">I", first[1:5]) != struct.unpack(">I", second[1:5])
    assert reader.decode(first) == {"amount": 1}
    assert reader.decode(second) == {"amount": 2, "note": "v2"}
    assert v1.decode(second) == {"amount": 2, "note": "v2"}
    assert AvroDeserializer(client)(first, value_ctx) == {"amount": 1}
    assert client.get_versions(f"{topic}-value") == [1, 2]

    key = Avro(registry, '"string"').bind(topic, "key")
    assert key.decode(key.encode("acct-1")) == "acct-1"
    assert f"{topic}-key" in client.get_subjects()

    with pytest.raises(DecodeError, match="unknown schema id 987654"):
        reader.decode(b"\x00" + struct.pack(">I", 987654) + b"\x02")
    with pytest.raises(DecodeError, match="not in the Confluent wire format"):
        reader.decode(b'{"amount": 1}')

    by_record = Avro(registry, _amount(1), subject_strategy="topic_record").bind(topic, "value")
    by_record.encode({"amount": 3})
    assert f"{topic}-lockgate.test.Amount" in client.get_subjects()


def _produce_avro(
    bootstrap: str,
    client: SchemaRegistryClient,
    topic: str,
    version: int,
    records: list[tuple[str, dict[str, object]]],
) -> None:
    key_ser = AvroSerializer(client, '"string"')
    value_ser = AvroSerializer(client, _amount(version))
    key_ctx = SerializationContext(topic, MessageField.KEY)
    value_ctx = SerializationContext(topic, MessageField.VALUE)
    p = Producer({"bootstrap.servers": bootstrap, "partitioner": "murmur2_random"})
    for key, value in records:
        p.produce(topic, value_ser(value, value_ctx), key_ser(key, key_ctx))
    assert p.flush(30) == 0


def test_avro_running_sum_with_schema_evolution_and_an_unknown_schema_id(  # type: ignore[no-untyped-def]
    kafka_bootstrap: str, schema_registry: RegistryServer, names, tmp_path: Path
) -> None:
    began = time.monotonic()
    print(f"registry start-up: {schema_registry.startup_seconds:.1f} s")
    env = app_env(
        kafka_bootstrap,
        names,
        tmp_path,
        "avrosum",
        LOCKGATE_TEST_SCHEMA_REGISTRY_URL=schema_registry.url,
    )
    topic, out_topic = env["LOCKGATE_INPUT_TOPIC"], env["LOCKGATE_OUTPUT_TOPIC"]
    create_topic(kafka_bootstrap, topic, 2)
    client = SchemaRegistryClient({"url": schema_registry.url})
    accounts = ["a", "b", "c"]
    v1 = [(accounts[i % 3], {"amount": i}) for i in range(9)]
    v2 = [(accounts[i % 3], {"amount": 100 + i, "note": f"n{i}"}) for i in range(6)]
    _produce_avro(kafka_bootstrap, client, topic, 1, v1)

    app = AppProcess(APP, env, tmp_path / "app.log").start()
    try:
        first = read_all(kafka_bootstrap, out_topic, expected=9, timeout=60, idle=1)
        assert len(first) == 9, app.log_text()[-3000:]
        # Mid-stream: a compatible version 2, and a record whose schema id is unknown.
        _produce_avro(kafka_bootstrap, client, topic, 2, v2[:3])
        bad_value = b"\x00" + struct.pack(">I", 987654) + b"\x02"
        key_bytes = AvroSerializer(client, '"string"')(
            "b", SerializationContext(topic, MessageField.KEY)
        )
        p = Producer({"bootstrap.servers": kafka_bootstrap, "partitioner": "murmur2_random"})
        p.produce(topic, bad_value, key_bytes)
        assert p.flush(30) == 0
        _produce_avro(kafka_bootstrap, client, topic, 2, v2[3:])
        dlq = read_all(kafka_bootstrap, f"{env['LOCKGATE_APP_NAME']}.dlq", expected=1, idle=1)
        out = read_all(kafka_bootstrap, out_topic, expected=15, idle=2)
    finally:
        code = app.terminate()
    log = app.log_text()
    assert code == 0, log[-3000:]
    assert "Traceback" not in log, log[-3000:]

    assert len(dlq) == 1, log[-3000:]
    headers = {k: v.decode() for k, v in dlq[0].headers()}
    assert headers["lockgate-error-stage"] == "deserialize", headers
    assert headers["lockgate-error-type"] == "DecodeError", headers
    assert "unknown schema id 987654" in headers["lockgate-error-message"], headers
    assert dlq[0].value() == bad_value

    # The outputs are Avro in the wire format, registered under <out>-key / <out>-value.
    assert len(out) == 15, log[-3000:]
    read_value = AvroDeserializer(client)
    read_key = AvroDeserializer(client)
    value_ctx = SerializationContext(out_topic, MessageField.VALUE)
    key_ctx = SerializationContext(out_topic, MessageField.KEY)
    last: dict[str, dict[str, object]] = {}
    for m in out:
        key = read_key(m.key(), key_ctx)
        value = read_value(m.value(), value_ctx)
        assert value["account"] == key
        last[key] = value
    want = {}
    for acct in accounts:
        amounts = [v["amount"] for k, v in v1 + v2 if k == acct]
        notes = [v.get("note", "") for k, v in v2 if k == acct]
        want[acct] = {"account": acct, "sum": sum(amounts), "count": len(amounts)}
        want[acct]["note"] = notes[-1]
    assert last == want
    subjects = set(client.get_subjects())
    assert {f"{out_topic}-key", f"{out_topic}-value", f"{topic}-value"} <= subjects
    versions = client.get_versions(f"{topic}-value")
    assert len(versions) == 2, versions
    took = time.monotonic() - began
    print(f"test body (registry up): {took:.1f} s")
    assert took < 60
