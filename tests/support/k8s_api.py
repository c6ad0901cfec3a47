"""A local HTTPS stand-in for the one Kubernetes API read lockgate makes.

``processors/_runtime/kubernetes.py`` reads
``GET /apis/apps/v1/namespaces/<ns>/statefulsets/<name>`` with a bearer token over TLS.
This server answers exactly that, from a dict the test changes, with a self-signed
certificate for 127.0.0.1 made by ``openssl``, and writes a service-account directory
(token, ca.crt, namespace) the runtime is pointed at with
``LOCKGATE_KUBERNETES_TOKEN_DIR``. It stands in for the API server only: Kafka stays real.
"""

from __future__ import annotations

import json
import ssl
import subprocess
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

TOKEN = "test-token-0123456789"  # noqa: S105 - a test credential


class FakeStatefulSetAPI:
    """Serves StatefulSets from :attr:`sets` (name -> object); counts the requests."""

    def __init__(self, workdir: Path, namespace: str = "apps") -> None:
        self.sa_dir = workdir / "serviceaccount"
        self.sa_dir.mkdir(parents=True)
        self.namespace = namespace
        self.sets: dict[str, dict[str, Any]] = {}
        self.status: int | None = None  # set to answer every request with this error
        self.requests: list[str] = []
        self.trickle_s = 0.0  # send the body one byte per this many seconds
        key, cert = workdir / "key.pem", self.sa_dir / "ca.crt"
        subprocess.run(
            [
                "openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt",
                "ec_paramgen_curve:prime256v1", "-nodes", "-days", "1",
                "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1",
                "-keyout", str(key), "-out", str(cert),
            ],
            check=True,
            capture_output=True,
        )  # fmt: skip
        (self.sa_dir / "token").write_text(TOKEN + "\n")
        (self.sa_dir / "namespace").write_text(namespace)
        api = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 - http.server's name
                api.requests.append(self.path)
                prefix = f"/apis/apps/v1/namespaces/{api.namespace}/statefulsets/"
                if self.headers.get("Authorization") != f"Bearer {TOKEN}":
                    self._answer(401, {"kind": "Status", "code": 401})
                elif api.status is not None:
                    self._answer(api.status, {"kind": "Status", "code": api.status})
                elif self.path.startswith(prefix) and self.path[len(prefix) :] in api.sets:
                    self._answer(200, api.sets[self.path[len(prefix) :]])
                else:
                    self._answer(404, {"kind": "Status", "code": 404})

            def _answer(self, code: int, body: dict[str, Any]) -> None:
                data = json.dumps(body).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                if not api.trickle_s:
                    self.wfile.write(data)
                    return
                for i in range(len(data)):  # a slow server: each read returns in time
                    self.wfile.write(data[i : i + 1])
                    self.wfile.flush()
                    time.sleep(api.trickle_s)

            def log_message(self, *args: Any) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(cert, key)
        self._server.socket = context.wrap_socket(self._server.socket, server_side=True)
        self.port = self._server.server_address[1]
        self.url = f"https://127.0.0.1:{self.port}"
        self._thread = threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )

    def set_replicas(
        self, name: str, replicas: int, deleting: bool = False, start: int | None = None
    ) -> None:
        meta: dict[str, Any] = {"name": name, "namespace": self.namespace}
        if deleting:
            meta["deletionTimestamp"] = "2026-11-26T00:00:00Z"
        spec: dict[str, Any] = {"replicas": replicas}
        if start is not None:
            spec["ordinals"] = {"start": start}
        self.sets[name] = {"kind": "StatefulSet", "metadata": meta, "spec": spec}

    def env(self) -> dict[str, str]:
        """The environment a pod would see (plus the token dir setting)."""
        return {
            "KUBERNETES_SERVICE_HOST": "127.0.0.1",
            "KUBERNETES_SERVICE_PORT": str(self.port),
            "LOCKGATE_KUBERNETES_TOKEN_DIR": str(self.sa_dir),
        }

    def __enter__(self) -> FakeStatefulSetAPI:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()
