"""Global tables against the real broker: loaded before ready, updated live, reloaded on restart.

tests/integration/apps/rates.py converts payment amounts with a global table of rates. The
rates topic has 3 partitions while the payments topic has 2: global tables are not
co-partitioned.

The app declares the variable it reads: ``App("rates", env=["LOCKGATE_RATES_TOPIC"])``.
"""

from __future__ import annotations

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
