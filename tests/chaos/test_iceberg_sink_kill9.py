"""The Iceberg sink stays exact under kill -9.

Three instances of examples/iceberg_sink.py share a 4-partition input while it keeps
arriving, against the real broker and a real pyiceberg SQL catalog (SQLite), with the
warehouse in a local directory (``file``) or in a bucket of an S3 API server (``s3``:
SeaweedFS, tests/support/s3_server.py: a real S3-compatible object store on loopback; the
instances reach it through the
endpoint in the catalog's properties and the credentials in pyiceberg's environment
configuration); all commit to the one table (optimistic concurrency: refused commits are
retried). An independent checker (tests/support/iceberg_model.py) compares the table with
the model of the stored input: every event exactly once with the right running total, no
prepare marker and no data file outside the table left.

Instances are killed at random moments (``LOCKGATE_CHAOS_KILLS``, 1 by default; ``make
chaos`` gives 40) and also kill themselves at the protocol's hardest points:
``before_commit`` (files prepared, Kafka not committed: the next owner must delete them),
``before_sink_commit`` (Kafka committed, files not appended: the next owner must append
them) and ``after_sink_table_commit`` (appended, markers left: the next owner must not
append again): each at least once, by the first incarnations. A supervisor restarts
every dead instance, a quarter of the time with its state dir wiped.
"""

from __future__ import annotations

import os
import random
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from examples.iceberg_sink import S3_ENDPOINT_ENV, TABLE_ENV, URI_ENV, WAREHOUSE_ENV
from tests.chaos._harness import (
    Fleet,
    InputFeeder,
    Supervisor,
    chaos_env,
    chaos_seed,
    stop_feeding_soon,
)
from tests.support.iceberg_model import Warehouse, check_table
from tests.support.kafka import create_topic, read_inputs, unique
from tests.support.procs import wait_until
from tests.support.s3_server import ACCESS_KEY, SECRET_KEY, S3Server

KILLS = int(os.environ.get("LOCKGATE_CHAOS_KILLS", "1"))
#: Files prepared, Kafka not committed (roll back) / Kafka committed, files not appended
#: (roll forward) / appended, markers not deleted (settled already: markers only).
CRASH_POINTS = ("before_commit", "before_sink_commit", "after_sink_table_commit")


@pytest.fixture
def s3_server(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[S3Server | None]:
    """The S3 API server of the ``s3`` variant (``None`` for ``file``)."""
    if request.param != "s3":
        yield None
        return
    server = S3Server(tmp_path / "s3-server.log")
    try:
        yield server
    finally:
        server.close()


@pytest.mark.parametrize("s3_server", ["file", "s3"], indirect=True)
def test_iceberg_sink_exact_under_kill9(
    kafka_bootstrap: str, tmp_path: Path, s3_server: S3Server | None
) -> None:
    seed = chaos_seed()
    rng = random.Random(seed)
    inp, app = unique("icek-in"), unique("icek-sums")
    table = "lockgate." + app.replace("-", "_")
    create_topic(kafka_bootstrap, inp, 4)
    wh = Warehouse(tmp_path / "iceberg", s3_server, bucket="lakehouse")
    wh.create(table)
    env = chaos_env(kafka_bootstrap, app, inp, unique("unused-out"))
    env |= {
        URI_ENV: wh.properties["uri"],
        WAREHOUSE_ENV: wh.properties["warehouse"],
        TABLE_ENV: table,
        "LOCKGATE_TEST_CRASH_POINTS": (
            "before_commit:0.03,before_sink_commit:0.08,after_sink_table_commit:0.08"
        ),
    }
    if s3_server is not None:
        env |= {
            S3_ENDPOINT_ENV: s3_server.endpoint,
            "PYICEBERG_CATALOG__DEFAULT__S3__ACCESS_KEY_ID": ACCESS_KEY,
            "PYICEBERG_CATALOG__DEFAULT__S3__SECRET_ACCESS_KEY": SECRET_KEY,
        }
    feeder = InputFeeder(kafka_bootstrap, inp, total=200_000, rate=300, keys=50)
    feeder.start()
    time.sleep(0.5)  # the first epochs have rows
    # Each hardest point at least once, in one round: the first incarnations crash at
    # their first commit with files (k1 after the Kafka commit, k2 before it, k3 after
    # the append); their restarts and later crashes at random.
    fleet = Fleet("examples.iceberg_sink:app", env, tmp_path, ["k1", "k2", "k3"])
    first = {"k1": "before_sink_commit", "k2": "before_commit", "k3": "after_sink_table_commit"}
    for iid, point in first.items():
        fleet.env = {**env, "LOCKGATE_TEST_CRASH_POINTS": f"{point}:1"}
        fleet.start(iid)
    fleet.env = env
    sup = Supervisor(fleet, rng)
    sup.start()
    kills: list[str] = []
    started = time.monotonic()
    try:
        # The random kills overlap the first incarnations' crashes (the short variant's
        # time is the faults lane's critical path); each hits an instance whose first
        # incarnation crashed already (else its crash point might never be reached).
        wait_until(lambda: "crash point" in fleet.logs_full(), timeout=60, what="a crash")
        for _ in range(KILLS):
            time.sleep(rng.uniform(0.3, 3.0))
            crashed = [i for i in fleet.ids if "crash point" in fleet.procs[i].log_text()]
            victim = rng.choice(crashed)
            with sup.lock:
                fleet.procs[victim].kill9()
            kills.append(f"{time.monotonic() - started:.1f}s {victim}")
        wait_until(
            lambda: all(f"crash point {p}" in fleet.logs_full() for p in CRASH_POINTS),
            timeout=90,
            what="the first incarnations' crashes",
        )
        faults_done = time.monotonic() - started
        stop_feeding_soon(feeder)
        feeder.join(120)
        assert feeder.error is None, feeder.error
        produced = len(feeder.produced)
        inputs = read_inputs(kafka_bootstrap, inp, produced)
        deadline = time.monotonic() + 150  # then the checker says what is missing
        # Every input in the table, and every marker settled (an instance killed after its
        # append leaves markers until the key groups' next owner settles them).
        while (wh.count(table) < produced or wh.markers(table)) and time.monotonic() < deadline:
            time.sleep(0.5)
        drained = time.monotonic() - started
        time.sleep(1.0)  # a duplicate or a late settle would show by now
        sup.stop()
        codes = fleet.stop_all()  # a clean stop finishes pending appends and settles
        problems = check_table(wh, table, inputs)
    except BaseException:
        print(f"chaos seed: {seed}; kills {kills}; restarts {sup.restarts}")
        sup.halt.set()
        fleet.report_and_kill()
        raise
    logs = fleet.logs_full()
    points = {p: logs.count(f"crash point {p}") for p in CRASH_POINTS}
    snapshots = len(wh.catalog().load_table(table).metadata.snapshots)
    print(
        f"chaos seed {seed} ({wh.properties['warehouse']}): {produced} inputs, "
        f"{snapshots} snapshots, {fleet.starts} starts, "
        f"kills {kills}; crash points {points}; restarts {sup.restarts}; exit codes {codes}; "
        f"faults done at {faults_done:.1f}s, drained at {drained:.1f}s"
    )
    assert problems == [], f"seed {seed}\n" + "\n".join(problems) + "\n" + fleet.logs()
    assert all(n >= 1 for n in points.values()), points
