"""Protobuf and JSON Schema codecs against a real registry (Apicurio, Confluent-compatible API).

The registry is the session's (tests/integration/conftest.py: started once, shared with
test_schema_registry.py). Two tests:

- the codecs in this process: round trips, interop with confluent-kafka's own
  serializers, a Protobuf schema importing a well-known type (registered as a reference or
  skipped), compatible and incompatible new versions, unknown schema ids, and the two
  limits of Apicurio 2.4.2 that docs/codecs.md documents (a JSON Schema needs ``$schema``
  or ``properties`` to be recognised; a compatibility rule on a Protobuf subject fails with
  HTTP 500 because the registered content is a base64 ``FileDescriptorProto``);
- one ``lockgate run`` process of :data:`app` (defined in this module, only when
  ``LOCKGATE_TEST_SR_FORMATS_APP`` is set) on the real broker with two inputs: Protobuf
  values (string keys) and JSON Schema keys and values, each summed per account into a
  Protobuf and a JSON Schema output. While it runs, version 2 of both input schemas (a new
  optional ``note`` field) and one record per input with an unknown schema id are
  produced; the unknown ids go to the DLQ with the reason, the sums are compared with
  sums computed here from the produced records.

Protobuf message classes are built at run time from ``FileDescriptorProto``s in private
descriptor pools (no protoc), so versions 1 and 2 of ``lockgate.test.Payment`` coexist.
"""

from __future__ import annotations

import functools
import os
import struct
import time
from pathlib import Path
from typing import Any

import orjson
import pytest

pytest.importorskip("confluent_kafka.schema_registry.protobuf")
pytest.importorskip("confluent_kafka.schema_registry.json_schema")

from confluent_kafka import Producer  # noqa: E402
from confluent_kafka.schema_registry import (  # noqa: E402
    MessageField,
    SchemaRegistryClient,
    SerializationContext,
)
from confluent_kafka.schema_registry.error import SchemaRegistryError  # noqa: E402
from confluent_kafka.schema_registry.json_schema import (  # noqa: E402
    JSONDeserializer,
    JSONSerializer,
)
from confluent_kafka.schema_registry.protobuf import (  # noqa: E402
    ProtobufDeserializer,
    ProtobufSerializer,
)
from google.protobuf import (  # noqa: E402
    descriptor_pb2,
    descriptor_pool,
    message_factory,
    timestamp_pb2,
)

from processors import App, Context, OutputSpec  # noqa: E402
from state import ValueState  # noqa: E402
from state.codecs import DecodeError  # noqa: E402
from state.schema_registry import JsonSchema, Protobuf, SchemaRegistry  # noqa: E402
from tests.integration._util import app_env  # noqa: E402
from tests.support.kafka import create_topic, read_all, unique  # noqa: E402
from tests.support.procs import AppProcess  # noqa: E402
from tests.support.schema_registry import RegistryServer  # noqa: E402

APP = "tests.integration.test_schema_registry_formats:app"
UNKNOWN_ID = 987654
DRAFT7 = "http://json-schema.org/draft-07/schema#"
# The string key schema: "$schema" makes Apicurio 2.4.2 see JSON Schema (docs/codecs.md).
KEY_SCHEMA = orjson.dumps({"$schema": DRAFT7, "type": "string"}).decode()
_F = descriptor_pb2.FieldDescriptorProto


# ---------------------------------------------------------------------- schemas


@functools.cache
def payment_class(version: int, *, timestamp: bool = False) -> Any:
    """``lockgate.test.Payment``: ``int64 amount = 1`` (v1), plus ``string note = 2`` (v2).

    ``timestamp=True`` adds ``google.protobuf.Timestamp at = 3`` (an imported file). Each
    variant lives in its own descriptor pool, so the versions share their full name.
    """
    pool = descriptor_pool.DescriptorPool()
    fdp = descriptor_pb2.FileDescriptorProto(
        name="lockgate/test/payment.proto", package="lockgate.test", syntax="proto3"
    )
    msg = fdp.message_type.add(name="Payment")
    msg.field.add(name="amount", number=1, type=_F.TYPE_INT64, label=_F.LABEL_OPTIONAL)
    if version >= 2:
        msg.field.add(name="note", number=2, type=_F.TYPE_STRING, label=_F.LABEL_OPTIONAL)
    if timestamp:
        pool.AddSerializedFile(timestamp_pb2.DESCRIPTOR.serialized_pb)
        fdp.dependency.append("google/protobuf/timestamp.proto")
        msg.field.add(
            name="at",
            number=3,
            type=_F.TYPE_MESSAGE,
            type_name=".google.protobuf.Timestamp",
            label=_F.LABEL_OPTIONAL,
        )
    pool.Add(fdp)
    return message_factory.GetMessageClass(pool.FindMessageTypeByName("lockgate.test.Payment"))


@functools.cache
def sum_class() -> Any:
    """``lockgate.test.PaymentSum {string account = 1; int64 sum = 2; int64 count = 3;}``."""
    pool = descriptor_pool.DescriptorPool()
    fdp = descriptor_pb2.FileDescriptorProto(
        name="lockgate/test/payment_sum.proto", package="lockgate.test", syntax="proto3"
    )
    msg = fdp.message_type.add(name="PaymentSum")
    msg.field.add(name="account", number=1, type=_F.TYPE_STRING, label=_F.LABEL_OPTIONAL)
    msg.field.add(name="sum", number=2, type=_F.TYPE_INT64, label=_F.LABEL_OPTIONAL)
    msg.field.add(name="count", number=3, type=_F.TYPE_INT64, label=_F.LABEL_OPTIONAL)
    pool.Add(fdp)
    return message_factory.GetMessageClass(pool.FindMessageTypeByName("lockgate.test.PaymentSum"))


def payment_json_schema(version: int, amount_type: str = "integer") -> str:
    """A closed ``Payment`` object: ``amount`` (v1), plus an optional ``note`` (v2).

    Closed (``additionalProperties: false``): adding an optional property is then a
    BACKWARD-compatible change; to an open object it is not (the registry answers 409).
    """
    props: dict[str, Any] = {"amount": {"type": amount_type}}
    if version >= 2:
        props["note"] = {"type": "string"}
    schema = {
        "$schema": DRAFT7,
        "title": "Payment",
        "type": "object",
        "properties": props,
        "required": ["amount"],
        "additionalProperties": False,
    }
    return orjson.dumps(schema).decode()


SUM_JSON_SCHEMA = orjson.dumps(
    {
        "$schema": DRAFT7,
        "title": "PaymentSum",
        "type": "object",
        "properties": {
            "account": {"type": "string"},
            "sum": {"type": "integer"},
            "count": {"type": "integer"},
            "note": {"type": "string"},
        },
        "required": ["account", "sum", "count", "note"],
    }
).decode()


def _unknown_id_record() -> bytes:
    return b"\x00" + struct.pack(">I", UNKNOWN_ID) + b"\x00\x08\x05"


# ---------------------------------------------------------------------- the app


def _make_app() -> App:
    """Per-account sums of Protobuf and JSON Schema payments (run by ``lockgate run``)."""
    registry = SchemaRegistry(os.environ["LOCKGATE_TEST_SCHEMA_REGISTRY_URL"])
    pb_in, pb_out = os.environ["LOCKGATE_INPUT_TOPIC"], os.environ["LOCKGATE_OUTPUT_TOPIC"]
    js_in, js_out = os.environ["LOCKGATE_TEST_JSON_INPUT"], os.environ["LOCKGATE_TEST_JSON_OUTPUT"]
    payment, payment_sum = payment_class(1), sum_class()
    json_key = JsonSchema(registry, KEY_SCHEMA)

    app = App(
        "sr_formats",
        env=[
            "LOCKGATE_TEST_SR_FORMATS_APP",
            "LOCKGATE_TEST_SCHEMA_REGISTRY_URL",
            "LOCKGATE_TEST_JSON_INPUT",
            "LOCKGATE_TEST_JSON_OUTPUT",
        ],
    )
    pb_totals: ValueState[list[int]] = app.value_state("pb_totals")
    js_totals: ValueState[list[int]] = app.value_state("js_totals")

    # Version 1 of Payment compiled in: a version 2 record decodes into it (the new
    # field is kept as an unknown field, not readable by name).
    @app.process(
        pb_in,
        value=Protobuf(registry, payment),
        outputs=[OutputSpec(pb_out, value=Protobuf(registry, payment_sum))],
    )
    def protobuf_sum(account: str, value: Any, ctx: Context) -> None:
        total, count = pb_totals.value() or [0, 0]
        total, count = total + value.amount, count + 1
        pb_totals.update([total, count])
        ctx.emit(pb_out, account, payment_sum(account=account, sum=total, count=count))

    # Decode-only: each record is read (and validated) with its writer schema, so the
    # note of version 2 is read as it comes.
    @app.process(
        js_in,
        key=json_key,
        value=JsonSchema(registry),
        outputs=[OutputSpec(js_out, key=json_key, value=JsonSchema(registry, SUM_JSON_SCHEMA))],
    )
    def json_sum(account: str, value: dict[str, Any], ctx: Context) -> None:
        total, count = js_totals.value() or [0, 0]
        total, count = total + value["amount"], count + 1
        js_totals.update([total, count])
        note = value.get("note", "")
        ctx.emit(js_out, account, {"account": account, "sum": total, "count": count, "note": note})

    return app


if os.environ.get("LOCKGATE_TEST_SR_FORMATS_APP"):
    app = _make_app()


# ---------------------------------------------------------------------- helpers


def _registry_error(call: Any) -> SchemaRegistryError:
    with pytest.raises(SchemaRegistryError) as info:
        call()
    return info.value


def _produce(bootstrap: str, topic: str, records: list[tuple[bytes, bytes]]) -> None:
    p = Producer({"bootstrap.servers": bootstrap, "partitioner": "murmur2_random"})
    for key, value in records:
        p.produce(topic, value, key)
    assert p.flush(30) == 0


# ---------------------------------------------------------------------- tests


def test_protobuf_and_json_schema_codecs_against_a_real_registry(
    schema_registry: RegistryServer,
) -> None:
    began = time.monotonic()
    registry = SchemaRegistry(schema_registry.url)
    client = SchemaRegistryClient({"url": schema_registry.url})
    topic = unique("formats")
    ctx = SerializationContext(topic, MessageField.VALUE)
    v1, v2 = payment_class(1), payment_class(2)

    # Protobuf: round trip (confluent-kafka's own serializers are used by the app test).
    codec = Protobuf(registry, v1).bind(topic, "value")
    first = codec.encode(v1(amount=5))
    assert codec.decode(first) == v1(amount=5)
    reader = ProtobufDeserializer(v1, {"use.deprecated.format": False})
    assert reader(first, ctx) == v1(amount=5)
    # A compatible version 2 (Apicurio's default: no rule, so it is not checked). The
    # version 1 class reads it; the new field survives as an unknown field.
    second = Protobuf(registry, v2).bind(topic, "value").encode(v2(amount=7, note="v2"))
    assert struct.unpack(">I", first[1:5]) != struct.unpack(">I", second[1:5])
    old_reader = codec.decode(second)
    assert old_reader.amount == 7
    assert v2.FromString(old_reader.SerializeToString()).note == "v2"
    assert client.get_versions(f"{topic}-value") == [1, 2]
    # Limit of Apicurio 2.4.2 (docs/codecs.md): with a compatibility rule on the subject,
    # its checker parses the stored base64 FileDescriptorProto as .proto text: HTTP 500.
    # (A schema already registered under the subject is found without a check, so the
    # next version is a new one: Payment with an imported Timestamp.)
    # (No retries: the client retries server errors, with back-off. Should a newer
    # Apicurio accept this version, drop the limit from docs/codecs.md.)
    client.set_compatibility(f"{topic}-value", "BACKWARD")
    stamped = payment_class(1, timestamp=True)
    no_retries = SchemaRegistry(schema_registry.url, **{"max.retries": 0})
    v3 = Protobuf(no_retries, stamped).bind(topic, "value")
    err = _registry_error(lambda: v3.encode(stamped(amount=8)))
    assert err.http_status_code == 500, err
    assert "unexpected label" in err.error_message, err

    # An imported well-known type: skipped (default) or registered as a reference.
    msg = stamped(amount=9)
    msg.at.seconds = 1_700_000_000
    refs = {}
    for skip in (True, False):
        ts_topic = unique("formats-ts")
        conf = {"skip.known.types": skip}
        ts_codec = Protobuf(registry, stamped, serializer_conf=conf).bind(ts_topic, "value")
        assert ts_codec.decode(ts_codec.encode(msg)) == msg
        schema = client.get_latest_version(f"{ts_topic}-value").schema
        refs[skip] = [(r.name, r.subject) for r in schema.references or []]
    timestamp_proto = "google/protobuf/timestamp.proto"
    assert refs == {True: [], False: [(timestamp_proto, timestamp_proto)]}

    # JSON Schema: key and value, round trips and interop.
    jtopic = unique("formats-json")
    jctx = SerializationContext(jtopic, MessageField.VALUE)
    key = JsonSchema(registry, KEY_SCHEMA).bind(jtopic, "key")
    assert key.decode(key.encode("acct-1")) == "acct-1"
    value = JsonSchema(registry, payment_json_schema(1)).bind(jtopic, "value")
    decode_only = JsonSchema(registry).bind(jtopic, "value")
    data = value.encode({"amount": 1})
    assert decode_only.decode(data) == {"amount": 1}
    assert JSONDeserializer(None, schema_registry_client=client)(data, jctx) == {"amount": 1}
    with pytest.raises(ValueError, match="cannot encode"):
        value.encode({"amount": 1, "extra": True})  # closed: no other properties
    # BACKWARD: an added optional property is accepted, a changed type refused (409).
    client.set_compatibility(f"{jtopic}-value", "BACKWARD")
    newer = JsonSchema(registry, payment_json_schema(2)).bind(jtopic, "value")
    newest = newer.encode({"amount": 3, "note": "v2"})
    assert decode_only.decode(newest) == {"amount": 3, "note": "v2"}
    # The codec of version 1 (closed) reads it too: it validates with the writer schema.
    assert value.decode(newest) == {"amount": 3, "note": "v2"}
    changed = JsonSchema(registry, payment_json_schema(3, amount_type="string"))
    err = _registry_error(lambda: changed.bind(jtopic, "value").encode({"amount": "x"}))
    assert err.http_status_code == 409, err
    assert client.get_versions(f"{jtopic}-value") == [1, 2]
    # Limit of Apicurio 2.4.2 (docs/codecs.md): it infers a schema's type from its content
    # and takes JSON for JSON Schema only with "$schema" (json-schema.org) or "properties";
    # {"type": "string"} parses as Avro, so the registration is refused (422).
    plain = JsonSchema(registry, '{"type": "string"}').bind(jtopic, "key")
    err = _registry_error(lambda: plain.encode("acct-1"))
    assert err.http_status_code == 422, err
    assert "Given schema is not from type: JSON" in err.error_message, err

    # An unknown schema id is a DecodeError naming it, for both formats.
    for bad_reader in (codec, decode_only):
        with pytest.raises(DecodeError, match=f"unknown schema id {UNKNOWN_ID}"):
            bad_reader.decode(_unknown_id_record())
    took = time.monotonic() - began
    print(f"registry start-up: {schema_registry.startup_seconds:.1f} s, test body: {took:.1f} s")


def test_protobuf_and_json_schema_app_with_evolution_and_unknown_schema_ids(  # type: ignore[no-untyped-def]
    kafka_bootstrap: str, schema_registry: RegistryServer, names, tmp_path: Path
) -> None:
    began = time.monotonic()
    env = app_env(
        kafka_bootstrap,
        names,
        tmp_path,
        "srfmt",
        LOCKGATE_TEST_SR_FORMATS_APP="1",
        LOCKGATE_TEST_SCHEMA_REGISTRY_URL=schema_registry.url,
        LOCKGATE_TEST_JSON_INPUT=names("srfmt-json-in"),
        LOCKGATE_TEST_JSON_OUTPUT=names("srfmt-json-out"),
    )
    pb_in, pb_out = env["LOCKGATE_INPUT_TOPIC"], env["LOCKGATE_OUTPUT_TOPIC"]
    js_in, js_out = env["LOCKGATE_TEST_JSON_INPUT"], env["LOCKGATE_TEST_JSON_OUTPUT"]
    for topic in (pb_in, js_in):
        create_topic(kafka_bootstrap, topic, 2)
    client = SchemaRegistryClient({"url": schema_registry.url})
    pb_ctx = SerializationContext(pb_in, MessageField.VALUE)
    js_key_ctx = SerializationContext(js_in, MessageField.KEY)
    js_ctx = SerializationContext(js_in, MessageField.VALUE)
    pb_conf = {"use.deprecated.format": False}
    pb_ser = {v: ProtobufSerializer(payment_class(v), client, pb_conf) for v in (1, 2)}
    js_ser = {v: JSONSerializer(payment_json_schema(v), client) for v in (1, 2)}
    js_key_ser = JSONSerializer(KEY_SCHEMA, client)

    accounts = ["a", "b", "c"]
    v1 = [(accounts[i % 3], {"amount": i + 1}) for i in range(6)]
    v2 = [(accounts[i % 3], {"amount": 100 + i, "note": f"n{i}"}) for i in range(6)]

    def produce(version: int, records: list[tuple[str, dict[str, Any]]]) -> None:
        cls = payment_class(version)
        pb = [(k.encode(), pb_ser[version](cls(**v), pb_ctx)) for k, v in records]
        _produce(kafka_bootstrap, pb_in, pb)
        js = [(js_key_ser(k, js_key_ctx), js_ser[version](v, js_ctx)) for k, v in records]
        _produce(kafka_bootstrap, js_in, js)

    produce(1, v1)
    client.set_compatibility(f"{js_in}-value", "BACKWARD")  # version 2 is checked

    app = AppProcess(APP, env, tmp_path / "app.log").start()
    try:
        first = read_all(kafka_bootstrap, js_out, expected=len(v1), timeout=60, idle=0.5)
        assert len(first) == len(v1), app.log_text()[-3000:]
        # Mid-stream: version 2 of both schemas, and a record with an unknown schema id.
        produce(2, v2[:3])
        _produce(kafka_bootstrap, pb_in, [(b"b", _unknown_id_record())])
        _produce(kafka_bootstrap, js_in, [(js_key_ser("b", js_key_ctx), _unknown_id_record())])
        produce(2, v2[3:])
        dlq_topic = f"{env['LOCKGATE_APP_NAME']}.dlq"
        dlq = read_all(kafka_bootstrap, dlq_topic, expected=2, timeout=60, idle=0.5)
        n = len(v1) + len(v2)
        pb_records = read_all(kafka_bootstrap, pb_out, expected=n, timeout=60, idle=0.5)
        js_records = read_all(kafka_bootstrap, js_out, expected=n, timeout=60, idle=1)
    finally:
        code = app.terminate()
    log = app.log_text()
    assert code == 0, log[-3000:]
    assert "Traceback" not in log, log[-3000:]

    # The two unknown schema ids are dead-lettered with the reason, bytes unchanged.
    assert len(dlq) == 2, log[-3000:]
    reasons = {}
    for record in dlq:
        headers = {k: v.decode() for k, v in record.headers()}
        assert headers["lockgate-error-stage"] == "deserialize", headers
        assert headers["lockgate-error-type"] == "DecodeError", headers
        assert record.value() == _unknown_id_record()
        reasons[headers["lockgate-error-message"].split(": ")[0]] = headers
    assert sorted(reasons) == sorted([f"protobuf:{pb_in}-value", f"jsonschema:{js_in}-value"])
    for headers in reasons.values():
        assert f"unknown schema id {UNKNOWN_ID}" in headers["lockgate-error-message"], headers

    # Expected: per account, the sum and count of every produced amount; the JSON app
    # also carries the latest note (version 2 read with its writer schema).
    want_pb: dict[str, dict[str, Any]] = {}
    want_js: dict[str, dict[str, Any]] = {}
    for acct in accounts:
        amounts = [v["amount"] for k, v in v1 + v2 if k == acct]
        notes = [v["note"] for k, v in v2 if k == acct]
        want_pb[acct] = {"account": acct, "sum": sum(amounts), "count": len(amounts)}
        want_js[acct] = {**want_pb[acct], "note": notes[-1]}

    assert len(pb_records) == len(v1) + len(v2), log[-3000:]
    read_sum = ProtobufDeserializer(sum_class(), pb_conf, client)
    pb_out_ctx = SerializationContext(pb_out, MessageField.VALUE)
    last_pb: dict[str, dict[str, Any]] = {}
    for m in pb_records:
        out = read_sum(m.value(), pb_out_ctx)
        assert out.account == m.key().decode()
        last_pb[out.account] = {"account": out.account, "sum": out.sum, "count": out.count}
    assert last_pb == want_pb

    assert len(js_records) == len(v1) + len(v2), log[-3000:]
    read_json = JSONDeserializer(None, schema_registry_client=client)
    js_out_key = SerializationContext(js_out, MessageField.KEY)
    js_out_value = SerializationContext(js_out, MessageField.VALUE)
    last_js: dict[str, dict[str, Any]] = {}
    for m in js_records:
        out = read_json(m.value(), js_out_value)
        assert read_json(m.key(), js_out_key) == out["account"]
        last_js[out["account"]] = out
    assert last_js == want_js

    subjects = set(client.get_subjects())
    assert {f"{pb_out}-value", f"{js_out}-key", f"{js_out}-value"} <= subjects
    assert client.get_versions(f"{pb_in}-value") == [1, 2]
    assert client.get_versions(f"{js_in}-value") == [1, 2]
    took = time.monotonic() - began
    print(f"test body (registry up): {took:.1f} s")
    assert took < 60
