"""Run lockgate apps as real subprocesses (the way users and orchestrators do)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import IO

ROOT = Path(__file__).resolve().parents[2]
LOCKGATE = Path(sys.executable).parent / "lockgate"


class AppProcess:
    """One ``lockgate run`` subprocess with its log file."""

    def __init__(
        self, spec: str, env: dict[str, str], log_path: Path, args: tuple[str, ...] = ()
    ) -> None:
        self.spec = spec
        self.env = env
        self.log_path = log_path
        self.args = args  # after ``lockgate run SPEC``
        self._log: IO[bytes] | None = None
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> AppProcess:
        self._log = open(self.log_path, "ab")  # noqa: SIM115 - closed in wait()/kill()
        full_env = {
            **os.environ,
            "LOCKGATE_LOG_FORMAT": "console",
            "LOCKGATE_HTTP_PORT": "0",
        }  # tests override
        full_env.update(self.env)
        self.proc = subprocess.Popen(
            [str(LOCKGATE), "run", self.spec, *self.args],
            cwd=ROOT,
            env=full_env,
            stdout=self._log,
            stderr=subprocess.STDOUT,
        )
        return self

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def signal(self, sig: int) -> None:
        assert self.proc is not None
        if self.proc.poll() is None:
            self.proc.send_signal(sig)

    def kill9(self) -> None:
        self.signal(signal.SIGKILL)
        self.wait(10)

    def terminate(self, timeout: float = 60) -> int:
        self.signal(signal.SIGTERM)
        return self.wait(timeout)

    def wait(self, timeout: float) -> int:
        assert self.proc is not None
        try:
            code = self.proc.wait(timeout)
        finally:
            if self._log is not None and self.proc.poll() is not None:
                self._log.close()
                self._log = None
        return code

    def log_text(self) -> str:
        return self.log_path.read_text(errors="replace")


def wait_until(predicate, timeout: float, interval: float = 0.2, what: str = "condition") -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(interval)
    raise TimeoutError(f"timed out after {timeout}s waiting for {what}")


def lockgate_cli(
    env: dict[str, str], *args: str, timeout: float = 150
) -> subprocess.CompletedProcess[str]:
    """Run ``lockgate ARGS`` (e.g. ``savepoint trigger ...``) to completion; capture its output.

    ``env`` is added to this process's environment (app-specific ``LOCKGATE_*`` variables
    must not be in it: the CLI refuses unknown ones).
    """
    return subprocess.run(
        [str(LOCKGATE), *args],
        cwd=ROOT,
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
