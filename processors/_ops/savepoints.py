"""The savepoint commands: trigger, cancel, list and describe (``lockgate savepoint``).

:func:`trigger_savepoint` writes the request to the source apps' control topics, waits
for every key group's manifest and writes the descriptor to the savepoint store;
:func:`cancel_savepoint` releases the key groups a stop-savepoint halted, and
:func:`cancel_halted` does so for whatever savepoint the key groups are halted at (read
from the checkpoint catalog: no id to name). The listing and description read the store
of ``LOCKGATE_SAVEPOINT_DIR`` (:func:`open_store`).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from processors._checkpoint.control_topics import REGISTRY_TOPIC, cancel_key, control_topic
from processors._config.settings import Settings
from processors._ops.client import Ops
from processors._ops.errors import OpsError
from processors._ops.pipelines import resolve_apps, source_apps
from processors._ops.savepoint_requests import choose_checkpoint, savepoint_request
from state.savepoint import (
    SavepointError,
    SavepointStore,
    build_descriptor,
    check_savepoint_id,
    ms_to_iso,
    new_savepoint_id,
)


def _now_ms() -> int:
    return time.time_ns() // 1_000_000


def trigger_savepoint(
    ops: Ops,
    store: SavepointStore,
    apps: Sequence[str] = (),
    pipeline: str | None = None,
    stop: bool = False,
    timeout_s: float = 120.0,
    progress: Callable[[str], None] = lambda _line: None,
) -> dict[str, Any]:
    """Take a savepoint of the apps and write its descriptor; return the descriptor.

    Writes the request to the source apps' control topics, waits for every key group's
    manifest (committed) and writes ``_savepoint.json`` to ``store``.

    Raises:
        OpsError: exit code 2 for usage problems (see :func:`resolve_apps`), 1 when a
            key group fails the savepoint, the timeout passes or the descriptor cannot
            be written.
    """
    registry = ops.registry()
    involved = resolve_apps(registry, apps, pipeline)
    totals = {a: ops.key_groups(a, registry[a]) for a in involved}
    for a, p in totals.items():
        if control_topic(a) not in ops.admin.partitions_of([control_topic(a)]):
            raise OpsError(
                f"app {a} has no control topic {control_topic(a)}: start the app first",
                exit_code=2,
            )
        declared = int(registry[a].get("key_groups") or p)
        if declared != p:
            progress(f"warning: {a} registered {declared} key groups, its control topic has {p}")
    latest = [
        int(r["checkpoint"])
        for a in involved
        for r in ops.latest_checkpoints(a, totals[a]).values()
        if isinstance(r.get("checkpoint"), int)
    ]
    now = _now_ms()
    checkpoint = choose_checkpoint(now, latest)
    savepoint_id = new_savepoint_id(now)
    sources = source_apps(registry, involved)
    request = savepoint_request(
        savepoint_id, checkpoint, stop, involved, now, wait_ms=int(timeout_s * 1000)
    )
    start = ops.end_offsets(totals)
    progress(
        f"savepoint {savepoint_id}: requesting checkpoint {checkpoint} of "
        f"{', '.join(involved)}{' (stop)' if stop else ''}"
    )
    ops.write_requests(sources, request)
    try:
        manifests = ops.wait_for_manifests(savepoint_id, start, totals, timeout_s, progress)
        descriptor = build_descriptor(
            savepoint_id, checkpoint, stop, _now_ms(), now, registry, manifests, sources
        )
        try:
            store.write_descriptor(savepoint_id, descriptor)
        except (SavepointError, TypeError) as exc:
            raise OpsError(f"savepoint {savepoint_id}: cannot write its descriptor: {exc}") from exc
    except BaseException as exc:
        if not stop:
            raise
        # Key groups that halted at a savepoint that will never complete would stay
        # halted (also on Ctrl-C or a Kafka error here): cancel it, they resume.
        try:
            cancel_savepoint(ops, savepoint_id, involved)
        except Exception as cancel_exc:  # noqa: BLE001 - report both
            progress(
                f"savepoint {savepoint_id}: could not cancel it ({cancel_exc}); run "
                f"`lockgate savepoint cancel {savepoint_id} --pipeline {involved[0]}`"
            )
            raise
        if isinstance(exc, OpsError):
            raise OpsError(
                f"{exc} (the savepoint was cancelled: halted key groups resume)", exc.exit_code
            ) from exc
        progress(f"savepoint {savepoint_id}: cancelled (halted key groups resume)")
        raise
    return descriptor


def cancel_savepoint(ops: Ops, savepoint_id: str, apps: Iterable[str]) -> None:
    """Cancel ``savepoint_id`` in ``apps``: key groups halted by it resume, none takes it.

    Raises:
        OpsError: a cancel record was not delivered.
    """
    check_savepoint_id(savepoint_id)
    record = {"savepoint": savepoint_id, "cancelled_ms": _now_ms()}
    # Durable in the registry (read whole by every starting instance), and in each app's
    # control partition 0 (followed by running instances).
    ops.write_records([(REGISTRY_TOPIC, 0)], record, cancel_key(savepoint_id))
    ops.write_requests(list(apps), record, key=cancel_key(savepoint_id))


def halted_key_groups(
    latest: Mapping[str, Mapping[int, Mapping[str, Any]]],
) -> dict[str, dict[str, list[int]]]:
    """Return savepoint id -> app -> the key groups halted at it, sorted.

    Args:
        latest: app -> key group -> its latest committed ``ckpt/<g>`` record (a key group
            halted by a stop-with-savepoint records the savepoint as ``halted`` in every
            checkpoint record until it is restored from it or the savepoint is cancelled).

    Returns:
        Only halted key groups; empty when none is halted.
    """
    out: dict[str, dict[str, list[int]]] = {}
    for app, by_group in latest.items():
        for g, record in by_group.items():
            halted = record.get("halted")
            if halted:
                out.setdefault(str(halted), {}).setdefault(app, []).append(int(g))
    for apps in out.values():
        for groups in apps.values():
            groups.sort()
    return out


def cancel_halted(
    ops: Ops, registry: Mapping[str, Mapping[str, Any]], apps: Sequence[str]
) -> dict[str, dict[str, list[int]]]:
    """Cancel every savepoint a key group of ``apps`` is halted at; return them.

    Reads each key group's latest committed checkpoint record (the checkpoint catalog)
    and cancels each savepoint named there as ``halted`` in all of ``apps``
    (:func:`cancel_savepoint`): the key groups halted at it resume where they stopped.
    Nothing halted: nothing is written.

    Args:
        ops: the command's Kafka clients.
        registry: the app registry (for apps without a control topic yet).
        apps: the apps (:func:`resolve_apps`).

    Returns:
        savepoint id -> app -> the key groups that were halted at it
        (:func:`halted_key_groups`).

    Raises:
        OpsError: an app is unknown (exit code 2), or a cancel record was not delivered.
    """
    latest = {a: ops.latest_checkpoints(a, ops.key_groups(a, registry.get(a))) for a in apps}
    halted = halted_key_groups(latest)
    for savepoint_id in sorted(halted):
        cancel_savepoint(ops, savepoint_id, apps)
    return halted


def open_store(settings: Settings) -> SavepointStore:
    """Return the :class:`SavepointStore` of ``LOCKGATE_SAVEPOINT_DIR``.

    Raises:
        OpsError: (exit code 2) the setting is not set, or the location is invalid.
    """
    if not settings.savepoint_dir:
        raise OpsError(
            "LOCKGATE_SAVEPOINT_DIR is not set: set it to the savepoint location (a local "
            "path or an fsspec URL such as s3://bucket/savepoints)",
            exit_code=2,
        )
    try:
        return SavepointStore(settings.savepoint_dir)
    except SavepointError as exc:
        raise OpsError(f"LOCKGATE_SAVEPOINT_DIR: {exc}", exit_code=2) from exc


def list_savepoints(store: SavepointStore) -> list[dict[str, Any]]:
    """Return id, created, checkpoint, apps and stop of every completed savepoint, oldest first.

    Raises:
        OpsError: a descriptor cannot be read (exit code 1).
    """
    out = []
    for sp in store.list_savepoints():
        try:
            d = store.read_descriptor(sp)
        except SavepointError as exc:
            raise OpsError(str(exc)) from exc
        out.append(
            {
                "savepoint": sp,
                "created": d.get("created") or ms_to_iso(d.get("created_ms")),
                "checkpoint": d.get("checkpoint"),
                "apps": sorted(d.get("apps") or {}),
                "stop": bool(d.get("stop")),
            }
        )
    return out


def describe_savepoint(store: SavepointStore, savepoint_id: str) -> dict[str, Any]:
    """Return the descriptor of ``savepoint_id``.

    Raises:
        OpsError: exit code 2 for a malformed or unknown id, 1 when it cannot be read.
    """
    try:
        check_savepoint_id(savepoint_id)
    except SavepointError as exc:
        raise OpsError(str(exc), exit_code=2) from exc
    if savepoint_id not in store.list_savepoints():
        raise OpsError(
            f"no savepoint {savepoint_id} under {store.url} (it does not exist or never "
            "completed; see `lockgate savepoint list`)",
            exit_code=2,
        )
    try:
        return store.read_descriptor(savepoint_id)
    except SavepointError as exc:
        raise OpsError(str(exc)) from exc


def savepoint_text(d: dict[str, Any]) -> list[str]:
    """Return the lines of ``lockgate savepoint describe`` (without ``--json``).

    ``d`` is a descriptor (:func:`describe_savepoint`): a header line, then per app its
    key groups, topics, and per key group the checkpoint, offsets and stores; a backfill's
    savepoint (``lockgate backfill``) ends with its ``backfill`` section.
    """

    def offsets_text(offsets: dict[str, Any]) -> str:
        return " ".join(f"{t}={o}" for t, o in sorted(offsets.items())) or "-"

    lines = [
        f"savepoint {d.get('savepoint')}: checkpoint {d.get('checkpoint')}, created "
        f"{d.get('created')}{', stop' if d.get('stop') else ''}"
    ]
    for app, info in (d.get("apps") or {}).items():
        lines.append(
            f"app {app}: {info.get('key_groups')} key groups, inputs "
            f"{','.join(info.get('inputs') or []) or '-'}, outputs "
            f"{','.join(info.get('outputs') or []) or '-'}"
        )
        for m in info.get("manifests") or []:
            lines.append(
                f"  key group {m.get('key_group')}: checkpoint {m.get('checkpoint')} "
                f"offsets {offsets_text(m.get('offsets') or {})}"
            )
            for name, st in sorted((m.get("stores") or {}).items()):
                lines.append(
                    f"    store {name}: {st.get('entries')} entries, {st.get('bytes')} bytes, "
                    f"sha256 {st.get('sha256')}"
                )
    backfill = d.get("backfill")
    if isinstance(backfill, dict):
        lines.append(
            f"backfill of {backfill.get('app_spec')}: {backfill.get('records')} records, "
            f"{backfill.get('outputs')} outputs, {backfill.get('dead_letters')} dead letters, "
            f"{backfill.get('seconds')} s"
        )
        if backfill.get("archive"):
            lines.append(f"  input from the archive {backfill['archive']}")
        if backfill.get("output_parquet"):
            lines.append(f"  outputs as Parquet in {backfill['output_parquet']}")
    return lines
