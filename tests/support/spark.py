"""A local Spark session for the test suite (one per pytest process)."""

from __future__ import annotations

import os
import sys
from typing import Any

_session: Any = None


def local_session() -> Any:
    """Return the shared ``local[2]`` SparkSession (built on first use, stopped at exit).

    Bound to 127.0.0.1 (no other address is used), UI off, small shuffles, the test
    process's Python on the executors.
    """
    global _session
    if _session is not None:
        return _session
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    from pyspark.sql import SparkSession

    _session = (
        SparkSession.builder.master("local[2]")
        .appName("lockgate-tests")
        .config("spark.ui.enabled", "false")
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.sql.shuffle.partitions", "4")
        .config("spark.python.worker.reuse", "true")
        .getOrCreate()
    )
    _session.sparkContext.setLogLevel("WARN")
    return _session
