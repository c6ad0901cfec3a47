"""A backfill's Spark side: the session, one task per key group, and progress lines.

The driver (:func:`processors.backfill.run_backfill`) hands :func:`run_tasks` one
:class:`~processors._spark.backfill_spec.TaskSpec` per key group. Kafka input: each Spark
partition is one key group and its task reads its own offset ranges. Archived Parquet
input: rows are re-keyed with the live app's murmur2 placement, partitioned by key group
and sorted within it (timestamp, input declared first, partition, offset, key, value)
before the task sees them. :class:`Progress` reports tasks done, records committed, the
rate and an ETA while the job runs; it never fails the job.
"""

from __future__ import annotations

import logging
import os
import re
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

from processors._config.settings import Settings
from processors._dsl.partitioner import key_group
from processors._dsl.record import Record
from processors._spark.backfill_spec import TaskSpec
from processors._spark.backfill_task import run_task
from processors.exceptions import ConfigError

__all__ = ["Progress", "new_spark_session", "run_tasks"]

log = logging.getLogger("lockgate.backfill")

#: Variables never copied into the executors' environment.
_SECRET_VAR = re.compile(r"PASSWORD|SECRET|TOKEN|CREDENTIAL|_KEY\b|KEY_PEM|JAAS", re.IGNORECASE)


# -- progress -------------------------------------------------------------------------


class Progress(threading.Thread):
    """Reports tasks done, records, records/s and ETA every few seconds (stderr)."""

    def __init__(
        self,
        report: Callable[[str], None],
        sc: Any,
        job: str,
        total: int | None,
        read_steps: Callable[[], dict[int, int]] | None,
        every_s: float = 5.0,
    ) -> None:
        super().__init__(name="lockgate-backfill-progress", daemon=True)
        self.report, self.sc, self.job, self.total = report, sc, job, total
        self.read_steps = read_steps
        self.every_s = every_s
        self.done = threading.Event()
        self.started = time.monotonic()

    def run(self) -> None:
        while not self.done.wait(self.every_s):
            try:
                self.report(self.line())
            except Exception as exc:  # noqa: BLE001 - progress must never fail the job
                log.debug("progress unavailable: %s", exc)

    def line(self) -> str:
        """One progress line."""
        tracker = self.sc.statusTracker()
        finished = total_tasks = 0
        for sid in tracker.getActiveStageIds():
            info = tracker.getStageInfo(sid)
            if info is not None:
                finished += info.numCompletedTasks
                total_tasks += info.numTasks
        elapsed = time.monotonic() - self.started
        text = f"backfill {self.job}: tasks {finished}/{total_tasks or '?'} done"
        if self.read_steps is not None:
            records = sum(self.read_steps().values())
            rate = records / elapsed if elapsed > 0 else 0.0
            text += f", {records:,} records committed, {rate:,.0f} rec/s"
            if self.total and rate > 0:
                left = int(max(self.total - records, 0) / rate)
                pct = 100 * records / self.total
                text += f", {pct:.1f}%, ETA {left // 60}m{left % 60:02d}s"
        return text


# -- tasks ----------------------------------------------------------------------------


def _attempt() -> int:
    from pyspark import TaskContext

    tc = TaskContext.get()
    return tc.attemptNumber() if tc is not None else 0


def _kafka_task(
    settings: Settings, specs: dict[int, TaskSpec]
) -> Callable[[int, Iterator[Any]], Iterator[dict[str, Any]]]:
    def task(index: int, _: Iterator[Any]) -> Iterator[dict[str, Any]]:
        yield run_task(settings, specs[index], attempt=_attempt()).to_dict()

    return task


def _archive_rows(spark: Any, path: str, inputs: tuple[str, ...], key_groups: int) -> Any:
    """Read the archive; return an RDD of (sort key, row) placed by key group."""
    df = spark.read.parquet(path)
    cols = set(df.columns)
    missing = {"key", "value", "timestamp"} - cols
    if missing:
        raise ConfigError(
            f"--archive {path}: missing column(s) {sorted(missing)} (have {sorted(cols)})"
        )
    if "topic" not in cols and len(inputs) > 1:
        raise ConfigError(
            f"--archive {path}: the app has inputs {list(inputs)}: add a topic column"
        )
    rank = {t: i for i, t in enumerate(inputs)}
    only = inputs[0]
    has_part, has_off, has_topic = "partition" in cols, "offset" in cols, "topic" in cols

    def as_bytes(v: Any) -> bytes | None:
        if v is None:
            return None
        if isinstance(v, str):
            return v.encode()
        return bytes(v)

    def keyed(row: Any) -> tuple[tuple[Any, ...], tuple[Any, ...]]:
        topic = row["topic"] if has_topic else only
        if topic not in rank:
            raise ConfigError(f"archived row of topic {topic!r}: not an input of the app")
        key, value = as_bytes(row["key"]), as_bytes(row["value"])
        g = 0 if key is None else key_group(key, key_groups)
        part = row["partition"] if has_part and row["partition"] is not None else -1
        off = row["offset"] if has_off and row["offset"] is not None else -1
        ts = int(row["timestamp"])
        order = (g, ts, rank[topic], part, off, key or b"", value or b"")
        return order, (topic, part, off, key, value, ts)

    return df.rdd.map(keyed).repartitionAndSortWithinPartitions(
        numPartitions=key_groups, partitionFunc=lambda k: k[0]
    )


def _archive_task(
    settings: Settings, specs: dict[int, TaskSpec]
) -> Callable[[int, Iterator[Any]], Iterator[dict[str, Any]]]:
    def task(index: int, rows: Iterator[Any]) -> Iterator[dict[str, Any]]:
        records = (
            Record(topic, index, off if off >= 0 else i, key, value, ts)
            for i, (_, (topic, _part, off, key, value, ts)) in enumerate(rows)
        )
        yield run_task(settings, specs[index], attempt=_attempt(), rows=records).to_dict()

    return task


def new_spark_session(
    app_spec: str, name: str, master: str, spark_conf: dict[str, str] | None
) -> Any:
    """A Spark session for the job; off ``local`` masters it ships the code and settings."""
    from processors._spark.job import spark_session

    top = app_spec.partition(":")[0].split(".")[0]
    conf = dict(spark_conf or {})
    ship = None
    if not master.startswith("local"):
        # Executors outside this process import the code shipped, and the app module
        # reads its LOCKGATE_* variables at import there: pass them (not secrets: the
        # settings travel with the tasks, and Spark shows its configuration).
        ship = ["processors", "state", top]
        for var, value in os.environ.items():
            if var.startswith("LOCKGATE_") and not _SECRET_VAR.search(var):
                conf.setdefault(f"spark.executorEnv.{var}", value)
    return spark_session(master, f"lockgate-backfill-{name}", conf=conf, ship=ship)


def run_tasks(
    spark: Any,
    settings: Settings,
    specs: dict[int, TaskSpec],
    archive: str | None,
    inputs: tuple[str, ...],
) -> list[dict[str, Any]]:
    """Run one Spark task per key group; return their results (raises what Spark raised)."""
    sc = spark.sparkContext
    key_groups = len(specs)
    if archive is None:
        rdd = sc.parallelize(range(key_groups), key_groups)
        return list(rdd.mapPartitionsWithIndex(_kafka_task(settings, specs)).collect())
    rows = _archive_rows(spark, str(archive), inputs, key_groups)
    return list(rows.mapPartitionsWithIndex(_archive_task(settings, specs)).collect())
