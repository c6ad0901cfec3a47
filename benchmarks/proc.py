"""Subprocesses under test: start, CPU / peak RSS of the process tree, stop."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import IO

from benchmarks.paths import ROOT

_TICK = os.sysconf("SC_CLK_TCK")
_PAGE = os.sysconf("SC_PAGE_SIZE")


def _stat(pid: int) -> list[str] | None:
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return raw[raw.rfind(")") + 2 :].split()


def cpu_seconds(pid: int) -> float:
    """utime + stime of ``pid`` plus its waited-for children, in seconds."""
    f = _stat(pid)
    if f is None:
        return 0.0
    # fields after "(comm) ": state=0, ppid=1, ... utime=11, stime=12, cutime=13, cstime=14
    return (int(f[11]) + int(f[12]) + int(f[13]) + int(f[14])) / _TICK


def descendants(pid: int) -> list[int]:
    """``pid`` and every process below it."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        f = _stat(int(entry))
        if f is not None:
            children.setdefault(int(f[1]), []).append(int(entry))
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        todo.extend(children.get(p, []))
    return out


def peak_rss_mb(pids: list[int]) -> float:
    """Sum of VmHWM (peak resident set) over ``pids``, in MiB."""
    total = 0
    for pid in pids:
        try:
            for line in Path(f"/proc/{pid}/status").read_text().splitlines():
                if line.startswith("VmHWM:"):
                    total += int(line.split()[1])
        except OSError:
            continue
    return total / 1024


class Proc:
    """One process under test, its log file, and its tree's resource use."""

    def __init__(self, argv: list[str], env: dict[str, str], log_path: Path) -> None:
        self.argv = argv
        self.log_path = log_path
        self._log: IO[bytes] = open(log_path, "ab")  # noqa: SIM115 - closed in stop()
        full = dict(os.environ)
        full.update(env)
        self.started = time.time()
        self.popen = subprocess.Popen(
            argv,
            cwd=ROOT,
            env=full,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        self.pid = self.popen.pid
        self._tree = [self.pid]
        self._tree_at = 0.0

    def tree(self) -> list[int]:
        """The process tree (refreshed at most once a second)."""
        now = time.monotonic()
        if now - self._tree_at > 1.0:
            self._tree = descendants(self.pid)
            self._tree_at = now
        return self._tree

    def cpu(self) -> float:
        """CPU seconds of the whole tree so far."""
        return sum(cpu_seconds(p) for p in self.tree())

    def rss_mb(self) -> float:
        """Peak RSS of the tree (sum of each process's peak), MiB."""
        return peak_rss_mb(descendants(self.pid))

    @property
    def alive(self) -> bool:
        """The process has not exited."""
        return self.popen.poll() is None

    def kill9(self) -> None:
        """SIGKILL the whole process group and reap it."""
        try:
            os.killpg(self.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.popen.wait(30)
        self._log.close()

    def stop(self, timeout: float = 30.0) -> int:
        """SIGTERM, then SIGKILL (whole group) after ``timeout``; returns the exit code."""
        if self.popen.poll() is None:
            self.popen.send_signal(signal.SIGTERM)
            try:
                self.popen.wait(timeout)
            except subprocess.TimeoutExpired:
                os.killpg(self.pid, signal.SIGKILL)
                self.popen.wait(30)
        else:
            try:  # leftovers of the group, if any
                os.killpg(self.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        self._log.close()
        return self.popen.returncode

    def log_tail(self, n: int = 15) -> str:
        """The last ``n`` lines of the log."""
        try:
            lines = self.log_path.read_text(errors="replace").splitlines()
        except OSError:
            return ""
        return "\n".join(lines[-n:])


def pyspy_record(exe: str, pid: int, *options: str) -> Callable[[], None]:
    """Start ``py-spy record`` (100 Hz) on ``pid`` with ``options``; return the function
    that stops it (SIGINT, so it writes its file; killed after 30 s)."""
    spy = subprocess.Popen(
        [exe, "record", "--pid", str(pid), "--rate", "100", *options],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )

    def detach() -> None:
        spy.send_signal(signal.SIGINT)
        try:
            spy.wait(30)
        except subprocess.TimeoutExpired:
            spy.kill()

    return detach
