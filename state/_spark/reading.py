"""Reading a savepoint's stores as DataFrames: :func:`read_savepoint`.

One Spark task per key group and store (:class:`_StoreReader`) verifies and reads the
store file, optionally decoding keys and values with the app's codecs.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any, overload

from state._spark.common import (
    _TIMER_HEAD,
    _TIMER_PREFIX,
    TIME_STORE,
    App,
    _spark_context,
    _to_json,
)
from state._spark.saved import SavedApp, load_saved_app
from state.codecs import JSON, Codec
from state.savepoint import SavepointError, SavepointStore, StoreFile

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession


class _StoreReader:
    """Spark task: the rows of one store in one key group (files verified first)."""

    def __init__(
        self,
        url: str,
        savepoint_id: str,
        app: str,
        store: str,
        files: dict[int, dict[str, Any]],
        key_codec: Codec | None,
        value_codec: Codec | None,
    ) -> None:
        self.url = url
        self.savepoint_id = savepoint_id
        self.app = app
        self.store = store
        self.files = files
        self.key_codec = key_codec
        self.value_codec = value_codec

    def __call__(self, g: int) -> Iterator[tuple[Any, ...]]:
        entry = self.files.get(g)
        if entry is None:
            return
        location = SavepointStore(self.url)
        rows = location.read_store(
            self.savepoint_id, self.app, g, self.store, StoreFile.from_dict(entry)
        )
        key_codec, value_codec = self.key_codec, self.value_codec
        if key_codec is None or value_codec is None:
            for key, value in rows:
                yield g, key, value
            return
        for key, value in rows:
            raw: bytes | None = key
            if self.store == TIME_STORE:
                raw = key[_TIMER_HEAD:] if key.startswith(_TIMER_PREFIX) else None
            try:
                text = None
                if raw is not None:
                    decoded = key_codec.decode(raw)
                    text = decoded if isinstance(decoded, str) else _to_json(decoded)
                value_json = _to_json(value_codec.decode(value))
            except Exception as exc:
                raise SavepointError(
                    f"store {self.store!r} key group {g}: cannot decode the entry of key "
                    f"{key[:64]!r} with the app's codecs ({type(exc).__name__}: {exc})"
                ) from exc
            yield g, key, value, text, value_json


def _decoders(saved: SavedApp, store: str, app: App) -> tuple[Codec, Codec]:
    """The key codec and ``store``'s value codec of ``app`` (checked against the save)."""
    if store == TIME_STORE:
        return app.key_codec, JSON
    handles = app.stores
    handle = handles.get(store)
    if handle is None:
        raise SavepointError(
            f"cannot decode store {store!r}: the app {app.name!r} given to decode= does not "
            f"declare it (it declares {', '.join(sorted(handles)) or 'no store'})"
        )
    saved_codec = saved.stores[store]["codec"]
    if handle.spec.codec.name != saved_codec:
        raise SavepointError(
            f"cannot decode store {store!r}: saved with codec {saved_codec!r}, the app given "
            f"to decode= declares {handle.spec.codec.name!r}"
        )
    return app.key_codec, handle.spec.codec


@overload
def read_savepoint(
    spark: SparkSession,
    url: str,
    savepoint_id: str,
    app: str,
    *,
    store: str,
    decode: App | None = None,
) -> DataFrame: ...


@overload
def read_savepoint(
    spark: SparkSession,
    url: str,
    savepoint_id: str,
    app: str,
    *,
    store: None = None,
    decode: App | None = None,
) -> dict[str, DataFrame]: ...


def read_savepoint(
    spark: SparkSession,
    url: str,
    savepoint_id: str,
    app: str,
    *,
    store: str | None = None,
    decode: App | None = None,
) -> DataFrame | dict[str, DataFrame]:
    """Return the stores of ``app`` in a savepoint as DataFrames.

    The descriptor and manifests are read on the driver; the store files are read by
    Spark tasks, one per key group and store, each verifying its file's size, SHA-256
    and entry count (:meth:`SavepointStore.read_store`) before yielding a row. The
    DataFrames are lazy: files are read when an action runs.

    Columns: ``key_group`` (int), ``key`` (binary: the raw key, as the app's key codec
    encoded it; for ``lockgate.time`` the timer key, or ``b"w"`` for the key group's
    watermark record) and ``value`` (binary: the stored bytes). With ``decode`` also
    ``key_text`` (the decoded key: the string itself for a str key, JSON otherwise;
    for ``lockgate.time`` the key the timer belongs to, null for the watermark record)
    and ``value_json`` (the store codec's decoded value as JSON; bytes as hex strings,
    tuples and sets as lists, other non-JSON values as their ``repr``). A store with a
    TTL stores ``[expires_at_ms, value]``.

    Args:
        spark: the Spark session.
        url: the savepoint root (``LOCKGATE_SAVEPOINT_DIR``: a local path, ``file://``
            or fsspec URL, reachable from the executors).
        savepoint_id: the savepoint.
        app: the app's name in the savepoint.
        store: only this store (returns one DataFrame).
        decode: the app's definition, to decode keys and values with its codecs.

    Returns:
        One DataFrame when ``store`` is given, else store name -> DataFrame for every
        store in the savepoint.

    Raises:
        SavepointError: no such savepoint, app or store, a key group failed the
            savepoint, or ``decode`` declares ``store`` with another codec. A file that
            is missing or corrupt, or an entry the codecs cannot decode, raises when
            the DataFrame is evaluated (Spark's error names it).
    """
    from pyspark.sql.types import BinaryType, IntegerType, StringType, StructField, StructType

    location = SavepointStore(url)
    saved = load_saved_app(location, savepoint_id, app)
    if store is not None and store not in saved.stores:
        raise SavepointError(
            f"savepoint {savepoint_id}: app {app!r} has no store {store!r} (it has "
            f"{', '.join(sorted(saved.stores)) or 'none'})"
        )
    fields = [
        StructField("key_group", IntegerType(), False),
        StructField("key", BinaryType(), False),
        StructField("value", BinaryType(), False),
    ]
    if decode is not None:
        fields += [
            StructField("key_text", StringType(), True),
            StructField("value_json", StringType(), False),
        ]
    schema = StructType(fields)
    sc = _spark_context(spark)
    frames: dict[str, DataFrame] = {}
    for name in [store] if store is not None else sorted(saved.stores):
        key_codec, value_codec = (
            _decoders(saved, name, decode) if decode is not None else (None, None)
        )
        reader = _StoreReader(
            url, savepoint_id, app, name, saved.files(name), key_codec, value_codec
        )
        groups = list(range(saved.key_groups))
        rdd = sc.parallelize(groups, len(groups)).flatMap(reader)
        frames[name] = spark.createDataFrame(rdd, schema)
    if store is not None:
        return frames[store]
    return frames
