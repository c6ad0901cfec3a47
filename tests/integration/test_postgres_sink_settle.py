"""The Postgres sink's two-phase commit against a real server, without Kafka.

What the epoch protocol relies on, one step at a time: an epoch's rows are invisible
while prepared; commit makes them visible, abort removes them; a key group taken over
settles its prepared transactions by the committed token (that one commits, any other
rolls back); a transaction a former owner prepares after the takeover is rolled back;
a prepared transaction survives a crash of the database; pending work stays pending while
the database is down and is done before the next epoch prepares.
"""

from __future__ import annotations

import time

from processors._checkpoint.protocol import writer_header
from processors._sinks import Sinks
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
    b.settle({0: "tok3", 1: "tok9"})  # the committed tokens the new owner reads
    assert _rows(pg, table) == {"x": 3, "y": 1} and _gids(pg) == []
    # A former owner prepares after the takeover (its Kafka commit will be refused):
    # the new owner's next epoch rolls it back before writing.
    _write(dead, 1, "y", 5)
    dead.prepare("tok5", [1], time.monotonic())
    _write(b, 1, "y", 6)
    b.prepare("tok6", [0, 1], time.monotonic())
    b.commit()
    assert _rows(pg, table) == {"x": 3, "y": 6} and _gids(pg) == []


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
