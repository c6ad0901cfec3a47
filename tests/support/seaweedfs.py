"""SeaweedFS as a test subprocess: a real S3-compatible object store on loopback.

One ``weed server`` process runs a master, a volume server, a filer and the S3 gateway.
Its data lives in a directory, so :meth:`SeaweedFS.stop` then :meth:`SeaweedFS.start`
(the same ports, the same directory) is an outage after which every object is back, and
:meth:`SeaweedFS.pause` / :meth:`SeaweedFS.resume` (SIGSTOP / SIGCONT) is a store that
accepts connections and never answers. The binary is built and cached by
``tests/support/ensure-seaweedfs.sh``.

The S3 gateway runs without identities: any access key is accepted. Bucket names follow
S3's rules (3 to 63 characters).
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import IO, Any

from tests.support.ports import free_port

ROOT = Path(__file__).resolve().parents[2]
ENSURE = ROOT / "tests" / "support" / "ensure-seaweedfs.sh"

#: The credentials the tests give their S3 clients (the gateway checks none).
ACCESS_KEY = "lockgate-test"
SECRET_KEY = "lockgate-test-secret"
REGION = "us-east-1"
#: A bucket of the server's own: :meth:`SeaweedFS.start` writes a probe object there.
_PROBE_BUCKET = "lockgate-probe"
#: The probe object's key (written and deleted again).
_PROBE_KEY = ".lockgate-probe"

#: The ``weed server`` ports: name -> offset from the first port of the block.
_PORTS = {
    "master.port": 0,
    "master.port.grpc": 1,
    "volume.port": 2,
    "volume.port.grpc": 3,
    "filer.port": 4,
    "filer.port.grpc": 5,
    "s3.port": 6,
    "s3.port.grpc": 7,
    "s3.port.iceberg": 8,
    "s3.port.lance": 9,
}


class SeaweedFSError(RuntimeError):
    """The server could not be built or started (the message says why)."""


def ensure_binary(timeout: float = 900) -> str:
    """Return the path of ``weed``, building it with the Go toolchain the first time."""
    # Progress (a first build takes about four minutes) and errors go to our stderr.
    done = subprocess.run([str(ENSURE)], stdout=subprocess.PIPE, timeout=timeout, text=True)
    if done.returncode != 0:
        raise SeaweedFSError(
            f"{ENSURE.relative_to(ROOT)} failed (exit {done.returncode}); see its stderr above"
        )
    return done.stdout.strip()


class SeaweedFS:
    """One ``weed server`` with the S3 gateway, its data in ``data_dir``.

    Args:
        data_dir: where the server keeps volumes and metadata (kept across restarts).
        log_path: the server's output.
        binary: the ``weed`` binary (default: :func:`ensure_binary`).
    """

    def __init__(self, data_dir: Path, log_path: Path, binary: str | None = None) -> None:
        self.data_dir = data_dir
        self.log_path = log_path
        self.binary = binary or ensure_binary()
        self.base_port = free_port(len(_PORTS))
        self.proc: subprocess.Popen[bytes] | None = None
        self._log: IO[bytes] | None = None

    @property
    def s3_port(self) -> int:
        """The S3 gateway's port."""
        return self.base_port + _PORTS["s3.port"]

    @property
    def endpoint(self) -> str:
        """The S3 endpoint URL (path-style addressing)."""
        return f"http://127.0.0.1:{self.s3_port}"

    def client(self, config: Any = None) -> Any:
        """A boto3 S3 client for this server (``config``: a ``botocore.config.Config``)."""
        import boto3

        return boto3.client(
            "s3",
            endpoint_url=self.endpoint,
            aws_access_key_id=ACCESS_KEY,
            aws_secret_access_key=SECRET_KEY,
            region_name=REGION,
            config=config,
        )

    def storage_options(self) -> dict[str, Any]:
        """fsspec/s3fs options for this server (``s3://bucket/...`` URLs)."""
        return {
            "key": ACCESS_KEY,
            "secret": SECRET_KEY,
            "client_kwargs": {"endpoint_url": self.endpoint, "region_name": REGION},
        }

    def start(self, timeout: float = 60) -> SeaweedFS:
        """Start the server and wait until S3 answers a listing and takes a write at once.

        Raises:
            SeaweedFSError: it exited or did not answer within ``timeout``.
        """
        self.data_dir.mkdir(parents=True, exist_ok=True)
        args = [
            self.binary,
            "server",
            f"-dir={self.data_dir}",
            "-ip=127.0.0.1",
            "-ip.bind=127.0.0.1",
            "-filer",
            "-s3",
            "-master.telemetry=false",
            # One master: a restart need not wait 10 s (the default) to elect itself.
            "-master.electionTimeout=1s",
            "-volume.max=100",
            "-volume.preStopSeconds=0",
            # Each bucket is a collection that grows several volumes at its first write:
            # room for 100 volume files of at most 256 MB (written as data comes, never
            # preallocated), so many buckets and gigabytes fit.
            "-master.volumeSizeLimitMB=256",
            *(f"-{name}={self.base_port + off}" for name, off in _PORTS.items()),
        ]
        self._log = self.log_path.open("ab")
        self.proc = subprocess.Popen(
            args, stdout=self._log, stderr=subprocess.STDOUT, cwd=self.data_dir
        )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise SeaweedFSError(
                    f"weed server exited with {self.proc.returncode}; see {self.log_path}"
                )
            if self._answers() and self._writes():
                return self
            time.sleep(0.3)
        self.stop()
        raise SeaweedFSError(f"weed server's S3 did not answer in {timeout} s; see {self.log_path}")

    def _answers(self) -> bool:
        try:
            with urllib.request.urlopen(self.endpoint + "/", timeout=2) as resp:
                return bool(resp.status == 200)
        except urllib.error.HTTPError as exc:
            return exc.code in (200, 403)
        except OSError:
            return False

    def _writes(self, bucket: str = _PROBE_BUCKET) -> bool:
        """Whether an object write to ``bucket`` is answered at once (created if missing).

        The S3 gateway answers listings before the filer has registered with the master
        (until then each object write waits for the filer's lock), and each bucket is a
        collection whose first write waits for its volumes to be grown: seconds, longer
        than the AWS SDK's low-speed limit in pyarrow. A probe object is written and
        deleted until that takes under a second.
        """
        import botocore.config

        client = self.client(
            botocore.config.Config(connect_timeout=2, read_timeout=2, retries={"max_attempts": 1})
        )
        try:
            with contextlib.suppress(Exception):
                client.create_bucket(Bucket=bucket)
            started = time.monotonic()
            client.put_object(Bucket=bucket, Key=_PROBE_KEY, Body=b"ready")
            client.delete_object(Bucket=bucket, Key=_PROBE_KEY)
            return time.monotonic() - started < 1.0
        except Exception:
            return False

    def create_bucket(self, name: str, timeout: float = 60) -> None:
        """Create bucket ``name`` and wait until it takes writes at once.

        Raises:
            SeaweedFSError: the bucket did not take a write at once within ``timeout``.
        """
        deadline = time.monotonic() + timeout
        while not self._writes(name):
            if time.monotonic() > deadline:
                raise SeaweedFSError(f"bucket {name!r} took no write within {timeout} s")
            time.sleep(0.3)

    def pause(self) -> None:
        """SIGSTOP the server: connections are accepted, nothing is answered."""
        assert self.proc is not None
        os.kill(self.proc.pid, signal.SIGSTOP)

    def resume(self) -> None:
        """SIGCONT a paused server."""
        assert self.proc is not None
        os.kill(self.proc.pid, signal.SIGCONT)

    def stop(self) -> None:
        """Stop the server (SIGTERM, then SIGKILL after 3 s); the data directory stays.

        A killed server loses nothing it acknowledged: its volumes are append-only files
        and its filer's metadata store writes a log (both in the page cache at worst).
        """
        if self.proc is not None and self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGCONT)
            self.proc.terminate()
            try:
                self.proc.wait(3)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        self.proc = None
        if self._log is not None:
            self._log.close()
            self._log = None
