"""What a savepoint trigger writes and waits for, as pure functions.

The savepoint's checkpoint id (:func:`choose_checkpoint`), the request record
(:func:`savepoint_request`) and its expiry, and the manifests that answer it: progress
text, the key groups still missing, the errors reported. Unit-tested without Kafka.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

#: The savepoint's checkpoint id is this far past now (or the latest checkpoint).
SAVEPOINT_MARGIN_MS = 60_000
#: A savepoint request expires this long after it was written, at least (the trigger's
#: ``--timeout`` when longer: an instance restoring for longer than this still takes it).
REQUEST_TTL_MS = 50_000


def choose_checkpoint(
    now_ms: int, latest: Iterable[int | None], margin_ms: int = SAVEPOINT_MARGIN_MS
) -> int:
    """Return the savepoint's checkpoint id: ``max(now, latest checkpoint) + margin``.

    Checkpoint ids are ms-scale and strictly increasing per key group, so an id past
    every key group's latest one (and past now) is one that every key group still has
    to reach.
    """
    known = [c for c in latest if c is not None]
    return max([now_ms, *known]) + margin_ms


def savepoint_request(
    savepoint_id: str,
    checkpoint: int,
    stop: bool,
    apps: Sequence[str],
    now_ms: int,
    wait_ms: int = 0,
) -> dict[str, Any]:
    """Return the value of a ``savepoint-request/<id>`` record.

    It expires when the trigger stops waiting for it (``wait_ms``), or after
    :data:`REQUEST_TTL_MS` if that is longer: an instance that restores for a long time
    (a request waits for the restore) still takes it while someone waits for it.
    """
    return {
        "savepoint": savepoint_id,
        "checkpoint": checkpoint,
        "stop": stop,
        "apps": list(apps),
        "requested_ms": now_ms,
        "expires_ms": now_ms + max(REQUEST_TTL_MS, wait_ms),
    }


def progress_text(savepoint_id: str, done: Mapping[str, int], totals: Mapping[str, int]) -> str:
    """Return ``savepoint <id>: 5/8 key groups (a 4/4, b 1/4)`` (apps in ``totals`` order)."""
    n = sum(done.get(a, 0) for a in totals)
    total = sum(totals.values())
    per = ", ".join(f"{a} {done.get(a, 0)}/{t}" for a, t in totals.items())
    return f"savepoint {savepoint_id}: {n}/{total} key groups ({per})"


def missing_key_groups(
    manifests: Mapping[str, Mapping[int, Any]], totals: Mapping[str, int]
) -> dict[str, list[int]]:
    """Return app -> key groups (of ``0..P-1``) without a manifest; apps with none left out."""
    out: dict[str, list[int]] = {}
    for app, p in totals.items():
        have = manifests.get(app, {})
        gone = [g for g in range(p) if g not in have]
        if gone:
            out[app] = gone
    return out


def manifest_problems(manifests: Mapping[str, Mapping[int, Mapping[str, Any]]]) -> list[str]:
    """Return ``"<app> key group <g>: <error>"`` for every manifest with an error."""
    return [
        f"{app} key group {g}: {m['error']}"
        for app in manifests
        for g, m in sorted(manifests[app].items())
        if m.get("error")
    ]


def _ranges(groups: Sequence[int]) -> str:
    """Return ``0-2,5`` for [0, 1, 2, 5]."""
    parts: list[str] = []
    i = 0
    while i < len(groups):
        j = i
        while j + 1 < len(groups) and groups[j + 1] == groups[j] + 1:
            j += 1
        parts.append(str(groups[i]) if i == j else f"{groups[i]}-{groups[j]}")
        i = j + 1
    return ",".join(parts)
