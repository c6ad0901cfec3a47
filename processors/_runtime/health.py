"""Health probes and Prometheus metrics on one HTTP port, served from a side thread.

Threading contract: the processing loop is the only writer of :class:`Metrics`, and it
only assigns plain attributes or appends to plain per-bucket counters (no locks, no
``prometheus_client`` objects on the hot path). The HTTP thread only reads them: at scrape
time a :class:`MetricsCollector` turns the current values into Prometheus families, and
each probe is a pure function of the :class:`Metrics` and the monotonic clock
(:func:`livez`, :func:`readyz`, :func:`startupz`). Single attribute reads are atomic under
the GIL; a scrape may mix values from two moments of the loop, never torn values.

Probe meanings (each answers with a short JSON body naming the reason):
    ``/startupz``: 200 once the instance initialised its clients and subscribed.
    ``/livez``: 200 while the loop made progress within ``LOCKGATE_LIVENESS_TIMEOUT_MS``,
    or while a bounded blocking call (or a restore) is in progress and its deadline has not
    passed; 503 once the deadline passed, or without progress for that long.
    ``/readyz``: 200 once the group was joined and the first assignment processed, and
    while no key group restores.
"""

from __future__ import annotations

import bisect
import errno
import logging
import socketserver
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import TracebackType
from typing import Any, NamedTuple

import orjson
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.process_collector import ProcessCollector
from prometheus_client.registry import Collector, CollectorRegistry

from processors._runtime.query import QueryService
from processors.exceptions import ConfigError

log = logging.getLogger("lockgate.http")

#: Upper bounds (seconds) of epoch commit and barrier alignment duration buckets.
DURATION_BUCKETS: tuple[float, ...] = (
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
)  # fmt: skip
#: Upper bounds (seconds) of key group restore duration buckets (restores can take minutes).
RESTORE_BUCKETS: tuple[float, ...] = (
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
    120.0, 300.0, 600.0, 1800.0,
)  # fmt: skip


class Histogram:
    """A lock-free histogram: plain per-bucket counters, written by one thread.

    ``counts[i]`` counts observations ``v <= bounds[i]`` (and ``> bounds[i-1]``);
    the last slot counts the ones above every bound (``+Inf``).
    """

    __slots__ = ("bounds", "counts", "sum")

    def __init__(self, bounds: Sequence[float]) -> None:
        """Create an empty histogram.

        Args:
            bounds: strictly increasing, finite upper bounds; ``+Inf`` is implied.

        Raises:
            ValueError: the bounds are empty or not strictly increasing.
        """
        if not bounds or any(b >= c for b, c in zip(bounds, bounds[1:], strict=False)):
            raise ValueError("histogram bounds must be non-empty and strictly increasing")
        self.bounds = tuple(float(b) for b in bounds)
        self.counts = [0] * (len(self.bounds) + 1)
        self.sum = 0.0

    def observe(self, value: float) -> None:
        """Count one observation (loop thread only; a list index bump and a float add)."""
        self.counts[bisect.bisect_left(self.bounds, value)] += 1
        self.sum += value

    @property
    def count(self) -> int:
        """Number of observations."""
        return sum(self.counts)

    def cumulative(self) -> tuple[list[tuple[str, float]], float]:
        """Return Prometheus buckets ``[(le, cumulative count)...]`` ending at ``+Inf``, and sum.

        The counts come from one copy of the list, so the buckets are monotonic and the
        ``+Inf`` bucket equals the count even while the loop keeps observing.
        """
        counts = list(self.counts)
        total = self.sum
        out: list[tuple[str, float]] = []
        running = 0
        for bound, n in zip(self.bounds, counts, strict=False):
            running += n
            out.append((_fmt_bound(bound), float(running)))
        out.append(("+Inf", float(running + counts[-1])))
        return out, total


def _fmt_bound(bound: float) -> str:
    return repr(bound)


class _Blocked:
    """Context manager returned by :meth:`Metrics.blocked`."""

    __slots__ = ("_metrics", "_timeout", "_what")

    def __init__(self, metrics: Metrics, what: str, timeout_s: float | None) -> None:
        self._metrics = metrics
        self._what = what
        self._timeout = timeout_s

    def __enter__(self) -> None:
        self._metrics.enter_blocking(self._what, self._timeout)

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._metrics.exit_blocking()


class Metrics:
    """Counters, gauges and probe state of one instance (written by the loop thread only).

    Every field is a plain attribute the loop assigns directly. Counter semantics:
    ``records_in``, ``records_out`` and ``dlq_records`` count what *committed* (added after
    a successful commit, never decreased); ``records_in_attempts`` and
    ``records_out_attempts`` count every processing attempt, replays after an abort
    included. Their difference is the replayed work.

    Probe state: ``started`` (clients initialised, subscribed), ``joined`` (the group was
    joined and the first assignment processed), ``restoring`` (key groups restoring now),
    ``heartbeat`` (monotonic time of the last loop progress, see :meth:`beat`), and the
    blocking call in progress: ``blocked_in`` (its name, or None), ``blocked_since`` and
    ``blocked_deadline`` (monotonic times; the deadline is None for an unbounded call).
    """

    def __init__(self, app: str, instance: str) -> None:
        self.app = app
        self.instance = instance
        # Probe state.
        self.started = False
        self.joined = False
        self.restoring = 0  # key groups being restored
        #: Key groups halted by a stop-with-savepoint, with the savepoint each is halted
        #: at (published by the loop as a new tuple: read whole, never mutated).
        self.halted: tuple[tuple[int, str], ...] = ()
        self.globals_loading = False  # global tables being read at start-up
        self.assigned = 0  # key groups owned
        self.heartbeat = time.monotonic()
        self.blocked_in: str | None = None
        self.blocked_since = 0.0
        self.blocked_deadline: float | None = None
        # Counters (committed work).
        self.records_in = 0
        self.records_out = 0
        self.dlq_records = 0
        # Counters (every attempt, replays included).
        self.records_in_attempts = 0
        self.records_out_attempts = 0
        self.epochs_committed = 0
        self.epochs_aborted = 0
        self.commits_unknown = 0  # commits without a definite answer in time
        self.commits_rolled_forward = 0  # ... that had committed (learned from the broker)
        self.alignments_forced = 0  # alignments switched to unaligned (timeout, bound)
        self.last_checkpoint_id = 0
        #: Unix time the instance's state was last known checkpointed: the last committed
        #: epoch, or the last epoch end that found nothing to commit (everything processed
        #: was committed already). The start time before either.
        self.last_checkpoint_time = time.time()
        #: Lowest event-time watermark (ms) over the owned key groups (idle ones left out
        #: unless all are idle), sampled at each epoch end; None without event time.
        self.watermark_ms: int | None = None
        #: Each owned key group's event-time watermark (ms) and whether it is idle, set
        #: with ``watermark_ms`` (published as a new dict: read whole, never mutated); key
        #: groups without a watermark are left out.
        self.key_group_watermarks: dict[int, tuple[int, bool]] = {}
        self.commit_seconds_max = 0.0
        self.restore_records = 0
        self.restore_remaining = 0
        self.consumer_lag = 0
        #: Lag per owned input partition, (topic, partition) -> records (published by the
        #: loop as a new dict with each sample: read whole, never mutated).
        self.partition_lag: dict[tuple[str, int], int] = {}
        # Durations.
        self.commit_seconds = Histogram(DURATION_BUCKETS)
        self.alignment_seconds = Histogram(DURATION_BUCKETS)
        self.restore_seconds = Histogram(RESTORE_BUCKETS)

    # -- loop-side API (cheap, lock-free) -----------------------------------------------

    def beat(self) -> None:
        """Record loop progress (for /livez)."""
        self.heartbeat = time.monotonic()

    def observe_commit(self, seconds: float) -> None:
        """Record the duration of one epoch commit (also updates ``commit_seconds_max``)."""
        self.commit_seconds.observe(seconds)
        if seconds > self.commit_seconds_max:
            self.commit_seconds_max = seconds

    def observe_restore(self, seconds: float) -> None:
        """Record the duration of one key group's restore (open and changelog replay)."""
        self.restore_seconds.observe(seconds)

    def observe_alignment(self, seconds: float) -> None:
        """Record the time one barrier alignment held input back."""
        self.alignment_seconds.observe(seconds)

    def enter_blocking(self, what: str, timeout_s: float | None) -> None:
        """Mark the start of a blocking call that makes no loop progress meanwhile.

        While it runs, /livez answers 200 until ``timeout_s`` passed (then 503), whatever
        the liveness timeout; an unbounded call (``timeout_s`` None) gets no exemption.
        Pass the call's own timeout plus the slack it may overrun by.
        """
        now = time.monotonic()
        self.blocked_since = now
        self.blocked_deadline = None if timeout_s is None else now + timeout_s
        self.blocked_in = what  # last: the reader checks it first

    def exit_blocking(self) -> None:
        """Mark the end of the blocking call (returned or raised); counts as progress."""
        self.blocked_in = None
        self.heartbeat = time.monotonic()

    def blocked(self, what: str, timeout_s: float | None) -> _Blocked:
        """Context manager form of :meth:`enter_blocking` / :meth:`exit_blocking`."""
        return _Blocked(self, what, timeout_s)

    # -- compatibility --------------------------------------------------------------------

    @property
    def commit_seconds_sum(self) -> float:
        """Total commit time (the histogram's sum)."""
        return self.commit_seconds.sum

    @commit_seconds_sum.setter
    def commit_seconds_sum(self, value: float) -> None:
        # ``m.commit_seconds_sum += took`` (the pre-histogram API) records one observation.
        # Use observe_commit() instead; never both.
        delta = value - self.commit_seconds.sum
        if delta >= 0:
            self.commit_seconds.observe(delta)

    @property
    def alignment_seconds_sum(self) -> float:
        """Total alignment time (the histogram's sum)."""
        return self.alignment_seconds.sum

    @alignment_seconds_sum.setter
    def alignment_seconds_sum(self, value: float) -> None:
        # Like commit_seconds_sum: an increase records one observation.
        delta = value - self.alignment_seconds.sum
        if delta >= 0:
            self.alignment_seconds.observe(delta)


# -- probes (pure functions of Metrics and the clock) ---------------------------------------


class Probe(NamedTuple):
    """The answer of one probe: ``ok`` (HTTP 200, else 503) and a JSON-able reason."""

    ok: bool
    body: dict[str, Any]

    @property
    def status(self) -> int:
        """The HTTP status code."""
        return 200 if self.ok else 503


def livez(m: Metrics, now: float, liveness_timeout_s: float) -> Probe:
    """Is the loop alive? (``/livez``).

    Rules, in order:
        1. A blocking call with a deadline is in progress: alive until the deadline, dead
           after it (``overdue``), whatever the heartbeat says.
        2. Otherwise alive iff the last progress (:meth:`Metrics.beat`, each loop
           iteration, each restore batch) is younger than ``liveness_timeout_s``.
           An unbounded blocking call is reported but gets no exemption.

    Args:
        m: the instance's metrics.
        now: ``time.monotonic()``.
        liveness_timeout_s: ``LOCKGATE_LIVENESS_TIMEOUT_MS`` in seconds.
    """
    blocked = m.blocked_in
    deadline = m.blocked_deadline
    since = m.blocked_since
    if blocked is not None and deadline is not None:
        body: dict[str, Any] = {"in": blocked, "blocked_s": round(now - since, 3)}
        if now <= deadline:
            return Probe(
                True, {"status": "blocked", **body, "deadline_in_s": round(deadline - now, 3)}
            )
        return Probe(False, {"status": "overdue", **body, "overdue_s": round(now - deadline, 3)})
    age = round(now - m.heartbeat, 3)
    ok = age < liveness_timeout_s
    body = {"status": "ok" if ok else "stalled", "last_progress_s": age}
    if m.restoring:
        body["restoring"] = m.restoring
    if blocked is not None:
        body["in"] = blocked
        body["blocked_s"] = round(now - since, 3)
    return Probe(ok, body)


def readyz(m: Metrics) -> Probe:
    """Is the instance processing every key group it owns? (``/readyz``).

    Not ready while global tables load, before the group was joined and the first
    assignment processed (``joined``, or any key group assigned, which implies it), nor
    while any key group restores (or catches its global tables up), nor while any key
    group it owns is halted by a stop-with-savepoint (it processes nothing until the app
    is started with ``--from-savepoint``: the body names the savepoints).
    """
    restoring = m.restoring
    halted = m.halted
    if m.globals_loading:
        return Probe(False, {"status": "loading global tables"})
    if not (m.joined or m.assigned > 0):
        return Probe(False, {"status": "joining"})
    if restoring > 0:
        return Probe(False, {"status": "restoring", "key_groups": restoring})
    if halted:
        savepoints = sorted({sp for _, sp in halted})
        return Probe(
            False,
            {
                "status": "halted",
                "key_groups": [g for g, _ in halted],
                "savepoints": savepoints,
                "resume": f"start the app with --from-savepoint {savepoints[-1]}",
            },
        )
    return Probe(True, {"status": "ready", "key_groups": m.assigned})


def startupz(m: Metrics) -> Probe:
    """Did the instance start? (``/startupz``): clients initialised and subscribed."""
    return Probe(True, {"status": "started"}) if m.started else Probe(False, {"status": "starting"})


# -- Prometheus exposition -------------------------------------------------------------------


class MetricsCollector(Collector):
    """Reads a :class:`Metrics` at scrape time and yields Prometheus metric families.

    Every series carries the labels ``app`` and ``lockgate_instance`` (the instance id; not
    ``instance``, which Prometheus sets to the scrape target). Counter families are named
    without ``_total`` here; the exposition appends it.
    """

    def __init__(self, metrics: Metrics, clock: Callable[[], float] = time.monotonic) -> None:
        self._m = metrics
        self._clock = clock

    def collect(self) -> Iterator[Metric]:
        """Yield the families (called by ``generate_latest`` on the HTTP thread)."""
        m = self._m
        names = ["app", "lockgate_instance"]
        labels = [m.app, m.instance]

        def counter(name: str, doc: str, value: float) -> CounterMetricFamily:
            f = CounterMetricFamily(name, doc, labels=names)
            f.add_metric(labels, value)
            return f

        def gauge(name: str, doc: str, value: float) -> GaugeMetricFamily:
            f = GaugeMetricFamily(name, doc, labels=names)
            f.add_metric(labels, value)
            return f

        def histogram(name: str, doc: str, h: Histogram) -> HistogramMetricFamily:
            f = HistogramMetricFamily(name, doc, labels=names)
            buckets, total = h.cumulative()
            f.add_metric(labels, buckets, total)
            return f

        yield counter(
            "lockgate_records_in", "Input records processed in committed epochs.", m.records_in
        )
        yield counter("lockgate_records_out", "Records emitted in committed epochs.", m.records_out)
        yield counter(
            "lockgate_dlq_records", "Records dead-lettered in committed epochs.", m.dlq_records
        )
        yield counter(
            "lockgate_records_in_attempts",
            "Input records processed, replays after aborts included.",
            m.records_in_attempts,
        )
        yield counter(
            "lockgate_records_out_attempts",
            "Records emitted, replays after aborts included.",
            m.records_out_attempts,
        )
        yield counter("lockgate_epochs_committed", "Epochs committed.", m.epochs_committed)
        yield counter("lockgate_epochs_aborted", "Epochs aborted.", m.epochs_aborted)
        yield counter(
            "lockgate_commits_unknown",
            "Commits that got no definite answer in time (outcome read from the broker).",
            m.commits_unknown,
        )
        yield counter(
            "lockgate_commits_rolled_forward",
            "Commits without an answer that had committed (not processed again).",
            m.commits_rolled_forward,
        )
        yield counter(
            "lockgate_alignments_forced",
            "Alignments switched to unaligned (timeout or held-record bound).",
            m.alignments_forced,
        )
        yield gauge(
            "lockgate_last_checkpoint_id",
            "Id of the last committed checkpoint.",
            m.last_checkpoint_id,
        )
        yield gauge(
            "lockgate_last_checkpoint_timestamp_seconds",
            "Unix time the state was last known checkpointed: the last committed epoch, or the "
            "last epoch end with nothing to commit (the start time before either).",
            round(m.last_checkpoint_time, 3),
        )
        watermark = GaugeMetricFamily(
            "lockgate_watermark_timestamp_seconds",
            "Lowest event-time watermark of the owned key groups, as Unix time (idle key "
            "groups left out unless all are idle; absent without event time or a watermark).",
            labels=names,
        )
        wm = m.watermark_ms
        if wm is not None:
            watermark.add_metric(labels, wm / 1000)
        yield watermark
        per_group = GaugeMetricFamily(
            "lockgate_key_group_watermark_timestamp_seconds",
            "Event-time watermark of one owned key group, as Unix time (sampled with "
            "lockgate_watermark_timestamp_seconds; absent without event time or a watermark).",
            labels=[*names, "key_group"],
        )
        idle_groups = GaugeMetricFamily(
            "lockgate_key_group_idle",
            "1 when the key group's watermark is idle (no input for the idleness timeout).",
            labels=[*names, "key_group"],
        )
        for g, (kg_wm, kg_idle) in sorted(m.key_group_watermarks.items()):
            per_group.add_metric([*labels, str(g)], kg_wm / 1000)
            idle_groups.add_metric([*labels, str(g)], 1 if kg_idle else 0)
        yield per_group
        yield idle_groups
        yield histogram(
            "lockgate_epoch_commit_seconds", "Duration of epoch commits.", m.commit_seconds
        )
        yield gauge(
            "lockgate_epoch_commit_seconds_max",
            "Longest epoch commit so far.",
            m.commit_seconds_max,
        )
        yield histogram(
            "lockgate_alignment_seconds",
            "Time barrier alignment held input back (0 for apps reading external topics).",
            m.alignment_seconds,
        )
        yield histogram(
            "lockgate_restore_seconds", "Duration of key group restores.", m.restore_seconds
        )
        yield gauge("lockgate_key_groups_assigned", "Key groups owned.", m.assigned)
        yield gauge("lockgate_key_groups_restoring", "Key groups restoring.", m.restoring)
        yield gauge(
            "lockgate_key_groups_halted",
            "Key groups halted by a stop-with-savepoint (nothing is processed until a start "
            "with --from-savepoint).",
            len(m.halted),
        )
        yield counter("lockgate_restore_records", "Changelog records restored.", m.restore_records)
        yield gauge(
            "lockgate_restore_remaining_records",
            "Changelog records left to restore (estimate).",
            m.restore_remaining,
        )
        yield gauge(
            "lockgate_consumer_lag_records",
            "Records between the committed offset and the end of owned input partitions "
            "(at each commit and every 5 s; also while nothing commits, e.g. halted).",
            m.consumer_lag,
        )
        partition_lag = GaugeMetricFamily(
            "lockgate_partition_lag_records",
            "Records between the committed offset and the end of one owned input partition "
            "(sampled with lockgate_consumer_lag_records).",
            labels=[*names, "topic", "partition"],
        )
        for (topic, partition), records in sorted(m.partition_lag.items()):
            partition_lag.add_metric([*labels, topic, str(partition)], records)
        yield partition_lag
        yield gauge(
            "lockgate_joined",
            "1 once the group was joined and the first assignment processed.",
            int(m.joined or m.assigned > 0),
        )
        now = self._clock()
        yield gauge(
            "lockgate_last_progress_age_seconds",
            "Seconds since the loop last made progress.",
            round(max(0.0, now - m.heartbeat), 3),
        )
        blocked = GaugeMetricFamily(
            "lockgate_blocked_seconds",
            "Seconds the blocking call named by `call` has been running (absent when none).",
            labels=[*names, "call"],
        )
        what = m.blocked_in
        if what is not None:
            blocked.add_metric([*labels, what], round(max(0.0, now - m.blocked_since), 3))
        yield blocked


def metrics_registry(metrics: Metrics) -> CollectorRegistry:
    """Return a private registry exposing ``metrics`` and the process's own metrics.

    The global ``prometheus_client.REGISTRY`` is never used: two runners in one process
    (tests) must not collide.
    """
    registry = CollectorRegistry()
    registry.register(MetricsCollector(metrics))
    ProcessCollector(registry=registry)
    return registry


# -- HTTP server ------------------------------------------------------------------------------


def _handler(
    metrics: Metrics,
    registry: CollectorRegistry,
    liveness_timeout_s: float,
    query: QueryService | None,
) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        timeout = 30  # a client that stops sending does not hold a thread forever

        def do_GET(self) -> None:  # noqa: N802 - http.server API
            path, _, query_string = self.path.partition("?")
            if path == "/state" or path.startswith("/state/"):
                if query is None:
                    self._send(
                        404,
                        b'{"status":"queryable state is off (LOCKGATE_QUERY_ENABLED)"}\n',
                        "application/json",
                    )
                    return
                code, data, extra = query.handle(path, query_string, self.headers)
                self._send(code, data, "application/json", extra)
                return
            if path == "/metrics":
                self._send(200, generate_latest(registry), CONTENT_TYPE_LATEST)
                return
            if path == "/livez":
                probe = livez(metrics, time.monotonic(), liveness_timeout_s)
            elif path == "/readyz":
                probe = readyz(metrics)
            elif path == "/startupz":
                probe = startupz(metrics)
            else:
                self._send(404, b'{"status":"not found"}\n', "application/json")
                return
            self._send(probe.status, orjson.dumps(probe.body) + b"\n", "application/json")

        def _send(
            self, code: int, data: bytes, ctype: str, extra: dict[str, str] | None = None
        ) -> None:
            self.send_response(code)
            self.send_header("Content-Type", ctype)
            for name, value in (extra or {}).items():
                self.send_header(name, value)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
            return

    return Handler


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def server_bind(self) -> None:
        # HTTPServer.server_bind resolves the host name (getfqdn), which can stall on DNS.
        socketserver.TCPServer.server_bind(self)
        host, port = self.server_address[:2]
        self.server_name = str(host)
        self.server_port = int(port)


class HealthServer:
    """Serves probes and ``/metrics`` on a daemon thread between :meth:`start` and :meth:`stop`.

    With a :class:`~processors._runtime.query.QueryService` it also serves ``GET /state/...``
    (queryable state); without one, those paths answer 404.
    """

    def __init__(
        self,
        metrics: Metrics,
        host: str,
        port: int,
        liveness_timeout_ms: int,
        query: QueryService | None = None,
    ) -> None:
        """Prepare the server; nothing is bound until :meth:`start`."""
        self._host = host
        self._port = port
        handler = _handler(metrics, metrics_registry(metrics), liveness_timeout_ms / 1000, query)
        self._server = _Server((host, port), handler, bind_and_activate=False)
        self._thread = threading.Thread(
            target=self._server.serve_forever, name="lockgate-http", daemon=True
        )
        self._bound = False

    @property
    def port(self) -> int:
        """The bound port (the configured one before :meth:`start`)."""
        return int(self._server.server_address[1])

    def start(self) -> None:
        """Bind the port and start serving.

        Raises:
            ConfigError: the port cannot be bound (in use by another process, e.g. a
                second instance on this host; or not permitted); the message names
                ``LOCKGATE_HTTP_PORT`` and the port.
        """
        try:
            self._server.server_bind()
            self._server.server_activate()
        except OSError as exc:
            self._server.server_close()
            where = f"{self._host}:{self._port}"
            if exc.errno == errno.EADDRINUSE:
                raise ConfigError(
                    f"LOCKGATE_HTTP_PORT={self._port}: address {where} is already in use "
                    "(another lockgate instance on this host?): give each instance its own "
                    "LOCKGATE_HTTP_PORT, or set LOCKGATE_HTTP_PORT=0 to disable probes and "
                    "metrics"
                ) from exc
            raise ConfigError(
                f"LOCKGATE_HTTP_PORT={self._port}: cannot listen on {where} ({exc.strerror}); "
                "check LOCKGATE_HTTP_HOST and LOCKGATE_HTTP_PORT, or set LOCKGATE_HTTP_PORT=0 "
                "to disable probes and metrics"
            ) from exc
        self._bound = True
        self._thread.start()
        log.info("http server listening", extra={"port": self.port})

    def stop(self) -> None:
        """Stop serving and release the port (no-op if :meth:`start` did not succeed)."""
        if not self._bound:
            return
        self._bound = False
        self._server.shutdown()
        self._server.server_close()
