"""Health probes and Prometheus metrics on one HTTP port, served from a side thread.

The processing loop only writes plain attributes of :class:`Metrics`; the server
thread only reads them (atomic under the GIL), so the hot path takes no lock.

Probe meanings:
    ``/startupz``: 200 once the instance initialised its clients and joined the group.
    ``/livez``: 200 while the loop (or a restore in progress) made progress within
    ``LOCKGATE_LIVENESS_TIMEOUT_MS``; a long restore never fails it.
    ``/readyz``: 200 while every assigned key group is restored and processing.
"""

from __future__ import annotations

import logging
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

log = logging.getLogger("lockgate.http")


class Metrics:
    """Counters and gauges of one instance (written by the loop thread only)."""

    def __init__(self, app: str, instance: str) -> None:
        self.app = app
        self.instance = instance
        self.started = False
        self.restoring = 0  # key groups being restored
        self.assigned = 0  # key groups owned
        self.heartbeat = time.monotonic()
        self.records_in = 0
        self.records_out = 0
        self.dlq_records = 0
        self.epochs_committed = 0
        self.epochs_aborted = 0
        self.last_checkpoint_id = 0
        self.commit_seconds_sum = 0.0
        self.commit_seconds_max = 0.0
        self.alignment_seconds_sum = 0.0
        self.restore_records = 0
        self.restore_remaining = 0
        self.consumer_lag = 0

    def beat(self) -> None:
        """Record loop progress (for /livez)."""
        self.heartbeat = time.monotonic()

    def render(self) -> str:
        """Return the metrics in the Prometheus text format."""
        labels = f'app="{self.app}",instance="{self.instance}"'
        rows: list[tuple[str, str, str, Any]] = [
            ("lockgate_records_in_total", "counter", "Input records processed.", self.records_in),
            ("lockgate_records_out_total", "counter", "Records emitted.", self.records_out),
            ("lockgate_dlq_records_total", "counter", "Records sent to the DLQ.", self.dlq_records),
            (
                "lockgate_epochs_committed_total",
                "counter",
                "Epochs committed.",
                self.epochs_committed,
            ),
            ("lockgate_epochs_aborted_total", "counter", "Epochs aborted.", self.epochs_aborted),
            (
                "lockgate_last_checkpoint_id",
                "gauge",
                "Id of the last committed checkpoint.",
                self.last_checkpoint_id,
            ),
            (
                "lockgate_epoch_commit_seconds_sum",
                "counter",
                "Total time spent committing epochs.",
                round(self.commit_seconds_sum, 6),
            ),
            (
                "lockgate_epoch_commit_seconds_max",
                "gauge",
                "Longest epoch commit so far.",
                round(self.commit_seconds_max, 6),
            ),
            (
                "lockgate_alignment_seconds_sum",
                "counter",
                "Time spent aligning barriers (0 for apps reading external topics).",
                round(self.alignment_seconds_sum, 6),
            ),
            ("lockgate_key_groups_assigned", "gauge", "Key groups owned.", self.assigned),
            ("lockgate_key_groups_restoring", "gauge", "Key groups restoring.", self.restoring),
            (
                "lockgate_restore_records_total",
                "counter",
                "Changelog records restored.",
                self.restore_records,
            ),
            (
                "lockgate_restore_remaining_records",
                "gauge",
                "Changelog records left to restore (estimate).",
                self.restore_remaining,
            ),
            (
                "lockgate_consumer_lag_records",
                "gauge",
                "Records between the position and the end of owned partitions (sampled).",
                self.consumer_lag,
            ),
        ]
        out = []
        for name, kind, help_text, value in rows:
            out.append(
                f"# HELP {name} {help_text}\n# TYPE {name} {kind}\n{name}{{{labels}}} {value}"
            )
        return "\n".join(out) + "\n"


def _handler(metrics: Metrics, liveness_timeout_s: float) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 - http.server API
            path = self.path.split("?", 1)[0]
            if path == "/metrics":
                self._send(200, metrics.render(), "text/plain; version=0.0.4")
                return
            if path == "/livez":
                age = time.monotonic() - metrics.heartbeat
                ok = age < liveness_timeout_s or metrics.restoring > 0
                self._send(200 if ok else 503, f"last progress {age:.1f}s ago\n")
                return
            if path == "/readyz":
                ok = metrics.started and metrics.restoring == 0
                self._send(200 if ok else 503, "ready\n" if ok else "not ready\n")
                return
            if path == "/startupz":
                self._send(200 if metrics.started else 503, f"started={metrics.started}\n")
                return
            self._send(404, "not found\n")

        def _send(self, code: int, body: str, ctype: str = "text/plain") -> None:
            data = body.encode()
            self.send_response(code)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
            return

    return Handler


class HealthServer:
    """Serves probes and metrics on a daemon thread until :meth:`stop`."""

    def __init__(self, metrics: Metrics, host: str, port: int, liveness_timeout_ms: int) -> None:
        self._server = ThreadingHTTPServer(
            (host, port), _handler(metrics, liveness_timeout_ms / 1000)
        )
        self._server.daemon_threads = True
        self._thread = threading.Thread(
            target=self._server.serve_forever, name="lockgate-http", daemon=True
        )

    @property
    def port(self) -> int:
        """The bound port."""
        return int(self._server.server_address[1])

    def start(self) -> None:
        """Start serving."""
        self._thread.start()
        log.info("http server listening", extra={"port": self.port})

    def stop(self) -> None:
        """Stop serving."""
        self._server.shutdown()
        self._server.server_close()
