"""The Postgres sink stays exact under kill -9 and through database outages.

Two instances of examples/postgres_sink.py (upsert table + append table) share a
4-partition input while it keeps arriving, against the real broker and a real
PostgreSQL server. An independent checker (tests/support/pg_model.py) compares the tables
with the model of the stored input: every event exactly once with the right running
total, every key's final sum, no prepared transaction left behind.

- kill -9: instances are killed at random moments (``LOCKGATE_CHAOS_KILLS``, 5 by
  default; ``make chaos`` gives 40) and also kill themselves at the protocol's hardest
  points: ``before_commit`` (rows prepared, Kafka not committed: the next owner must roll
  them back) and ``before_sink_commit`` (Kafka committed, rows still prepared: the next
  owner must commit them). A supervisor restarts every dead instance, a quarter of the
  time with its state dir wiped (as an orchestrator would).
- outage: the database is stopped mid-run (once ``immediate``, like a crash, once
  ``fast``) for a few seconds and restarted, an instance killed during the first outage;
  then every server process is stopped (SIGSTOP) for longer than the transaction
  timeout, so calls hang rather than fail.
  Epochs abort while it is away (their rows are replayed later); instances that give up
  after too many aborts in a row exit and are restarted.
"""

from __future__ import annotations

import os
import random
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from examples.postgres_sink import DSN_ENV, TABLE_ENV, ddl
from tests.chaos._harness import (
    Fleet,
    InputFeeder,
    Supervisor,
    chaos_env,
    chaos_seed,
    stop_feeding_soon,
)
from tests.support.kafka import create_topic, read_inputs, unique
from tests.support.pg_model import check_tables
from tests.support.postgres import PostgresServer, PostgresUnavailable
from tests.support.procs import wait_until

KILLS = int(os.environ.get("LOCKGATE_CHAOS_KILLS", "5"))
#: Rows prepared, Kafka not committed (roll back) / Kafka committed, rows prepared (commit).
CRASH_POINTS = ("before_commit", "before_sink_commit")


def _pg_env(bootstrap: str, pg: PostgresServer, app: str, inp: str, table: str) -> dict[str, str]:
    env = chaos_env(bootstrap, app, inp, unique("unused-out"))
    env[DSN_ENV] = pg.dsn
    env[TABLE_ENV] = table
    return env


def _count(pg: PostgresServer, table: str) -> int:
    try:
        return int(pg.execute(f"SELECT count(DISTINCT seq) FROM {table}_events")[0][0])  # noqa: S608
    except Exception:  # noqa: BLE001 - the server is restarting
        return -1


def _finish(
    fleet: Fleet, sup: Supervisor, feeder: InputFeeder, pg: PostgresServer, table: str, inp: str
) -> list[str]:
    """Stop the input, wait for every event, check the tables; stop the fleet."""
    stop_feeding_soon(feeder)
    feeder.join(120)
    assert feeder.error is None, feeder.error
    produced = len(feeder.produced)
    inputs = read_inputs(fleet.env["LOCKGATE_BOOTSTRAP_SERVERS"], inp, produced)
    deadline = time.monotonic() + 150  # then the checker says what is missing
    while _count(pg, table) < produced and time.monotonic() < deadline:
        time.sleep(0.5)
    time.sleep(2.0)  # a duplicate or a late settle would show by now
    sup.stop()
    problems = check_tables(pg, table, inputs)
    codes = fleet.stop_all()
    print(f"{produced} inputs, {fleet.starts} starts, restarts: {sup.restarts}, exit codes {codes}")
    return problems


@pytest.fixture
def own_postgres() -> Iterator[PostgresServer]:
    """A server of this test alone (the outage test stops it)."""
    try:
        server = PostgresServer().start()
    except PostgresUnavailable as exc:
        pytest.skip(str(exc))
    try:
        yield server
    finally:
        server.destroy()


def test_postgres_sink_exact_under_kill9(
    kafka_bootstrap: str, postgres: PostgresServer, tmp_path: Path
) -> None:
    seed = chaos_seed()
    rng = random.Random(seed)
    inp, app = unique("pgk-in"), unique("pgk-sums")
    table = app.replace("-", "_")
    create_topic(kafka_bootstrap, inp, 4)
    postgres.execute(ddl(table))
    env = _pg_env(kafka_bootstrap, postgres, app, inp, table)
    env["LOCKGATE_TEST_CRASH_POINTS"] = "before_commit:0.04,before_sink_commit:0.15"
    feeder = InputFeeder(kafka_bootstrap, inp, total=200_000, rate=400, keys=50)
    feeder.start()
    time.sleep(1.0)  # the first epochs have rows
    # Each hardest point at least once: the first incarnations crash at their first commit
    # (p1 after the Kafka commit with rows prepared, p2 before it); later ones at random.
    fleet = Fleet("examples.postgres_sink:app", env, tmp_path, ["p1", "p2"])
    fleet.env = {**env, "LOCKGATE_TEST_CRASH_POINTS": "before_sink_commit:1"}
    fleet.start("p1")
    fleet.env = {**env, "LOCKGATE_TEST_CRASH_POINTS": "before_commit:1"}
    fleet.start("p2")
    fleet.env = env
    sup = Supervisor(fleet, rng)
    sup.start()
    kills: list[str] = []
    started = time.monotonic()
    try:
        wait_until(
            lambda: all(f"crash point {p}" in fleet.logs_full() for p in CRASH_POINTS),
            timeout=90,
            what="the first incarnations' crashes",
        )
        for _ in range(KILLS):
            time.sleep(rng.uniform(0.3, 3.0))
            victim = rng.choice(fleet.ids)
            with sup.lock:
                fleet.procs[victim].kill9()
            kills.append(f"{time.monotonic() - started:.1f}s {victim}")
        problems = _finish(fleet, sup, feeder, postgres, table, inp)
    except BaseException:
        print(f"chaos seed: {seed}; kills {kills}; restarts {sup.restarts}")
        sup.halt.set()
        fleet.report_and_kill()
        raise
    logs = fleet.logs_full()
    crashed = {p: logs.count(f"crash point {p}") for p in CRASH_POINTS}
    print(f"chaos seed {seed}: kills {kills}; crash points {crashed}")
    assert problems == [], f"seed {seed}\n" + "\n".join(problems) + "\n" + fleet.logs()
    assert crashed["before_commit"] >= 1 and crashed["before_sink_commit"] >= 1, crashed


def test_postgres_outage_ends_exact(
    kafka_bootstrap: str, own_postgres: PostgresServer, tmp_path: Path
) -> None:
    pg = own_postgres
    seed = chaos_seed()
    rng = random.Random(seed)
    inp, app = unique("pgo-in"), unique("pgo-sums")
    table = app.replace("-", "_")
    create_topic(kafka_bootstrap, inp, 4)
    pg.execute(ddl(table))
    env = _pg_env(kafka_bootstrap, pg, app, inp, table)
    fleet = Fleet("examples.postgres_sink:app", env, tmp_path, ["o1", "o2"])
    fleet.start_all()
    sup = Supervisor(fleet, rng)
    sup.start()
    feeder = InputFeeder(kafka_bootstrap, inp, total=200_000, rate=300, keys=50)
    feeder.start()
    try:
        wait_until(lambda: _count(pg, table) > 300, timeout=90, what="rows before the outage")
        pg.stop("immediate")  # like a crash of the database
        time.sleep(2.0)
        with sup.lock:
            fleet.procs["o1"].kill9()  # a takeover while the database is away
        time.sleep(3.0)
        pg.start()
        before = _count(pg, table)
        wait_until(lambda: _count(pg, table) > before + 300, timeout=90, what="rows again")
        pg.stop("fast")
        time.sleep(4.0)
        pg.start()
        # A database that stops answering (every process stopped) longer than the
        # transaction timeout: the sink's bound aborts the epochs, Kafka never waits.
        before = _count(pg, table)
        wait_until(lambda: _count(pg, table) > before + 300, timeout=90, what="rows again")
        frozen = pg.freeze()
        try:
            time.sleep(12.0)
        finally:
            pg.thaw(frozen)
        problems = _finish(fleet, sup, feeder, pg, table, inp)
    except BaseException:
        print(f"chaos seed: {seed}; restarts {sup.restarts}\n{pg.log_tail()}")
        sup.halt.set()
        fleet.report_and_kill()
        raise
    logs = fleet.logs_full()
    print(f"outage: {logs.count('aborting epoch')} aborted epochs in the current logs")
    assert problems == [], f"seed {seed}\n" + "\n".join(problems) + "\n" + fleet.logs()
    # The sink's bound ended the epochs the frozen database held, not the coordinator.
    assert "outlived its timeout" not in logs, fleet.logs()


#: How late an injected late commit answers (past the transaction timeout of chaos_env).
LATE_S = 13


def test_postgres_sink_exact_through_commits_without_an_answer(
    kafka_bootstrap: str, postgres: PostgresServer, tmp_path: Path
) -> None:
    """Kafka commits whose answer comes late (they committed: the rows must commit) or never
    (EndTxn never sent: the rows must roll back) are settled by the committed offsets' token.
    """
    seed = chaos_seed()
    rng = random.Random(seed)
    inp, app = unique("pgu-in"), unique("pgu-sums")
    table = app.replace("-", "_")
    create_topic(kafka_bootstrap, inp, 4)
    postgres.execute(ddl(table))
    env = _pg_env(kafka_bootstrap, postgres, app, inp, table)
    env["LOCKGATE_TEST_LATE_COMMIT"] = f"0.1:{LATE_S}"
    env["LOCKGATE_TEST_UNSENT_COMMIT"] = "0.05"
    env["LOCKGATE_TEST_FAULT_SEED"] = str(seed)
    fleet = Fleet("examples.postgres_sink:app", env, tmp_path, ["u1", "u2"])
    fleet.start_all()
    sup = Supervisor(fleet, rng)
    sup.start()
    feeder = InputFeeder(kafka_bootstrap, inp, total=200_000, rate=300, keys=50)
    feeder.start()
    try:
        wait_until(
            lambda: (
                fleet.logs_full().count("had committed: going on from it") >= 1
                and fleet.logs_full().count("did not commit: the epoch is replayed") >= 1
            ),
            timeout=300,
            what="a late commit rolled forward and an unsent one replayed",
        )
        problems = _finish(fleet, sup, feeder, postgres, table, inp)
    except BaseException:
        print(f"chaos seed: {seed}; restarts {sup.restarts}")
        sup.halt.set()
        fleet.report_and_kill()
        raise
    assert problems == [], f"seed {seed}\n" + "\n".join(problems) + "\n" + fleet.logs()
