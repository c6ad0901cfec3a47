"""The Postgres sink writes each epoch's rows exactly once, also across aborted epochs.

examples/postgres_sink.py (upsert table + append table) runs against the real broker and
a real PostgreSQL server. A trigger makes the database refuse one row once, and hang on
another once for longer than the Kafka transaction may stay open (sequences count the
attempts: they are not rolled back with the failed transaction). Both epochs abort before
their Kafka commit and are replayed; the slow one is cut by the sink's bound (the time the
transaction has left), never by the transaction timeout. The tables must then equal the
model of the stored input: every event once, every key's final sum; no prepared
transaction left.
"""

from __future__ import annotations

import time
from pathlib import Path

from examples.postgres_sink import DSN_ENV, TABLE_ENV, ddl
from tests.support.kafka import create_topic, produce_numbers, read_inputs, unique
from tests.support.pg_model import check_tables
from tests.support.postgres import PostgresServer
from tests.support.procs import AppProcess

RECORDS = 3000
KEYS = 40
#: The seq the database refuses once.
REFUSED_SEQ = 1777
#: The seq whose first insert hangs longer than the transaction timeout.
SLOW_SEQ = 2444
TXN_TIMEOUT_MS = 6000


def _inputs() -> list[tuple[str, int, int]]:
    return [(f"k{(s * 13) % KEYS}", (s * 7) % 11, s) for s in range(RECORDS)]


def _arm_refusal(pg: PostgresServer, table: str) -> None:
    """The first insert of ``REFUSED_SEQ`` fails, the first of ``SLOW_SEQ`` hangs."""
    pg.execute(f"CREATE SEQUENCE {table}_attempts")
    pg.execute(f"CREATE SEQUENCE {table}_slow")
    pg.execute(
        f"""
        CREATE FUNCTION {table}_refuse_once() RETURNS trigger AS $$
        BEGIN
            IF NEW.seq = {REFUSED_SEQ} AND nextval('{table}_attempts') = 1 THEN
                RAISE EXCEPTION 'injected refusal of seq %', NEW.seq;
            END IF;
            IF NEW.seq = {SLOW_SEQ} AND nextval('{table}_slow') = 1 THEN
                PERFORM pg_sleep({3 * TXN_TIMEOUT_MS / 1000});
            END IF;
            RETURN NEW;
        END $$ LANGUAGE plpgsql"""
    )
    pg.execute(
        f"CREATE TRIGGER {table}_refuse BEFORE INSERT ON {table}_events "
        f"FOR EACH ROW EXECUTE FUNCTION {table}_refuse_once()"
    )


def _count(pg: PostgresServer, table: str) -> int:
    return int(pg.execute(f"SELECT count(*) FROM {table}_events")[0][0])  # noqa: S608


def test_postgres_sink_exactly_once_with_an_aborted_epoch(
    kafka_bootstrap: str, postgres: PostgresServer, tmp_path: Path
) -> None:
    inp, app = unique("pg-in"), unique("pg-sums")
    table = app.replace("-", "_")
    create_topic(kafka_bootstrap, inp, 3)
    postgres.execute(ddl(table))
    _arm_refusal(postgres, table)
    produce_numbers(kafka_bootstrap, inp, _inputs())
    env = {
        "LOCKGATE_BOOTSTRAP_SERVERS": kafka_bootstrap,
        "LOCKGATE_APP_NAME": app,
        "LOCKGATE_INPUT_TOPIC": inp,
        "LOCKGATE_STATE_DIR": str(tmp_path / "state"),
        "LOCKGATE_INSTANCE_ID": "pg1",
        "LOCKGATE_CHECKPOINT_INTERVAL_MS": "200",
        "LOCKGATE_CONSUME_BATCH_SIZE": "100",
        "LOCKGATE_TRANSACTION_TIMEOUT_MS": str(TXN_TIMEOUT_MS),
        DSN_ENV: postgres.dsn,
        TABLE_ENV: table,
    }
    proc = AppProcess("examples.postgres_sink:app", env, tmp_path / "pg1.log").start()
    started = time.monotonic()
    try:
        deadline = time.monotonic() + 120  # then the checker says what is missing
        while _count(postgres, table) < RECORDS and time.monotonic() < deadline:
            time.sleep(0.3)
        time.sleep(1.0)  # anything written twice would show by now
        problems = check_tables(postgres, table, read_inputs(kafka_bootstrap, inp, RECORDS))
        code = proc.terminate(60)
    except BaseException:
        print(proc.log_text()[-6000:])
        if proc.alive:
            proc.kill9()
        raise
    log = proc.log_text()
    print(f"{RECORDS} inputs in {time.monotonic() - started:.1f} s")
    assert problems == [], "\n".join(problems) + "\n" + log[-6000:]
    # The refusal aborted an epoch (and only the replay wrote it).
    assert "injected refusal of seq 1777" in log, log[-6000:]
    assert "aborting epoch" in log, log[-6000:]
    assert int(postgres.execute(f"SELECT last_value FROM {table}_attempts")[0][0]) >= 2
    # The hanging insert was cut within the transaction's time (statement_timeout), the
    # transaction never outlived its timeout, and the replay wrote the row.
    assert int(postgres.execute(f"SELECT last_value FROM {table}_slow")[0][0]) >= 2
    assert "statement timeout" in log, log[-6000:]
    assert "outlived its timeout" not in log, log[-6000:]
    assert code == 0, log[-6000:]
