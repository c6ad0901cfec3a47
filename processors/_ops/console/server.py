"""The console's HTTP server (stdlib ``http.server``) and its routes.

Read-only routes need no token::

    GET /                      the overview (live)
    GET /partial/live          the overview's live fragment (HTML)
    GET /dashboard[?app=APP]   the chart's Grafana dashboard, drawn here (live)
    GET /partial/dashboard     the dashboard's live fragment (HTML; same ?app=)
    GET /savepoints/<id>       a savepoint's page
    GET /api/overview          the snapshot (JSON)
    GET /api/savepoints        the savepoint list (JSON, as `savepoint list --json`)
    GET /api/savepoints/<id>   a savepoint's descriptor (as `savepoint describe --json`)
    GET /api/jobs              the savepoints triggered here
    GET /healthz               200 ok

Actions need ``Authorization: Bearer <LOCKGATE_QUERY_TOKEN>`` (403 when no token is
configured: they are off)::

    POST /api/savepoints               {"pipeline": APP} or {"apps": [...]}, "stop": bool
    POST /api/savepoints/<id>/cancel   {"pipeline": APP} or {"apps": [...]}

The token is compared in constant time and never logged or rendered; the access log
names the method, the path and the status only.
"""

from __future__ import annotations

import hmac
import logging
import secrets
import socketserver
import threading
import urllib.parse
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import orjson
from confluent_kafka import KafkaException

from processors._config.settings import Settings
from processors._ops.catalog import OpsError, describe_savepoint, list_savepoints, open_store
from processors._ops.console.dashboard import MetricsHistory
from processors._ops.console.data import Snapshotter
from processors._ops.console.jobs import SavepointJobs
from processors._ops.console.pages import (
    actions,
    dashboard_page,
    live_fragment,
    page,
    savepoint_page,
)
from processors.exceptions import LockgateError
from state.savepoint import SavepointError

__all__ = ["ConsoleServer"]

log = logging.getLogger("lockgate.console")

#: Largest request body accepted (the actions' JSON is tiny).
MAX_BODY = 16 * 1024


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def server_bind(self) -> None:
        # HTTPServer.server_bind resolves the host name (getfqdn), which can stall on DNS.
        socketserver.TCPServer.server_bind(self)
        host, port = self.server_address[:2]
        self.server_name = str(host)
        self.server_port = int(port)


def _targets(body: Any) -> tuple[list[str], str | None]:
    """Return (apps, pipeline) of an action's JSON body.

    Raises:
        OpsError: (exit code 2) not an object, or malformed fields.
    """
    if not isinstance(body, dict):
        raise OpsError("the body must be a JSON object", exit_code=2)
    apps = body.get("apps") or []
    pipeline = body.get("pipeline") or None
    if not isinstance(apps, list) or not all(isinstance(a, str) and a for a in apps):
        raise OpsError("apps must be a list of app names", exit_code=2)
    if pipeline is not None and not isinstance(pipeline, str):
        raise OpsError("pipeline must be an app name", exit_code=2)
    return apps, pipeline


class ConsoleServer:
    """Serves the console on a daemon thread between :meth:`start` and :meth:`stop`.

    Args:
        settings: the lockgate settings (its ``query_token`` guards the actions).
        snapshots: the snapshot source (started and stopped with the server).
        jobs: the savepoint jobs.
        host: the address to bind.
        port: the port to bind (0: any free port).
        history: the dashboard's metrics history (the snapshots' own by default).
    """

    def __init__(
        self,
        settings: Settings,
        snapshots: Snapshotter,
        jobs: SavepointJobs,
        host: str,
        port: int,
        history: MetricsHistory | None = None,
    ) -> None:
        self._settings = settings
        found = history if history is not None else getattr(snapshots, "history", None)
        self._history = found if isinstance(found, MetricsHistory) else MetricsHistory()
        self._snapshots = snapshots
        self._jobs = jobs
        token = settings.query_token
        self._token = None if token is None else token.get_secret_value().encode()
        self._server = _Server((host, port), self._handler(), bind_and_activate=True)
        self._thread = threading.Thread(
            target=self._server.serve_forever, name="lockgate-console-http", daemon=True
        )

    @property
    def address(self) -> tuple[str, int]:
        """The bound (host, port)."""
        host, port = self._server.server_address[:2]
        return str(host), int(port)

    def start(self) -> None:
        """Start the snapshots and serving."""
        self._snapshots.start()
        self._thread.start()

    def stop(self) -> None:
        """Stop serving and the snapshots."""
        self._server.shutdown()
        self._server.server_close()
        self._snapshots.stop()

    # -- routes ---------------------------------------------------------------------------

    def authorized(self, header: str | None) -> tuple[int, str] | None:
        """Return ``None`` when ``header`` carries the token, else (status, reason)."""
        if self._token is None:
            return 403, "savepoint actions are off: LOCKGATE_QUERY_TOKEN is not set"
        scheme, _, given = str(header or "").partition(" ")
        if scheme.lower() != "bearer" or not hmac.compare_digest(
            given.strip().encode(), self._token
        ):
            return 401, "a valid token is required (Authorization: Bearer <token>)"
        return None

    def get(self, path: str, nonce: str) -> tuple[int, str, bytes]:
        """Answer a GET of ``path`` (with its query string, if any): (status, type, body)."""
        html_type = "text/html; charset=utf-8"
        path, _, query = path.partition("?")
        if path in ("/dashboard", "/partial/dashboard"):
            app = (urllib.parse.parse_qs(query).get("app") or [""])[0] or None
            apps = [str(a["name"]) for a in self._snapshots.snapshot().get("apps") or ()]
            fragment = self._history.fragment(app, apps)
            if path == "/partial/dashboard":
                return 200, html_type, fragment.encode()
            src = "/partial/dashboard" + (f"?{urllib.parse.urlencode({'app': app})}" if app else "")
            return (
                200,
                html_type,
                page("lockgate dashboard", dashboard_page(fragment, src), nonce).encode(),
            )
        if path == "/":
            snap = self._snapshots.snapshot()
            body = actions(self._token is not None) + (
                f'<div id="live">{live_fragment(snap, self._jobs.jobs())}</div>'
            )
            return 200, html_type, page("lockgate console", body, nonce).encode()
        if path == "/partial/live":
            return (
                200,
                html_type,
                live_fragment(self._snapshots.snapshot(), self._jobs.jobs()).encode(),
            )
        if path == "/api/overview":
            return 200, "application/json", orjson.dumps(self._snapshots.snapshot())
        if path == "/api/jobs":
            return 200, "application/json", orjson.dumps(self._jobs.jobs())
        if path == "/healthz":
            return 200, "text/plain", b"ok\n"
        if path == "/api/savepoints":
            try:
                rows = list_savepoints(open_store(self._settings))
            except LockgateError as exc:
                return _error(exc)
            return 200, "application/json", orjson.dumps(rows)
        for prefix, as_json in (("/api/savepoints/", True), ("/savepoints/", False)):
            if path.startswith(prefix) and "/" not in path[len(prefix) :]:
                sid = urllib.parse.unquote(path[len(prefix) :])
                try:
                    d = describe_savepoint(open_store(self._settings), sid)
                except LockgateError as exc:
                    return _error(exc)
                if as_json:
                    return 200, "application/json", orjson.dumps(d)
                body = savepoint_page(d)
                return 200, html_type, page(f"savepoint {sid}", body, nonce, live=False).encode()
        return 404, "application/json", orjson.dumps({"status": "not found"})

    def post(self, path: str, auth: str | None, body: bytes) -> tuple[int, str, bytes]:
        """Answer a POST (an action): (status, content type, JSON body)."""
        denied = self.authorized(auth)
        if denied is not None:
            return denied[0], "application/json", orjson.dumps({"status": denied[1]})
        try:
            data = orjson.loads(body or b"{}")
        except orjson.JSONDecodeError:
            return 400, "application/json", orjson.dumps({"status": "the body is not JSON"})
        try:
            apps, pipeline = _targets(data)
            if path == "/api/savepoints":
                job = self._jobs.trigger(apps, pipeline, bool(data.get("stop")))
                return (
                    202,
                    "application/json",
                    orjson.dumps(
                        {"status": f"savepoint job {job.id} started", "job": job.to_json()}
                    ),
                )
            parts = path.split("/")  # "", "api", "savepoints", id, "cancel"
            if len(parts) == 5 and parts[:3] == ["", "api", "savepoints"] and parts[4] == "cancel":
                sid = urllib.parse.unquote(parts[3])
                involved = self._jobs.cancel(sid, apps, pipeline)
                self._snapshots.refresh_savepoints()
                return (
                    200,
                    "application/json",
                    orjson.dumps({"status": f"cancelled {sid} in {', '.join(involved)}"}),
                )
        except (LockgateError, SavepointError, KafkaException) as exc:
            return _error(exc)
        return 404, "application/json", orjson.dumps({"status": "not found"})

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        console = self

        class Handler(BaseHTTPRequestHandler):
            timeout = 30

            def do_GET(self) -> None:  # noqa: N802 - http.server API
                nonce = secrets.token_urlsafe(12)
                path = self.path
                self._answer(lambda: console.get(path, nonce), nonce)

            def do_POST(self) -> None:  # noqa: N802 - http.server API
                path = self.path.partition("?")[0]
                length = int(self.headers.get("Content-Length") or 0)
                if length > MAX_BODY:
                    self._send(413, "application/json", b'{"status":"body too large"}', None)
                    return
                body = self.rfile.read(length) if length > 0 else b""
                auth = self.headers.get("Authorization")
                self._answer(lambda: console.post(path, auth, body), None)

            def _answer(
                self, handle: Callable[[], tuple[int, str, bytes]], nonce: str | None
            ) -> None:
                try:
                    code, ctype, data = handle()
                except Exception as exc:  # noqa: BLE001 - the client gets an answer, always
                    log.exception("console request failed")
                    code, ctype = 500, "application/json"
                    data = orjson.dumps({"status": f"error: {type(exc).__name__}"})
                self._send(code, ctype, data, nonce)

            def _send(self, code: int, ctype: str, data: bytes, nonce: str | None) -> None:
                self.send_response(code)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(data)))
                self.send_header("Cache-Control", "no-store")
                self.send_header("X-Content-Type-Options", "nosniff")
                self.send_header("X-Frame-Options", "DENY")
                script = f"'nonce-{nonce}'" if nonce else "'none'"
                self.send_header(
                    "Content-Security-Policy",
                    f"default-src 'self'; script-src {script}; style-src 'unsafe-inline'; "
                    "img-src 'self' data:; frame-ancestors 'none'",
                )
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
                # Only the request line's method and path and the status: never headers.
                log.debug("console request", extra={"request": self.command, "path": self.path})

        return Handler


def _error(exc: Exception) -> tuple[int, str, bytes]:
    """Return the answer for an operator-command error (400 for usage problems)."""
    usage = isinstance(exc, SavepointError) or (isinstance(exc, OpsError) and exc.exit_code == 2)
    return (400 if usage else 502), "application/json", orjson.dumps({"status": str(exc)})
