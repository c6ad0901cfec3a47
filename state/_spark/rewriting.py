"""Re-keying a savepoint to another key-group count: :func:`rewrite_savepoint`.

Owns the Spark tasks that read each old key group and write each new one, the
conservative watermark merge (:func:`merge_watermarks`) and what a re-keying refuses
(:func:`check_rewritable`).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import orjson

from state._spark.common import (
    _NO_WATERMARK,
    _TIMER_HEAD,
    _TIMER_PREFIX,
    _UPSTREAM_FIELDS,
    _WM_KEY,
    TIME_STORE,
    OffsetSpec,
    _check_key_groups,
    _offsets_by_group,
    _run_job,
    _spark_context,
)
from state._spark.saved import SavedApp, load_saved_app
from state._spark.writing import _first, _fresh_id, _strictly_increasing, _write_descriptor
from state.partitioning import key_group
from state.savepoint import (
    SavepointError,
    SavepointStore,
    StoreFile,
    _check_name,
    key_group_manifest,
    state_version,
)

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


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
    version = str(saved.info.get("state_version") or state_version(saved.stores))
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
