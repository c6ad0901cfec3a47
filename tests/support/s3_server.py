"""An S3 API server for tests: moto's, in a child process that keeps its data across outages.

moto's ``ThreadedMotoServer`` is a real HTTP server speaking the S3 API (requests signed
with SigV4, the AWS SDKs and pyarrow's S3 filesystem talk to it as to any S3 endpoint),
but its store is moto's in-memory implementation, not a production object store: no
durability, no latency of a network, one Python process serving every request. It runs in
a child process (``python -m tests.support.s3_server PORT``) so that its request handling
does not compete for the test process's GIL, and it takes commands on its stdin:
``stop`` closes the listener (connections are refused: a file store outage) and
``start`` opens it again on the same port, with the same buckets and objects (moto's
store belongs to the process, not to the listener). Each command is answered with one
line, ``ok`` or ``error <text>``.

Credentials are fixed test values (moto accepts any); the region is ``us-east-1``.
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path
from typing import IO, Any

from tests.support.ports import free_port

ROOT = Path(__file__).resolve().parents[2]
ACCESS_KEY, SECRET_KEY, REGION = "lockgate-test", "lockgate-test-secret", "us-east-1"


class S3Server:
    """moto's S3 API server in a child process on 127.0.0.1 (see the module docs)."""

    def __init__(self, log_path: Path, port: int | None = None) -> None:
        self.port = port if port is not None else free_port()
        self.endpoint = f"http://127.0.0.1:{self.port}"
        self._log: IO[bytes] = open(log_path, "ab")  # noqa: SIM115 - closed in close()
        self._proc = subprocess.Popen(
            [sys.executable, "-m", "tests.support.s3_server", str(self.port)],
            cwd=ROOT,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._log,
            text=True,
        )
        self.up = False
        self.start()

    def _command(self, cmd: str) -> None:
        assert self._proc.stdin is not None and self._proc.stdout is not None
        self._proc.stdin.write(cmd + "\n")
        self._proc.stdin.flush()
        answer = self._proc.stdout.readline().strip()
        if answer != "ok":
            raise RuntimeError(f"S3 server {cmd}: {answer or 'exited'}")

    def start(self) -> None:
        """Listen (again) on the port; returns once requests are answered."""
        self._command("start")
        self.up = True
        deadline = time.monotonic() + 30
        while True:
            try:
                self.fs().ls("")
                return
            except Exception:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)

    def stop(self) -> None:
        """Close the listener: every request is refused until :meth:`start`; data kept."""
        self._command("stop")
        self.up = False

    def close(self) -> None:
        """End the server process (its data goes with it)."""
        if self._proc.poll() is None:
            assert self._proc.stdin is not None
            self._proc.stdin.close()
            try:
                self._proc.wait(15)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait(15)
        self._log.close()

    def fs(self) -> Any:
        """An s3fs filesystem on the server (a fresh one: no cached listings)."""
        import s3fs  # type: ignore[import-untyped]

        return s3fs.S3FileSystem(
            endpoint_url=self.endpoint,
            key=ACCESS_KEY,
            secret=SECRET_KEY,
            skip_instance_cache=True,
            use_listings_cache=False,
        )

    def create_bucket(self, bucket: str) -> None:
        fs = self.fs()
        if not fs.exists(bucket):
            fs.mkdir(bucket)

    def file_io_properties(self) -> dict[str, str]:
        """pyiceberg FileIO properties for this server (path-style, fixed region)."""
        return {
            "s3.endpoint": self.endpoint,
            "s3.access-key-id": ACCESS_KEY,
            "s3.secret-access-key": SECRET_KEY,
            "s3.region": REGION,
            "s3.force-virtual-addressing": "false",
        }


def _serve(port: int) -> None:
    """The child process: run the server, obey ``start``/``stop`` from stdin until EOF."""
    from moto.server import ThreadedMotoServer

    server: ThreadedMotoServer | None = None
    for line in sys.stdin:
        cmd = line.strip()
        try:
            if cmd == "start" and server is None:
                server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
                server.start()
            elif cmd == "stop" and server is not None:
                server.stop()
                server = None
            print("ok", flush=True)
        except Exception as exc:  # noqa: BLE001 - reported to the parent
            print(f"error {type(exc).__name__}: {exc}", flush=True)
    if server is not None:
        server.stop()


if __name__ == "__main__":
    _serve(int(sys.argv[1]))
