"""An S3 API server for the tier's savepoint stores: moto's, in the test process.

It listens on the node address (``NODE_IP``), which every pod routes to, so the pods' s3fs
reaches it through ``savepoints.endpointUrl``; the credentials go to the pods from a Secret
(``savepoints.credentials``), as an operator would give them.
"""

from __future__ import annotations

from typing import Any

from tests.k8s.kube import NODE_IP, Cluster
from tests.support.ports import free_port

BUCKET = "lockgate-savepoints"
SECRET = "savepoint-store"
ACCESS_KEY, SECRET_KEY = "lockgate", "lockgate-secret"


class S3Server:
    """moto's S3 API server in this process, on the node address (pods route to it)."""

    def __init__(self) -> None:
        from moto.server import ThreadedMotoServer

        self.port = free_port()
        self.url = f"http://{NODE_IP}:{self.port}"
        self._cls = ThreadedMotoServer
        self._server: Any = None

    def start(self) -> None:
        """Start (or restart) the server on its port."""
        self._server = self._cls(ip_address=NODE_IP, port=self.port)
        self._server.start()

    def stop(self) -> None:
        """Stop the server (connections are refused until :meth:`start`)."""
        if self._server is not None:
            self._server.stop()
            self._server = None

    def create_bucket(self) -> None:
        """Create ``BUCKET`` unless it exists (moto's store is shared by every server of the
        process: the tier's modules each start one, the bucket outlives them)."""
        fs = self.fs()
        if not fs.exists(BUCKET):
            fs.mkdir(BUCKET)

    def fs(self) -> Any:
        """An s3fs filesystem on the server, with the test credentials."""
        import s3fs  # type: ignore[import-untyped]

        return s3fs.S3FileSystem(
            endpoint_url=self.url, key=ACCESS_KEY, secret=SECRET_KEY, skip_instance_cache=True
        )

    def ids(self, prefix: str) -> list[str]:
        """The savepoint ids under ``prefix`` (``bucket/path``)."""
        fs = self.fs()
        if not fs.exists(prefix):
            return []
        return sorted(path.rsplit("/", 1)[-1] for path in fs.ls(prefix, refresh=True))


def create_secret(cluster: Cluster, ns: str) -> None:
    """The object store's credentials as the operator's Secret ``SECRET`` in ``ns``."""
    cluster.kubectl(
        "-n", ns, "create", "secret", "generic", SECRET,
        f"--from-literal=access-key={ACCESS_KEY}",
        f"--from-literal=secret-key={SECRET_KEY}",
        "--from-literal=region=us-east-1",
    )  # fmt: skip


def s3_values(server: S3Server, prefix: str) -> list[str]:
    """Chart arguments: savepoints at ``s3://prefix`` on ``server``, credentials from the Secret."""
    return [
        "--set", f"savepoints.location=s3://{prefix}",
        "--set", f"savepoints.endpointUrl={server.url}",
        "--set", f"savepoints.credentials.existingSecret={SECRET}",
        "--set-json",
        'savepoints.credentials.env={"AWS_ACCESS_KEY_ID": "access-key",'
        ' "AWS_SECRET_ACCESS_KEY": "secret-key", "AWS_DEFAULT_REGION": "region"}',
    ]  # fmt: skip
