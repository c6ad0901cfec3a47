"""Codecs turn Python values into bytes and back.

They serve both as record serializers (keys and values of Kafka records) and as
state value codecs. A codec is any object with ``name``, ``encode`` and ``decode``;
the built-in ones are module-level singletons. :class:`Model` (pydantic v2 models) and
:class:`FaustRecord` (``faust.Record`` classes) make typed codecs from a class
(docs/codecs.md).
"""

from __future__ import annotations

import pickle  # noqa: S403 - only used when the user opts in with PICKLE
from collections.abc import Callable, Mapping
from decimal import Decimal
from typing import Any, Generic, Literal, Protocol, TypeVar, runtime_checkable

import orjson
from pydantic import BaseModel, ValidationError
from pydantic_core import PydanticSerializationError

__all__ = [
    "BYTES",
    "JSON",
    "PICKLE",
    "STR",
    "Codec",
    "CodecUnavailable",
    "DecodeError",
    "FaustRecord",
    "Field",
    "Model",
    "bind_codec",
    "codec_by_name",
]

M = TypeVar("M", bound=BaseModel)


class DecodeError(ValueError):
    """Raised by a codec when bytes cannot be decoded (e.g. invalid JSON or UTF-8)."""


class CodecUnavailable(RuntimeError):
    """Raised by a codec when a service it needs (e.g. a schema registry) cannot answer.

    Not the record's fault: the runtime stops the task (the record is read again after
    the restart) instead of dead-lettering it, as it does for :class:`DecodeError` and
    any other decoding error.
    """


@runtime_checkable
class Codec(Protocol):
    """Encodes values to bytes and decodes them back.

    Contract: ``decode(encode(v)) == v`` for every value the codec accepts; ``decode``
    raises :class:`DecodeError` (or a ``ValueError`` subclass) on bytes it cannot read.
    ``None`` is never passed to either method: a missing key or value stays ``None``.
    """

    name: str

    def encode(self, value: Any) -> bytes:
        """Return the bytes of ``value``."""
        ...

    def decode(self, data: bytes) -> Any:
        """Return the value stored in ``data``."""
        ...


class _Json:
    name = "json"

    def __init__(self) -> None:
        # Bind once: the per-record path calls these directly.
        self.encode = orjson.dumps
        self.decode = orjson.loads


class _Str:
    name = "str"

    def __init__(self) -> None:
        # UTF-8, strict: bytes.decode itself, so decoding a key adds no Python frame.
        # Takes ``bytes`` only (what Kafka, RocksDB and the runtime hand it).
        self.decode: Callable[[bytes], Any] = bytes.decode

    @staticmethod
    def encode(value: Any) -> bytes:
        return str(value).encode()


class _Bytes:
    name = "bytes"

    @staticmethod
    def encode(value: Any) -> bytes:
        return bytes(value)

    @staticmethod
    def decode(data: bytes) -> Any:
        return data


class _Pickle:
    name = "pickle"

    @staticmethod
    def encode(value: Any) -> bytes:
        return pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL)

    @staticmethod
    def decode(data: bytes) -> Any:
        return pickle.loads(data)  # noqa: S301 - opt-in codec, trusted state only


#: Which part of a Kafka record a codec handles.
Field = Literal["key", "value"]


def bind_codec(codec: Codec, topic: str, field: Field) -> Codec:
    """Return ``codec`` bound to the keys or values of ``topic``.

    Codecs that need to know where their bytes live (the Schema Registry codecs of
    :mod:`state.schema_registry`: the subject derives from the topic) define an
    optional ``bind(topic, field) -> Codec``; the app calls this function when it
    declares an input or output. Every other codec is returned unchanged, so plain
    codecs need no ``bind``.

    Args:
        codec: any codec.
        topic: the topic the codec reads or writes.
        field: ``"key"`` or ``"value"``.

    Raises:
        TypeError: ``codec.bind`` returned something that is not a codec.
    """
    bind = getattr(codec, "bind", None)
    if not callable(bind):
        return codec
    bound = bind(topic, field)
    if not isinstance(bound, Codec):
        raise TypeError(f"{codec!r}.bind() returned {bound!r}, which is not a codec")
    return bound


JSON: Codec = _Json()
STR: Codec = _Str()
BYTES: Codec = _Bytes()
PICKLE: Codec = _Pickle()

_BY_NAME = {c.name: c for c in (JSON, STR, BYTES, PICKLE)}


def codec_by_name(name: str) -> Codec:
    """Return the built-in codec called ``name``.

    Raises:
        KeyError: no built-in codec has that name.
    """
    return _BY_NAME[name]


# ------------------------------------------------------------------ typed codecs

#: How many validation errors a message lists (the rest are counted).
_MAX_ERRORS = 5
#: How long the ``(got ...)`` part of one error may be.
_MAX_INPUT = 60


def _class_path(cls: type, name: str | None) -> str:
    """``name``, or ``<module>.<qualname>`` of ``cls``: the stable part of a codec name."""
    if name is not None:
        if not isinstance(name, str) or not name or any(c.isspace() for c in name):
            raise ValueError(f"codec name {name!r} must be a non-empty string without spaces")
        return name
    return f"{cls.__module__}.{cls.__qualname__}"


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= _MAX_INPUT else text[: _MAX_INPUT - 3] + "..."


def _describe_validation_error(label: str, exc: ValidationError) -> str:
    """Return a one-line description of ``exc`` naming each failing field.

    Each error reads ``<label>.<field path>: <message> (got <input>)``, e.g.
    ``Order.qty: Input should be a valid integer, unable to parse string as an integer
    (got 'x')``; errors about the whole document (invalid JSON, not an object) read
    ``<label>: ...``. At most five errors are listed, the others counted.
    """
    errors = exc.errors(include_url=False)
    parts = []
    for err in errors[:_MAX_ERRORS]:
        loc = ".".join(str(p) for p in err["loc"])
        where = f"{label}.{loc}" if loc else label
        part = f"{where}: {err['msg']}"
        if err["type"] != "missing":  # the input of a missing field is the whole object
            part += f" (got {_short(err.get('input'))})"
        parts.append(part)
    if len(errors) > _MAX_ERRORS:
        parts.append(f"(+{len(errors) - _MAX_ERRORS} more errors)")
    return "; ".join(parts)


class Model(Generic[M]):
    """A codec for a pydantic v2 model: JSON bytes <-> validated model instances.

    ``decode`` validates with ``model_validate_json``; invalid bytes raise
    :class:`DecodeError` naming each failing field (``Order.qty: Input should be a valid
    integer ... (got 'x')``), so the runtime dead-letters the record with that message.
    ``encode`` writes ``model_dump_json(by_alias=True, round_trip=True)``, which
    ``decode`` reads back: ``decode(encode(v)) == v`` for every instance ``v``. It also
    accepts a mapping of the model's fields, validated first. A value that would not
    read back (a field holding the wrong type, e.g. after ``model_construct`` or an
    unvalidated assignment) is refused with :class:`ValueError` instead of being
    written.

    The codec's ``name`` is ``pydantic:<module>.<qualname>`` of the class (or
    ``pydantic:<name>`` when ``name`` is given). It is saved with the state of stores
    using the codec: a savepoint restores into an app whose store declares the same
    name. Give ``name`` to keep it when the class moves to another module.

    Args:
        cls: a subclass of ``pydantic.BaseModel``.
        name: the stable part of the codec name (default: the class path).

    Raises:
        TypeError: ``cls`` is not a pydantic model class (a ``faust.Record`` class is
            pointed to :class:`FaustRecord`).
        ValueError: ``name`` is empty or contains whitespace.
    """

    def __init__(self, cls: type[M], *, name: str | None = None) -> None:
        if not (isinstance(cls, type) and issubclass(cls, BaseModel)):
            hint = " (for a faust.Record use FaustRecord(cls))" if _is_faust(cls) else ""
            raise TypeError(f"Model() needs a pydantic BaseModel subclass, got {cls!r}{hint}")
        self.cls = cls
        self.name = f"pydantic:{_class_path(cls, name)}"
        self._label = cls.__name__

    def __repr__(self) -> str:
        return f"Model({self.cls.__qualname__}, name={self.name!r})"

    def encode(self, value: M | Mapping[str, Any]) -> bytes:
        """Return the JSON bytes of ``value`` (an instance of the model, or its fields).

        Raises:
            TypeError: ``value`` is neither an instance of the model nor a mapping.
            ValueError: a mapping that does not validate, or an instance whose fields
                do not serialize as their declared types; the message names the fields.
        """
        if not isinstance(value, self.cls):
            if not isinstance(value, Mapping):
                raise TypeError(
                    f"{self.name} encodes {self._label} instances (or a dict of their "
                    f"fields), got {type(value).__name__}"
                )
            try:
                value = self.cls.model_validate(value)
            except ValidationError as exc:
                raise ValueError(_describe_validation_error(self._label, exc)) from exc
        try:
            return value.model_dump_json(by_alias=True, round_trip=True, warnings="error").encode()
        except PydanticSerializationError as exc:
            detail = " ".join(str(exc).split())
            raise ValueError(f"{self._label} cannot be encoded: {detail}") from exc

    def decode(self, data: bytes) -> M:
        """Return the validated model instance stored in ``data``.

        Raises:
            DecodeError: ``data`` is not valid JSON or does not validate; the message
                names every failing field.
        """
        try:
            return self.cls.model_validate_json(data)
        except ValidationError as exc:
            raise DecodeError(_describe_validation_error(self._label, exc)) from exc


def _is_faust(cls: object) -> bool:
    """Whether ``cls`` has faust's public model API (``from_data``, ``to_representation``)."""
    return callable(getattr(cls, "from_data", None)) and callable(
        getattr(cls, "to_representation", None)
    )


def _faust_default(value: Any) -> Any:
    """The orjson fallback for what ``to_representation`` leaves: nested records, decimals."""
    if callable(getattr(value, "to_representation", None)):
        return value.to_representation()
    if isinstance(value, Decimal):
        return str(value)  # as faust's JSON serializer writes it
    raise TypeError(f"{type(value).__name__} is not JSON serializable")


class FaustRecord:
    """A codec for a ``faust.Record`` class, for apps migrated from Faust.

    Works by duck typing on faust's public model API, without importing faust:
    ``encode`` writes ``value.to_representation()`` as JSON (nested records as their
    representation, ``Decimal`` as a string, ``datetime`` as ISO 8601, the ``__faust``
    namespace kept, like faust's ``json`` serializer); ``decode`` parses the JSON and
    returns ``cls.from_data(obj)``. Faust checks field types only for classes declared
    with ``validation=True`` (or converts them with ``coerce=True``); whatever
    ``from_data`` raises (a missing field, a failed validation or coercion) becomes a
    :class:`DecodeError` naming the class, and the field when faust reports it.

    The codec's ``name`` is ``faust:<module>.<qualname>`` (or ``faust:<name>``); see
    :class:`Model` about names and savepoints.

    Args:
        cls: a class with a ``from_data(mapping)`` classmethod and instances with
            ``to_representation()``, e.g. a ``faust.Record`` subclass.
        name: the stable part of the codec name (default: the class path).

    Raises:
        TypeError: ``cls`` lacks that API.
        ValueError: ``name`` is empty or contains whitespace.
    """

    def __init__(self, cls: type, *, name: str | None = None) -> None:
        if not (isinstance(cls, type) and _is_faust(cls)):
            raise TypeError(
                "FaustRecord() needs a faust.Record class (from_data() and "
                f"to_representation()), got {cls!r}"
            )
        self.cls: type[Any] = cls
        self.name = f"faust:{_class_path(cls, name)}"
        self._label = cls.__name__

    def __repr__(self) -> str:
        return f"FaustRecord({self.cls.__qualname__}, name={self.name!r})"

    def encode(self, value: Any) -> bytes:
        """Return the JSON bytes of ``value.to_representation()``.

        Raises:
            TypeError: ``value`` is not an instance of the class, or holds a value JSON
                cannot represent.
        """
        if not isinstance(value, self.cls):
            raise TypeError(
                f"{self.name} encodes {self._label} records, got {type(value).__name__}"
            )
        return orjson.dumps(value.to_representation(), default=_faust_default)

    def decode(self, data: bytes) -> Any:
        """Return ``cls.from_data(...)`` of the JSON object in ``data``.

        Raises:
            DecodeError: ``data`` is not a JSON object, or ``from_data`` refused it.
        """
        try:
            obj = orjson.loads(data)
        except orjson.JSONDecodeError as exc:
            raise DecodeError(f"{self._label}: invalid JSON: {exc}") from exc
        if not isinstance(obj, dict):
            raise DecodeError(f"{self._label}: expected a JSON object, got {type(obj).__name__}")
        try:
            return self.cls.from_data(obj)
        except Exception as exc:  # noqa: BLE001 - any refusal of from_data is bad input
            field = getattr(getattr(exc, "field", None), "field", None)
            where = f"{self._label}.{field}" if isinstance(field, str) else self._label
            raise DecodeError(f"{where}: {type(exc).__name__}: {exc}") from exc
