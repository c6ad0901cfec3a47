"""Driver program of the standalone-cluster test, run as its own process.

One Python process may hold only one SparkContext, and the pytest process already has
the shared ``local[2]`` one (``tests/support/spark.py``), so the test runs this script
with ``sys.executable``::

    python tests/spark/_cluster_job.py spark://127.0.0.1:PORT APP_NAME OUT.json

It ships ``processors``, ``state`` and ``examples`` with
``processors._spark.job.spark_session(..., ship=...)``, runs 4 tasks that import the app and
lockgate inside the executors, and writes what every task saw to ``OUT.json``.
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
TASKS = 4
#: Same as tests/support/spark_cluster.FAST_JVM_OPTS: quick start of short-lived JVMs.
FAST_JVM_OPTS = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"


def task(index: int, _rows: Iterable[int]) -> Iterator[dict[str, Any]]:
    """One task: import the shipped code in the executor and run the app on 3 records."""
    import examples.running_sum
    import processors
    import state
    from processors._dsl.partitioner import key_group
    from processors.testing import TestDriver

    driver = TestDriver(examples.running_sum.app)
    key = f"k{index}"
    sums = [driver.send(key, {"v": index + v, "seq": v})[0].value["sum"] for v in range(3)]
    driver.commit()
    yield {
        "index": index,
        "pid": os.getpid(),
        "sid": os.getsid(0),
        "key_group": key_group(b"a", 4),
        "sums": sums,
        "files": {
            "examples": examples.running_sum.__file__,
            "processors": processors.__file__,
            "state": state.__file__,
        },
    }


def main() -> None:
    master, app_name, out = sys.argv[1:4]
    sys.path.insert(0, str(ROOT))  # code_archive finds examples/ where the tests see it
    from processors._spark.job import spark_session

    t0 = time.monotonic()
    session = spark_session(
        master,
        app_name,
        conf={
            "spark.executor.memory": "512m",
            "spark.driver.extraJavaOptions": FAST_JVM_OPTS,
            "spark.executor.extraJavaOptions": FAST_JVM_OPTS,
            "spark.cores.max": "2",
            # Start the job only once both executors are up, so both workers get tasks.
            "spark.scheduler.minRegisteredResourcesRatio": "1.0",
            "spark.scheduler.maxRegisteredResourcesWaitingTime": "40s",
        },
        ship=["processors", "state", "examples"],
    )
    try:
        started = time.monotonic()
        sc = session.sparkContext
        sc.setLogLevel("WARN")
        rows = sc.parallelize(range(TASKS), TASKS).mapPartitionsWithIndex(task).collect()
        job = time.monotonic() - started
    finally:
        session.stop()
    result = {
        "driver_pid": os.getpid(),
        "rows": rows,
        "session_seconds": started - t0,
        "job_seconds": job,
    }
    Path(out).write_text(json.dumps(result))


if __name__ == "__main__":
    main()
