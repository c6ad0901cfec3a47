"""Savepoint trigger and cancel for the console, run off the HTTP threads.

A trigger waits for every key group's manifest (up to its timeout), so it runs as a
background job with its own Kafka clients; the page follows the job's progress lines
(the same lines ``lockgate savepoint trigger`` prints). A cancel is quick and answers at
once. Both reuse :mod:`processors._ops.catalog` as the CLI does.
"""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from confluent_kafka import KafkaException

from processors._config.settings import Settings
from processors._ops.catalog import (
    Ops,
    OpsError,
    cancel_savepoint,
    open_store,
    resolve_apps,
    trigger_savepoint,
)
from processors.exceptions import LockgateError
from state.savepoint import SavepointError, ms_to_iso

__all__ = ["Job", "SavepointJobs"]

#: Triggers running at once at most (each holds Kafka clients and a thread).
MAX_RUNNING = 2
#: Finished jobs kept for the page.
KEEP_FINISHED = 20


@dataclass
class Job:
    """One savepoint trigger.

    Attributes:
        id: the job's number (as text).
        apps: the apps named, or empty with ``pipeline``.
        pipeline: the pipeline named, or ``None``.
        stop: whether the apps halt at the savepoint.
        state: ``running``, ``completed`` or ``failed``.
        savepoint: the savepoint id once known.
        lines: the progress lines.
        error: why it failed.
        started_ms: when it started.
    """

    id: str
    apps: list[str]
    pipeline: str | None
    stop: bool
    state: str = "running"
    savepoint: str | None = None
    lines: list[str] = field(default_factory=list)
    error: str | None = None
    started_ms: int = field(default_factory=lambda: time.time_ns() // 1_000_000)

    def to_json(self) -> dict[str, Any]:
        """Return a JSON-able form."""
        return {
            "id": self.id,
            "apps": self.apps,
            "pipeline": self.pipeline,
            "stop": self.stop,
            "state": self.state,
            "savepoint": self.savepoint,
            "lines": self.lines[-10:],
            "error": self.error,
            "started": ms_to_iso(self.started_ms),
        }


def _savepoint_of(line: str) -> str | None:
    """The id in a progress line ``savepoint <id>: ...``."""
    if line.startswith("savepoint ") and ":" in line:
        return line[len("savepoint ") : line.index(":")].strip() or None
    return None


class SavepointJobs:
    """Starts savepoint triggers on threads and cancels savepoints.

    Args:
        settings: the lockgate settings (Kafka and ``LOCKGATE_SAVEPOINT_DIR``).
        timeout_s: how long a trigger waits for the manifests.
        on_done: called after a trigger finished (e.g. to list the savepoints again).
    """

    def __init__(
        self,
        settings: Settings,
        timeout_s: float = 120.0,
        on_done: Callable[[], None] = lambda: None,
    ) -> None:
        self._settings = settings
        self._timeout_s = timeout_s
        self._on_done = on_done
        self._lock = threading.Lock()
        self._jobs: dict[str, Job] = {}
        self._ids = itertools.count(1)

    def jobs(self) -> list[dict[str, Any]]:
        """Return every kept job, newest first."""
        with self._lock:
            return [j.to_json() for j in reversed(self._jobs.values())]

    def trigger(self, apps: Sequence[str], pipeline: str | None, stop: bool) -> Job:
        """Start a savepoint of ``apps`` or ``pipeline``; return its job.

        Raises:
            OpsError: (exit code 2) neither or both of ``apps`` and ``pipeline``, no
                savepoint location, or too many triggers running.
        """
        if bool(apps) == (pipeline is not None):
            raise OpsError("give either apps or a pipeline", exit_code=2)
        open_store(self._settings)  # fail now when LOCKGATE_SAVEPOINT_DIR is missing
        with self._lock:
            running = sum(1 for j in self._jobs.values() if j.state == "running")
            if running >= MAX_RUNNING:
                raise OpsError(f"{running} savepoints are being taken: wait", exit_code=2)
            job = Job(str(next(self._ids)), list(apps), pipeline, stop)
            self._jobs[job.id] = job
            finished = [k for k, j in self._jobs.items() if j.state != "running"]
            for k in finished[: max(0, len(finished) - KEEP_FINISHED)]:
                del self._jobs[k]
        threading.Thread(
            target=self._run, args=(job,), name="lockgate-savepoint", daemon=True
        ).start()
        return job

    def _progress(self, job: Job, line: str) -> None:
        with self._lock:
            job.lines.append(line)
            if job.savepoint is None:
                job.savepoint = _savepoint_of(line)

    def _run(self, job: Job) -> None:
        ops = Ops(self._settings)
        try:
            descriptor = trigger_savepoint(
                ops,
                open_store(self._settings),
                job.apps,
                job.pipeline,
                stop=job.stop,
                timeout_s=self._timeout_s,
                progress=lambda line: self._progress(job, line),
            )
            with self._lock:
                job.savepoint = str(descriptor["savepoint"])
                job.state = "completed"
        except (LockgateError, KafkaException, SavepointError) as exc:
            with self._lock:
                job.state, job.error = "failed", str(exc)
        except Exception as exc:  # noqa: BLE001 - the page shows every failure
            with self._lock:
                job.state, job.error = "failed", f"{type(exc).__name__}: {exc}"
        finally:
            ops.close()
            self._on_done()

    def cancel(self, savepoint_id: str, apps: Sequence[str], pipeline: str | None) -> list[str]:
        """Cancel ``savepoint_id`` in ``apps`` or ``pipeline``; return the apps.

        Raises:
            OpsError: usage problems (exit code 2) or an undelivered record.
            SavepointError: a malformed savepoint id.
            KafkaException: a Kafka client error.
        """
        ops = Ops(self._settings)
        try:
            involved = resolve_apps(ops.registry(), apps, pipeline)
            cancel_savepoint(ops, savepoint_id, involved)
        finally:
            ops.close()
        return involved
