"""A small client for Toxiproxy's HTTP API, and the server as a test subprocess.

Toxiproxy (github.com/Shopify/toxiproxy) is a TCP proxy whose faults are set over HTTP:
a proxy listens on one address and forwards to an upstream; *toxics* added to it delay,
reset or black-hole the traffic of one direction (``downstream``: upstream -> client,
``upstream``: client -> upstream); disabling a proxy closes its listener and every open
connection. The binary is built and cached by ``tests/support/ensure-toxiproxy.sh``.

Only the standard library (urllib) is used.
"""

from __future__ import annotations

import json
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import IO, Any

from tests.support.ports import free_port

ROOT = Path(__file__).resolve().parents[2]
ENSURE = ROOT / "tests" / "support" / "ensure-toxiproxy.sh"


class ToxiproxyError(RuntimeError):
    """The API answered with an error status (or not at all)."""


def ensure_binary(timeout: float = 600) -> str:
    """Return the path of toxiproxy-server, building it with ``go install`` the first time."""
    # Progress (a first build takes about a minute) and errors go to our stderr.
    done = subprocess.run([str(ENSURE)], stdout=subprocess.PIPE, timeout=timeout, text=True)
    if done.returncode != 0:
        raise ToxiproxyError(
            f"{ENSURE.relative_to(ROOT)} failed (exit {done.returncode}); see its stderr above"
        )
    return done.stdout.strip()


class Toxiproxy:
    """The HTTP API of one toxiproxy-server (``http://127.0.0.1:<port>``)."""

    def __init__(self, api: str) -> None:
        self.api = api.rstrip("/")

    def _request(self, method: str, path: str, body: dict[str, Any] | None = None) -> Any:
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(
            self.api + path,
            data=data,
            method=method,
            headers={"Content-Type": "application/json"} if data is not None else {},
        )
        try:
            with urllib.request.urlopen(req, timeout=10) as resp:
                raw = resp.read()
        except urllib.error.HTTPError as exc:
            detail = exc.read().decode(errors="replace")
            raise ToxiproxyError(f"{method} {path}: HTTP {exc.code}: {detail}") from exc
        except OSError as exc:
            raise ToxiproxyError(f"{method} {path}: {exc}") from exc
        return json.loads(raw) if raw.strip() else None

    def version(self) -> str:
        req = urllib.request.Request(self.api + "/version")
        with urllib.request.urlopen(req, timeout=5) as resp:
            return str(resp.read().decode().strip())

    def reset(self) -> None:
        """Enable every proxy and remove every toxic."""
        self._request("POST", "/reset")

    def create_proxy(self, name: str, listen: str, upstream: str) -> Proxy:
        self._request(
            "POST",
            "/proxies",
            {"name": name, "listen": listen, "upstream": upstream, "enabled": True},
        )
        return Proxy(self, name)

    def proxy(self, name: str) -> Proxy:
        return Proxy(self, name)


class Proxy:
    """One proxy: its toxics and its enabled flag."""

    def __init__(self, api: Toxiproxy, name: str) -> None:
        self.api = api
        self.name = name

    def info(self) -> dict[str, Any]:
        info: dict[str, Any] = self.api._request("GET", f"/proxies/{self.name}")
        return info

    def add_toxic(
        self,
        kind: str,
        attributes: dict[str, Any],
        stream: str = "downstream",
        name: str | None = None,
        toxicity: float = 1.0,
    ) -> str:
        """Add a toxic; returns its name (default ``<kind>_<stream>``)."""
        name = name or f"{kind}_{stream}"
        self.api._request(
            "POST",
            f"/proxies/{self.name}/toxics",
            {
                "name": name,
                "type": kind,
                "stream": stream,
                "toxicity": toxicity,
                "attributes": attributes,
            },
        )
        return name

    def remove_toxic(self, name: str) -> None:
        self.api._request("DELETE", f"/proxies/{self.name}/toxics/{name}")

    def toxics(self) -> list[dict[str, Any]]:
        toxics: list[dict[str, Any]] = self.api._request("GET", f"/proxies/{self.name}/toxics")
        return toxics

    def clear_toxics(self) -> None:
        for toxic in self.toxics():
            self.remove_toxic(toxic["name"])

    # The toxics the chaos tests use.

    def latency(
        self, ms: int, jitter: int = 0, streams: tuple[str, ...] = ("downstream",)
    ) -> list[str]:
        """Delay every chunk of data by ``ms`` (± ``jitter``) ms."""
        return [
            self.add_toxic("latency", {"latency": ms, "jitter": jitter}, stream=s) for s in streams
        ]

    def reset_peer(
        self, after_ms: int = 0, streams: tuple[str, ...] = ("upstream", "downstream")
    ) -> list[str]:
        """Reset (TCP RST) each connection ``after_ms`` after its next data."""
        return [self.add_toxic("reset_peer", {"timeout": after_ms}, stream=s) for s in streams]

    def timeout(
        self, ms: int = 0, streams: tuple[str, ...] = ("upstream", "downstream")
    ) -> list[str]:
        """Black-hole the data; close the connection after ``ms`` (0: keep it open, silent)."""
        return [self.add_toxic("timeout", {"timeout": ms}, stream=s) for s in streams]

    def set_enabled(self, enabled: bool) -> None:
        """Disabled: the listener and every open connection are closed (connection refused)."""
        self.api._request("POST", f"/proxies/{self.name}", {"enabled": enabled})

    def disable(self) -> None:
        self.set_enabled(False)

    def enable(self) -> None:
        self.set_enabled(True)


class ToxiproxyServer:
    """A toxiproxy-server subprocess on 127.0.0.1 with its API client."""

    def __init__(self, log_path: Path, binary: str | None = None) -> None:
        self.binary = binary or ensure_binary()
        self.log_path = log_path
        self.port = free_port()
        self.api = Toxiproxy(f"http://127.0.0.1:{self.port}")
        self.proc: subprocess.Popen[bytes] | None = None
        self._log: IO[bytes] | None = None

    def start(self, timeout: float = 15) -> ToxiproxyServer:
        self._log = open(self.log_path, "ab")  # noqa: SIM115 - closed in stop()
        self.proc = subprocess.Popen(
            [self.binary, "-host", "127.0.0.1", "-port", str(self.port)],
            stdout=self._log,
            stderr=subprocess.STDOUT,
        )
        deadline = time.monotonic() + timeout
        while True:
            try:
                self.api.version()
                return self
            except OSError:
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    self.stop()
                    raise ToxiproxyError(
                        f"toxiproxy-server did not start on port {self.port}:\n"
                        + self.log_path.read_text(errors="replace")[-2000:]
                    ) from None
                time.sleep(0.05)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        if self._log is not None:
            self._log.close()
            self._log = None
