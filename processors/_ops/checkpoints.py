"""The checkpoint catalog: completed checkpoints (``lockgate checkpoints list``).

Pure functions over the committed ``ckpt/<g>`` records (the bound every key group has
reached, the checkpoints complete for a set of apps, :func:`checkpoint_summary`) and the
command :func:`list_checkpoints` that reads them through :class:`~processors._ops.client.Ops`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from processors._ops.client import Ops
from processors._ops.errors import OpsError
from processors._ops.pipelines import pipeline_closure, topo_order
from state.savepoint import ms_to_iso


def complete_bound(latest: Mapping[int, int], key_groups: int) -> int | None:
    """Return the largest checkpoint id every key group has reached, or ``None``.

    Args:
        latest: key group -> its latest committed checkpoint id.
        key_groups: P; key groups ``0..P-1`` must all have one.
    """
    if key_groups <= 0 or any(g not in latest for g in range(key_groups)):
        return None
    return min(latest[g] for g in range(key_groups))


def complete_checkpoints(
    histories: Mapping[str, Mapping[int, Iterable[int]]],
    key_groups: Mapping[str, int],
    limit: int | None = None,
) -> list[int]:
    """Return the checkpoint ids complete for every app, newest first.

    An id ``c`` is complete for an app when each of its key groups ``0..P-1`` has a
    committed checkpoint record with a checkpoint ``>= c``; it is complete for a set of
    apps when it is complete for each. Only ids that appear in some record are listed.

    Args:
        histories: app -> key group -> the checkpoint ids of its committed records.
        key_groups: app -> P.
        limit: at most this many ids (all when ``None``).
    """
    bounds: list[int] = []
    ids: set[int] = set()
    for app, by_group in histories.items():
        seen = {g: list(v) for g, v in by_group.items()}
        latest = {g: max(v) for g, v in seen.items() if v}
        bound = complete_bound(latest, key_groups.get(app, 0))
        if bound is None:
            return []
        bounds.append(bound)
        for values in seen.values():
            ids.update(values)
    if not bounds:
        return []
    top = min(bounds)
    out = sorted((c for c in ids if c <= top), reverse=True)
    return out if limit is None else out[:limit]


def checkpoint_summary(
    histories: Mapping[str, Mapping[int, Sequence[Mapping[str, Any]]]],
    key_groups: Mapping[str, int],
    limit: int,
) -> dict[str, Any]:
    """Return the ``checkpoints list`` result from the committed ``ckpt/<g>`` records.

    Args:
        histories: app -> key group -> its committed checkpoint records (any order;
            the newest must be among them).
        key_groups: app -> P.
        limit: at most this many checkpoints.

    Returns:
        ``{"apps": {app: {"key_groups", "latest": [...], "halted": {g: id},
        "restored": {g: id}}}, "checkpoints": [{"checkpoint", "ts", "time",
        "aligned"}], "newest": None | {"checkpoint", "key_groups": {app: [...]}}}``;
        for the newest complete checkpoint each key group shows its first record at
        or past it (the record of that id when the key group has one).
    """
    apps: dict[str, Any] = {}
    ids: dict[str, dict[int, list[int]]] = {}
    by_id: dict[int, list[Mapping[str, Any]]] = {}
    for app, by_group in histories.items():
        latest_rows: list[dict[str, Any]] = []
        halted: dict[str, str] = {}
        restored: dict[str, str] = {}
        ids[app] = {}
        for g in range(key_groups.get(app, 0)):
            recs = [r for r in by_group.get(g, ()) if isinstance(r.get("checkpoint"), int)]
            ids[app][g] = [int(r["checkpoint"]) for r in recs]
            for r in recs:
                by_id.setdefault(int(r["checkpoint"]), []).append(r)
            if not recs:
                latest_rows.append({"key_group": g, "checkpoint": None})
                continue
            last = max(recs, key=lambda r: int(r["checkpoint"]))
            latest_rows.append(
                {
                    "key_group": g,
                    "checkpoint": last["checkpoint"],
                    "ts": last.get("ts"),
                    "time": ms_to_iso(last.get("ts")),
                    "aligned": bool(last.get("aligned")),
                    "instance": last.get("instance"),
                    "halted": last.get("halted"),
                    "origin": last.get("origin"),
                }
            )
            if last.get("halted"):
                halted[str(g)] = str(last["halted"])
            if last.get("origin"):
                restored[str(g)] = str(last["origin"])
        apps[app] = {
            "key_groups": key_groups.get(app, 0),
            "latest": latest_rows,
            "halted": halted,
            "restored": restored,
        }
    complete = complete_checkpoints(ids, key_groups, limit)
    rows = []
    for c in complete:
        recs = by_id.get(c, [])
        ts = max((int(r["ts"]) for r in recs if isinstance(r.get("ts"), int)), default=None)
        rows.append(
            {
                "checkpoint": c,
                "ts": ts,
                "time": ms_to_iso(ts),
                "aligned": bool(recs) and all(bool(r.get("aligned")) for r in recs),
            }
        )
    newest: dict[str, Any] | None = None
    if complete:
        c = complete[0]
        per_app: dict[str, list[dict[str, Any]]] = {}
        for app, by_group in histories.items():
            per_app[app] = []
            for g in range(key_groups.get(app, 0)):
                at = [r for r in by_group.get(g, ()) if int(r.get("checkpoint") or 0) >= c]
                first = min(at, key=lambda r: int(r["checkpoint"]))
                per_app[app].append(
                    {
                        "key_group": g,
                        "checkpoint": first["checkpoint"],
                        "offsets": first.get("offsets") or {},
                    }
                )
        newest = {"checkpoint": c, "key_groups": per_app}
    return {"apps": apps, "checkpoints": rows, "newest": newest}


def list_checkpoints(
    ops: Ops, apps: Sequence[str] = (), pipeline: str | None = None, limit: int = 20
) -> dict[str, Any]:
    """Return the completed checkpoints of ``apps`` or ``pipeline`` (:func:`checkpoint_summary`).

    ``--app`` names need no registration when their control topic exists.

    Raises:
        OpsError: (exit code 2) no app given, or an unknown app.
    """
    if not apps and pipeline is None:
        raise OpsError("give --app NAME (repeatable) or --pipeline NAME", exit_code=2)
    if limit < 1:
        raise OpsError("--limit must be at least 1", exit_code=2)
    registry = ops.registry()
    names: list[str] = list(dict.fromkeys(apps))
    if pipeline is not None:
        names = list(dict.fromkeys([*names, *pipeline_closure(registry, pipeline)]))
    names = topo_order(registry, names)
    key_groups = {a: ops.key_groups(a, registry.get(a)) for a in names}
    latest = {a: ops.latest_checkpoints(a, key_groups[a]) for a in names}
    bounds = [
        complete_bound({g: int(r["checkpoint"]) for g, r in latest[a].items()}, p)
        for a, p in key_groups.items()
    ]
    top = None if any(b is None for b in bounds) else min(b for b in bounds if b is not None)
    histories: dict[str, Mapping[int, Sequence[Mapping[str, Any]]]] = {}
    for a in names:
        if top is None:  # nothing is complete: the latest record per key group is enough
            histories[a] = {g: [r] for g, r in latest[a].items()}
        else:
            hist = ops.checkpoint_history(a, key_groups[a], lambda _g: top, limit)
            for g, r in latest[a].items():  # a record newer than the read window's end
                if all(h.get("checkpoint") != r.get("checkpoint") for h in hist.get(g, [])):
                    hist.setdefault(g, []).append(r)
            histories[a] = hist
    result = checkpoint_summary(histories, key_groups, limit)
    result["pipeline"] = pipeline
    return result
