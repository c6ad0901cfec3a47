"""What a backfill task runs and reports: its input ranges, its spec, its result.

A leaf module: the driver (:mod:`processors.backfill`), the task
(:mod:`processors._spark.backfill_task`) and its input and output modules all read these.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

__all__ = ["Range", "TaskResult", "TaskSpec"]


@dataclass(frozen=True)
class Range:
    """Input records ``[start, end)`` of partition ``key group`` of ``topic``."""

    topic: str
    start: int
    end: int


@dataclass(frozen=True)
class TaskSpec:
    """What one backfill task runs (picklable; shipped to a Spark executor).

    Attributes:
        job: the job id (also the id of the savepoint the job writes).
        app_spec: ``module:attribute`` of the App (imported in the task).
        app_name: the app name (``LOCKGATE_APP_NAME`` or the App's own).
        key_group: the key group this task runs.
        key_groups: the app's key-group count.
        ranges: the Kafka input (one range per input topic), empty for archived input.
        savepoint_url: where the job's savepoint goes.
        progress_topic: the job's progress topic (Kafka output; partition = key group).
        output_dir: Parquet output directory; ``None``: outputs go to Kafka.
        commit_every: steps per transaction at most.
        local_dir: parent of the task's scratch RocksDB (default: the temp dir).
        clock_ceiling_ms: the processing-time clock (record time) never passes this
            (the job's planning time): a record stamped in the future does not expire
            state or fire processing-time timers early.
    """

    job: str
    app_spec: str
    app_name: str
    key_group: int
    key_groups: int
    ranges: tuple[Range, ...]
    savepoint_url: str
    progress_topic: str
    output_dir: str | None = None
    commit_every: int = 5000
    local_dir: str | None = None
    clock_ceiling_ms: int | None = None


@dataclass
class TaskResult:
    """What a finished task reports to the driver."""

    key_group: int
    records: int
    outputs: int
    dead_letters: int
    resumed_from: int
    seconds: float
    manifest: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        """Return the result as plain data."""
        return {
            "key_group": self.key_group,
            "records": self.records,
            "outputs": self.outputs,
            "dead_letters": self.dead_letters,
            "resumed_from": self.resumed_from,
            "seconds": self.seconds,
            "manifest": self.manifest,
        }
