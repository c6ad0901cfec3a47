"""Global tables against the real broker: loaded before ready, updated live, reloaded on restart.

tests/integration/apps/rates.py converts payment amounts with a global table of rates. The
rates topic has 3 partitions while the payments topic has 2: global tables are not
co-partitioned.

The apps declare the variables they read: ``App("rates", env=["LOCKGATE_RATES_TOPIC"])``,
``App("customer-tiers", env=["LOCKGATE_CUSTOMERS_TOPIC"])``.
"""

from __future__ import annotations

import time
import urllib.request
from pathlib import Path
from typing import Any

import orjson
from confluent_kafka import Consumer, Producer, TopicPartition

from tests.support.kafka import create_topic, read_all
from tests.support.ports import free_port
from tests.support.procs import AppProcess, wait_until

SPEC = "tests.integration.apps.rates:app"


def _produce(bootstrap: str, topic: str, records: list[tuple[str, Any]]) -> None:
    p = Producer({"bootstrap.servers": bootstrap, "partitioner": "murmur2_random"})
    for key, value in records:
        p.produce(topic, None if value is None else orjson.dumps(value), key.encode())
    assert p.flush(30) == 0


def _ready(port: int) -> int:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=2) as r:
            return int(r.status)
    except Exception:  # noqa: BLE001 - 503 raises HTTPError; not up yet raises URLError
        return 0


def _outputs(bootstrap: str, topic: str, n: int) -> dict[int, dict[str, Any]]:
    msgs = read_all(bootstrap, topic, expected=n, idle=1.5, timeout=60)
    out: dict[int, dict[str, Any]] = {}
    for m in msgs:
        v = orjson.loads(m.value())
        assert v["seq"] not in out, f"duplicate output for seq {v['seq']}"
        out[v["seq"]] = v
    return out


def test_global_table_loaded_before_ready_updated_live_and_reloaded(  # type: ignore[no-untyped-def]
    kafka_bootstrap: str, names, tmp_path: Path
) -> None:
    port = free_port()
    env = {
        "LOCKGATE_BOOTSTRAP_SERVERS": kafka_bootstrap,
        "LOCKGATE_APP_NAME": names("rates"),
        "LOCKGATE_INPUT_TOPIC": names("payments"),
        "LOCKGATE_RATES_TOPIC": names("rates-table"),
        "LOCKGATE_OUTPUT_TOPIC": names("converted"),
        "LOCKGATE_STATE_DIR": str(tmp_path / "state"),
        "LOCKGATE_INSTANCE_ID": "i1",
        "LOCKGATE_CHECKPOINT_INTERVAL_MS": "200",
        "LOCKGATE_HTTP_PORT": str(port),
    }
    create_topic(kafka_bootstrap, env["LOCKGATE_INPUT_TOPIC"], 2)
    create_topic(kafka_bootstrap, env["LOCKGATE_RATES_TOPIC"], 3)
    # 3000 rate records (older versions, then the final ones, then a deleted currency).
    _produce(
        kafka_bootstrap,
        env["LOCKGATE_RATES_TOPIC"],
        [(f"c{i % 100}", {"rate": 1000 + i}) for i in range(2900)]
        + [(f"c{i}", {"rate": i + 1}) for i in range(100)]
        + [("gone", {"rate": 7}), ("gone", None)],
    )
    app = AppProcess(SPEC, env, tmp_path / "app.log").start()
    try:
        wait_until(lambda: _ready(port) == 200, 60, what="/readyz 200")
        assert "global tables loaded" in app.log_text()
        assert "tables={'" + env["LOCKGATE_RATES_TOPIC"] + "': 100}" in app.log_text()
        payments = [
            (f"acct-{i % 7}", {"amount": 2, "currency": f"c{i % 100}", "seq": i})
            for i in range(300)
        ]
        payments.append(("acct-0", {"amount": 5, "currency": "gone", "seq": 300}))
        _produce(kafka_bootstrap, env["LOCKGATE_INPUT_TOPIC"], payments)
        out = _outputs(kafka_bootstrap, env["LOCKGATE_OUTPUT_TOPIC"], len(payments))
        assert len(out) == len(payments)
        for i in range(300):
            assert out[i]["converted"] == 2 * (i % 100 + 1), out[i]
        assert out[300]["converted"] is None  # deleted from the global table
        # A live update of the table is applied between batches: records processed
        # after it see it (probe with one payment at a time until one does).
        _produce(kafka_bootstrap, env["LOCKGATE_RATES_TOPIC"], [("c5", {"rate": 500})])
        seq = 301
        while True:
            _produce(
                kafka_bootstrap,
                env["LOCKGATE_INPUT_TOPIC"],
                [("acct-1", {"amount": 1, "currency": "c5", "seq": seq})],
            )
            out = _outputs(kafka_bootstrap, env["LOCKGATE_OUTPUT_TOPIC"], seq + 1)
            assert len(out) == seq + 1
            if out[seq]["converted"] == 500:
                break
            assert out[seq]["converted"] == 6 and seq < 320, out[seq]
            seq += 1
    finally:
        code = app.terminate()
    assert code == 0, app.log_text()[-3000:]
    # Checkpoint records name the global-table positions the committed state used.
    positions = _checkpoint_globals(kafka_bootstrap, env["LOCKGATE_APP_NAME"] + ".control")
    assert positions, "no checkpoint record names global-table positions"
    table = env["LOCKGATE_RATES_TOPIC"]
    assert all(table in p for p in positions)
    assert max(sum(p[table].values()) for p in positions) == 3003
    # Restarted: the table is loaded again (from Kafka, nothing local) before ready.
    app = AppProcess(SPEC, env, tmp_path / "app2.log").start()
    try:
        wait_until(lambda: _ready(port) == 200, 60, what="/readyz 200 after restart")
        _produce(
            kafka_bootstrap,
            env["LOCKGATE_INPUT_TOPIC"],
            [("acct-1", {"amount": 3, "currency": "c5", "seq": seq + 1})],
        )
        out = _outputs(kafka_bootstrap, env["LOCKGATE_OUTPUT_TOPIC"], seq + 2)
        assert out[seq + 1]["converted"] == 1500
        assert len(out) == seq + 2
    finally:
        assert app.terminate() == 0, app.log_text()[-3000:]


def _checkpoint_globals(bootstrap: str, control: str) -> list[dict[str, dict[str, int]]]:
    c = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": "globals-reader",
            "enable.auto.commit": False,
            "isolation.level": "read_committed",
            "enable.partition.eof": True,
        }
    )
    try:
        md = c.list_topics(control, timeout=10).topics[control]
        parts = list(md.partitions)
        c.assign([TopicPartition(control, p, 0) for p in parts])
        out: list[dict[str, dict[str, int]]] = []
        eofs: set[int] = set()
        for _ in range(100):
            for m in c.consume(500, 0.3):
                if m.error() is not None:
                    eofs.add(m.partition())
                    continue
                if m.key() and m.key().startswith(b"ckpt/") and m.value():
                    record = orjson.loads(m.value())
                    if "globals" in record:
                        out.append(record["globals"])
            if len(eofs) == len(parts):
                break
        return out
    finally:
        c.close()


def _produce_at(bootstrap: str, topic: str, records: list[tuple[str, Any, int]]) -> None:
    """Produce ``(key, value or None, timestamp ms)`` in this order (one partition each key)."""
    p = Producer({"bootstrap.servers": bootstrap, "partitioner": "murmur2_random"})
    for key, value, ts in records:
        p.produce(topic, None if value is None else orjson.dumps(value), key.encode(), timestamp=ts)
    assert p.flush(30) == 0


def test_versioned_global_table_answers_as_of_each_orders_time(  # type: ignore[no-untyped-def]
    kafka_bootstrap: str, names, tmp_path: Path
) -> None:
    """Orders keyed by order id look customers (keyed by customer id) up as of their time.

    tests/integration/apps/customer_tiers.py (60 s of history per customer). The customers
    topic (3 partitions) and the orders topic (2) are not co-partitioned. Checked against
    versions written with explicit record timestamps: before the first version, between
    versions, exactly at one, after a deletion, a version that arrived after a newer one
    (older timestamp, later offset: it answers its own time span but is not the latest),
    and a version dropped because it is more than 60 s older than the customer's newest.
    Timestamps are ten minutes old, well inside the topics' retention.
    """
    port = free_port()
    env = {
        "LOCKGATE_BOOTSTRAP_SERVERS": kafka_bootstrap,
        "LOCKGATE_APP_NAME": names("tiers"),
        "LOCKGATE_INPUT_TOPIC": names("orders"),
        "LOCKGATE_CUSTOMERS_TOPIC": names("customers"),
        "LOCKGATE_OUTPUT_TOPIC": names("order-tiers"),
        "LOCKGATE_STATE_DIR": str(tmp_path / "state"),
        "LOCKGATE_HTTP_PORT": str(port),
        "LOCKGATE_CHECKPOINT_INTERVAL_MS": "300",
    }
    create_topic(kafka_bootstrap, env["LOCKGATE_CUSTOMERS_TOPIC"], 3)
    create_topic(kafka_bootstrap, env["LOCKGATE_INPUT_TOPIC"], 2)
    base = (int(time.time()) - 600) * 1000
    _produce_at(
        kafka_bootstrap,
        env["LOCKGATE_CUSTOMERS_TOPIC"],
        [
            ("c1", {"tier": "bronze"}, base),
            ("c1", {"tier": "silver"}, base + 1000),
            ("c1", {"tier": "gold"}, base + 2000),
            ("c2", {"tier": "bronze"}, base + 500),
            ("c2", None, base + 1500),  # deleted from then on
            ("c4", {"tier": "gold"}, base + 2000),
            ("c4", {"tier": "silver"}, base + 1000),  # arrives late with an older time
            ("c3", {"tier": "dropped"}, base),
            ("c3", {"tier": "kept"}, base + 10),
            ("c3", {"tier": "newest"}, base + 120_000),  # base + 10 is newest - 60 s or older
        ],
    )
    # (customer, order time) -> expected (as_of, latest)
    cases = [
        ("c1", base - 1, None, "gold"),
        ("c1", base + 999, "bronze", "gold"),
        ("c1", base + 1000, "silver", "gold"),
        ("c1", base + 2500, "gold", "gold"),
        ("c2", base + 600, "bronze", None),
        ("c2", base + 1600, None, None),
        ("c4", base + 1500, "silver", "gold"),
        ("c4", base + 2000, "gold", "gold"),
        ("c3", base + 5, None, "newest"),  # its version was dropped (beyond the history)
        ("c3", base + 50, "kept", "newest"),
        ("c5", base, None, None),  # never known
    ]
    app = AppProcess(
        "tests.integration.apps.customer_tiers:app", env, tmp_path / "tiers.log"
    ).start()
    try:
        wait_until(lambda: _ready(port) == 200, 90, what="/readyz 200 (customers loaded)")
        _produce_at(
            kafka_bootstrap,
            env["LOCKGATE_INPUT_TOPIC"],
            [
                (f"order-{i}", {"customer": c, "seq": i}, ts)
                for i, (c, ts, _, _) in enumerate(cases)
            ],
        )
        out = _outputs(kafka_bootstrap, env["LOCKGATE_OUTPUT_TOPIC"], len(cases))
    finally:
        code = app.terminate()
    got = [(out[i]["as_of"], out[i]["latest"]) for i in range(len(cases))]
    want = [(as_of, latest) for _, _, as_of, latest in cases]
    assert got == want, "\n".join(
        f"{c} @ base{ts - base:+d}: got {g}, expected {w}"
        for (c, ts, _, _), g, w in zip(cases, got, want, strict=True)
        if g != w
    )
    assert code == 0, app.log_text()[-3000:]
