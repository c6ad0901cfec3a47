r"""Savepoint tools on Spark: a State Processor API for lockgate savepoints.

Three operations on the savepoints of :mod:`state.savepoint`, run as Spark jobs so
that a savepoint of any size is read and written by the executors, one task per key
group (the driver only handles descriptors and manifests):

* :func:`read_savepoint` — a savepoint's stores as DataFrames
  (``key_group``, ``key``, ``value``; decoded ``key_text``/``value_json`` on request);
* :func:`write_savepoint` — bootstrap state: a complete, restorable savepoint built
  from a DataFrame of keys and values (Flink's ``BootstrapTransformation``);
* :func:`rewrite_savepoint` — the same state re-keyed to another key-group count
  (rescaling; :mod:`processors.rescale` copies the input topics to match).

Placement: an entry of a user store (value, list, map, reducing, aggregating state,
tables, window stores) is keyed by the record's raw key, the key as the app's key
codec encodes it, and lives in key group ``key_group(raw_key, P)``, Kafka's murmur2
partition of the key (:func:`processors._dsl.partitioner.key_group`). The time store
``lockgate.time`` holds timers keyed ``b"t" + kind + be64(time + 2**63) + raw_key``
(placed by their raw key) and one watermark record ``b"w"`` per key group.

Importing this module needs neither pyspark nor a Spark session; the functions import
pyspark when called. Executors need lockgate (and the codecs of the app, when they are
not built-in ones) importable, as for any PySpark job.
"""

from __future__ import annotations

import hashlib
import math
import re
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, TypeVar, overload

import orjson

from state.codecs import JSON, Codec
from state.partitioning import key_group
from state.primitives import StateHandle
from state.savepoint import (
    SavepointError,
    SavepointStore,
    StoreFile,
    _check_name,
    build_descriptor,
    check_savepoint_id,
    key_group_manifest,
    new_savepoint_id,
)

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession


class _Output(Protocol):
    @property
    def internal(self) -> bool: ...


class App(Protocol):
    """What the savepoint tools use of an app (a :class:`processors.App` is one).

    ``state`` never imports ``processors``: this says what is needed instead.
    """

    @property
    def name(self) -> str:
        """The app's declared name."""

    @property
    def key_codec(self) -> Codec:
        """The codec of the app's keys."""

    @property
    def stores(self) -> Mapping[str, StateHandle]:
        """The app's state stores by name."""

    @property
    def input_topics(self) -> tuple[str, ...]:
        """The app's input topics, in declaration order."""

    @property
    def outputs(self) -> Mapping[str, _Output]:
        """The app's outputs by topic (``internal``: read by another lockgate app)."""

    def run_as(self, name: str) -> None:
        """Name the app's per-app topics after ``name`` (its ``LOCKGATE_APP_NAME``)."""


__all__ = [
    "TIME_STORE",
    "OffsetSpec",
    "SavedApp",
    "check_rewritable",
    "load_saved_app",
    "merge_watermarks",
    "read_savepoint",
    "rewrite_savepoint",
    "write_savepoint",
]

#: The store of watermarks and timers (the same name as ``processors._task.time.TIME_STORE``).
TIME_STORE = "lockgate.time"
#: Where a restored app starts reading one input, given as one offset for every key group (an
#: int >= 0, or ``"earliest"`` for 0), a sequence with one offset per key group, or a
#: mapping key group -> offset covering every key group.
OffsetSpec = int | str | Sequence[int] | Mapping[int, int]

_WM_KEY = b"w"
_TIMER_PREFIX = b"t"
_TIMER_HEAD = 10  # b"t" + kind (1 byte) + be64(time + 2**63)
_NO_WATERMARK = -(2**63)
#: Fields of the watermark record that only inputs written by other lockgate apps fill;
#: they describe the upstream writers of one key group and cannot be merged.
_UPSTREAM_FIELDS = ("writers", "expected", "internal", "pending")
_WORKER_ERROR = re.compile(r"SavepointError: (.+)")

T = TypeVar("T")


# --------------------------------------------------------------------- helpers


def _json_default(value: Any) -> Any:
    """Return a JSON stand-in for a decoded value orjson has no type for."""
    if isinstance(value, bytes | bytearray | memoryview):
        return bytes(value).hex()
    if isinstance(value, set | frozenset | tuple):
        return list(value)
    return repr(value)


def _to_json(value: Any) -> str:
    return orjson.dumps(value, default=_json_default, option=orjson.OPT_NON_STR_KEYS).decode()


def _show_key(raw: bytes, codec: Codec | None) -> str:
    """A key for an error message: decoded when possible, else its bytes."""
    if codec is not None:
        try:
            return repr(codec.decode(raw))
        except Exception:  # noqa: BLE001, S110 - any codec error: show the bytes
            pass
    return repr(raw[:64])


def _check_key_groups(what: str, key_groups: object) -> int:
    if isinstance(key_groups, bool) or not isinstance(key_groups, int) or key_groups < 1:
        raise SavepointError(f"{what}: key_groups must be an int >= 1, got {key_groups!r}")
    return key_groups


def _offsets_by_group(
    offsets: Mapping[str, OffsetSpec], topics: Sequence[str], key_groups: int
) -> dict[int, dict[str, int]]:
    """Return key group -> {input topic -> offset} (see :data:`OffsetSpec`).

    Raises:
        SavepointError: an input has no offset, a topic is not an input, or an offset
            is not an int >= 0 or does not cover exactly key groups ``0..P-1``.
    """
    if not isinstance(offsets, Mapping):
        raise SavepointError(
            f"offsets must map each input topic to its start offsets, got {type(offsets).__name__}"
        )
    missing = [t for t in topics if t not in offsets]
    extra = sorted(t for t in offsets if t not in topics)
    if missing or extra:
        parts = []
        if missing:
            parts.append(f"no offsets for input topic(s) {', '.join(missing)}")
        if extra:
            parts.append(f"{', '.join(extra)} is not an input of the app")
        raise SavepointError(
            f"offsets: {'; '.join(parts)} (the app's inputs: {', '.join(topics)}; a restore "
            "needs a start offset for every input)"
        )

    def checked(topic: str, value: object) -> int:
        if value == "earliest":
            return 0
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise SavepointError(
                f"offsets[{topic!r}]: {value!r} is not an offset (an int >= 0 or 'earliest')"
            )
        return value

    out: dict[int, dict[str, int]] = {g: {} for g in range(key_groups)}
    for topic in topics:
        spec = offsets[topic]
        if isinstance(spec, int | str):
            value = checked(topic, spec)
            for g in range(key_groups):
                out[g][topic] = value
        elif isinstance(spec, Mapping):
            if sorted(spec) != list(range(key_groups)):
                raise SavepointError(
                    f"offsets[{topic!r}] has key groups {sorted(spec)}, expected exactly "
                    f"0..{key_groups - 1} (key_groups={key_groups})"
                )
            for g in range(key_groups):
                out[g][topic] = checked(topic, spec[g])
        elif isinstance(spec, Sequence):
            if len(spec) != key_groups:
                raise SavepointError(
                    f"offsets[{topic!r}] has {len(spec)} offsets, expected one per key group "
                    f"(key_groups={key_groups})"
                )
            for g in range(key_groups):
                out[g][topic] = checked(topic, spec[g])
        else:
            raise SavepointError(f"offsets[{topic!r}]: unsupported value {spec!r}")
    return out


def _state_version(schemas: Mapping[str, Mapping[str, str]]) -> str:
    """The runtime's state version of these store schemas (``SavepointMixin``)."""
    return hashlib.sha256(orjson.dumps(dict(sorted(schemas.items())))).hexdigest()[:16]


def _run_job(what: str, action: Callable[[], T]) -> T:
    """Run a Spark action; a :class:`SavepointError` raised in a task is raised here.

    Spark reports a task's exception as its own error with the worker's traceback in
    the message; the lockgate message is taken out of it so callers see one clear line.
    """
    try:
        return action()
    except SavepointError:
        raise
    except Exception as exc:
        found = _WORKER_ERROR.findall(str(exc))
        if found:
            raise SavepointError(f"{what}: {found[-1].strip()}") from exc
        raise


def _spark_context(spark: Any) -> Any:
    return spark.sparkContext


# ------------------------------------------------------------ a saved app


@dataclass(frozen=True)
class SavedApp:
    """One app of a savepoint, as read by :func:`load_saved_app`.

    Attributes:
        savepoint: the savepoint id.
        app: the app's name in it.
        descriptor: the whole ``_savepoint.json``.
        info: the descriptor's entry of the app.
        key_groups: P.
        manifests: key group -> its manifest (every group ``0..P-1``, none failed).
        stores: store name -> ``{"kind", "codec"}``, plus ``operator`` (and
            ``timers``) for a window or interval-join store saved with its operator id
            (a rewrite keeps them).
    """

    savepoint: str
    app: str
    descriptor: dict[str, Any]
    info: dict[str, Any]
    key_groups: int
    manifests: dict[int, dict[str, Any]]
    stores: dict[str, dict[str, str]]

    @property
    def inputs(self) -> list[str]:
        """The app's input topics (the registry's list, else the manifests' offsets)."""
        listed = [str(t) for t in self.info.get("inputs") or ()]
        return listed or sorted(self.manifests[0].get("offsets") or {})

    def cut(self, topic: str) -> dict[int, int]:
        """Key group (= partition of ``topic``) -> the savepoint's offset in ``topic``.

        Raises:
            SavepointError: a key group has no offset for ``topic``.
        """
        out = {}
        for g, m in sorted(self.manifests.items()):
            offset = (m.get("offsets") or {}).get(topic)
            if not isinstance(offset, int):
                raise SavepointError(
                    f"savepoint {self.savepoint}: key group {g} of {self.app!r} has no offset "
                    f"for {topic!r}"
                )
            out[g] = offset
        return out

    def files(self, store: str) -> dict[int, dict[str, Any]]:
        """Key group -> the manifest entry of ``store``'s file (groups that have one)."""
        out = {}
        for g, m in self.manifests.items():
            entry = (m.get("stores") or {}).get(store)
            if entry is not None:
                out[g] = StoreFile.from_dict(entry).to_dict()
        return out


def load_saved_app(location: SavepointStore, savepoint_id: str, app: str) -> SavedApp:
    """Read the descriptor and every key group's manifest of ``app`` in a savepoint.

    Raises:
        SavepointError: no such savepoint or app, a manifest is missing or records a
            failure, or the key groups disagree on a store's kind or codec.
    """
    check_savepoint_id(savepoint_id)
    descriptor = location.read_descriptor(savepoint_id)
    apps = descriptor.get("apps") or {}
    if app not in apps:
        raise SavepointError(
            f"savepoint {savepoint_id} has no app {app!r} (it has "
            f"{', '.join(sorted(apps)) or 'none'})"
        )
    info = dict(apps[app])
    key_groups = info.get("key_groups")
    if not isinstance(key_groups, int) or key_groups < 1:
        raise SavepointError(
            f"savepoint {savepoint_id}: app {app!r} has no valid key_groups ({key_groups!r})"
        )
    committed = {
        m.get("key_group"): dict(m) for m in info.get("manifests") or () if isinstance(m, dict)
    }
    manifests: dict[int, dict[str, Any]] = {}
    for g in range(key_groups):
        manifest = committed.get(g) or location.read_manifest(savepoint_id, app, g)
        if manifest.get("error"):
            raise SavepointError(
                f"savepoint {savepoint_id}: key group {g} of {app!r} failed: {manifest['error']}"
            )
        manifests[g] = manifest
    stores: dict[str, dict[str, str]] = {}
    for g, m in manifests.items():
        for name, entry in sorted((m.get("stores") or {}).items()):
            schema = {"kind": str(entry.get("kind")), "codec": str(entry.get("codec"))}
            schema.update({f: str(entry[f]) for f in ("operator", "timers") if entry.get(f)})
            if stores.setdefault(name, schema) != schema:
                raise SavepointError(
                    f"savepoint {savepoint_id}: store {name!r} of {app!r} is "
                    f"{stores[name]['kind']}/{stores[name]['codec']} in one key group and "
                    f"{schema['kind']}/{schema['codec']} in key group {g}"
                )
    return SavedApp(savepoint_id, app, descriptor, info, key_groups, manifests, stores)


# ------------------------------------------------------------------ reading


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


# ------------------------------------------------------------------ writing


def _plain(value: Any) -> Any:
    """A Spark value as a plain Python value (Row -> dict, bytearray -> bytes)."""
    if isinstance(value, tuple) and hasattr(value, "asDict"):
        return {k: _plain(v) for k, v in value.asDict().items()}
    if isinstance(value, bytearray):
        return bytes(value)
    if isinstance(value, list):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    return value


class _Encoder:
    """Spark task: a row (key, value) -> ((key group, raw key), encoded value)."""

    def __init__(self, key_codec: Codec, value_codec: Codec, store: str, key_groups: int) -> None:
        self.key_codec = key_codec
        self.value_codec = value_codec
        self.store = store
        self.key_groups = key_groups

    def __call__(self, row: Any) -> tuple[tuple[int, bytes], bytes]:

        key, value = _plain(row[0]), _plain(row[1])
        if key is None:
            raise SavepointError(f"store {self.store!r}: a row has a null key")
        try:
            raw = self.key_codec.encode(key)
        except Exception as exc:
            raise SavepointError(
                f"store {self.store!r}: cannot encode key {key!r} with the key codec "
                f"{self.key_codec.name!r} ({type(exc).__name__}: {exc})"
            ) from exc
        if value is None:
            raise SavepointError(
                f"store {self.store!r}: key {key!r} has a null value (leave the row out: an "
                "absent key has no state)"
            )
        try:
            encoded = self.value_codec.encode(value)
        except Exception as exc:
            raise SavepointError(
                f"store {self.store!r}: cannot encode the value of key {key!r} with codec "
                f"{self.value_codec.name!r} ({type(exc).__name__}: {exc})"
            ) from exc
        return (key_group(raw, self.key_groups), bytes(raw)), bytes(encoded)


def _first(key: tuple[int, Any]) -> int:
    """partitionFunc: the key group in front of the sort key."""
    return key[0]


def _strictly_increasing(
    items: Iterable[tuple[bytes, bytes]], store: str, g: int, key_codec: Codec | None
) -> Iterator[tuple[bytes, bytes]]:
    """Yield ``items``; raise :class:`SavepointError` on a repeated key."""
    prev: bytes | None = None
    for key, value in items:
        if prev is not None and key <= prev:
            if key == prev:
                raise SavepointError(
                    f"duplicate key {_show_key(key, key_codec)} in store {store!r} (key group "
                    f"{g}): a store holds one value per key; aggregate the rows per key first"
                )
            raise SavepointError(f"store {store!r} key group {g}: keys out of order")
        prev = key
        yield key, value


class _BootstrapWriter:
    """Spark task: write every store file and the manifest of one key group."""

    def __init__(
        self,
        url: str,
        savepoint_id: str,
        app: str,
        store: str,
        schemas: dict[str, dict[str, str]],
        offsets: dict[int, dict[str, int]],
        checkpoint: int,
        state_version: str,
        key_codec: Codec,
    ) -> None:
        self.url = url
        self.savepoint_id = savepoint_id
        self.app = app
        self.store = store
        self.schemas = schemas
        self.offsets = offsets
        self.checkpoint = checkpoint
        self.state_version = state_version
        self.key_codec = key_codec

    @staticmethod
    def _entries(
        g: int, rows: Iterable[tuple[tuple[int, bytes], bytes]]
    ) -> Iterator[tuple[bytes, bytes]]:
        for (kg, raw), value in rows:
            if kg != g:  # the partitioner put it elsewhere: a bug, never user data
                raise SavepointError(f"internal error: key group {kg} in partition {g}")
            yield raw, value

    def __call__(
        self, g: int, rows: Iterable[tuple[tuple[int, bytes], bytes]]
    ) -> Iterator[dict[str, Any]]:
        location = SavepointStore(self.url)
        stores: dict[str, Any] = {}
        for name, schema in sorted(self.schemas.items()):
            items: Iterable[tuple[bytes, bytes]] = ()
            if name == self.store:
                items = _strictly_increasing(self._entries(g, rows), name, g, self.key_codec)
            written = location.write_store(self.savepoint_id, self.app, g, name, items)
            stores[name] = {**schema, **written.to_dict()}
        manifest = key_group_manifest(
            self.savepoint_id,
            self.app,
            g,
            checkpoint=self.checkpoint,
            offsets=self.offsets[g],
            stores=stores,
            state_version=self.state_version,
            instance="spark-bootstrap",
        )
        location.write_manifest(self.savepoint_id, self.app, g, manifest)
        yield manifest


def _fresh_id(location: SavepointStore, savepoint_id: str | None) -> str:
    sp_id = check_savepoint_id(savepoint_id) if savepoint_id is not None else new_savepoint_id()
    if sp_id in location.list_savepoints():
        raise SavepointError(f"savepoint {sp_id} already exists under {location.url}")
    return sp_id


def _write_descriptor(
    location: SavepointStore,
    savepoint_id: str,
    app: str,
    registration: dict[str, Any],
    manifests: list[dict[str, Any]],
    checkpoint: int,
    stop: bool,
    extra: dict[str, Any],
) -> None:
    """Write the descriptor (the layout of :func:`state.savepoint.build_descriptor`)."""
    by_group = {int(m["key_group"]): m for m in manifests}
    now = int(time.time() * 1000)
    descriptor = build_descriptor(
        savepoint_id, checkpoint, stop, now, now, {app: registration}, {app: by_group}, [app]
    )
    descriptor.update(extra)
    location.write_descriptor(savepoint_id, descriptor)


def write_savepoint(
    df: DataFrame,
    url: str,
    app: App,
    store: str,
    *,
    key_groups: int,
    offsets: Mapping[str, OffsetSpec],
    app_name: str | None = None,
    savepoint_id: str | None = None,
    checkpoint: int | None = None,
) -> str:
    """Write a complete savepoint of ``app`` whose ``store`` holds ``df``'s rows.

    Bootstraps state (Flink's ``BootstrapTransformation``): start the app with
    ``lockgate run MODULE:APP --from-savepoint ID`` (``LOCKGATE_SAVEPOINT_DIR=url``) on
    inputs with ``key_groups`` partitions and every key group starts with this state
    at ``offsets``. Each row is placed in key group ``key_group(raw_key, key_groups)``
    (murmur2, as Kafka's producers place the key); one Spark task per key group sorts
    its keys, writes a file for every store the app declares (empty for the others,
    so the restore's compatibility check passes) and its manifest; the driver writes
    the descriptor last, so an interrupted write leaves no listed savepoint.

    Accepted values: ``key`` is passed to the app's key codec (``STR`` encodes
    ``str(key)``: strings, or numbers as their text; ``BYTES`` takes a binary column;
    ``JSON`` any JSON value) and ``value`` to the store's codec as Spark hands it to
    Python: strings, numbers, booleans, arrays (lists), maps (dicts), structs (dicts
    of their fields), binary (bytes). Use the form the state handle stores:
    ``value_state`` the value, ``list_state`` a list, ``map_state`` a dict; a store
    with ``ttl_ms`` stores ``[expires_at_ms, value]``.

    Args:
        df: a DataFrame with columns ``key`` and ``value`` (others are ignored).
        url: the savepoint root (``LOCKGATE_SAVEPOINT_DIR``), written by the executors.
        app: the app's definition (its key codec, stores and inputs).
        store: the store to fill (not ``lockgate.time``).
        key_groups: P, the partition count of the inputs the app will run on.
        offsets: input topic -> where each key group starts reading it
            (:data:`OffsetSpec`: ``"earliest"``/0 for all, an int, or one per key
            group); every input of ``app`` needs one.
        app_name: the name the app runs under (``LOCKGATE_APP_NAME``); ``app.name``
            by default.
        savepoint_id: the id to write (:func:`new_savepoint_id` by default).
        checkpoint: the checkpoint id recorded (ms-scale; now by default).

    Returns:
        The savepoint id.

    Raises:
        SavepointError: a bad argument (unknown store, ``key_groups`` < 1, offsets not
            covering every input and key group, missing columns, an existing id); a
            row with a null key or value, a key or value its codec cannot encode, or a
            key given twice (the message names the key); or a file cannot be written.
    """
    name = app_name if app_name is not None else app.name
    location = SavepointStore(url)
    _check_name("app", name)
    app.run_as(name)  # its per-app late topics, in the registration's outputs
    handles = app.stores
    if store == TIME_STORE:
        raise SavepointError(
            f"{TIME_STORE} (watermarks and timers) cannot be bootstrapped: write user stores"
        )
    if store not in handles:
        raise SavepointError(
            f"app {app.name!r} has no store {store!r} (it declares "
            f"{', '.join(sorted(handles)) or 'no store'})"
        )
    p = _check_key_groups("write_savepoint", key_groups)
    topics = list(app.input_topics)
    by_group = _offsets_by_group(offsets, topics, p)
    missing = [c for c in ("key", "value") if c not in df.columns]
    if missing:
        raise SavepointError(
            f"the DataFrame has no column {', '.join(missing)} (it has {', '.join(df.columns)})"
        )
    schemas = {
        n: {"kind": h.spec.kind, "codec": h.spec.codec.name} for n, h in sorted(handles.items())
    }
    version = _state_version(schemas)
    sp_id = _fresh_id(location, savepoint_id)
    ckpt = int(time.time() * 1000) if checkpoint is None else int(checkpoint)
    key_codec = app.key_codec
    encoder = _Encoder(key_codec, handles[store].spec.codec, store, p)
    writer = _BootstrapWriter(url, sp_id, name, store, schemas, by_group, ckpt, version, key_codec)
    rdd = (
        df.select("key", "value")
        .rdd.map(encoder)
        .repartitionAndSortWithinPartitions(p, _first)
        .mapPartitionsWithIndex(writer)
    )
    manifests: list[dict[str, Any]] = _run_job(f"savepoint {sp_id}", rdd.collect)
    registration = {
        "inputs": topics,
        "outputs": sorted(app.outputs),
        "internal_outputs": sorted(t for t, s in app.outputs.items() if s.internal),
        "stores": schemas,
        "state_version": version,
    }
    _write_descriptor(
        location, sp_id, name, registration, manifests, ckpt, False, {"bootstrap": store}
    )
    return sp_id


# ---------------------------------------------------------------- rewriting


def _contributors(g: int, old: int, new: int) -> list[int]:
    """The new key groups that can receive keys of old key group ``g``.

    ``h % old == g`` and ``h % new == g2`` have a common solution exactly when
    ``g == g2 (mod gcd(old, new))`` (e.g. each new group has one old group when ``new``
    is a multiple of ``old``).
    """
    d = math.gcd(old, new)
    return [g2 for g2 in range(new) if g2 % d == g % d]


def merge_watermarks(
    records: Sequence[dict[str, Any]], expected: int, topics: Mapping[str, str]
) -> dict[str, Any] | None:
    """Return the conservative merge of the watermark records of several key groups.

    ``wm`` is the lowest of their watermarks and ``max`` (the highest event time seen
    per input) the lowest per input, renamed by ``topics``; an input some record has no
    entry for is left out (never seen there: the lowest). With fewer than ``expected``
    records some key group never saw event time (its watermark is the lowest
    possible): the result is ``None``, no record.

    Args:
        records: the decoded ``b"w"`` records (``processors._task.time``) of the old key
            groups whose keys the new key group can receive.
        expected: how many old key groups that is.
        topics: old input topic -> new name.

    Returns:
        The new key group's watermark record, or ``None`` for none.

    Raises:
        SavepointError: a record has upstream-writer fields (an input written by other
            lockgate apps): they describe one key group's writers and have no merge.
    """
    for rec in records:
        used = [f for f in _UPSTREAM_FIELDS if rec.get(f)]
        if used:
            raise SavepointError(
                f"the watermark record has upstream-writer state ({', '.join(used)}): an "
                "input written by another lockgate app cannot be re-keyed"
            )
    if not records or len(records) < expected:
        return None
    wm = min(int(r.get("wm", _NO_WATERMARK)) for r in records)
    common = set.intersection(*(set(r.get("max") or {}) for r in records))
    highest = {topics.get(t, t): min(int(r["max"][t]) for r in records) for t in sorted(common)}
    return {"wm": wm, "max": highest, "writers": {}, "expected": {}, "internal": [], "pending": []}


class _Rekeyer:
    """Spark task: every entry of one old key group, keyed for its new key group.

    Yields ``((new group, store, key), (old group, value))``; the watermark record goes
    to every new group that can receive keys of the old one (:func:`_contributors`).
    """

    def __init__(
        self,
        url: str,
        savepoint_id: str,
        app: str,
        files: dict[str, dict[int, dict[str, Any]]],
        old: int,
        new: int,
    ) -> None:
        self.url = url
        self.savepoint_id = savepoint_id
        self.app = app
        self.files = files
        self.old = old
        self.new = new

    def __call__(self, g: int) -> Iterator[tuple[tuple[int, str, bytes], tuple[int, bytes]]]:

        location = SavepointStore(self.url)
        old, new = self.old, self.new
        for store, by_group in sorted(self.files.items()):
            entry = by_group.get(g)
            if entry is None:
                continue
            expected = StoreFile.from_dict(entry)
            for key, value in location.read_store(self.savepoint_id, self.app, g, store, expected):
                raw = key
                if store == TIME_STORE:
                    if key == _WM_KEY:
                        for g2 in _contributors(g, old, new):
                            yield (g2, store, key), (g, value)
                        continue
                    if not key.startswith(_TIMER_PREFIX) or len(key) < _TIMER_HEAD:
                        raise SavepointError(
                            f"{TIME_STORE} key group {g}: unexpected key {key[:32]!r}"
                        )
                    raw = key[_TIMER_HEAD:]
                if key_group(raw, old) != g:
                    raise SavepointError(
                        f"store {store!r}: key {raw[:64]!r} is in key group {g} but Kafka's "
                        f"murmur2 places it in {key_group(raw, old)} of {old}: the inputs were "
                        "not partitioned by murmur2 of the key (e.g. librdkafka's default "
                        "partitioner); a rescale needs murmur2-partitioned inputs"
                    )
                yield (key_group(raw, new), store, key), (g, value)


class _RekeyWriter:
    """Spark task: write the files and manifest of one new key group."""

    def __init__(
        self,
        url: str,
        savepoint_id: str,
        app: str,
        schemas: dict[str, dict[str, str]],
        offsets: dict[int, dict[str, int]],
        checkpoint: int,
        state_version: str,
        old: int,
        topics: dict[str, str],
        source: str,
    ) -> None:
        self.url = url
        self.savepoint_id = savepoint_id
        self.app = app
        self.schemas = schemas
        self.offsets = offsets
        self.checkpoint = checkpoint
        self.state_version = state_version
        self.old = old
        self.topics = topics
        self.source = source

    def _store_items(
        self, g: int, store: str, head: list[Any], rows: Iterator[Any]
    ) -> Iterator[tuple[bytes, bytes]]:
        """Yield the entries of ``store`` from ``rows``, leaving the next one in ``head``."""
        watermarks: list[dict[str, Any]] = []
        while head and head[0][0][1] == store:
            (kg, _, key), (_, value) = head[0]
            if kg != g:
                raise SavepointError(f"internal error: key group {kg} in partition {g}")
            if store == TIME_STORE and key == _WM_KEY:
                watermarks.append(orjson.loads(value))
            else:
                yield key, value
            following = next(rows, None)
            if following is None:
                head.clear()
            else:
                head[0] = following
        if watermarks:
            new = len(self.offsets)  # one entry per new key group
            expected = self.old // math.gcd(self.old, new)  # old groups that reach g
            merged = merge_watermarks(watermarks, expected, self.topics)
            if merged is not None:
                yield _WM_KEY, orjson.dumps(merged)

    def __call__(self, g: int, partition: Iterable[Any]) -> Iterator[dict[str, Any]]:
        location = SavepointStore(self.url)
        rows = iter(partition)
        first = next(rows, None)
        head: list[Any] = [] if first is None else [first]
        stores: dict[str, Any] = {}
        for name, schema in sorted(self.schemas.items()):
            items = _strictly_increasing(self._store_items(g, name, head, rows), name, g, None)
            written = location.write_store(self.savepoint_id, self.app, g, name, items)
            stores[name] = {**schema, **written.to_dict()}
        if head:
            raise SavepointError(
                f"internal error: store {head[0][0][1]!r} left over in key group {g}"
            )
        manifest = key_group_manifest(
            self.savepoint_id,
            self.app,
            g,
            checkpoint=self.checkpoint,
            offsets=self.offsets[g],
            stores=stores,
            state_version=self.state_version,
            instance="spark-rewrite",
            rewritten_from=self.source,
        )
        location.write_manifest(self.savepoint_id, self.app, g, manifest)
        yield manifest


def check_rewritable(saved: SavedApp) -> None:
    """Refuse what a re-keying cannot carry over (see :func:`rewrite_savepoint`).

    Raises:
        SavepointError: the app reads or writes internal topics of lockgate apps, or
            a key group was saved during a barrier alignment.
    """
    where = f"savepoint {saved.savepoint}: app {saved.app!r}"
    if saved.info.get("source") is False:
        raise SavepointError(
            f"{where} reads internal topics of other lockgate apps: only apps whose inputs "
            "are ordinary topics can be rescaled"
        )
    if saved.info.get("internal_outputs"):
        raise SavepointError(
            f"{where} writes internal topics ({', '.join(saved.info['internal_outputs'])}) "
            "that other lockgate apps read: rescaling one app of a pipeline is not supported"
        )
    for g, m in saved.manifests.items():
        if m.get("align"):
            raise SavepointError(f"{where}: key group {g} was saved during a barrier alignment")


def rewrite_savepoint(
    spark: SparkSession,
    url: str,
    savepoint_id: str,
    app_name: str,
    key_groups: int,
    *,
    offsets: Mapping[str, OffsetSpec],
    topics: Mapping[str, str] | None = None,
    new_app_name: str | None = None,
    new_savepoint_id: str | None = None,
) -> str:
    """Write a new savepoint with ``app_name``'s state re-keyed to ``key_groups`` groups.

    Every entry of every store moves to key group ``key_group(raw_key, key_groups)``
    (timers of ``lockgate.time`` by the raw key inside their key). One Spark task per
    old key group reads (and verifies) its files, one per new key group writes its
    files and manifest; the driver writes the descriptor last. The source savepoint is
    only read.

    The watermark record of each new key group is the conservative merge of the old
    groups whose keys it can receive (:func:`merge_watermarks`): the lowest watermark,
    and per input the lowest highest-event-time seen. So no timer fires early and no
    record that was on time becomes late; records that were already late for their old
    key group may be on time again, up to the old watermark (as after a Flink restore,
    where watermarks start over). The merge is not sound for the fields that track
    upstream lockgate writers (inputs that are internal topics): such savepoints are
    refused, as are apps that read or write internal topics at all, and key groups
    saved during a barrier alignment.

    Args:
        spark: the Spark session.
        url: the savepoint root (``LOCKGATE_SAVEPOINT_DIR``).
        savepoint_id: the source savepoint.
        app_name: the app in it to rewrite (the only app in the new savepoint).
        key_groups: P', the new key-group count (the partition count of the inputs
            the app will run on).
        offsets: new input topic -> where each new key group starts reading it
            (:data:`OffsetSpec`), e.g. the cut offsets returned by
            :func:`processors.rescale.copy_topic_repartitioned`.
        topics: old input topic -> new one (the copies); unlisted inputs keep their
            name. The manifests' offsets and the watermark record use the new names.
        new_app_name: the name the app will run under (``LOCKGATE_APP_NAME``); the
            old one by default. A new name gets new internal topics; the old name's
            changelogs and control topic have the old partition count.
        new_savepoint_id: the id to write (a new one by default).

    Returns:
        The new savepoint id.

    Raises:
        SavepointError: no such savepoint or app, a key group failed it, the app
            reads or writes internal topics, ``key_groups`` < 1, the offsets do not
            cover every (renamed) input and new key group, a file is corrupt, or a
            key is not in the key group murmur2 places it in (inputs not partitioned
            by murmur2).
    """
    location = SavepointStore(url)
    saved = load_saved_app(location, savepoint_id, app_name)
    check_rewritable(saved)
    p2 = _check_key_groups("rewrite_savepoint", key_groups)
    renames = dict(topics or {})
    unknown = sorted(t for t in renames if t not in saved.inputs)
    if unknown:
        raise SavepointError(
            f"topics: {', '.join(unknown)} is not an input of {app_name!r} in savepoint "
            f"{savepoint_id} (its inputs: {', '.join(saved.inputs)})"
        )
    new_inputs = [renames.get(t, t) for t in saved.inputs]
    by_group = _offsets_by_group(offsets, new_inputs, p2)
    name = new_app_name if new_app_name is not None else app_name
    _check_name("app", name)
    sp_id = _fresh_id(location, new_savepoint_id)
    checkpoint = max(int(m.get("checkpoint") or 0) for m in saved.manifests.values())
    version = str(saved.info.get("state_version") or _state_version(saved.stores))
    files = {store: saved.files(store) for store in saved.stores}
    rekeyer = _Rekeyer(url, savepoint_id, app_name, files, saved.key_groups, p2)
    writer = _RekeyWriter(
        url,
        sp_id,
        name,
        saved.stores,
        by_group,
        checkpoint,
        version,
        saved.key_groups,
        renames,
        savepoint_id,
    )
    sc = _spark_context(spark)
    rdd = (
        sc.parallelize(list(range(saved.key_groups)), saved.key_groups)
        .flatMap(rekeyer)
        .repartitionAndSortWithinPartitions(p2, _first)
        .mapPartitionsWithIndex(writer)
    )
    manifests: list[dict[str, Any]] = _run_job(f"savepoint {sp_id}", rdd.collect)
    registration = {
        "inputs": new_inputs,
        "outputs": list(saved.info.get("outputs") or ()),
        "internal_outputs": [],
        "stores": saved.stores,
        "state_version": version,
    }
    _write_descriptor(
        location,
        sp_id,
        name,
        registration,
        manifests,
        int(saved.descriptor.get("checkpoint") or checkpoint),
        bool(saved.descriptor.get("stop")),
        {
            "rewritten_from": {
                "savepoint": savepoint_id,
                "app": app_name,
                "key_groups": saved.key_groups,
                "topics": renames,
            }
        },
    )
    return sp_id
