"""Schema Registry codecs (state/schema_registry.py) against confluent-kafka's mock registry.

No server needed: ``mock://`` URLs give an in-process registry per URL.
"""

from __future__ import annotations

import itertools
import struct

import orjson
import pytest

pytest.importorskip("confluent_kafka.schema_registry.avro")

from confluent_kafka.schema_registry import MessageField, SerializationContext  # noqa: E402
from confluent_kafka.schema_registry.avro import AvroDeserializer, AvroSerializer  # noqa: E402

from processors import App, OutputSpec  # noqa: E402
from state.codecs import JSON, STR, Codec, DecodeError, bind_codec  # noqa: E402
from state.schema_registry import Avro, JsonSchema, Protobuf, SchemaRegistry  # noqa: E402

_N = itertools.count()

SUM_V1 = orjson.dumps(
    {
        "type": "record",
        "name": "Amount",
        "namespace": "com.acme",
        "fields": [{"name": "amount", "type": "long"}],
    }
).decode()
SUM_V2 = orjson.dumps(
    {
        "type": "record",
        "name": "Amount",
        "namespace": "com.acme",
        "fields": [
            {"name": "amount", "type": "long"},
            {"name": "note", "type": "string", "default": ""},
        ],
    }
).decode()


@pytest.fixture
def registry() -> SchemaRegistry:
    return SchemaRegistry(f"mock://unit-{next(_N)}")


def test_plain_codecs_are_unchanged_by_bind() -> None:
    assert bind_codec(JSON, "t", "value") is JSON
    assert bind_codec(STR, "t", "key") is STR


def test_bind_rejects_a_non_codec() -> None:
    class Bad:
        name = "bad"

        def encode(self, value: object) -> bytes:
            return b""

        def decode(self, data: bytes) -> object:
            return data

        def bind(self, topic: str, field: str) -> object:
            return 42

    with pytest.raises(TypeError, match="not a codec"):
        bind_codec(Bad(), "t", "value")


@pytest.mark.parametrize(
    ("strategy", "field", "name"),
    [
        ("topic", "value", "avro:orders-value"),
        ("topic", "key", "avro:orders-key"),
        ("record", "value", "avro:com.acme.Amount"),
        ("topic_record", "value", "avro:orders-com.acme.Amount"),
    ],
)
def test_names_follow_the_subject_strategy(
    registry: SchemaRegistry, strategy: str, field: str, name: str
) -> None:
    codec = Avro(registry, SUM_V1, subject_strategy=strategy)  # type: ignore[arg-type]
    assert codec.name == "avro:*"
    bound = codec.bind("orders", field)  # type: ignore[arg-type]
    assert bound.name == name
    assert codec.name == "avro:*"  # binding copies
    assert isinstance(bound, Codec)


def test_subject_overrides_strategy_and_registers_there(registry: SchemaRegistry) -> None:
    codec = Avro(registry, SUM_V1, subject="amounts")
    assert codec.name == "avro:amounts"
    data = codec.encode({"amount": 3})
    assert codec.decode(data) == {"amount": 3}
    assert registry.client.get_subjects() == ["amounts"]


def test_invalid_arguments(registry: SchemaRegistry) -> None:
    with pytest.raises(ValueError, match="subject_strategy"):
        Avro(registry, SUM_V1, subject_strategy="nope")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="invalid Avro schema"):
        Avro(registry, '{"type": "record"}')
    with pytest.raises(TypeError, match="SchemaRegistry"):
        Avro("mock://x", SUM_V1)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="field"):
        Avro(registry, SUM_V1).bind("t", "header")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="protobuf"):
        Protobuf(registry, dict)


def test_unbound_without_subject_refuses_to_encode(registry: SchemaRegistry) -> None:
    with pytest.raises(ValueError, match="not bound to a topic"):
        Avro(registry, SUM_V1).encode({"amount": 1})


def test_avro_round_trip_and_interop_with_confluent_serializers(registry: SchemaRegistry) -> None:
    codec = Avro(registry, SUM_V1).bind("payments", "value")
    data = codec.encode({"amount": 7})
    assert data[0] == 0
    assert codec.decode(data) == {"amount": 7}
    assert registry.client.get_subjects() == ["payments-value"]
    ctx = SerializationContext("payments", MessageField.VALUE)
    # What confluent-kafka's own serializer writes, the codec reads, and vice versa.
    theirs = AvroSerializer(registry.client, SUM_V1)({"amount": 9}, ctx)
    assert codec.decode(theirs) == {"amount": 9}
    assert AvroDeserializer(registry.client)(data, ctx) == {"amount": 7}


def test_avro_reads_a_newer_compatible_version(registry: SchemaRegistry) -> None:
    reader = Avro(registry, SUM_V1).bind("payments", "value")
    writer_v2 = Avro(registry, SUM_V2).bind("payments", "value")
    old = reader.encode({"amount": 1})
    new = writer_v2.encode({"amount": 2, "note": "v2"})
    assert struct.unpack(">I", old[1:5]) != struct.unpack(">I", new[1:5])
    assert reader.decode(old) == {"amount": 1}
    assert reader.decode(new) == {"amount": 2, "note": "v2"}


def test_avro_key_codec(registry: SchemaRegistry) -> None:
    key = Avro(registry, '"string"').bind("payments", "key")
    assert key.name == "avro:payments-key"
    assert key.decode(key.encode("acct-1")) == "acct-1"
    assert registry.client.get_subjects() == ["payments-key"]


def test_avro_from_dict_and_to_dict(registry: SchemaRegistry) -> None:
    codec = Avro(
        registry,
        SUM_V1,
        to_dict=lambda n: {"amount": n},
        from_dict=lambda d: d["amount"],
    ).bind("t", "value")
    assert codec.decode(codec.encode(5)) == 5


@pytest.mark.parametrize(
    ("data", "reason"),
    [
        (b"", "not in the Confluent wire format"),
        (b'{"amount": 1}', "not in the Confluent wire format"),
        (b"\x00\x00\x00", "not in the Confluent wire format"),
        (b"\x00\x00\x00\x7f\xff\x02", "unknown schema id 32767"),
    ],
)
def test_bad_bytes_raise_decode_error(registry: SchemaRegistry, data: bytes, reason: str) -> None:
    codec = Avro(registry, SUM_V1).bind("payments", "value")
    with pytest.raises(DecodeError, match=reason):
        codec.decode(data)


def test_truncated_payload_raises_decode_error(registry: SchemaRegistry) -> None:
    codec = Avro(registry, SUM_V2).bind("payments", "value")
    data = codec.encode({"amount": 10**12, "note": "long enough"})
    with pytest.raises(DecodeError, match="cannot decode with schema id"):
        codec.decode(data[:7])


def test_value_not_matching_the_schema_is_a_value_error(registry: SchemaRegistry) -> None:
    codec = Avro(registry, SUM_V1).bind("payments", "value")
    with pytest.raises(ValueError, match="cannot encode"):
        codec.encode({"amount": "x"})


def test_decode_only_codec(registry: SchemaRegistry) -> None:
    writer = Avro(registry, SUM_V1).bind("payments", "value")
    reader = Avro(registry).bind("payments", "value")
    assert reader.name == "avro:payments-value"
    assert reader.decode(writer.encode({"amount": 4})) == {"amount": 4}
    with pytest.raises(ValueError, match="only decodes"):
        reader.encode({"amount": 4})


def test_json_schema_round_trip(registry: SchemaRegistry) -> None:
    schema = orjson.dumps(
        {
            "title": "Amount",
            "type": "object",
            "properties": {"amount": {"type": "integer"}},
            "required": ["amount"],
        }
    ).decode()
    codec = JsonSchema(registry, schema, subject_strategy="record").bind("t", "value")
    assert codec.name == "jsonschema:Amount"
    assert codec.decode(codec.encode({"amount": 3})) == {"amount": 3}
    with pytest.raises(ValueError, match="cannot encode"):
        codec.encode({"amount": "x"})
    with pytest.raises(DecodeError):
        codec.decode(b"\x01abc")


def _closed_amount(note: bool) -> str:
    props: dict[str, object] = {"amount": {"type": "integer"}}
    if note:
        props["note"] = {"type": "string"}
    return orjson.dumps(
        {
            "title": "Amount",
            "type": "object",
            "properties": props,
            "required": ["amount"],
            "additionalProperties": False,
        }
    ).decode()


def test_json_schema_reads_with_the_writer_schema(registry: SchemaRegistry) -> None:
    # Version 2 adds an optional property to a closed object; the codec of version 1
    # reads it as the Avro codec would, validated with the writer schema (version 2).
    old = JsonSchema(registry, _closed_amount(note=False)).bind("t", "value")
    new = JsonSchema(registry, _closed_amount(note=True)).bind("t", "value")
    data = new.encode({"amount": 2, "note": "v2"})
    assert old.decode(data) == {"amount": 2, "note": "v2"}
    with pytest.raises(ValueError, match="cannot encode"):
        old.encode({"amount": 2, "note": "v2"})  # encoding still uses its own schema
    # The writer schema still validates: bytes that break it are a DecodeError.
    forged = data[:5] + b'{"amount": "x"}'
    with pytest.raises(DecodeError, match="cannot decode"):
        old.decode(forged)


def _amount_message() -> type:
    """A protobuf message class ``lockgate.test.Amount`` built at run time (no protoc)."""
    from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

    pool = descriptor_pool.Default()
    try:
        desc = pool.FindMessageTypeByName("lockgate.test.Amount")
    except KeyError:
        fdp = descriptor_pb2.FileDescriptorProto(
            name="lockgate_test_amount.proto", package="lockgate.test", syntax="proto3"
        )
        msg = fdp.message_type.add(name="Amount")
        msg.field.add(
            name="amount",
            number=1,
            type=descriptor_pb2.FieldDescriptorProto.TYPE_INT64,
            label=descriptor_pb2.FieldDescriptorProto.LABEL_OPTIONAL,
        )
        pool.Add(fdp)
        desc = pool.FindMessageTypeByName("lockgate.test.Amount")
    cls: type = message_factory.GetMessageClass(desc)
    return cls


def test_protobuf_round_trip(registry: SchemaRegistry) -> None:
    amount = _amount_message()
    codec = Protobuf(registry, amount).bind("t", "value")
    assert codec.name == "protobuf:t-value"
    data = codec.encode(amount(amount=5))
    assert data[0] == 0
    assert codec.decode(data) == amount(amount=5)
    by_record = Protobuf(registry, amount, subject_strategy="record").bind("t", "value")
    assert by_record.name == "protobuf:lockgate.test.Amount"
    with pytest.raises(DecodeError, match="unknown schema id"):
        codec.decode(b"\x00\x00\x00\x01\x00\x00\x08\x05")


def test_app_binds_codecs_of_inputs_and_outputs(registry: SchemaRegistry) -> None:
    value = Avro(registry, SUM_V1)
    key = Avro(registry, '"string"')
    app = App("sr-bind")

    @app.process(
        "payments",
        key=key,
        value=value,
        outputs=[
            "plain",
            OutputSpec("sums", key=key, value=value),
        ],
    )
    def handle(k: object, v: object, ctx: object) -> None:
        pass

    app.output("more", value=value)
    in_key, in_value = app.input_codecs("payments")
    assert (in_key.name, in_value.name) == ("avro:payments-key", "avro:payments-value")
    outs = app._def.outputs
    assert outs["sums"].key.name == "avro:sums-key"
    assert outs["sums"].value.name == "avro:sums-value"
    assert outs["more"].value.name == "avro:more-value"
    assert outs["plain"].value is JSON


def test_an_unreachable_registry_is_codec_unavailable_not_a_decode_error() -> None:
    from state.codecs import CodecUnavailable

    writer = Avro(SchemaRegistry("mock://unreachable-writer"), SUM_V1).bind("t", "value")
    data = writer.encode({"amount": 1})
    # Nothing listens on port 9 (discard) of 127.0.0.1 here: connection refused.
    reader = Avro(SchemaRegistry("http://127.0.0.1:9")).bind("t", "value")
    with pytest.raises(CodecUnavailable, match="cannot be reached"):
        reader.decode(data)
