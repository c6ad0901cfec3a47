"""An S3 server for tests: SeaweedFS, a real object store, that keeps its data across outages.

SeaweedFS (tests/support/seaweedfs.py; Apache-2.0, built from the Go module proxy by
``tests/support/ensure-seaweedfs.sh`` and cached) runs a master, a volume server, a filer
and its S3 gateway in one ``weed server`` process on loopback. Requests are signed with
SigV4 as for any S3 endpoint; the AWS SDKs, s3fs and pyarrow's S3 filesystem talk to it
unchanged. Objects are stored in volume files under a data directory, so :meth:`S3Server.stop`
(the process ends: connections are refused, a file store outage) and :meth:`S3Server.start`
(the same ports, the same directory) bring back every bucket and object.

Credentials are fixed test values (the gateway runs without identities and accepts any);
the region is ``us-east-1``.
"""

from __future__ import annotations

import shutil
import time
from pathlib import Path
from typing import Any

from tests.support.seaweedfs import ACCESS_KEY, REGION, SECRET_KEY, SeaweedFS

__all__ = ["ACCESS_KEY", "REGION", "SECRET_KEY", "S3Server"]


class S3Server:
    """A SeaweedFS S3 server on 127.0.0.1 (see the module docs), started at construction.

    Args:
        log_path: the server's output; its data directory is created beside it.
    """

    def __init__(self, log_path: Path) -> None:
        self._data = log_path.parent / f"{log_path.stem}-data"
        self._server = SeaweedFS(self._data, log_path)
        self.port = self._server.s3_port
        self.endpoint = self._server.endpoint
        self.up = False
        self.start()

    def start(self) -> None:
        """Start the server (again); returns once bucket listings are answered."""
        self._server.start()
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
        """Stop the server: every request is refused until :meth:`start`; data kept."""
        self._server.stop()
        self.up = False

    def close(self) -> None:
        """Stop the server and delete its data."""
        self._server.stop()
        self.up = False
        shutil.rmtree(self._data, ignore_errors=True)

    def fs(self) -> Any:
        """An s3fs filesystem on the server (a fresh one: no cached listings)."""
        import s3fs  # type: ignore[import-untyped]

        return s3fs.S3FileSystem(
            endpoint_url=self.endpoint,
            key=ACCESS_KEY,
            secret=SECRET_KEY,
            client_kwargs={"region_name": REGION},
            skip_instance_cache=True,
            use_listings_cache=False,
        )

    def create_bucket(self, bucket: str) -> None:
        """Create ``bucket`` unless it exists (retried while the volume server registers)."""
        self._server.create_bucket(bucket)

    def file_io_properties(self) -> dict[str, str]:
        """pyiceberg FileIO properties for this server (path-style, fixed region)."""
        return {
            "s3.endpoint": self.endpoint,
            "s3.access-key-id": ACCESS_KEY,
            "s3.secret-access-key": SECRET_KEY,
            "s3.region": REGION,
            "s3.force-virtual-addressing": "false",
        }
