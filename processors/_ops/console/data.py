"""The console's snapshot of a deployment, refreshed on a background thread.

Everything comes from what the runtime committed (the registry and the ``<app>.control``
topics, read ``read_committed`` through :class:`processors._ops.catalog.Ops` and the
catalog's own functions), from the brokers' offsets, from the savepoint store
(:func:`processors._ops.catalog.list_savepoints`) and, where an instance's address is
known, from its ``/readyz`` and ``/metrics``:

* apps with their topics and the pipeline graph;
* per key group the latest committed checkpoint, its instance, halt and origin;
* the completed checkpoints of each app (:func:`~processors._ops.catalog.checkpoint_summary`)
  with a duration (commit time minus the checkpoint id, which is the checkpoint's start
  in ms) and a size (input records committed since the previous completed checkpoint);
* lag per input partition (end offset minus the committed offset of the key group);
* throughput: input records committed per second, from the committed offsets over the
  last :data:`RATE_WINDOW_S` seconds (on internal topics, barrier records count too);
* dead letters: the record count of ``<app>.dlq``;
* the instances' ``/metrics`` texts, kept for the dashboard every ``scrape_s``
  (:class:`~processors._ops.console.dashboard.MetricsHistory`);
* an app's ``error`` when the console's principal may not read its control topic or
  describe its inputs or DLQ (such topics look missing in the cluster's metadata: without
  it the app would show no checkpoint, lag or dead letter, silently).

The pure helpers (:func:`checkpoint_rows`, :func:`partition_lag`, :class:`Rates`) are
unit-tested without Kafka.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from confluent_kafka import KafkaException, TopicPartition

from processors._checkpoint.control_topics import control_topic
from processors._config.settings import Settings
from processors._ops.catalog import (
    Ops,
    checkpoint_summary,
    list_savepoints,
    open_store,
    pipeline_closure,
    topo_order,
)
from processors._ops.console.dashboard import MetricsHistory
from processors._ops.console.graph import pipeline_graph
from processors._ops.console.instances import InstanceDirectory, probe_instance
from processors._ops.dlq import dlq_topic
from processors.exceptions import AuthorizationError, LockgateError
from state.savepoint import ms_to_iso

__all__ = ["RATE_WINDOW_S", "Rates", "Snapshotter", "checkpoint_rows", "partition_lag"]

log = logging.getLogger("lockgate.console")

#: Throughput is measured over this many seconds of snapshots.
RATE_WINDOW_S = 10.0
#: Completed checkpoints shown per app.
CHECKPOINTS_SHOWN = 8
#: Instances asked at once (each request waits 1 s at most).
PROBE_THREADS = 8
#: Savepoints are listed again at most this often (a store may be remote).
SAVEPOINTS_EVERY_S = 3.0
#: An app's ACLs are checked again at most this often.
ACCESS_EVERY_S = 10.0


def _offset_sum(record: Mapping[str, Any] | None) -> int | None:
    if record is None:
        return None
    offsets = record.get("offsets") or {}
    return sum(int(v) for v in offsets.values() if isinstance(v, int))


def checkpoint_rows(
    rows: Sequence[Mapping[str, Any]], history: Mapping[int, Sequence[Mapping[str, Any]]]
) -> list[dict[str, Any]]:
    """Add ``duration_ms`` and ``records`` to the completed checkpoints of one app.

    Args:
        rows: the ``checkpoints`` of :func:`~processors._ops.catalog.checkpoint_summary`
            for this app alone, newest first.
        history: key group -> its committed checkpoint records in log order.

    Returns:
        The rows, each with ``duration_ms`` (``ts - checkpoint``; ``None`` without a
        time or when the id is past the commit time, as after a savepoint) and
        ``records``: the input records committed between the previous row's checkpoint
        and this one, over all key groups (``None`` for the oldest row or
        when a key group's records do not reach back that far).
    """

    def offsets_at(g: int, c: int) -> int | None:
        found: Mapping[str, Any] | None = None
        for rec in history.get(g, ()):
            ckpt = rec.get("checkpoint")
            if isinstance(ckpt, int) and ckpt <= c:
                found = rec
        return _offset_sum(found)

    out: list[dict[str, Any]] = []
    for i, row in enumerate(rows):
        c = int(row["checkpoint"])
        ts = row.get("ts")
        records: int | None = None
        if i + 1 < len(rows):
            prev = int(rows[i + 1]["checkpoint"])
            total = 0
            for g in history:
                now_at, then_at = offsets_at(g, c), offsets_at(g, prev)
                if now_at is None or then_at is None:
                    total = -1
                    break
                total += now_at - then_at
            records = total if total >= 0 else None
        # After a savepoint the ids run ahead of the clock (its id is a margin past now and
        # the next ones follow it by 1 ms): such an id is no start time, so no duration.
        took = int(ts) - c if isinstance(ts, int) else -1
        out.append(
            {
                **row,
                "duration_ms": took if took >= 0 else None,
                "records": records,
            }
        )
    return out


def partition_lag(
    inputs: Sequence[str],
    key_groups: int,
    latest: Mapping[int, Mapping[str, Any]],
    ends: Mapping[tuple[str, int], int],
) -> list[dict[str, Any]]:
    """Return the lag of each input partition: end offset minus committed offset.

    Partition ``g`` of every input belongs to key group ``g``; its committed offset is
    in the key group's latest checkpoint record (``offsets``).

    Args:
        inputs: the app's input topics.
        key_groups: P.
        latest: key group -> its latest committed checkpoint record.
        ends: (topic, partition) -> end offset (missing: unknown).

    Returns:
        ``[{"topic", "partition", "committed", "end", "lag"}]``; ``committed`` and ``lag``
        are ``None`` when the key group has no committed offset for the topic yet.
    """
    rows: list[dict[str, Any]] = []
    for topic in inputs:
        for g in range(key_groups):
            end = ends.get((topic, g))
            if end is None:
                continue
            offsets = (latest.get(g) or {}).get("offsets") or {}
            committed = offsets.get(topic)
            lag = max(0, end - int(committed)) if isinstance(committed, int) else None
            rows.append(
                {
                    "topic": topic,
                    "partition": g,
                    "committed": committed,
                    "end": end,
                    "lag": lag,
                }
            )
    return rows


class Rates:
    """Records per second of a growing total, over a sliding window.

    Args:
        window_s: how far back the rate looks.
        clock: monotonic seconds.
    """

    def __init__(
        self, window_s: float = RATE_WINDOW_S, clock: Callable[[], float] = time.monotonic
    ):
        self._window_s = window_s
        self._clock = clock
        self._seen: dict[str, deque[tuple[float, int]]] = {}

    def add(self, name: str, total: int) -> float | None:
        """Record ``name``'s total now; return its rate (``None`` until two samples).

        A total that went down (a restore from a savepoint, a reset) starts over.
        """
        now = self._clock()
        seen = self._seen.setdefault(name, deque())
        if seen and total < seen[-1][1]:
            seen.clear()
        seen.append((now, total))
        while len(seen) > 2 and now - seen[1][0] >= self._window_s:
            seen.popleft()
        if len(seen) < 2 or seen[-1][0] <= seen[0][0]:
            return None
        return (seen[-1][1] - seen[0][1]) / (seen[-1][0] - seen[0][0])


class Snapshotter:
    """Builds the console's snapshot every ``refresh_s`` on a daemon thread.

    The Kafka clients are used by that thread only; :meth:`snapshot` hands out the last
    complete snapshot (a dict that is never mutated afterwards).

    Args:
        settings: the lockgate settings (bootstrap servers, security, savepoint dir).
        directory: where instances' HTTP endpoints are.
        refresh_s: seconds between two snapshots.
        history: where the instances' ``/metrics`` are kept for the dashboard (every
            ``history.scrape_s``; a default :class:`MetricsHistory` when ``None``).
    """

    def __init__(
        self,
        settings: Settings,
        directory: InstanceDirectory,
        refresh_s: float = 1.0,
        history: MetricsHistory | None = None,
    ) -> None:
        self.history = history if history is not None else MetricsHistory()
        self._settings = settings
        self._directory = directory
        self._refresh_s = refresh_s
        self._rates = Rates()
        self._lock = threading.Lock()
        self._snapshot: dict[str, Any] = {"generated_ms": None, "apps": [], "error": None}
        self._savepoints: dict[str, Any] = {"rows": [], "error": None}
        self._savepoints_at = 0.0
        #: app -> (when checked, the authorization error or None).
        self._access: dict[str, tuple[float, str | None]] = {}
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._thread = threading.Thread(target=self._run, name="lockgate-console", daemon=True)

    def start(self) -> None:
        """Start refreshing."""
        self._thread.start()

    def stop(self) -> None:
        """Stop refreshing: waits up to 5 s for the current round.

        A round blocked on an unreachable broker is not waited for: the thread is a daemon
        and ends with the process.
        """
        self._stop.set()
        self._wake.set()
        if self._thread.is_alive():
            self._thread.join(5)

    def snapshot(self) -> dict[str, Any]:
        """Return the latest snapshot."""
        with self._lock:
            return self._snapshot

    def refresh_savepoints(self) -> None:
        """List the savepoints again in the next round (after a trigger)."""
        self._savepoints_at = 0.0
        self._wake.set()

    def _run(self) -> None:
        ops = Ops(self._settings)
        try:
            while not self._stop.is_set():
                started = time.monotonic()
                snap = self.collect(ops)
                with self._lock:
                    self._snapshot = snap
                self._wake.wait(max(0.05, self._refresh_s - (time.monotonic() - started)))
                self._wake.clear()
        finally:
            with contextlib.suppress(Exception):
                ops.close()

    def collect(self, ops: Ops) -> dict[str, Any]:
        """Build one snapshot (never raises: a failure is the snapshot's ``error``)."""
        now_ms = time.time_ns() // 1_000_000
        snap: dict[str, Any] = {
            "generated_ms": now_ms,
            "generated": ms_to_iso(now_ms),
            "apps": [],
            "graph": {"nodes": [], "edges": []},
            "instances": [],
            "error": None,
        }
        try:
            registry = ops.registry()
            snap["graph"] = pipeline_graph(registry).to_json()
            order = topo_order(registry, registry)
            instances: dict[str, dict[str, Any]] = {}
            for app in order:
                snap["apps"].append(self._app(ops, registry, app, instances))
            ids = sorted(instances)
            urls = [self._directory.url(instances[iid]["app"], iid) for iid in ids]
            with ThreadPoolExecutor(max_workers=PROBE_THREADS) as pool:
                statuses = list(pool.map(probe_instance, urls))
            for iid, status in zip(ids, statuses, strict=True):
                snap["instances"].append({"id": iid, **instances[iid], **status.to_json()})
            if self.history.due():
                self.history.ingest(
                    [(i, s.text) for i, s in zip(ids, statuses, strict=True) if s.text]
                )
        except (LockgateError, KafkaException, OSError) as exc:
            log.warning("console snapshot failed", extra={"error": str(exc)})
            snap["error"] = f"{type(exc).__name__}: {exc}"
        snap["savepoints"] = self._list_savepoints()
        return snap

    def _app(
        self,
        ops: Ops,
        registry: Mapping[str, Mapping[str, Any]],
        app: str,
        instances: dict[str, dict[str, Any]],
    ) -> dict[str, Any]:
        reg = registry[app]
        inputs = [str(t) for t in reg.get("inputs") or ()]
        info: dict[str, Any] = {
            "name": app,
            "pipeline": pipeline_closure(registry, app),
            "inputs": inputs,
            "outputs": [str(t) for t in reg.get("outputs") or ()],
            "internal_outputs": [str(t) for t in reg.get("internal_outputs") or ()],
            "control_topic": control_topic(app),
            "dlq_topic": dlq_topic(app),
            "stores": sorted(reg.get("stores") or {}),
        }
        info["error"] = self._access_error(ops, app, inputs)
        p = ops.key_groups(app, reg)
        info["key_groups"] = p
        history = ops.checkpoint_history(app, p, lambda _g: None, CHECKPOINTS_SHOWN + 1)
        summary = checkpoint_summary({app: history}, {app: p}, CHECKPOINTS_SHOWN + 1)
        mine = summary["apps"][app]
        info["key_group_rows"] = mine["latest"]
        info["halted"] = mine["halted"]
        info["restored"] = mine["restored"]
        info["checkpoints"] = checkpoint_rows(summary["checkpoints"], history)[:CHECKPOINTS_SHOWN]
        latest = {g: recs[-1] for g, recs in history.items() if recs}
        owned: dict[str, list[int]] = {}
        for row in mine["latest"]:
            if row.get("instance"):
                owned.setdefault(str(row["instance"]), []).append(int(row["key_group"]))
        info["instances"] = owned
        for iid, groups in owned.items():
            instances[iid] = {"app": app, "key_groups": groups}
        tps = [TopicPartition(t, g) for t in inputs for g in range(p)]
        present = ops.admin.partitions_of(inputs) if inputs else {}
        tps = [tp for tp in tps if tp.topic in present and tp.partition < present[tp.topic]]
        ends = ops.admin.end_offsets(tps, within_s=2.0) if tps else {}
        info["lag"] = partition_lag(inputs, p, latest, ends)
        info["lag_total"] = sum(r["lag"] for r in info["lag"] if r["lag"] is not None)
        committed = sum(_offset_sum(r) or 0 for r in latest.values())
        info["throughput"] = self._rates.add(app, committed)
        info["dead_letters"] = self._dead_letters(ops, app)
        return info

    def _access_error(self, ops: Ops, app: str, inputs: Sequence[str]) -> str | None:
        """The missing ACLs (a message) that hide ``app``'s topics from the console, if any.

        Checked every :data:`ACCESS_EVERY_S` at most (docs/security.md, "The console").
        """
        checked = self._access.get(app)
        if checked is not None and time.monotonic() - checked[0] < ACCESS_EVERY_S:
            return checked[1]
        needs: dict[str, list[str]] = {t: ["DESCRIBE"] for t in inputs}
        needs[control_topic(app)] = ["READ"]
        needs[dlq_topic(app)] = ["DESCRIBE"]
        try:
            ops.admin.check_access(needs)
            error = None
        except AuthorizationError as exc:
            error = str(exc)
        self._access[app] = (time.monotonic(), error)
        return error

    def _dead_letters(self, ops: Ops, app: str) -> int | None:
        topic = dlq_topic(app)
        parts = ops.admin.partitions_of([topic]).get(topic)
        if parts is None:
            return None
        tps = [TopicPartition(topic, q) for q in range(parts)]
        lows = ops.admin.start_offsets(tps)
        highs = ops.admin.stable_offsets(tps)
        return sum(max(0, highs[(topic, q)] - lows[(topic, q)]) for q in range(parts))

    def _list_savepoints(self) -> dict[str, Any]:
        if time.monotonic() - self._savepoints_at < SAVEPOINTS_EVERY_S:
            return self._savepoints
        self._savepoints_at = time.monotonic()
        if not self._settings.savepoint_dir:
            self._savepoints = {"rows": [], "error": "LOCKGATE_SAVEPOINT_DIR is not set"}
            return self._savepoints
        try:
            rows = list_savepoints(open_store(self._settings))
            self._savepoints = {"rows": list(reversed(rows)), "error": None}
        except LockgateError as exc:
            self._savepoints = {"rows": [], "error": str(exc)}
        return self._savepoints
