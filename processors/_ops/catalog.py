"""Operator commands: the checkpoint catalog and savepoints (``lockgate checkpoints|savepoint``).

Everything here reads what the runtime committed to the control topics
(:mod:`processors._checkpoint.control_topics`) with a group-less ``read_committed``
consumer, so a listing never shows a checkpoint or a savepoint manifest of an aborted transaction.

The module has two halves:

* pure functions over registry records and checkpoint ids (pipeline closure, source
  apps, completeness, the savepoint's checkpoint id, progress text, the descriptor),
  unit-tested without Kafka and reusable by the runtime and tests;
* :class:`Ops`, the Kafka side (registry, checkpoint history, savepoint requests and
  manifests), and the command functions :func:`list_checkpoints`,
  :func:`trigger_savepoint`, :func:`list_savepoints` and :func:`describe_savepoint`
  that ``processors/cli.py`` wraps.

Errors are :class:`OpsError` with the exit code the CLI uses: 2 for usage and
configuration problems, 1 for runtime failures and timeouts.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import orjson
from confluent_kafka import Consumer, KafkaError, Producer, TopicPartition

from processors._checkpoint.control_topics import (
    REGISTRY_TOPIC,
    REQUEST_PARTITION,
    cancel_key,
    checkpoint_key,
    control_topic,
    latest_records,
    read_partition,
    read_registry,
    request_key,
)
from processors._config.settings import Settings
from processors._kafka.clients import (
    PARTITION_EOF,
    Admin,
    producer_config,
    restore_consumer_config,
)
from processors.exceptions import LockgateError
from state.savepoint import (
    SavepointError,
    SavepointStore,
    build_descriptor,
    check_savepoint_id,
    ms_to_iso,
    new_savepoint_id,
)

__all__ = [
    "REQUEST_TTL_MS",
    "SAVEPOINT_MARGIN_MS",
    "Ops",
    "OpsError",
    "cancel_savepoint",
    "checkpoint_summary",
    "choose_checkpoint",
    "complete_bound",
    "complete_checkpoints",
    "describe_savepoint",
    "list_checkpoints",
    "list_savepoints",
    "manifest_problems",
    "missing_key_groups",
    "savepoint_text",
    "open_store",
    "pipeline_closure",
    "progress_text",
    "resolve_apps",
    "savepoint_request",
    "source_apps",
    "topo_order",
    "trigger_savepoint",
    "unnamed_upstreams",
    "writers_by_topic",
]

#: The savepoint's checkpoint id is this far past now (or the latest checkpoint).
SAVEPOINT_MARGIN_MS = 60_000
#: A savepoint request expires this long after it was written, at least (the trigger's
#: ``--timeout`` when longer: an instance restoring for longer than this still takes it).
REQUEST_TTL_MS = 50_000
#: Progress lines on stderr at most this often while waiting for manifests.
PROGRESS_EVERY_S = 2.0

_CLIENT = "lockgate-cli"


class OpsError(LockgateError):
    """An operator command failed.

    Args:
        message: what went wrong and, where there is one, what to do.
        exit_code: 2 for usage/configuration problems, 1 for runtime failures.
    """

    def __init__(self, message: str, exit_code: int = 1) -> None:
        super().__init__(message)
        self.exit_code = exit_code


# ------------------------------------------------------------------ pure logic


def writers_by_topic(registry: Mapping[str, Mapping[str, Any]]) -> dict[str, list[str]]:
    """Return internal topic -> the apps that registered it as an internal output."""
    out: dict[str, list[str]] = {}
    for name in sorted(registry):
        for topic in registry[name].get("internal_outputs") or ():
            out.setdefault(str(topic), []).append(name)
    return out


def _edges(registry: Mapping[str, Mapping[str, Any]]) -> dict[str, set[str]]:
    """Return app -> the registered apps directly downstream of it."""
    writers = writers_by_topic(registry)
    down: dict[str, set[str]] = {name: set() for name in registry}
    for name, reg in registry.items():
        for topic in reg.get("inputs") or ():
            for writer in writers.get(str(topic), ()):
                if writer != name:
                    down[writer].add(name)
    return down


def pipeline_closure(registry: Mapping[str, Mapping[str, Any]], app: str) -> list[str]:
    """Return ``app`` and every app connected to it through internal topics, sorted.

    App X is upstream of Y when one of X's ``internal_outputs`` is among Y's
    ``inputs``; the closure follows these edges both ways, transitively (so apps that
    share an upstream are in the same pipeline).

    Raises:
        OpsError: ``app`` is not registered (exit code 2).
    """
    if app not in registry:
        raise OpsError(_unknown_app(registry, app), exit_code=2)
    down = _edges(registry)
    neighbours: dict[str, set[str]] = {name: set(nxt) for name, nxt in down.items()}
    for name, nxt in down.items():
        for other in nxt:
            neighbours[other].add(name)
    seen = {app}
    todo = [app]
    while todo:
        for other in neighbours[todo.pop()]:
            if other not in seen:
                seen.add(other)
                todo.append(other)
    return sorted(seen)


def topo_order(registry: Mapping[str, Mapping[str, Any]], apps: Iterable[str]) -> list[str]:
    """Return ``apps`` upstream first (ties and cycles by name)."""
    wanted = set(apps)
    down = _edges({k: v for k, v in registry.items() if k in wanted})
    indeg = {name: 0 for name in wanted}
    for nxt in down.values():
        for other in nxt:
            indeg[other] += 1
    order: list[str] = []
    ready = sorted(n for n, d in indeg.items() if d == 0)
    while ready:
        name = ready.pop(0)
        order.append(name)
        for other in sorted(down.get(name, ())):
            indeg[other] -= 1
            if indeg[other] == 0:
                ready.append(other)
                ready.sort()
    order.extend(sorted(wanted - set(order)))  # a cycle: whatever is left, by name
    return order


def source_apps(registry: Mapping[str, Mapping[str, Any]], apps: Iterable[str]) -> list[str]:
    """Return the apps among ``apps`` none of whose inputs is a registered internal output.

    These receive the savepoint request; the others get the savepoint's barrier from
    their upstream apps.
    """
    internal = set(writers_by_topic(registry))
    return sorted(
        name
        for name in set(apps)
        if not any(str(t) in internal for t in registry.get(name, {}).get("inputs") or ())
    )


def unnamed_upstreams(
    registry: Mapping[str, Mapping[str, Any]], apps: Iterable[str]
) -> dict[str, list[tuple[str, str]]]:
    """Return app -> [(internal topic, writer app)] for writers that are not in ``apps``.

    A savepoint of an app that reads an internal topic needs the topic's writers in
    the same savepoint (the barrier comes from them).
    """
    named = set(apps)
    writers = writers_by_topic(registry)
    out: dict[str, list[tuple[str, str]]] = {}
    for name in sorted(named):
        for topic in registry.get(name, {}).get("inputs") or ():
            for writer in writers.get(str(topic), ()):
                if writer not in named and writer != name:
                    out.setdefault(name, []).append((str(topic), writer))
    return out


def _unknown_app(registry: Mapping[str, Any], app: str) -> str:
    known = ", ".join(sorted(registry)) or "none"
    return (
        f"app {app!r} is not in the registry (lockgate.registry); registered apps: {known} "
        "(an app registers when an instance starts)"
    )


def resolve_apps(
    registry: Mapping[str, Mapping[str, Any]],
    apps: Sequence[str] = (),
    pipeline: str | None = None,
) -> list[str]:
    """Return the apps of a savepoint, upstream first.

    Args:
        registry: app name -> registration record.
        apps: exactly these apps (``--app``).
        pipeline: this app's pipeline (``--pipeline``); exclusive with ``apps``.

    Raises:
        OpsError: (exit code 2) neither or both given, an app is not registered, or a
            named app reads an internal topic whose writer is not named.
    """
    if bool(apps) == (pipeline is not None):
        raise OpsError("give either --app NAME (repeatable) or --pipeline NAME", exit_code=2)
    if pipeline is not None:
        return topo_order(registry, pipeline_closure(registry, pipeline))
    for name in apps:
        if name not in registry:
            raise OpsError(_unknown_app(registry, name), exit_code=2)
    missing = unnamed_upstreams(registry, apps)
    if missing:
        parts = [
            f"{app} reads {topic}, written by {writer}"
            for app, pairs in missing.items()
            for topic, writer in pairs
        ]
        raise OpsError(
            "; ".join(parts) + ": use --pipeline " + sorted(missing)[0] + " or name the "
            "upstream app(s) with --app too",
            exit_code=2,
        )
    return topo_order(registry, dict.fromkeys(apps))


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


# ------------------------------------------------------------------ Kafka side


class Ops:
    """The Kafka clients of one operator command (a group-less read_committed reader).

    Args:
        settings: the lockgate settings (bootstrap servers, security, savepoint dir).
    """

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.admin = Admin(settings)
        self._consumer: Consumer | None = None

    @property
    def consumer(self) -> Consumer:
        """The group-less ``read_committed`` consumer (created on first use)."""
        if self._consumer is None:
            self._consumer = Consumer(restore_consumer_config(self.settings, _CLIENT))
        return self._consumer

    def close(self) -> None:
        """Close the consumer."""
        if self._consumer is not None:
            self._consumer.close()
            self._consumer = None

    def registry(self) -> dict[str, dict[str, Any]]:
        """Return every app's registration (empty when the registry topic is missing)."""
        if not self.admin.partitions_of([REGISTRY_TOPIC]):
            return {}
        return read_registry(self.consumer, self.admin.end_offsets)

    def key_groups(self, app: str, registration: Mapping[str, Any] | None) -> int:
        """Return P of ``app``: its control topic's partition count, else the registry's.

        Raises:
            OpsError: neither exists (exit code 2).
        """
        found = self.admin.partitions_of([control_topic(app)])
        if control_topic(app) in found:
            return found[control_topic(app)]
        if registration is not None and int(registration.get("key_groups") or 0) > 0:
            return int(registration["key_groups"])
        raise OpsError(
            f"app {app!r} has neither a registration nor a control topic "
            f"({control_topic(app)}): has it run?",
            exit_code=2,
        )

    def _bounds(self, app: str, key_groups: int) -> dict[int, tuple[int, int]]:
        topic = control_topic(app)
        if topic not in self.admin.partitions_of([topic]):
            return {}
        tps = [TopicPartition(topic, g) for g in range(key_groups)]
        lows = self.admin.start_offsets(tps)
        highs = self.admin.end_offsets(tps)
        return {g: (lows[(topic, g)], highs[(topic, g)]) for g in range(key_groups)}

    def latest_checkpoints(self, app: str, key_groups: int) -> dict[int, dict[str, Any]]:
        """Return key group -> its latest committed ``ckpt/<g>`` record (if it has one)."""
        topic = control_topic(app)
        out: dict[int, dict[str, Any]] = {}
        for g, (low, high) in self._bounds(app, key_groups).items():
            found = latest_records(self.consumer, topic, g, low, high, checkpoint_key(g))
            value = found.get(checkpoint_key(g))
            if isinstance(value, dict):
                out[g] = value
        return out

    def checkpoint_history(
        self, app: str, key_groups: int, at_most: Callable[[int], int | None], limit: int
    ) -> dict[int, list[dict[str, Any]]]:
        """Return key group -> committed ``ckpt/<g>`` records read back from the end.

        Reads each partition backwards in growing windows until it has ``limit``
        records whose checkpoint is at most ``at_most(g)`` (``None``: no bound), or
        the partition's start.
        """
        topic = control_topic(app)
        out: dict[int, list[dict[str, Any]]] = {}
        for g, (low, high) in self._bounds(app, key_groups).items():
            key = checkpoint_key(g)
            bound = at_most(g)
            recs: list[dict[str, Any]] = []
            end = high
            window = 256
            while end > low:
                start = max(low, end - window)
                chunk = [
                    v
                    for k, v, _ in read_partition(self.consumer, topic, g, start, end)
                    if k == key and isinstance(v, dict) and isinstance(v.get("checkpoint"), int)
                ]
                recs = chunk + recs
                end = start
                window *= 4
                wanted = [r for r in recs if bound is None or r["checkpoint"] <= bound]
                if len(wanted) >= limit:
                    break
            out[g] = recs
        return out

    def end_offsets(self, apps: Mapping[str, int]) -> dict[tuple[str, int], int]:
        """Return the end offset of every control partition of ``apps`` (app -> P)."""
        tps = [TopicPartition(control_topic(a), g) for a, p in apps.items() for g in range(p)]
        return self.admin.end_offsets(tps)

    def write_records(
        self, targets: Iterable[tuple[str, int]], value: Mapping[str, Any], key: bytes
    ) -> None:
        """Write one record to each (topic, partition) of ``targets`` (acks=all, checked).

        Raises:
            OpsError: a record was not delivered (exit code 1).
        """
        conf = producer_config(self.settings, _CLIENT, None)
        conf["acks"] = "all"
        producer = Producer(conf)
        failures: list[str] = []

        def report(err: KafkaError | None, msg: Any) -> None:
            if err is not None:
                failures.append(f"{msg.topic()}: {err}")

        data = orjson.dumps(dict(value))
        for topic, partition in targets:
            producer.produce(topic, data, key, partition=partition, on_delivery=report)
        left = producer.flush(30)
        if left:
            failures.append(f"{left} record(s) not delivered within 30 s")
        if failures:
            raise OpsError(f"cannot write {key.decode(errors='replace')}: " + "; ".join(failures))

    def write_requests(
        self, apps: Iterable[str], request: Mapping[str, Any], key: bytes | None = None
    ) -> None:
        """Write ``request`` to partition 0 of each app's control topic (acks=all).

        ``key`` defaults to the request key of ``request["savepoint"]``.

        Raises:
            OpsError: a record was not delivered (exit code 1).
        """
        self.write_records(
            [(control_topic(app), REQUEST_PARTITION) for app in apps],
            request,
            key or request_key(str(request["savepoint"])),
        )

    def wait_for_manifests(
        self,
        savepoint_id: str,
        start: Mapping[tuple[str, int], int],
        totals: Mapping[str, int],
        timeout_s: float,
        progress: Callable[[str], None],
    ) -> dict[str, dict[int, dict[str, Any]]]:
        """Read the control partitions from ``start`` until every key group has a manifest.

        Args:
            savepoint_id: the savepoint.
            start: (control topic, partition) -> the offset to read from (the end
                before the request was written).
            totals: app -> P, in the order to report.
            timeout_s: give up after this long.
            progress: called with a progress line at most every 2 s (and at the end).

        Returns:
            app -> key group -> manifest record.

        Raises:
            OpsError: (exit code 1) a manifest reports an error (every error seen is
                named), or the timeout passed (the missing key groups are named).
        """
        prefix = f"savepoint/{savepoint_id}/".encode()
        apps_by_topic = {control_topic(a): a for a in totals}
        manifests: dict[str, dict[int, dict[str, Any]]] = {a: {} for a in totals}
        consumer = self.consumer
        consumer.assign([TopicPartition(t, p, off) for (t, p), off in start.items()])
        deadline = time.monotonic() + timeout_s
        last_progress = 0.0
        shown = ""
        try:
            while True:
                for msg in consumer.consume(500, 0.2):
                    err = msg.error()
                    if err is not None:
                        if err.code() != PARTITION_EOF and err.fatal():
                            raise OpsError(f"reading the control topics: {err}")
                        continue
                    key = msg.key()
                    if key is None or not key.startswith(prefix):
                        continue
                    try:
                        value = orjson.loads(msg.value() or b"null")
                    except orjson.JSONDecodeError:
                        continue
                    app = apps_by_topic.get(str(msg.topic()))
                    if app is None or not isinstance(value, dict):
                        continue
                    try:
                        g = int(key[len(prefix) :])
                    except ValueError:
                        continue
                    if 0 <= g < totals[app]:
                        manifests[app][g] = value
                errors = manifest_problems(manifests)
                done = {a: len(m) for a, m in manifests.items()}
                text = progress_text(savepoint_id, done, totals)
                complete = not missing_key_groups(manifests, totals)
                now = time.monotonic()
                if text != shown and (now - last_progress >= PROGRESS_EVERY_S or complete):
                    progress(text)
                    shown, last_progress = text, now
                if errors:
                    raise OpsError(f"savepoint {savepoint_id} failed:\n  " + "\n  ".join(errors))
                if complete:
                    return manifests
                if now > deadline:
                    missing = missing_key_groups(manifests, totals)
                    parts = [f"{a} key group(s) {_ranges(gs)}" for a, gs in missing.items()]
                    raise OpsError(
                        f"savepoint {savepoint_id} timed out after {timeout_s:g}s ({text}); "
                        f"no manifest from: {'; '.join(parts)}. Are the apps running? "
                        "(an unfinished savepoint is ignored; trigger a new one)"
                    )
        finally:
            consumer.unassign()


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


def _now_ms() -> int:
    return time.time_ns() // 1_000_000


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
