"""The Postgres sink's two-phase commit against a real server, without Kafka.

What the epoch protocol relies on, one step at a time: an epoch's rows are invisible
while prepared; commit makes them visible, abort removes them; a key group taken over
settles its prepared transactions by the committed token (that one commits, any other
rolls back); a transaction a former owner prepares after the takeover is left to it
(only the settle right after an assignment rolls back others' transactions); a commit
that finds its transaction rolled back stops the instance;
a prepared transaction survives a crash of the database; pending work stays pending while
the database is down and is done before the next epoch prepares.
"""

from __future__ import annotations

import time

import pytest

from processors._checkpoint.protocol import writer_header
from processors._sinks import Sinks
from processors._sinks.errors import SinkRowsLost
from processors._sinks.postgres import PostgresOutput
from tests.support.postgres import PostgresServer

APP = "settle-app"


def _sinks(pg: PostgresServer, table: str) -> Sinks:
    spec = PostgresOutput("t", pg.dsn, table, "upsert", ("k",))
    return Sinks(APP, {"t": spec}, 10.0)


def _rows(pg: PostgresServer, table: str) -> dict[str, int]:
    return {k: v for k, v in pg.execute(f"SELECT k, v FROM {table}")}  # noqa: S608


def _gids(pg: PostgresServer) -> list[str]:
    return sorted(g for (g,) in pg.execute("SELECT gid FROM pg_prepared_xacts") if f":{APP}:" in g)


def _write(s: Sinks, g: int, k: str, v: int) -> None:
    s.write("t", writer_header(APP, g), k, {"v": v})


def test_two_phase_commit_and_settle(postgres: PostgresServer) -> None:
    pg, table = postgres, "settle_t"
    pg.execute(f"CREATE TABLE {table} (k text PRIMARY KEY, v int NOT NULL)")
    a = _sinks(pg, table)
    # An epoch: prepared rows are invisible; committed, they show.
    _write(a, 0, "x", 1)
    _write(a, 1, "y", 1)
    a.prepare("tok1", [0, 1], time.monotonic())
    assert _rows(pg, table) == {} and len(_gids(pg)) == 2
    a.commit()
    assert _rows(pg, table) == {"x": 1, "y": 1} and _gids(pg) == []
    # An aborted epoch leaves nothing.
    _write(a, 0, "x", 2)
    a.prepare("tok2", [0, 1], time.monotonic())
    a.abort()
    assert _rows(pg, table) == {"x": 1, "y": 1} and _gids(pg) == []
    # A crash between prepare and the Kafka outcome: two epochs of key group 0 left
    # prepared by instances that died (tok3 committed in Kafka, tok4 did not), and the
    # database crashes too.
    _write(a, 0, "x", 3)
    a.prepare("tok3", [0], time.monotonic())
    dead = _sinks(pg, table)
    _write(dead, 1, "y", 4)
    dead.prepare("tok4", [1], time.monotonic())
    pg.stop("immediate")
    pg.start()
    assert len(_gids(pg)) == 2  # prepared transactions survive the crash
    b = _sinks(pg, table)
    b.settle([(0, "tok3"), (1, "tok9")])  # the committed tokens the new owner reads
    assert _rows(pg, table) == {"x": 3, "y": 1} and _gids(pg) == []
    # A former owner prepares after the takeover (its Kafka commit will be refused, so it
    # aborts): the new owner leaves it alone; the former owner's abort rolls it back.
    _write(dead, 1, "z", 5)
    dead.prepare("tok5", [1], time.monotonic())
    _write(b, 1, "y", 6)
    b.prepare("tok6", [0, 1], time.monotonic())
    assert len(_gids(pg)) == 2
    b.commit()
    dead.abort()
    assert _rows(pg, table) == {"x": 3, "y": 6} and _gids(pg) == []


def test_an_instance_that_lost_a_key_group_never_rolls_back_its_owner(
    postgres: PostgresServer,
) -> None:
    pg, table = postgres, "settle_zombie"
    pg.execute(f"CREATE TABLE {table} (k text PRIMARY KEY, v int NOT NULL)")
    owner, zombie = _sinks(pg, table), _sinks(pg, table)
    zombie.settle([(0, None)])  # it owned key group 0 once
    _write(owner, 0, "x", 1)
    owner.prepare("tok1", [0], time.monotonic())
    # The zombie still believes it owns key group 0: its idle tidies and its epochs'
    # prepares (refused by Kafka later) leave the owner's prepared rows alone.
    zombie.tidy([0])
    _write(zombie, 0, "w", 9)
    zombie.prepare("tokz", [0], time.monotonic())
    zombie.abort()
    owner.commit()
    assert _rows(pg, table) == {"x": 1} and _gids(pg) == []


def test_a_commit_whose_transaction_was_rolled_back_stops_the_instance(
    postgres: PostgresServer,
) -> None:
    pg, table = postgres, "settle_lost"
    pg.execute(f"CREATE TABLE {table} (k text PRIMARY KEY, v int NOT NULL)")
    s = _sinks(pg, table)
    _write(s, 0, "x", 1)
    s.prepare("tok1", [0], time.monotonic())
    (gid,) = _gids(pg)
    pg.execute(f"ROLLBACK PREPARED '{gid}'")  # someone else rolled it back
    with pytest.raises(SinkRowsLost, match="tok1"):
        s.commit()  # committed in Kafka: its rows are lost, and that is said loudly
    # Committed by someone else (the next owner's settle) is fine.
    s = _sinks(pg, table)  # the instance stopped: a new one
    _write(s, 0, "x", 2)
    s.prepare("tok2", [0], time.monotonic())
    (gid,) = _gids(pg)
    pg.execute(f"COMMIT PREPARED '{gid}'")
    s.commit()
    assert _rows(pg, table) == {"x": 2} and _gids(pg) == []


def test_a_partition_without_a_token_does_not_roll_back_a_committed_epoch(
    postgres: PostgresServer,
) -> None:
    # Two inputs: key group 0 is partition 0 of each. The committed offsets of one name
    # the epoch; the other's (an input with nothing committed by an epoch) name none.
    pg, table = postgres, "settle_two_inputs"
    pg.execute(f"CREATE TABLE {table} (k text PRIMARY KEY, v int NOT NULL)")
    dead = _sinks(pg, table)
    _write(dead, 0, "x", 1)
    dead.prepare("tok1", [0], time.monotonic())  # committed in Kafka, then it crashed
    b = _sinks(pg, table)
    b.settle([(0, "tok1"), (0, None)])
    assert _rows(pg, table) == {"x": 1} and _gids(pg) == []


def test_pending_work_waits_for_the_database(postgres: PostgresServer) -> None:
    pg, table = postgres, "settle_down"
    pg.execute(f"CREATE TABLE {table} (k text PRIMARY KEY, v int NOT NULL)")
    s = _sinks(pg, table)
    _write(s, 0, "x", 1)
    s.prepare("tok1", [0], time.monotonic())
    pg.stop("immediate")
    s.commit()  # committed in Kafka, the database is away: pending, never raises
    assert s._sinks["t"].has_pending()
    pg.start()
    _write(s, 0, "x", 2)
    s.prepare("tok2", [0], time.monotonic())  # first commits tok1, then prepares tok2
    assert _rows(pg, table) == {"x": 1}
    s.commit()
    assert _rows(pg, table) == {"x": 2} and _gids(pg) == []


def test_upsert_rows_of_one_epoch_write_what_they_would_across_epochs(
    postgres: PostgresServer,
) -> None:
    pg, table = postgres, "settle_merge"
    pg.execute(f"CREATE TABLE {table} (k text PRIMARY KEY, a int, b int)")
    s = _sinks(pg, table)
    s.write("t", writer_header(APP, 0), "x", {"a": 1, "b": 1})
    s.write("t", writer_header(APP, 0), "y", {"a": 1, "b": 1})
    s.prepare("tok1", [0], time.monotonic())
    s.commit()
    s.write("t", writer_header(APP, 0), "x", {"a": 2})
    s.write("t", writer_header(APP, 0), "x", {"b": 3})  # merged: a=2, b=3
    s.write("t", writer_header(APP, 0), "y", {"a": 2})
    s.write("t", writer_header(APP, 0), "y", None)
    s.write("t", writer_header(APP, 0), "y", {"b": 4})  # deleted, then a new row: a NULL
    s.prepare("tok2", [0], time.monotonic())
    s.commit()
    got = sorted(pg.execute(f"SELECT k, a, b FROM {table}"))  # noqa: S608
    assert got == [("x", 2, 3), ("y", None, 4)]
