"""The Flink peer: PyFlink (its own venv) plus the Kafka SQL connector jar (Maven).

``ensure()`` builds the ``flink`` venv (benchmarks/venvs.py pins ``apache-flink``, whose
wheel bundles the Flink runtime jars) and resolves ``flink-sql-connector-kafka`` with
Maven from benchmarks/nexmark/pom.xml, the way docker/kafka/broker.sh resolves the
broker's jars (``mvn dependency:copy-dependencies``, the machine's Maven settings), into
``.cache/bench/flink/<connector version>/``. Jobs run as a local mini-cluster inside the
PyFlink gateway JVM (benchmarks/nexmark/flink_job.py).

``python -m benchmarks.flink`` sets both up and checks that the connector loads in the
installed Flink (a Kafka table is declared and planned: the connector's factory is
found and accepts its options).
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

from benchmarks import venvs
from benchmarks.paths import CACHE, ROOT
from benchmarks.progress import say

POM = ROOT / "benchmarks" / "nexmark" / "pom.xml"
JOB = ROOT / "benchmarks" / "nexmark" / "flink_job.py"


def connector_version() -> str:
    """The connector version the pom pins."""
    found = re.search(
        r"<flink\.kafka\.connector\.version>([^<]+)<", POM.read_text(encoding="utf-8")
    )
    if not found:
        raise RuntimeError(f"no <flink.kafka.connector.version> in {POM}")
    return found.group(1)


def connector_jar() -> Path:
    """Where the connector jar is (after :func:`ensure`)."""
    version = connector_version()
    return CACHE / "flink" / version / f"flink-sql-connector-kafka-{version}.jar"


def fetch_connector() -> Path:
    """Resolve the connector jar with Maven (skipped when present for this pom)."""
    jar = connector_jar()
    stamp = jar.parent / ".pom-sha256"
    digest = hashlib.sha256(POM.read_bytes()).hexdigest()
    if jar.exists() and stamp.exists() and stamp.read_text() == digest:
        return jar
    mvn = shutil.which(os.environ.get("BENCH_MVN", "mvn"))
    if mvn is None:
        raise RuntimeError("Maven (mvn) not found: apt-get install maven, or set BENCH_MVN")
    say(f"resolving the Flink Kafka connector {connector_version()} with Maven")
    tmp = jar.parent / "tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    log = jar.parent / "mvn.log"
    with log.open("w") as out:
        done = subprocess.run(
            [
                mvn,
                "-q",
                "-B",
                "-f",
                str(POM),
                "dependency:copy-dependencies",
                "-DincludeScope=runtime",
                "-DexcludeTypes=pom",
                f"-DoutputDirectory={tmp}",
            ],
            stdout=out,
            stderr=subprocess.STDOUT,
            check=False,
        )
    got = tmp / jar.name
    if done.returncode != 0 or not got.exists():
        raise RuntimeError(f"Maven could not resolve {jar.name} (see {log})")
    got.replace(jar)
    shutil.rmtree(tmp, ignore_errors=True)
    stamp.write_text(digest)
    return jar


def python() -> Path:
    """The Flink venv's interpreter."""
    return venvs.python("flink")


def ensure() -> Path:
    """Set up the Flink venv and the connector jar; return the jar."""
    venvs.ensure("flink")
    return fetch_connector()


def java_version() -> str:
    """The first line of ``java -version`` (PyFlink starts the machine's Java)."""
    java = (
        Path(os.environ["JAVA_HOME"]) / "bin" / "java"
        if os.environ.get("JAVA_HOME")
        else shutil.which("java")
    )
    if java is None:
        return "no java"
    out = subprocess.run([str(java), "-version"], capture_output=True, text=True, check=False)
    return (out.stderr or out.stdout).splitlines()[0] if (out.stderr or out.stdout) else "?"


CHECK = """
import sys
from pyflink.common import Configuration
from pyflink.table import EnvironmentSettings, TableEnvironment
conf = Configuration()
conf.set_string("pipeline.jars", "file://" + sys.argv[1])
env = TableEnvironment.create(
    EnvironmentSettings.new_instance().in_streaming_mode().with_configuration(conf).build())
for name in ("src", "dst"):
    env.execute_sql(
        f"CREATE TABLE {name} (v BIGINT) WITH ('connector' = 'kafka', 'topic' = '{name}', "
        "'properties.bootstrap.servers' = '127.0.0.1:1', 'format' = 'json', "
        "'scan.startup.mode' = 'earliest-offset', "
        "'sink.delivery-guarantee' = 'exactly-once', 'sink.transactional-id-prefix' = 'x')")
plan = env.explain_sql("INSERT INTO dst SELECT v FROM src")
assert "KafkaSource" in plan or "TableSourceScan" in plan, plan
import pyflink.version
print("flink", pyflink.version.__version__, "kafka connector loads: ok")
"""


def check() -> str:
    """Plan a Kafka-to-Kafka query with the connector; return the check's last line."""
    jar = ensure()
    out = subprocess.run(
        [str(python()), "-c", CHECK, str(jar)],
        capture_output=True,
        text=True,
        check=False,
        cwd=ROOT,
        timeout=300,
    )
    if out.returncode != 0:
        raise RuntimeError(f"the Flink Kafka connector does not load:\n{out.stderr[-3000:]}")
    return out.stdout.strip().splitlines()[-1]


def main() -> int:
    """Set up the Flink peer and check the connector."""
    say(check())
    say(f"connector jar: {connector_jar()}; {java_version()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
