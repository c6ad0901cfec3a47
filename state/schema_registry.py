"""Schema Registry codecs: Avro, Protobuf and JSON Schema in the Confluent wire format.

Records are framed as Confluent's serializers frame them: a zero magic byte, the
4-byte big-endian schema id, then the payload. The codecs wrap the serializers of
``confluent_kafka.schema_registry`` (install ``lockgate[schema-registry]``), so records
written by any Confluent-compatible producer are read, and the other way round.

Confluent's serializers need to know the topic and whether they handle the key or the
value (a ``SerializationContext``): the subject a schema is registered under derives
from them. The codecs here are *bindable*: the app calls :meth:`RegistryCodec.bind`
with the topic and the field when it declares an input or output with such a codec
(see :func:`state.codecs.bind_codec`); codecs without ``bind`` are used unchanged.

Decoding never crashes the runtime on bad input: bytes that are not in the wire format,
a schema id the registry does not know, or a payload that does not match its writer
schema raise :class:`~state.codecs.DecodeError`, so the record is dead-lettered with
that reason. A registry that cannot be reached (or answers with a server error) is not
the record's fault: :class:`~state.codecs.CodecUnavailable` stops the task instead.
"""

from __future__ import annotations

import io
import json
import struct
import threading
from collections.abc import Callable, Mapping
from typing import Any, Literal

from state.codecs import Codec, CodecUnavailable, DecodeError, Field

__all__ = [
    "Avro",
    "JsonSchema",
    "Protobuf",
    "RegistryCodec",
    "SchemaRegistry",
    "SubjectStrategy",
]

#: How a schema's subject is named: ``topic`` (``<topic>-key`` / ``<topic>-value``,
#: Confluent's default), ``record`` (the record's full name) or ``topic_record``
#: (``<topic>-<record full name>``).
SubjectStrategy = Literal["topic", "record", "topic_record"]

_STRATEGIES: tuple[str, ...] = ("topic", "record", "topic_record")
_MAGIC = 0
_HEADER = 5
#: The schema id: 4 bytes big-endian after the magic byte (read in place, no slice).
_SCHEMA_ID = struct.Struct(">I")


def _import_sr() -> Any:
    """Return ``confluent_kafka.schema_registry``, or explain which extra to install."""
    try:
        import confluent_kafka.schema_registry as sr
        import confluent_kafka.schema_registry.avro
        import confluent_kafka.schema_registry.json_schema
        import confluent_kafka.schema_registry.protobuf  # noqa: F401
    except ImportError as exc:  # pragma: no cover - the extra is installed in tests
        raise ImportError(
            "Schema Registry codecs need the schema-registry extra: "
            "pip install 'lockgate[schema-registry]'"
        ) from exc
    return sr


class SchemaRegistry:
    """Connection settings of a Confluent-compatible schema registry, shared by codecs.

    The client (``confluent_kafka.schema_registry.SchemaRegistryClient``) is created on
    first use, so declaring codecs at import time contacts nothing. It caches schemas by
    id, so each schema is fetched once per process.

    Args:
        url: the registry's base URL, e.g. ``http://127.0.0.1:8081`` (``mock://name``
            gives confluent-kafka's in-process mock registry, for tests).
        **conf: further ``SchemaRegistryClient`` settings, with their dotted names
            given as a mapping, e.g. ``SchemaRegistry(url, **{"basic.auth.user.info":
            "u:p"})``.

    Raises:
        ValueError: ``url`` is empty.
    """

    def __init__(self, url: str, **conf: Any) -> None:
        if not isinstance(url, str) or not url:
            raise ValueError("SchemaRegistry needs a non-empty url")
        self.url = url
        self.conf: dict[str, Any] = {"url": url, **conf}
        self._client: Any = None
        self._lock = threading.Lock()

    def __repr__(self) -> str:
        return f"SchemaRegistry({self.url!r})"

    @property
    def client(self) -> Any:
        """The ``SchemaRegistryClient`` (created on first use)."""
        with self._lock:
            if self._client is None:
                sr = _import_sr()
                self._client = sr.SchemaRegistryClient.new_client(dict(self.conf))
            return self._client


class RegistryCodec:
    """Base of the Schema Registry codecs: naming, binding and error mapping.

    Subclasses give ``kind`` (the name prefix) and build the Confluent serializer and
    deserializer. A codec is first *unbound* (declared by the user); the app binds it
    to ``(topic, field)`` when it declares an input or output with it. An unbound codec
    can still decode; it encodes only when ``subject`` is given (as a state codec).

    The codec's ``name`` is ``<kind>:<subject>``, e.g. ``avro:orders-value`` (topic
    strategy), ``avro:com.acme.Order`` (record strategy) or
    ``avro:orders-com.acme.Order`` (topic_record). A decode-only codec (no schema)
    bound to a record strategy is named after ``<topic>-<field>``; an unbound one
    without ``subject`` is ``<kind>:*``.
    """

    kind = "registry"

    def __init__(
        self,
        registry: SchemaRegistry,
        *,
        subject_strategy: SubjectStrategy = "topic",
        subject: str | None = None,
        serializer_conf: Mapping[str, Any] | None = None,
        deserializer_conf: Mapping[str, Any] | None = None,
        record: str | None = None,
    ) -> None:
        if not isinstance(registry, SchemaRegistry):
            raise TypeError(f"registry must be a SchemaRegistry, got {type(registry).__name__}")
        if subject_strategy not in _STRATEGIES:
            raise ValueError(
                f"subject_strategy must be one of {', '.join(_STRATEGIES)}, "
                f"got {subject_strategy!r}"
            )
        if subject is not None and (not subject or any(c.isspace() for c in subject)):
            raise ValueError(f"subject {subject!r} must be a non-empty string without spaces")
        self.registry = registry
        self.subject_strategy: SubjectStrategy = subject_strategy
        self.subject = subject
        self.serializer_conf = dict(serializer_conf or {})
        self.deserializer_conf = dict(deserializer_conf or {})
        self._record = record
        self.topic: str | None = None
        self.field: Field | None = None
        #: ``<kind>:<subject>`` (stable: saved with savepoints of stores using it).
        self.name = self.codec_name()
        self._serializer: Any = None
        self._deserializer: Any = None
        self._lock = threading.Lock()

    # ------------------------------------------------------------------ naming

    def record_name(self) -> str | None:
        """The full name of the record type the schema declares, if known."""
        return self._record

    def _subject_for(self, topic: str | None, field: Field | None) -> str | None:
        if self.subject is not None:
            return self.subject
        if topic is None or field is None:
            return None
        record = self.record_name()
        if self.subject_strategy == "topic" or record is None:
            return f"{topic}-{field}"
        if self.subject_strategy == "record":
            return record
        return f"{topic}-{record}"

    def codec_name(self) -> str:
        """Return ``<kind>:<subject>`` for the codec's binding (what ``name`` holds)."""
        return f"{self.kind}:{self._subject_for(self.topic, self.field) or '*'}"

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.name!r})"

    # ------------------------------------------------------------------ binding

    def bind(self, topic: str, field: Field) -> RegistryCodec:
        """Return a copy of this codec bound to ``topic``'s keys or values.

        Args:
            topic: the Kafka topic the records are read from or written to.
            field: ``"key"`` or ``"value"``.

        Raises:
            ValueError: ``field`` is neither ``"key"`` nor ``"value"``, or ``topic`` is
                empty.
        """
        if field not in ("key", "value"):
            raise ValueError(f"field must be 'key' or 'value', got {field!r}")
        if not topic:
            raise ValueError("bind() needs a topic")
        bound = self._copy()
        bound.topic = topic
        bound.field = field
        bound.name = bound.codec_name()
        return bound

    def _copy(self) -> RegistryCodec:
        clone = object.__new__(type(self))
        clone.__dict__.update(self.__dict__)
        clone._serializer = None
        clone._deserializer = None
        clone._lock = threading.Lock()
        return clone

    def _context(self) -> Any:
        sr = _import_sr()
        field = sr.MessageField.KEY if self.field == "key" else sr.MessageField.VALUE
        return sr.SerializationContext(self.topic or "", field)

    def _strategy_conf(self) -> dict[str, Any]:
        sr = _import_sr()
        if self.subject is not None:
            fixed = self.subject
            return {"subject.name.strategy": lambda _ctx, _record: fixed}
        strategy: Callable[..., Any] = {
            "topic": sr.topic_subject_name_strategy,
            "record": sr.record_subject_name_strategy,
            "topic_record": sr.topic_record_subject_name_strategy,
        }[self.subject_strategy]
        return {"subject.name.strategy": strategy}

    # ------------------------------------------------------------------ serde

    def _make_serializer(self, conf: dict[str, Any]) -> Any:
        raise NotImplementedError

    def _make_deserializer(self, conf: dict[str, Any]) -> Any:
        raise NotImplementedError

    def _ser(self) -> Any:
        with self._lock:
            if self._serializer is None:
                conf = {**self._strategy_conf(), **self.serializer_conf}
                self._serializer = self._make_serializer(conf)
            return self._serializer

    def _deser(self) -> Any:
        with self._lock:
            if self._deserializer is None:
                conf = {**self._strategy_conf(), **self.deserializer_conf}
                self._deserializer = self._make_deserializer(conf)
            return self._deserializer

    def encode(self, value: Any) -> bytes:
        """Return ``value`` in the Confluent wire format (registering its schema).

        Raises:
            ValueError: the codec has no schema, is neither bound nor given a
                ``subject``, or ``value`` does not match the schema.
            confluent_kafka.schema_registry.SchemaRegistryError: the registry refused
                the schema (e.g. an incompatible change) or cannot be reached.
        """
        if self.topic is None and self.subject is None:
            raise ValueError(
                f"{self.name} is not bound to a topic: declare it as an input/output "
                "codec, or give subject= to use it elsewhere (e.g. for state)"
            )
        sr = _import_sr()
        try:
            data = self._ser()(value, self._context())
        except sr.SchemaRegistryError:
            raise
        except Exception as exc:  # noqa: BLE001 - any refusal is a bad value
            raise ValueError(f"{self.name} cannot encode {_short(value)}: {exc}") from exc
        return bytes(data)

    def decode(self, data: bytes) -> Any:
        """Return the value in ``data``, read with its writer schema.

        Raises:
            DecodeError: ``data`` is not in the Confluent wire format, names a schema id
                the registry does not know, or does not match its writer schema.
            CodecUnavailable: the registry failed otherwise (a server error) or cannot
                be reached: not the record's fault, the runtime stops instead of
                dead-lettering it.
        """
        if len(data) < _HEADER or data[0] != _MAGIC:
            head = data[:1].hex() or "empty"
            raise DecodeError(
                f"{self.name}: not in the Confluent wire format (magic byte {_MAGIC:#04x} "
                f"and a 4-byte schema id expected, got {len(data)} bytes starting {head})"
            )
        schema_id = _SCHEMA_ID.unpack_from(data, 1)[0]
        sr = _import_sr()
        ctx = self._context() if self.topic is not None else None
        try:
            return self._deser()(data, ctx)
        except sr.SchemaRegistryError as exc:
            if exc.http_status_code == 404:
                raise DecodeError(
                    f"{self.name}: unknown schema id {schema_id}: {exc.error_message}"
                ) from exc
            raise CodecUnavailable(
                f"{self.name}: the schema registry failed fetching schema id {schema_id}: "
                f"HTTP {exc.http_status_code}: {exc.error_message}"
            ) from exc
        except (sr.SerializationError, ValueError, TypeError, EOFError, IndexError) as exc:
            raise DecodeError(
                f"{self.name}: cannot decode with schema id {schema_id}: {exc}"
            ) from exc
        except (struct.error, KeyError) as exc:
            raise DecodeError(
                f"{self.name}: cannot decode with schema id {schema_id}: {exc!r}"
            ) from exc
        except Exception as exc:
            if isinstance(exc, OSError) or type(exc).__module__.startswith(("httpx", "httpcore")):
                raise CodecUnavailable(
                    f"{self.name}: the schema registry at {self.registry.url} cannot be "
                    f"reached: {type(exc).__name__}: {exc}"
                ) from exc
            raise


def _short(value: Any, limit: int = 60) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


class Avro(RegistryCodec):
    """Avro through the schema registry: dicts (or your objects) <-> Confluent Avro.

    ``encode`` takes a dict matching ``schema`` (or what ``to_dict`` turns into one) and
    registers the schema under the subject on first use (``auto.register.schemas``,
    override with ``serializer_conf``). ``decode`` reads each record with the schema
    its id names (its writer schema) and returns a dict, or ``from_dict(dict)``. Give a
    reader ``schema`` only with ``deserializer_conf={"use.latest.version": True}``
    style settings; by default the writer schema is used, so a record written with a
    newer compatible version (an added field) decodes with that field.

    Args:
        registry: the registry.
        schema: the Avro schema (JSON text) used to encode; ``None`` for a decode-only
            codec.
        subject_strategy: ``topic`` (default), ``record`` or ``topic_record``.
        subject: a fixed subject (overrides the strategy; needed for state codecs).
        to_dict: ``fn(obj) -> dict`` applied before encoding.
        from_dict: ``fn(dict) -> obj`` applied after decoding.
        serializer_conf: extra ``AvroSerializer`` settings.
        deserializer_conf: extra ``AvroDeserializer`` settings.

    Raises:
        ValueError: an unknown strategy, a bad ``subject``, or ``schema`` is not a valid
            Avro schema.
        TypeError: ``registry`` is not a :class:`SchemaRegistry`.
    """

    kind = "avro"

    def __init__(
        self,
        registry: SchemaRegistry,
        schema: str | None = None,
        *,
        subject_strategy: SubjectStrategy = "topic",
        subject: str | None = None,
        to_dict: Callable[[Any], dict[str, Any]] | None = None,
        from_dict: Callable[[dict[str, Any]], Any] | None = None,
        serializer_conf: Mapping[str, Any] | None = None,
        deserializer_conf: Mapping[str, Any] | None = None,
    ) -> None:
        super().__init__(
            registry,
            subject_strategy=subject_strategy,
            subject=subject,
            serializer_conf=serializer_conf,
            deserializer_conf=deserializer_conf,
            record=_avro_full_name(schema) if schema is not None else None,
        )
        self.schema = schema
        self.to_dict = to_dict
        self.from_dict = from_dict
        #: (wire header, parsed schema, fastavro's ``schemaless_writer``) once in use.
        self._fast_writer: tuple[bytes, Any, Callable[..., None]] | None = None
        #: schema id -> (parsed writer schema, fastavro's ``schemaless_reader``).
        self._fast_readers: dict[int, tuple[Any, Callable[..., Any]]] = {}

    def _copy(self) -> RegistryCodec:
        clone = super()._copy()
        clone.__dict__.update(_fast_writer=None, _fast_readers={})  # per binding
        return clone

    # Fast path. Confluent's Avro serde re-derives the subject, walks the schema for
    # inline tags and runs the (empty) rule pipeline on every record: ~14k encodes and
    # ~5.5k decodes per second. Once a schema id is known and its registered schema has
    # no rules and no references, and the codec uses the default serde settings, the
    # payload is written and read with fastavro directly (the same bytes: the framing is
    # the magic byte and the id). The first record of each id always goes through
    # Confluent's serde (registration, lookup, errors). The per-record path imports
    # nothing and slices nothing: fastavro's functions are kept with the parsed schema
    # and the id is read in place.

    def _plain_schema(self, schema_id: int) -> Any:
        """The parsed schema of ``schema_id`` when the fast path may use it, else None."""
        from fastavro import parse_schema  # noqa: PLC0415 - comes with the avro extra

        registered = self.registry.client.get_schema(schema_id)
        if (
            registered.rule_set
            or registered.references
            or registered.schema_type
            not in (
                None,
                "AVRO",
            )
        ):
            return None
        return parse_schema(json.loads(registered.schema_str))

    def encode(self, value: Any) -> bytes:
        """Return ``value`` in the Confluent wire format, as :meth:`RegistryCodec.encode`."""
        fast = self._fast_writer
        if fast is None:
            data = super().encode(value)
            if not self.serializer_conf and self._fast_writer is None:
                parsed = self._plain_schema(_SCHEMA_ID.unpack_from(data, 1)[0])
                if parsed is not None:
                    from fastavro import schemaless_writer  # noqa: PLC0415 - the avro extra

                    self._fast_writer = (data[:_HEADER], parsed, schemaless_writer)
            return data
        header, parsed, write = fast
        buf = io.BytesIO()
        buf.write(header)
        try:
            write(buf, parsed, self.to_dict(value) if self.to_dict else value)
        except Exception as exc:  # noqa: BLE001 - any refusal is a bad value
            raise ValueError(f"{self.name} cannot encode {_short(value)}: {exc}") from exc
        return buf.getvalue()

    def decode(self, data: bytes) -> Any:
        """Return the value in ``data``, read with its writer schema.

        Raises:
            DecodeError: see :meth:`RegistryCodec.decode`.
            CodecUnavailable: see :meth:`RegistryCodec.decode`.
        """
        if len(data) >= _HEADER and data[0] == _MAGIC:
            schema_id = _SCHEMA_ID.unpack_from(data, 1)[0]
            fast = self._fast_readers.get(schema_id)
            if fast is not None:
                parsed, read = fast
                buf = io.BytesIO(data)
                buf.seek(_HEADER)
                try:
                    value = read(buf, parsed, None)
                except Exception as exc:  # noqa: BLE001 - a payload not of its schema
                    raise DecodeError(
                        f"{self.name}: cannot decode with schema id {schema_id}: {exc!r}"
                    ) from exc
                return self.from_dict(value) if self.from_dict else value
            value = super().decode(data)  # validates the id, fetches the schema
            if not self.deserializer_conf:
                plain = self._plain_schema(schema_id)
                if plain is not None:
                    from fastavro import schemaless_reader  # noqa: PLC0415 - the avro extra

                    self._fast_readers[schema_id] = (plain, schemaless_reader)
            return value
        return super().decode(data)

    def _make_serializer(self, conf: dict[str, Any]) -> Any:
        if self.schema is None:
            raise ValueError(f"{self.name} has no schema: it only decodes")
        sr = _import_sr()
        to_dict = self.to_dict
        return sr.avro.AvroSerializer(
            schema_registry_client=self.registry.client,
            schema_str=self.schema,
            to_dict=(lambda obj, _ctx: to_dict(obj)) if to_dict else None,
            conf=conf,
        )

    def _make_deserializer(self, conf: dict[str, Any]) -> Any:
        sr = _import_sr()
        from_dict = self.from_dict
        return sr.avro.AvroDeserializer(
            schema_registry_client=self.registry.client,
            from_dict=(lambda obj, _ctx: from_dict(obj)) if from_dict else None,
            conf=conf,
        )


def _avro_full_name(schema: str) -> str | None:
    """Return ``namespace.name`` of a record schema (``None`` for other types).

    Raises:
        ValueError: ``schema`` is not valid JSON or not a valid Avro schema.
    """
    import fastavro
    import orjson

    try:
        parsed = fastavro.parse_schema(orjson.loads(schema))
    except Exception as exc:  # noqa: BLE001 - fastavro raises several types
        raise ValueError(f"invalid Avro schema: {exc}") from exc
    if isinstance(parsed, dict) and parsed.get("type") == "record":
        name = parsed.get("name")
        return str(name) if name else None
    return None


class Protobuf(RegistryCodec):
    """Protobuf through the schema registry: generated message instances <-> bytes.

    Args:
        registry: the registry.
        message_type: the generated message class; ``decode`` returns its instances and
            ``encode`` takes them.
        subject_strategy: ``topic`` (default), ``record`` (the message's full name) or
            ``topic_record``.
        subject: a fixed subject (overrides the strategy).
        serializer_conf: extra ``ProtobufSerializer`` settings.
        deserializer_conf: extra ``ProtobufDeserializer`` settings.

    Raises:
        TypeError: ``message_type`` is not a protobuf message class.
    """

    kind = "protobuf"

    def __init__(
        self,
        registry: SchemaRegistry,
        message_type: type,
        *,
        subject_strategy: SubjectStrategy = "topic",
        subject: str | None = None,
        serializer_conf: Mapping[str, Any] | None = None,
        deserializer_conf: Mapping[str, Any] | None = None,
    ) -> None:
        descriptor = getattr(message_type, "DESCRIPTOR", None)
        if not isinstance(message_type, type) or descriptor is None:
            raise TypeError(
                f"Protobuf() needs a generated protobuf message class, got {message_type!r}"
            )
        super().__init__(
            registry,
            subject_strategy=subject_strategy,
            subject=subject,
            serializer_conf=serializer_conf,
            deserializer_conf=deserializer_conf,
            record=str(descriptor.full_name),
        )
        self.message_type = message_type

    def _make_serializer(self, conf: dict[str, Any]) -> Any:
        sr = _import_sr()
        conf = {"use.deprecated.format": False, **conf}
        return sr.protobuf.ProtobufSerializer(
            msg_type=self.message_type,
            schema_registry_client=self.registry.client,
            conf=conf,
        )

    def _make_deserializer(self, conf: dict[str, Any]) -> Any:
        sr = _import_sr()
        conf = {"use.deprecated.format": False, **conf}
        return sr.protobuf.ProtobufDeserializer(
            message_type=self.message_type,
            schema_registry_client=self.registry.client,
            conf=conf,
        )


class JsonSchema(RegistryCodec):
    """JSON Schema through the schema registry: dicts <-> validated JSON.

    ``encode`` validates the value against ``schema`` and writes it; ``decode``
    validates against the writer schema (the one the record's id names) and returns the
    parsed JSON, as :class:`Avro` reads with the writer schema: a record of a newer
    compatible version (a property added to a closed object) decodes, the new property
    included, even though ``schema`` would refuse it. ``deserializer_conf=
    {"use.latest.version": True}`` validates with the subject's latest version instead.

    Args:
        registry: the registry.
        schema: the JSON Schema (JSON text), with a ``title`` for the record
            strategies; ``None`` for a decode-only codec.
        subject_strategy: ``topic`` (default), ``record`` (the schema's ``title``) or
            ``topic_record``.
        subject: a fixed subject (overrides the strategy).
        serializer_conf: extra ``JSONSerializer`` settings.
        deserializer_conf: extra ``JSONDeserializer`` settings.

    Raises:
        ValueError: ``schema`` is not a JSON object.
    """

    kind = "jsonschema"

    def __init__(
        self,
        registry: SchemaRegistry,
        schema: str | None = None,
        *,
        subject_strategy: SubjectStrategy = "topic",
        subject: str | None = None,
        serializer_conf: Mapping[str, Any] | None = None,
        deserializer_conf: Mapping[str, Any] | None = None,
    ) -> None:
        import orjson

        record: str | None = None
        if schema is not None:
            try:
                parsed = orjson.loads(schema)
            except orjson.JSONDecodeError as exc:
                raise ValueError(f"invalid JSON Schema: {exc}") from exc
            if not isinstance(parsed, dict):
                raise ValueError("a JSON Schema must be a JSON object")
            title = parsed.get("title")
            record = title if isinstance(title, str) and title else None
        super().__init__(
            registry,
            subject_strategy=subject_strategy,
            subject=subject,
            serializer_conf=serializer_conf,
            deserializer_conf=deserializer_conf,
            record=record,
        )
        self.schema = schema

    def _make_serializer(self, conf: dict[str, Any]) -> Any:
        if self.schema is None:
            raise ValueError(f"{self.name} has no schema: it only decodes")
        sr = _import_sr()
        return sr.json_schema.JSONSerializer(
            schema_str=self.schema,
            schema_registry_client=self.registry.client,
            conf=conf,
        )

    def _make_deserializer(self, conf: dict[str, Any]) -> Any:
        sr = _import_sr()
        # No reader schema: confluent-kafka would validate every record with it (not
        # with its writer schema), refusing newer versions that are compatible.
        return sr.json_schema.JSONDeserializer(
            schema_str=None,
            schema_registry_client=self.registry.client,
            conf=conf,
        )


def _check_protocol(codec: RegistryCodec) -> Codec:
    return codec  # mypy checks that the codecs satisfy the Codec protocol
