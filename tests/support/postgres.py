"""A real PostgreSQL server for the Postgres sink's tests, started like the broker.

``PostgresServer(root).start()`` runs ``initdb`` into a fresh temporary directory and
``pg_ctl start`` on a free port of the lane's range (tests/support/ports.py), listening on
127.0.0.1 only, trust authentication, ``max_prepared_transactions`` set (the sink's
two-phase commit needs it). PostgreSQL refuses to run as root: as root the server runs as
``nobody`` (through ``runuser``), its directory owned by that user. The binaries come from
tests/support/ensure-postgres.sh (which installs Debian's package when missing, as root).
``stop()`` / ``start()`` again simulate an outage (``stop(mode="immediate")``: a crash,
prepared transactions survive it as they do any crash).
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

from tests.support.ports import free_port

ROOT = Path(__file__).resolve().parents[2]
ENSURE = ROOT / "tests" / "support" / "ensure-postgres.sh"
#: The user the server runs as when the tests run as root.
SERVER_USER = "nobody"


class PostgresUnavailable(RuntimeError):
    """No PostgreSQL binaries here and none can be installed (the tests skip)."""


def pg_bin() -> Path:
    """The directory of initdb/pg_ctl (installing Debian's package if root and missing).

    Raises:
        PostgresUnavailable: none found, and not root (exit 3 of the script).
        RuntimeError: the install failed.
    """
    proc = subprocess.run([str(ENSURE)], capture_output=True, text=True, check=False)
    if proc.returncode == 3:
        raise PostgresUnavailable(proc.stderr.strip())
    if proc.returncode != 0:
        raise RuntimeError(f"ensure-postgres.sh failed: {proc.stderr}")
    return Path(proc.stdout.strip().splitlines()[-1])


class PostgresServer:
    """One PostgreSQL server in a temporary directory (see the module docs)."""

    def __init__(self, max_prepared: int = 64) -> None:
        self.bin = pg_bin()
        self.port = free_port()
        self.max_prepared = max_prepared
        self.dir = Path(tempfile.mkdtemp(prefix="lockgate-pg-"))
        self.data = self.dir / "data"
        self.log = self.dir / "server.log"
        self.as_root = os.geteuid() == 0
        self.startup_seconds = 0.0

    @property
    def dsn(self) -> str:
        """The connection URL (superuser ``postgres``, database ``postgres``)."""
        return f"postgresql://postgres@127.0.0.1:{self.port}/postgres"

    def _run(self, *args: str, check: bool = True, timeout: float = 60) -> Any:
        cmd = [str(self.bin / args[0]), *args[1:]]
        if self.as_root:
            cmd = ["runuser", "-u", SERVER_USER, "--", *cmd]
        return subprocess.run(
            cmd, check=check, capture_output=True, text=True, timeout=timeout, cwd=self.dir
        )

    def init(self) -> PostgresServer:
        """``initdb`` (once)."""
        if self.as_root:
            shutil.chown(self.dir, SERVER_USER)
        self.dir.chmod(0o700)
        self._run(
            "initdb",
            "-D",
            str(self.data),
            "-U",
            "postgres",
            "--auth=trust",
            "-E",
            "UTF8",
            "--no-sync",
        )
        conf = self.data / "postgresql.conf"
        with conf.open("a") as f:
            f.write(
                f"\nlisten_addresses = '127.0.0.1'\nport = {self.port}\n"
                f"unix_socket_directories = ''\nmax_prepared_transactions = {self.max_prepared}\n"
                "fsync = off\nfull_page_writes = off\n"
            )
        return self

    def start(self) -> PostgresServer:
        """Start the server (initialising it first if needed); return when it accepts."""
        if not self.data.exists():
            self.init()
        started = time.monotonic()
        self._run("pg_ctl", "-D", str(self.data), "-l", str(self.log), "-w", "-t", "60", "start")
        self.wait_ready()
        self.startup_seconds = time.monotonic() - started
        return self

    def wait_ready(self, timeout: float = 30) -> None:
        import psycopg

        deadline = time.monotonic() + timeout
        while True:
            try:
                psycopg.connect(self.dsn, connect_timeout=2).close()
                return
            except psycopg.OperationalError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)

    def stop(self, mode: str = "fast") -> None:
        """Stop the server (``immediate``: like a crash, recovered at the next start)."""
        self._run("pg_ctl", "-D", str(self.data), "-m", mode, "-w", "stop", check=False)

    def pids(self) -> list[int]:
        """The postmaster's pid and its children's (``[]`` when it is not running)."""
        try:
            main = int((self.data / "postmaster.pid").read_text().split()[0])
        except (OSError, ValueError, IndexError):
            return []
        out = [main]
        for stat in Path("/proc").glob("[0-9]*/stat"):
            try:
                fields = stat.read_text().rsplit(")", 1)[1].split()
            except (OSError, IndexError):
                continue
            if int(fields[1]) == main:
                out.append(int(stat.parent.name))
        return out

    def freeze(self) -> list[int]:
        """SIGSTOP every process of the server (a database that stops answering)."""
        pids = []
        for pid in self.pids():
            try:
                os.kill(pid, signal.SIGSTOP)
                pids.append(pid)
            except ProcessLookupError:
                pass  # a backend that just ended
        return pids

    def thaw(self, pids: list[int]) -> None:
        """SIGCONT what :meth:`freeze` stopped."""
        for pid in pids:
            try:
                os.kill(pid, signal.SIGCONT)
            except ProcessLookupError:
                pass

    def destroy(self) -> None:
        """Stop and remove everything."""
        self.thaw(self.pids())  # a test that failed while the server was frozen
        self.stop("immediate")
        shutil.rmtree(self.dir, ignore_errors=True)

    def execute(self, statement: str, params: Any = None) -> list[tuple[Any, ...]]:
        """Run one statement (autocommit) and return its rows (``[]`` without any)."""
        import psycopg

        with psycopg.connect(self.dsn, autocommit=True, connect_timeout=5) as conn:
            cur = conn.execute(statement, params)
            return list(cur.fetchall()) if cur.description is not None else []

    def log_tail(self, lines: int = 30) -> str:
        """The last lines of the server log (for failure reports)."""
        try:
            return "\n".join(self.log.read_text().splitlines()[-lines:])
        except OSError:
            return ""
