"""Writing a new savepoint on Spark: :func:`write_savepoint` (bootstrap state).

Owns the bootstrap's Spark tasks (encoding rows, writing one key group's files and
manifest) and what every new savepoint is written with, which the rewrite reuses: the
key-group partitioner, the strictly increasing key check, a fresh savepoint id and the
descriptor, written last.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Iterator, Mapping
from typing import TYPE_CHECKING, Any

from state._spark.common import (
    TIME_STORE,
    App,
    OffsetSpec,
    _check_key_groups,
    _offsets_by_group,
    _run_job,
    _show_key,
)
from state.codecs import Codec
from state.partitioning import key_group
from state.savepoint import (
    SavepointError,
    SavepointStore,
    _check_name,
    build_descriptor,
    check_savepoint_id,
    key_group_manifest,
    new_savepoint_id,
    state_version,
)

if TYPE_CHECKING:
    from pyspark.sql import DataFrame


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
    version = state_version(schemas)
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
