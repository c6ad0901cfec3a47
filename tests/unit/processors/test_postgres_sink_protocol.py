"""The Postgres sink's bookkeeping under timeouts, reassignment and failures, without a database.

A fake connection records the statements that end a transaction (``PREPARE
TRANSACTION``, ``COMMIT PREPARED``, ``ROLLBACK PREPARED``), so the tests see what would
reach the database and when.
"""

from __future__ import annotations

import time
from typing import Any

import psycopg
import pytest

from processors import App
from processors._checkpoint.protocol import writer_header
from processors._sinks import Sinks
from processors._sinks.errors import SinkUnavailable
from processors._sinks.postgres import PostgresOutput, PostgresSink
from processors._spark.backfill_task import check_backfillable
from processors.exceptions import ConfigError


class _Result:
    def fetchall(self) -> list[tuple[Any, ...]]:
        return []

    def fetchone(self) -> tuple[Any, ...]:
        return (1,)


class _Cursor:
    def __enter__(self) -> _Cursor:
        return self

    def __exit__(self, *exc: object) -> None:
        return None

    def executemany(self, stmt: Any, params: Any) -> None:
        return None


class _FakeConn:
    """Records the statements that prepare or end a transaction; ``refuse`` raises."""

    closed = False

    def __init__(self, done: list[str], refuse: dict[str, BaseException] | None = None):
        self.done = done
        self.refuse = refuse or {}

    def execute(self, stmt: Any, params: Any = None) -> _Result:
        text = stmt if isinstance(stmt, str) else repr(stmt)
        for word in ("PREPARE TRANSACTION", "COMMIT PREPARED", "ROLLBACK PREPARED"):
            if word in text:
                gid = text[text.find("lockgate") :].split("'")[0]
                if word in self.refuse:
                    raise self.refuse[word]
                self.done.append(f"{word} {gid}")
        return _Result()

    def cursor(self) -> _Cursor:
        return _Cursor()

    def close(self) -> None:
        return None


def _sinks(app: str = "app") -> tuple[Sinks, PostgresSink]:
    sinks = Sinks(app, {"s": PostgresOutput("s", "unused", "t", "append")}, 10.0)
    return sinks, sinks._sinks["s"]


def _write(sinks: Sinks, g: int, value: str, app: str = "app") -> None:
    sinks.write("s", writer_header(app, g), "k", {"v": value})


def test_a_timed_out_prepare_prepares_nothing_later() -> None:
    # The first connection answers only after the prepare's deadline (a database thawed
    # late): the aborted epoch's rows must never be prepared afterwards, and so never
    # commit with the next epoch.
    sinks, pg = _sinks()
    done: list[str] = []
    calls = [0]

    def slow_connection(*args: Any) -> _FakeConn:
        calls[0] += 1
        if calls[0] == 1:
            time.sleep(1.5)
        pg._conn = _FakeConn(done)
        return pg._conn

    pg._connection = slow_connection  # type: ignore[method-assign]
    _write(sinks, 3, "epoch1")
    with pytest.raises(SinkUnavailable):
        sinks.prepare("tok1", [3], time.monotonic() - 7.5 + 0.8)  # 0.8 s left
    sinks.abort()
    time.sleep(2)  # the stale job wakes up meanwhile
    assert pg._prepared == []
    _write(sinks, 3, "epoch1")  # the replay
    sinks.prepare("tok2", [3], time.monotonic())
    sinks.commit()
    assert [d for d in done if "tok1" in d and "ROLLBACK" not in d] == []
    assert done[-2:] == [
        "PREPARE TRANSACTION lockgate:app:s:3:tok2",
        "COMMIT PREPARED lockgate:app:s:3:tok2",
    ]


def test_a_pending_settle_survives_the_assignment_of_another_key_group() -> None:
    sinks, pg = _sinks()

    def down(*args: Any) -> Any:
        raise psycopg.OperationalError("down")

    pg._connection = down  # type: ignore[method-assign]
    sinks.settle([(1, "tokA")])  # the database is away: pending
    sinks.settle([(2, "tokB")])  # an incremental assignment, key group 1 still owned
    assert pg._settle == {1: "tokA", 2: "tokB"}
    sinks.tidy([2])  # 1 revoked meanwhile: its new owner settles it
    assert pg._settle == {2: "tokB"}


def test_the_token_of_a_key_group_is_the_one_its_partitions_name() -> None:
    sinks, pg = _sinks()

    def down(*args: Any) -> Any:
        raise psycopg.OperationalError("down")

    pg._connection = down  # type: ignore[method-assign]
    # Two inputs: one partition without a token (never committed by an epoch) says nothing.
    sinks.settle([(0, "tokA"), (0, None), (1, None), (1, None)])
    assert pg._settle == {0: "tokA", 1: None}
    with pytest.raises(ConfigError, match="different epochs"):
        sinks.settle([(2, "tokA"), (2, "tokB")])


def test_a_rollback_the_server_keeps_refusing_does_not_block_commits() -> None:
    sinks, pg = _sinks()
    done: list[str] = []
    refusal = psycopg.errors.InsufficientPrivilege("permission denied")
    conn = _FakeConn(done, {"ROLLBACK PREPARED": refusal})
    pg._connection = lambda *args: conn  # type: ignore[method-assign]
    _write(sinks, 0, "a")
    sinks.prepare("tok1", [0], time.monotonic())
    sinks.abort()  # refused once
    assert pg._to_rollback == ["lockgate:app:s:0:tok1"]
    sinks.tidy([0])  # twice
    _write(sinks, 0, "b")
    sinks.prepare("tok2", [0], time.monotonic())  # the third refusal gives it up
    sinks.commit()
    assert pg._to_rollback == [] and not pg.has_pending()
    assert done[-1] == "COMMIT PREPARED lockgate:app:s:0:tok2"


def test_close_commits_what_is_pending_then_refuses_work() -> None:
    sinks, pg = _sinks()
    done: list[str] = []
    down = [True]

    def connection(*args: Any) -> _FakeConn:
        if down[0]:
            raise psycopg.OperationalError("down")
        return _FakeConn(done)

    pg._connection = connection  # type: ignore[method-assign]
    down[0] = False
    _write(sinks, 0, "a")
    sinks.prepare("tok1", [0], time.monotonic())
    down[0] = True
    sinks.commit()  # committed in Kafka, the database is away: pending
    assert pg.has_pending()
    down[0] = False
    sinks.close(time.monotonic() + 5)
    assert done[-1] == "COMMIT PREPARED lockgate:app:s:0:tok1" and not pg.has_pending()
    _write(sinks, 0, "b")
    with pytest.raises(SinkUnavailable, match="closed"):
        sinks.prepare("tok2", [0], time.monotonic())
    sinks.close(None)  # twice: nothing more


def test_close_logs_what_stays_prepared(caplog: pytest.LogCaptureFixture) -> None:
    sinks, pg = _sinks()
    conn = _FakeConn([])
    pg._connection = lambda *args: conn  # type: ignore[method-assign]
    _write(sinks, 0, "a")
    sinks.prepare("tok1", [0], time.monotonic())
    conn.refuse["COMMIT PREPARED"] = psycopg.OperationalError("down")
    sinks.commit()
    with caplog.at_level("ERROR", logger="lockgate.sinks"):
        sinks.close(time.monotonic() + 1)
    assert "committed by the next owner" in caplog.text


def test_the_settings_and_names_a_postgres_output_needs() -> None:
    spec = PostgresOutput("s", "unused", "t", "append")
    with pytest.raises(ConfigError, match="exactly_once"):
        Sinks("app", {"s": spec}, 10.0, exactly_once=False)
    Sinks("app", {}, 10.0, exactly_once=False)  # no postgres output: nothing to refuse
    Sinks("a" * 100, {"s" * 65: PostgresOutput("s" * 65, "unused", "t", "append")}, 10.0)
    with pytest.raises(ConfigError, match="199 bytes"):
        Sinks("a" * 100, {"s" * 66: PostgresOutput("s" * 66, "unused", "t", "append")}, 10.0)


def test_backfill_refuses_postgres_outputs() -> None:
    app = App("pg-backfill")
    app.postgres_output("t", dsn="x", table="t", key_columns=["key"])
    with pytest.raises(ConfigError, match="postgres outputs"):
        check_backfillable(app)


def test_upsert_rows_of_a_key_merge_within_an_epoch_as_across_epochs() -> None:
    # Across epochs each row updates its own columns; within one epoch the same must
    # hold, whatever the epoch cuts.
    sink = PostgresSink("app", PostgresOutput("t", "x", "t", "upsert", ("key",)))
    sink.add(0, "a", {"x": 1})
    sink.add(0, "a", {"y": 2})
    sink.add(0, "b", None)
    sink.add(0, "b", {"x": 3})
    sink.add(0, "b", {"y": 4})
    rows = sink._rows[0]
    assert isinstance(rows, dict)
    assert list(rows.values()) == [
        ("row", {"x": 1, "key": "a", "y": 2}),
        ("replace", {"x": 3, "key": "b", "y": 4}),  # deleted, then the row
    ]
    done: list[tuple[str, Any]] = []

    class Cur(_Cursor):
        def executemany(self, stmt: Any, params: Any) -> None:
            done.append((repr(stmt).split(" ")[0][-6:], list(params)))

    class Conn(_FakeConn):
        def cursor(self) -> Cur:
            return Cur()

    sink._write(Conn([]), list(rows.values()))
    assert done[0] == ("DELETE", [("b",)])  # every delete before every row
    assert [kind for kind, _ in done[1:]] == ["INSERT"]
    assert done[1][1] == [(1, "a", 2), (3, "b", 4)]
