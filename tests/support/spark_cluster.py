"""A Spark standalone cluster (one master, N workers) on 127.0.0.1 for the test suite.

Started from the pyspark distribution's own launch script (``<pyspark>/bin/spark-class``
with ``SPARK_HOME`` = the pyspark package directory), so the test cluster is the Spark
the product runs against, with nothing downloaded. Every daemon binds 127.0.0.1 only, on
ports picked free here (``spark.port.maxRetries=0``: a port taken meanwhile fails the
start loudly instead of silently moving to the next port); the master's REST submission
server, which would take the fixed port 6066, is off.

Every daemon is started in its own session (``start_new_session``); everything it starts
(executor JVMs, the pyspark daemon — which moves itself to its own process *group* — and
its forked Python workers) stays in that session, so :meth:`StandaloneCluster.stop` finds
and kills all of them through ``/proc``: no orphans, also when a test fails.
"""

from __future__ import annotations

import atexit
import ipaddress
import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from types import TracebackType
from typing import IO, Any

from tests.support.ports import free_port

START_TIMEOUT_S = 60.0
#: JVM flags for quick start-up of short-lived test JVMs on a small machine: C1 JIT only,
#: serial GC (measured on 2 loaded cores: cluster start 13-14 s instead of 22-25 s).
FAST_JVM_OPTS = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"
_HOST = "127.0.0.1"
#: urllib without proxies: the web UI is on 127.0.0.1, never ask a proxy for it.
_HTTP = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def spark_home() -> Path:
    """The pyspark package directory: a Spark distribution (bin/, jars/)."""
    import pyspark

    return Path(pyspark.__file__).resolve().parent


def free_ports(count: int) -> list[int]:
    """Return ``count`` distinct ports free on 127.0.0.1 (:mod:`tests.support.ports`)."""
    return [free_port() for _ in range(count)]


def _stat(pid: str) -> tuple[str, int, int] | None:
    """(state, pgid, sid) of process ``pid`` from /proc, or None when it is gone."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = raw[raw.rindex(")") + 2 :].split()
    return fields[0], int(fields[2]), int(fields[3])


def session_members(sids: set[int]) -> dict[int, int]:
    """``{pid: pgid}`` of the live (non-zombie) processes in sessions ``sids`` (Linux)."""
    members: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        stat = _stat(entry)
        if stat is not None and stat[0] != "Z" and stat[2] in sids:
            members[int(entry)] = stat[1]
    return members


def listening_addresses(pids: list[int]) -> set[tuple[str, int]]:
    """(host, port) of every TCP socket the processes ``pids`` listen on (Linux /proc).

    IPv4-mapped IPv6 addresses (``::ffff:127.0.0.1``, how the JVM binds) are given as IPv4.
    """
    inodes: set[str] = set()
    for pid in pids:
        try:
            fds = os.listdir(f"/proc/{pid}/fd")
        except OSError:
            continue
        for fd in fds:
            try:
                target = os.readlink(f"/proc/{pid}/fd/{fd}")
            except OSError:
                continue
            if target.startswith("socket:["):
                inodes.add(target[8:-1])
    found: set[tuple[str, int]] = set()
    for table in ("tcp", "tcp6"):
        for line in Path(f"/proc/net/{table}").read_text().splitlines()[1:]:
            fields = line.split()
            if fields[3] != "0A" or fields[9] not in inodes:  # 0A = LISTEN
                continue
            host_hex, port_hex = fields[1].split(":")
            # The kernel prints each 32-bit word of the address in host (little) order.
            raw = b"".join(
                bytes.fromhex(host_hex[i : i + 8])[::-1] for i in range(0, len(host_hex), 8)
            )
            addr: ipaddress.IPv4Address | ipaddress.IPv6Address = ipaddress.ip_address(raw)
            if isinstance(addr, ipaddress.IPv6Address) and addr.ipv4_mapped is not None:
                addr = addr.ipv4_mapped
            found.add((str(addr), int(port_hex, 16)))
    return found


def _tail(path: Path, lines: int = 40) -> str:
    try:
        text = path.read_text(errors="replace").splitlines()
    except OSError as exc:
        return f"    ({exc})"
    return "\n".join(f"    {line}" for line in text[-lines:])


class ClusterError(RuntimeError):
    """The cluster did not come up; the message carries the tails of its logs."""


class StandaloneCluster:
    """A Spark standalone master and ``workers`` workers on 127.0.0.1.

    Use as a context manager (stopped on exit, also on error)::

        with StandaloneCluster(workers=2, work_dir=tmp_path) as cluster:
            run_driver(cluster.master_url)

    Attributes:
        master_url: ``spark://127.0.0.1:PORT``, set once started.
        web_ui: ``http://127.0.0.1:PORT`` of the master web UI.
        start_seconds: Wall time :meth:`start` took (processes up, all workers registered).
    """

    def __init__(
        self,
        workers: int = 2,
        cores_per_worker: int = 1,
        memory: str = "1g",
        *,
        work_dir: Path,
        daemon_memory: str = "256m",
        start_timeout: float = START_TIMEOUT_S,
    ) -> None:
        if workers < 1 or cores_per_worker < 1:
            raise ValueError("need at least one worker with at least one core")
        self.workers = workers
        self.cores_per_worker = cores_per_worker
        self.memory = memory
        self.daemon_memory = daemon_memory
        self.work_dir = work_dir.resolve()
        self.log_dir = self.work_dir / "logs"
        self.start_timeout = start_timeout
        self.master_url = ""
        self.web_ui = ""
        self.start_seconds = 0.0
        self._procs: list[tuple[str, subprocess.Popen[bytes], Path]] = []
        self._logs: list[IO[bytes]] = []

    # -- lifecycle -------------------------------------------------------------------------

    def __enter__(self) -> StandaloneCluster:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def _env(self) -> dict[str, str]:
        home = spark_home()
        conf_dir = self.work_dir / "conf"  # empty: no spark-env.sh / defaults of the host
        conf_dir.mkdir(parents=True, exist_ok=True)
        env = {
            k: v
            for k, v in os.environ.items()
            # The executors must import shipped code, not what this process can see.
            if not k.startswith(("SPARK_", "PYSPARK_")) and k != "PYTHONPATH"
        }
        env.update(
            SPARK_HOME=str(home),
            SPARK_CONF_DIR=str(conf_dir),
            SPARK_LOG_DIR=str(self.log_dir),
            SPARK_LOCAL_IP=_HOST,
            SPARK_MASTER_HOST=_HOST,
            SPARK_DAEMON_MEMORY=self.daemon_memory,
            # No silent move to the next port; no REST submission server (fixed port 6066).
            SPARK_DAEMON_JAVA_OPTS=(
                f"{FAST_JVM_OPTS} -Dspark.port.maxRetries=0 -Dspark.master.rest.enabled=false"
            ),
            SPARK_LAUNCHER_OPTS=FAST_JVM_OPTS,  # the launcher JVM spark-class runs first
            SPARK_LOCAL_DIRS=str(self.work_dir / "local"),
            PYSPARK_PYTHON=sys.executable,
        )
        return env

    def _spawn(self, name: str, args: list[str], env: dict[str, str]) -> None:
        log_path = self.log_dir / f"{name}.log"
        log = open(log_path, "ab")  # noqa: SIM115 - closed in stop()
        self._logs.append(log)
        proc = subprocess.Popen(
            [str(spark_home() / "bin" / "spark-class"), *args],
            cwd=self.work_dir,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # own session: stop() finds all its descendants
        )
        self._procs.append((name, proc, log_path))

    def start(self) -> StandaloneCluster:
        """Start the master, then the workers; return once every worker is registered.

        Raises:
            ClusterError: Within ``start_timeout`` seconds the master did not answer or
                not every worker registered, or a daemon exited; the message has the tails
                of the logs. Everything started is stopped before it is raised.
        """
        t0 = time.monotonic()
        deadline = t0 + self.start_timeout
        for sub in ("logs", "local"):
            (self.work_dir / sub).mkdir(parents=True, exist_ok=True)
        env = self._env()
        master_port, ui_port, *worker_ports = free_ports(2 + 2 * self.workers)
        self.web_ui = f"http://{_HOST}:{ui_port}"
        atexit.register(self.stop)
        try:
            self._spawn(
                "master",
                [
                    "org.apache.spark.deploy.master.Master",
                    "--host",
                    _HOST,
                    "--port",
                    str(master_port),
                    "--webui-port",
                    str(ui_port),
                ],
                {
                    **env,
                    "SPARK_MASTER_PORT": str(master_port),
                    "SPARK_MASTER_WEBUI_PORT": str(ui_port),
                },
            )
            # Workers started before the master listens back off for 5-15 s: wait for it.
            status = self._wait(deadline, lambda s: True, "the master web UI to answer")
            self.master_url = str(status["url"])
            for i in range(self.workers):
                port, worker_ui = worker_ports[2 * i], worker_ports[2 * i + 1]
                worker_dir = self.work_dir / f"worker-{i}"
                worker_dir.mkdir(exist_ok=True)
                self._spawn(
                    f"worker-{i}",
                    [
                        "org.apache.spark.deploy.worker.Worker",
                        "--host",
                        _HOST,
                        "--port",
                        str(port),
                        "--webui-port",
                        str(worker_ui),
                        "--cores",
                        str(self.cores_per_worker),
                        "--memory",
                        self.memory,
                        "--work-dir",
                        str(worker_dir),
                        self.master_url,
                    ],
                    env,
                )
            self._wait(
                deadline,
                lambda s: int(s.get("aliveworkers", 0)) >= self.workers,
                f"{self.workers} workers to register",
            )
        except BaseException:
            self.stop()
            raise
        self.start_seconds = time.monotonic() - t0
        return self

    def _wait(self, deadline: float, done: Any, what: str) -> dict[str, Any]:
        """Poll the master's /json until ``done(status)``; raise ClusterError at deadline."""
        last = "no answer yet"
        while True:
            for name, proc, _ in self._procs:
                if proc.poll() is not None:
                    raise ClusterError(
                        f"spark {name} exited with {proc.returncode} while waiting for "
                        f"{what}\n{self.log_tails()}"
                    )
            try:
                status = self.status(timeout=2.0)
            except (OSError, ValueError) as exc:
                last = repr(exc)
            else:
                if done(status):
                    return status
                last = f"aliveworkers={status.get('aliveworkers')}"
            if time.monotonic() >= deadline:
                raise ClusterError(
                    f"timed out after {self.start_timeout:.0f}s waiting for {what} "
                    f"({self.web_ui}/json: {last})\n{self.log_tails()}"
                )
            time.sleep(0.25)

    def status(self, timeout: float = 5.0) -> dict[str, Any]:
        """The master web UI's ``/json`` (``aliveworkers``, ``activeapps``, ...)."""
        with _HTTP.open(f"{self.web_ui}/json", timeout=timeout) as response:
            result: dict[str, Any] = json.loads(response.read())
        return result

    def pids(self) -> list[int]:
        """Pids of the daemons (``spark-class`` execs the JVM: same pid) = their sessions."""
        return [proc.pid for _, proc, _ in self._procs]

    def worker_pids(self) -> list[int]:
        """Pids (= session ids) of the worker daemons, in start order."""
        return [proc.pid for name, proc, _ in self._procs if name.startswith("worker")]

    def listening(self) -> set[tuple[str, int]]:
        """(host, port) of every TCP socket a process of the cluster listens on."""
        return listening_addresses(list(session_members(set(self.pids()))))

    def log_tails(self, lines: int = 40) -> str:
        """The last ``lines`` lines of every daemon log and executor stderr."""
        paths = [log_path for _, _, log_path in self._procs]
        paths += sorted(self.work_dir.glob("worker-*/app-*/*/stderr"))
        return "\n".join(f"--- {path}\n{_tail(path, lines)}" for path in paths)

    def stop(self, grace: float = 10.0) -> None:
        """Kill every process the cluster started; idempotent.

        SIGTERM to every process group in the daemons' sessions (the workers then stop
        their executors), SIGKILL to whatever is still there after ``grace`` seconds,
        until the sessions are empty; then reap the daemons and close the logs.
        """
        sids = {proc.pid for _, proc, _ in self._procs}
        if sids:
            self._signal_all(sids, signal.SIGTERM)
            deadline = time.monotonic() + grace
            while session_members(sids) and time.monotonic() < deadline:
                time.sleep(0.1)
            for _ in range(50):
                if not self._signal_all(sids, signal.SIGKILL):
                    break
                time.sleep(0.1)
        for _, proc, _ in self._procs:
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                pass
        for log in self._logs:
            log.close()
        self._procs.clear()
        self._logs.clear()
        atexit.unregister(self.stop)

    @staticmethod
    def _signal_all(sids: set[int], sig: int) -> bool:
        """Send ``sig`` to every live member of ``sids`` and its group; False if none."""
        members = session_members(sids)
        for pid, pgid in members.items():
            for kill, target in ((os.killpg, pgid), (os.kill, pid)):
                try:
                    kill(target, sig)
                except (ProcessLookupError, PermissionError):
                    pass
        return bool(members)
