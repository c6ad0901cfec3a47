"""Codecs turn Python values into bytes and back.

They serve both as record serializers (keys and values of Kafka records) and as
state value codecs. A codec is any object with ``name``, ``encode`` and ``decode``;
the built-in ones are module-level singletons.
"""

from __future__ import annotations

import pickle  # noqa: S403 - only used when the user opts in with PICKLE
from typing import Any, Protocol, runtime_checkable

import orjson

__all__ = ["BYTES", "JSON", "PICKLE", "STR", "Codec", "DecodeError", "codec_by_name"]


class DecodeError(ValueError):
    """Raised by a codec when bytes cannot be decoded (e.g. invalid JSON or UTF-8)."""


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

    @staticmethod
    def encode(value: Any) -> bytes:
        return str(value).encode()

    @staticmethod
    def decode(data: bytes) -> Any:
        return data.decode()


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
