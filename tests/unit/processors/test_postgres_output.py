"""app.postgres_output: the declaration's rules and how emitted rows are buffered (no server)."""

from __future__ import annotations

import time

import pytest

from processors import App
from processors._checkpoint.protocol import writer_header
from processors._kafka.errors import AbortEpoch
from processors._sinks import Sinks
from processors._sinks.errors import SinkRowError, SinkUnavailable
from processors._sinks.postgres import PostgresOutput, PostgresSink
from processors.exceptions import ConfigError
from tests.support.ports import free_port


def test_declaration_rules() -> None:
    app = App("pg-decl")
    spec = app.postgres_output("t", dsn="postgresql://x", table="s.t", key_columns=["k"])
    assert spec.key_columns == ("k",) and app.sinks == {"t": spec}
    with pytest.raises(ConfigError, match="declared twice"):
        app.postgres_output("t", dsn="x", table="t", key_columns=["k"])
    with pytest.raises(ConfigError, match="already declared as a Postgres output"):
        app.output("t")
    app.output("topic")
    with pytest.raises(ConfigError, match="declared twice"):
        app.postgres_output("topic", dsn="x", table="t", key_columns=["k"])
    with pytest.raises(ConfigError, match="needs key_columns"):
        app.postgres_output("u", dsn="x", table="t")
    with pytest.raises(ConfigError, match="upsert' only"):
        app.postgres_output("u", dsn="x", table="t", mode="append", key_columns=["k"])
    with pytest.raises(ConfigError, match="mode must be"):
        app.postgres_output("u", dsn="x", table="t", mode="merge", key_columns=["k"])  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="schema.name"):
        app.postgres_output("u", dsn="x", table="a.b.c", key_columns=["k"])
    with pytest.raises(ConfigError, match="must match"):
        app.postgres_output("a:b", dsn="x", table="t", key_columns=["k"])
    assert "u" not in app.sinks


def test_upsert_keeps_the_last_op_per_key_and_takes_the_key_from_the_record() -> None:
    sink = PostgresSink("app", PostgresOutput("t", "x", "t", "upsert", ("key",)))
    sink.add(0, "a", {"total": 1})
    sink.add(0, "b", {"total": 5})
    sink.add(0, "a", {"total": 2})
    sink.add(0, "b", None)  # delete
    rows = sink._rows[0]
    assert isinstance(rows, dict)
    assert list(rows.values()) == [
        ("row", {"total": 2, "key": "a"}),
        ("delete", {"key": "b"}),
    ]
    with pytest.raises(SinkRowError, match="mapping"):
        sink.add(0, "a", 3)
    two = PostgresSink("app", PostgresOutput("t", "x", "t", "upsert", ("a", "b")))
    with pytest.raises(SinkRowError, match="no key columns"):
        two.add(0, "k", {"v": 1})
    two.add(1, {"a": 1, "b": 2}, {"v": 1})
    assert list(two._rows[1].values()) == [("row", {"v": 1, "a": 1, "b": 2})]  # type: ignore[union-attr]


def test_append_keeps_every_row() -> None:
    sink = PostgresSink("app", PostgresOutput("t", "x", "t", "append"))
    sink.add(3, "a", {"v": 1})
    sink.add(3, "a", {"v": 1})
    assert sink._rows[3] == [("row", {"v": 1}), ("row", {"v": 1})]
    with pytest.raises(SinkRowError, match="append"):
        sink.add(3, "a", None)


def test_rows_go_to_the_key_group_the_writer_header_names() -> None:
    app = App("pg-kg")
    app.postgres_output("t", dsn="x", table="t", mode="append")
    sinks = Sinks("pg-kg", app.sinks, 10.0)
    assert "t" in sinks and "other" not in sinks
    sinks.write("t", writer_header("pg-kg", 7), "k", {"v": 1})
    assert list(sinks._sinks["t"]._rows) == [7]
    sinks.abort()  # nothing prepared: drops the rows without a connection
    assert sinks._sinks["t"]._rows == {}


def test_nothing_to_do_touches_no_database() -> None:
    sinks = Sinks(
        "pg-none", {"t": PostgresOutput("t", "postgresql://nohost.invalid/x", "t", "append")}, 1
    )
    sinks.prepare("tok", [0], time.monotonic())  # no rows, nothing pending: returns at once


def test_a_database_that_is_down_aborts_the_epoch_within_the_time_left() -> None:
    port = free_port()  # nothing listens there
    spec = PostgresOutput("t", f"postgresql://u@127.0.0.1:{port}/x", "t", "append")
    sinks = Sinks("pg-down", {"t": spec}, 2.0)
    sinks.write("t", writer_header("pg-down", 0), "k", {"v": 1})
    started = time.monotonic()
    with pytest.raises(SinkUnavailable, match="prepare failed") as info:
        sinks.prepare("tok", [0], started)  # 0.75 x 2 s to prepare
    took = time.monotonic() - started
    assert isinstance(info.value, AbortEpoch)
    assert 1.0 <= took < 2.5, took  # retried connecting until the time was up, not past it
    sinks.abort()


def test_the_test_driver_records_rows_and_checks_them() -> None:
    from processors.testing import TestDriver

    app = App("pg-driver")
    app.postgres_output("t", dsn="x", table="t", key_columns=["key"])

    @app.process("in")
    def handle(key: str, value: dict[str, int], ctx: object) -> None:
        ctx.emit("t", key, value if value["v"] >= 0 else 5)  # type: ignore[attr-defined]

    driver = TestDriver(app)
    assert [(e.topic, e.key, e.value) for e in driver.send("a", {"v": 1})] == [("t", "a", {"v": 1})]
    driver.commit()
    driver.send("a", {"v": 2})
    driver.crash()  # lost with the epoch
    assert [e.value for e in driver.emitted] == [{"v": 1}]
    assert driver.send("b", {"v": -1}) == []  # not a mapping: dead-lettered
    assert isinstance(driver.dead_letters[0].error, SinkRowError)
