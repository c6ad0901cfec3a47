"""The Schema Registry codecs against a real registry (Apicurio, Confluent-compatible API).

The registry is built once from Maven Central and started for the session
(tests/support/schema_registry.py); its start-up time is printed.
"""

from __future__ import annotations

import struct

import orjson
import pytest

pytest.importorskip("confluent_kafka.schema_registry.avro")

from confluent_kafka.schema_registry import (  # noqa: E402
    MessageField,
    SchemaRegistryClient,
    SerializationContext,
)
from confluent_kafka.schema_registry.avro import AvroDeserializer, AvroSerializer  # noqa: E402

from state.codecs import DecodeError  # noqa: E402
from state.schema_registry import Avro, SchemaRegistry  # noqa: E402
from tests.support.kafka import unique  # noqa: E402
from tests.support.schema_registry import RegistryServer  # noqa: E402


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
