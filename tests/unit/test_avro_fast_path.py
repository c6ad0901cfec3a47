"""The Avro codec's fastavro path writes and reads exactly what Confluent's serde does.

Against confluent-kafka's in-process mock registry (``mock://``): the first record of a
schema id goes through Confluent's serializer/deserializer, later ones through fastavro;
bytes and values must be identical either way, and the error mapping must not change.
"""

from __future__ import annotations

import itertools
import json

import pytest

pytest.importorskip("confluent_kafka.schema_registry")
pytest.importorskip("fastavro")

from confluent_kafka.schema_registry import MessageField, SerializationContext  # noqa: E402
from confluent_kafka.schema_registry.avro import AvroDeserializer, AvroSerializer  # noqa: E402

from state.codecs import DecodeError  # noqa: E402
from state.schema_registry import Avro, SchemaRegistry  # noqa: E402

_N = itertools.count()
V1 = json.dumps(
    {
        "type": "record",
        "name": "Sum",
        "namespace": "t",
        "fields": [
            {"name": "sum", "type": "long"},
            {"name": "tags", "type": {"type": "array", "items": "string"}},
            {"name": "note", "type": ["null", "string"], "default": None},
        ],
    }
)
V2 = json.dumps(
    {
        "type": "record",
        "name": "Sum",
        "namespace": "t",
        "fields": [
            *json.loads(V1)["fields"],
            {"name": "ratio", "type": "double", "default": 0.0},
        ],
    }
)
VALUES = [
    {"sum": i * 7919 - 5, "tags": ["a"] * (i % 3), "note": None if i % 2 else f"n{i}"}
    for i in range(50)
]


def _registry() -> SchemaRegistry:
    return SchemaRegistry(f"mock://fast-{next(_N)}")


def test_fast_bytes_and_values_equal_confluents() -> None:
    reg = _registry()
    codec = Avro(reg, V1).bind("sums", "value")
    ctx = SerializationContext("sums", MessageField.VALUE)
    reference = AvroSerializer(reg.client, V1)
    reader = AvroDeserializer(reg.client)
    encoded = [codec.encode(v) for v in VALUES]
    assert codec._fast_writer is not None  # noqa: SLF001 - the fast path is in use
    assert encoded == [reference(v, ctx) for v in VALUES]
    decoded = [codec.decode(b) for b in encoded]
    assert codec._fast_readers  # noqa: SLF001
    assert decoded == [reader(b, ctx) for b in encoded] == VALUES


def test_a_newer_writer_schema_gets_its_own_reader() -> None:
    reg = _registry()
    v1 = Avro(reg, V1).bind("sums", "value")
    v2 = Avro(reg, V2).bind("sums", "value")
    old = [v1.encode(v) for v in VALUES[:3]]
    new = [v2.encode({**v, "ratio": 0.5}) for v in VALUES[:3]]
    reader = Avro(reg).bind("sums", "value")  # decode-only, like an input codec
    assert [reader.decode(b) for b in old + new + old + new] == (
        VALUES[:3] + [{**v, "ratio": 0.5} for v in VALUES[:3]]
    ) * 2
    assert len(reader._fast_readers) == 2  # noqa: SLF001


def test_fast_path_errors_are_the_same_as_confluents() -> None:
    reg = _registry()
    codec = Avro(reg, V1).bind("sums", "value")
    good = codec.encode(VALUES[0])
    codec.decode(good)  # the id's reader is cached now
    with pytest.raises(DecodeError, match="cannot decode with schema id"):
        codec.decode(good[:6])  # truncated payload
    with pytest.raises(ValueError, match="cannot encode"):
        codec.encode({"sum": "not a long", "tags": []})
    with pytest.raises(DecodeError, match="unknown schema id"):
        codec.decode(b"\x00\x00\x0f\x42\x40" + good[5:])


def test_custom_serde_settings_keep_confluents_path() -> None:
    reg = _registry()
    codec = Avro(reg, V1, serializer_conf={"normalize.schemas": True}).bind("sums", "value")
    codec.encode(VALUES[0])
    assert codec._fast_writer is None  # noqa: SLF001
    reader = Avro(reg, deserializer_conf={"use.latest.version": False}).bind("sums", "value")
    reader.decode(codec.encode(VALUES[1]))
    assert reader._fast_readers == {}  # noqa: SLF001


def test_to_and_from_dict_apply_on_the_fast_path() -> None:
    reg = _registry()
    codec = Avro(
        reg,
        V1,
        to_dict=lambda obj: {"sum": obj[0], "tags": [], "note": None},
        from_dict=lambda d: (d["sum"],),
    ).bind("sums", "value")
    for i in range(3):
        assert codec.decode(codec.encode((i,))) == (i,)


def test_the_fast_path_imports_nothing_per_record(monkeypatch: pytest.MonkeyPatch) -> None:
    # fastavro's functions are kept with the parsed schema when the path is set up; an
    # import statement per record cost ~0.4 us of a ~2 us decode (docs/benchmarks.md).
    import builtins

    reg = _registry()
    codec = Avro(reg, V1).bind("sums", "value")
    codec.decode(codec.encode(VALUES[0]))  # sets up both directions
    real_import = builtins.__import__
    imported: list[str] = []

    def spy(name: str, *args: object, **kwargs: object) -> object:
        imported.append(name)
        return real_import(name, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(builtins, "__import__", spy)
    for v in VALUES:
        assert codec.decode(codec.encode(v)) == v
    monkeypatch.undo()
    assert imported == []


def test_fast_path_reads_any_bytes_like_input_as_bytes() -> None:
    reg = _registry()
    codec = Avro(reg, V1).bind("sums", "value")
    data = codec.encode(VALUES[3])
    codec.decode(data)  # the id's reader is cached now
    assert codec.decode(bytearray(data)) == codec.decode(memoryview(data)) == VALUES[3]
    schema_id = int.from_bytes(data[1:5], "big")
    assert set(codec._fast_readers) == {schema_id}  # noqa: SLF001 - keyed by the id


def test_fast_state_is_per_binding() -> None:
    reg = _registry()
    unbound = Avro(reg, V1)
    a = unbound.bind("sums", "value")
    a.decode(a.encode(VALUES[0]))
    b = a.bind("other", "value")
    assert b._fast_writer is None and b._fast_readers == {}  # noqa: SLF001
    assert a._fast_writer is not None and a._fast_readers  # noqa: SLF001
    assert b.decode(a.encode(VALUES[1])) == VALUES[1]
