"""Running sum per key into Postgres, exactly once: an upsert table and an append table.

Input (``LOCKGATE_INPUT_TOPIC``, default ``numbers``): key = UTF-8 string, value =
``{"v": <int>, "seq": <int>}`` (as examples/running_sum.py). For every input record:

- table ``<LOCKGATE_PG_TABLE>`` (default ``sums``), upsert by ``key``: the key's running
  ``total``, ``count`` of records and the ``seq`` of the last one;
- table ``<LOCKGATE_PG_TABLE>_events``, append: one row per input (``seq``, ``key``,
  ``v``, ``total``).

Both receive each epoch's rows exactly once, committed with the epoch's Kafka
transaction (docs/sinks.md). Create the tables first (:data:`DDL`), then run::

    LOCKGATE_BOOTSTRAP_SERVERS=127.0.0.1:9092 \
    LOCKGATE_PG_DSN=postgresql://app@127.0.0.1:5432/app \
    lockgate run examples.postgres_sink:app

The server needs ``max_prepared_transactions`` > 0 (e.g. 64).
"""

import os
from typing import Any

from processors import App, Context

INPUT = os.environ.get("LOCKGATE_INPUT_TOPIC", "numbers")
TABLE = os.environ.get("LOCKGATE_PG_TABLE", "sums")
#: The variables this app reads (declared, so ``lockgate run`` accepts them).
DSN_ENV, TABLE_ENV = "LOCKGATE_PG_DSN", "LOCKGATE_PG_TABLE"


def ddl(table: str) -> str:
    """The tables this example writes (``table`` and ``<table>_events``)."""
    return (
        f"CREATE TABLE IF NOT EXISTS {table} (key text PRIMARY KEY, total bigint NOT NULL, "
        "count bigint NOT NULL, seq bigint NOT NULL);"
        f"CREATE TABLE IF NOT EXISTS {table}_events (seq bigint NOT NULL, key text NOT NULL, "
        "v bigint NOT NULL, total bigint NOT NULL)"
    )


DDL = ddl(TABLE)

app = App("pg-sums", env=["LOCKGATE_PG_DSN", "LOCKGATE_PG_TABLE"])
totals = app.value_state("totals")
app.postgres_output(
    "sums",
    dsn=lambda: os.environ[DSN_ENV],
    table=TABLE,
    mode="upsert",
    key_columns=["key"],
)
app.postgres_output(
    "events", dsn=lambda: os.environ[DSN_ENV], table=f"{TABLE}_events", mode="append"
)


@app.process(INPUT)
def running_sum(key: str, value: dict[str, Any], ctx: Context) -> None:
    total, count = totals.value() or [0, 0]
    total, count = total + value["v"], count + 1
    totals.update([total, count])
    # The key column comes from the record's key (key_columns=["key"]).
    ctx.emit("sums", key, {"total": total, "count": count, "seq": value["seq"]})
    ctx.emit("events", key, {"seq": value["seq"], "key": key, "v": value["v"], "total": total})
