"""Apps run against the session broker: the ``lockgate_app`` fixture's factory and runs.

Owns :class:`AppFactory` (the environment an instance gets, its ports and state
directory), :class:`AppRun` and its two kinds (a ``lockgate run`` subprocess, a processor
container), and finding an App object's ``module:attribute`` spec.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Mapping
from pathlib import Path
from typing import IO, TYPE_CHECKING

from processors._testing.broker import LockgateKafka
from processors._testing.containers import (
    _LABEL,
    _graceful_stop,
    _live,
    _logs_of,
    _remove,
    _testcontainers,
)
from processors._testing.ports import free_port
from processors._testing.topics import _unique

if TYPE_CHECKING:
    from processors._dsl.app import App


def _find_spec(app: App | str) -> str:
    """``module:attribute`` of an app object (searched in the loaded modules) or the spec."""
    if isinstance(app, str):
        if ":" not in app:
            raise ValueError(f"app spec {app!r} must look like 'package.module:app'")
        return app
    home = getattr(app, "defined_in", None)  # the module that created it, first
    modules = list(sys.modules.items())
    if home is not None and home in sys.modules:
        modules.insert(0, (home, sys.modules[home]))
    for name, module in modules:
        if name == "__main__" or module is None:
            continue
        for attr, value in list(vars(module).items()):
            if value is app and not attr.startswith("_"):
                return f"{name}:{attr}"
    raise ValueError(
        f"the App {getattr(app, 'name', app)!r} is not a module-level name of any imported "
        "module: pass 'package.module:app' (the app runs in its own process and imports it)"
    )


def _http_ready(port: int, path: str = "/readyz") -> bool:
    try:
        url = f"http://127.0.0.1:{port}{path}"
        with urllib.request.urlopen(url, timeout=2) as resp:  # noqa: S310 - loopback http
            return int(resp.status) == 200
    except (urllib.error.URLError, OSError):
        return False


class AppRun:
    """One running instance of an app (a ``lockgate run`` process or a processor container).

    Attributes:
        spec: ``module:app``.
        app_name: ``LOCKGATE_APP_NAME`` (consumer group, changelog and DLQ prefix).
        http_port: the port of /livez /readyz /metrics on 127.0.0.1.
        env: the ``LOCKGATE_*`` environment the plugin set (plus the caller's ``env``).
        returncode: the exit code once it exited (137 or -9 after :meth:`kill`), else None.
        settled: the test stopped or killed it (or was told it failed to start): the
            fixture's teardown leaves it alone.
    """

    def __init__(self, spec: str, app_name: str, http_port: int, env: dict[str, str]) -> None:
        self.spec = spec
        self.app_name = app_name
        self.http_port = http_port
        self.env = env
        self.returncode: int | None = None
        self.settled = False

    @property
    def alive(self) -> bool:
        """Whether it is still running."""
        raise NotImplementedError

    def logs(self) -> str:
        """Its output (stdout and stderr) so far."""
        raise NotImplementedError

    def stop(self, timeout: float = 60.0) -> int | None:
        """SIGTERM (the app commits its epoch and leaves), wait; return the exit code.

        0 is a clean stop. After ``timeout`` seconds it is killed.
        """
        raise NotImplementedError

    def kill(self) -> None:
        """SIGKILL at once, like ``kill -9`` (uncommitted work is lost, not duplicated)."""
        raise NotImplementedError

    def ready(self) -> bool:
        """Whether ``/readyz`` answers 200 (group joined, key groups restored)."""
        return _http_ready(self.http_port)

    def wait_ready(self, timeout: float = 60.0) -> None:
        """Wait until :meth:`ready`.

        Raises:
            RuntimeError: it exited first (the message has its exit code and log tail).
            TimeoutError: not ready within ``timeout`` seconds (with the log tail).
        """
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.ready():
                return
            if not self.alive:
                raise RuntimeError(
                    f"lockgate run {self.spec} exited with code {self.returncode} before it "
                    f"was ready:\n{self.logs()[-4000:]}"
                )
            time.sleep(0.2)
        raise TimeoutError(
            f"lockgate run {self.spec} not ready within {timeout:.0f}s:\n{self.logs()[-4000:]}"
        )


class _ProcessRun(AppRun):
    """``lockgate run`` as a subprocess of the test."""

    def __init__(
        self,
        spec: str,
        app_name: str,
        http_port: int,
        env: dict[str, str],
        log_path: Path,
        cwd: Path,
    ) -> None:
        super().__init__(spec, app_name, http_port, env)
        self.log_path = log_path
        self._log: IO[bytes] | None = open(log_path, "ab")  # noqa: SIM115 - closed on exit
        paths = [p for p in sys.path if p and Path(p).is_dir()]
        if os.environ.get("PYTHONPATH"):
            paths.insert(0, os.environ["PYTHONPATH"])
        full = {**os.environ, "PYTHONPATH": os.pathsep.join(paths), **env}
        lockgate = Path(sys.executable).parent / "lockgate"
        cmd = (
            [str(lockgate), "run", spec]
            if lockgate.exists()
            else [sys.executable, "-c", "from processors.cli import main; main()", "run", spec]
        )
        self.proc = subprocess.Popen(
            cmd, cwd=cwd, env=full, stdout=self._log, stderr=subprocess.STDOUT
        )

    @property
    def alive(self) -> bool:
        """Whether the process still runs."""
        code = self.proc.poll()
        if code is not None:
            self._closed(code)
        return code is None

    def _closed(self, code: int) -> None:
        self.returncode = code
        if self._log is not None:
            self._log.close()
            self._log = None

    def logs(self) -> str:
        """The process output so far."""
        try:
            return self.log_path.read_text(errors="replace")
        except OSError:
            return ""

    def stop(self, timeout: float = 60.0) -> int | None:
        """SIGTERM, wait up to ``timeout`` s (then SIGKILL); return the exit code."""
        self.settled = True
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        self._closed(int(self.proc.returncode))
        return self.returncode

    def kill(self) -> None:
        """SIGKILL and reap the process."""
        self.settled = True
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(10)
        self._closed(int(self.proc.returncode))


class _ContainerRun(AppRun):
    """The processor image (entrypoint ``lockgate``) on the host network."""

    def __init__(
        self, spec: str, app_name: str, http_port: int, env: dict[str, str], image: str
    ) -> None:
        super().__init__(spec, app_name, http_port, env)
        tc = _testcontainers()
        self.image = image
        self.container = (
            tc.DockerContainer(image, env=env)
            .with_kwargs(network_mode="host", labels={_LABEL: "processor"})
            .with_command(["run", spec])
        )
        self.container.start()
        _live.append(self.container)

    @property
    def alive(self) -> bool:
        """Whether the container still runs."""
        try:
            wrapped = self.container.get_wrapped_container()
            wrapped.reload()
        except Exception:  # noqa: BLE001 - removed
            return False
        if wrapped.status in ("exited", "dead"):
            self.returncode = int(wrapped.attrs["State"]["ExitCode"])
            return False
        return True

    def logs(self) -> str:
        """The container output so far."""
        return _logs_of(self.container)

    def stop(self, timeout: float = 60.0) -> int | None:
        """``docker stop`` (SIGTERM, SIGKILL after ``timeout``), remove; return the exit code."""
        self.settled = True
        if self.returncode is None or self.alive:
            self.returncode = _graceful_stop(self.container, timeout)
        return self.returncode

    def kill(self) -> None:
        """SIGKILL and remove the container."""
        self.settled = True
        with contextlib.suppress(Exception):
            self.container.get_wrapped_container().kill(signal="SIGKILL")
        self.returncode = 137
        _remove(self.container)


class AppFactory:
    """Runs apps against the ``lockgate_kafka`` broker (the ``lockgate_app`` fixture).

    Every app started through it is stopped with SIGTERM at the end of the test; with
    ``check_exit`` (default) a non-zero exit at that stop fails the test's teardown with the
    app's log.
    """

    def __init__(self, kafka: LockgateKafka, tmp_path: Path, cwd: Path) -> None:
        self._kafka = kafka
        self._tmp = tmp_path
        self._cwd = cwd
        self.runs: list[AppRun] = []

    def __call__(
        self,
        app: App | str,
        env: Mapping[str, str] | None = None,
        *,
        app_name: str | None = None,
        instance_id: str | None = None,
        image: str | None = None,
        checkpoint_interval_ms: int = 200,
        wait_ready: bool = True,
        ready_timeout: float = 60.0,
    ) -> AppRun:
        """Start one instance of ``app`` and (by default) wait until it is ready.

        The instance gets ``LOCKGATE_BOOTSTRAP_SERVERS`` (the broker), ``LOCKGATE_APP_NAME``
        (``app_name``, default the App's name plus a random suffix, so each test has its own
        consumer group and state topics), ``LOCKGATE_INSTANCE_ID``, ``LOCKGATE_STATE_DIR``
        (under the test's tmp_path; not set for containers), ``LOCKGATE_HTTP_PORT`` and
        ``LOCKGATE_HTTP_HOST`` (127.0.0.1), ``LOCKGATE_CHECKPOINT_INTERVAL_MS`` and
        ``LOCKGATE_LOG_FORMAT=console``; ``env`` is applied last and wins.

        Args:
            app: ``"package.module:app"``, or the App object itself (it must be a
                module-level name of an imported module: the app runs in its own process).
            env: more environment (e.g. the app's topic variables).
            app_name: fixes ``LOCKGATE_APP_NAME``; pass the same name to a second instance
                or a restart to share the group and its state.
            instance_id: ``LOCKGATE_INSTANCE_ID`` (default ``i1``, ``i2``, ... per name).
            image: run the processor image (entrypoint ``lockgate``, host network) instead of
                a local ``lockgate run`` process; the image must contain the app's module.
            checkpoint_interval_ms: epochs commit this often (outputs become visible to
                read_committed consumers at each commit).
            wait_ready: wait for ``/readyz`` before returning.
            ready_timeout: seconds for that wait.

        Returns:
            The running instance.

        Raises:
            RuntimeError: the app exited before it was ready (with its exit code and log).
            TimeoutError: not ready in time (with its log).
        """
        spec = _find_spec(app)
        module = spec.split(":")[0].rsplit(".", 1)[-1]
        base = getattr(app, "name", None) or re.sub(r"[^A-Za-z0-9-]", "-", module)
        name = app_name or _unique(str(base))
        same = [r for r in self.runs if r.app_name == name]
        instance = instance_id or f"i{len(same) + 1}"
        port = free_port()
        plugin_env = {
            "LOCKGATE_BOOTSTRAP_SERVERS": self._kafka.bootstrap,
            "LOCKGATE_APP_NAME": name,
            "LOCKGATE_INSTANCE_ID": instance,
            "LOCKGATE_HTTP_PORT": str(port),
            "LOCKGATE_HTTP_HOST": "127.0.0.1",
            "LOCKGATE_CHECKPOINT_INTERVAL_MS": str(checkpoint_interval_ms),
            "LOCKGATE_LOG_FORMAT": "console",
        }
        run: AppRun
        if image is None:
            state = self._tmp / f"{name}-{instance}"
            state.mkdir(parents=True, exist_ok=True)
            plugin_env["LOCKGATE_STATE_DIR"] = str(state / "state")
            full = {**plugin_env, **(env or {})}
            log = state / "app.log"
            run = _ProcessRun(spec, name, port, full, log, self._cwd)
        else:
            full = {**plugin_env, **(env or {})}
            run = _ContainerRun(spec, name, port, full, image)
        self.runs.append(run)
        if wait_ready:
            try:
                run.wait_ready(ready_timeout)
            except (RuntimeError, TimeoutError):
                run.stop(10)  # the error tells the test; teardown leaves it be
                raise
        return run

    def stop_all(self, timeout: float = 60.0) -> list[str]:
        """Stop every instance the test did not stop or kill; return what went wrong.

        A problem is an instance that exits non-zero on SIGTERM, or one that had exited by
        itself with a non-zero code during the test (e.g. a crash the test did not notice);
        each comes with the instance's log tail.
        """
        problems = []
        for run in reversed(self.runs):
            if run.settled:
                continue
            who = f"{run.spec} ({run.app_name}/{run.env.get('LOCKGATE_INSTANCE_ID')})"
            if not run.alive:
                code = run.returncode
                run.stop(timeout)  # release its log file or container
                if code not in (0, None):
                    problems.append(
                        f"{who} exited by itself with code {code} during the test:\n"
                        f"{run.logs()[-3000:]}"
                    )
                continue
            code = run.stop(timeout)
            if code not in (0, None):
                problems.append(f"{who} exited with {code} on SIGTERM:\n{run.logs()[-3000:]}")
        return problems
