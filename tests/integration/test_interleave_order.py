"""Deterministic interleaving of co-partitioned inputs, against the real broker.

tests/integration/apps/merge_order.py hashes the sequence of records each key sees from two
inputs, so its outputs depend on the processing order. Both topics are filled before the app
starts (a replay/backfill situation), with small fetches so the inputs arrive in many small,
unevenly interleaved pieces; the app is killed with SIGKILL and restarted a few times on the
way. The output must equal the model: per key group, records in timestamp order, ties by
declared input order (left first), each partition in offset order — whatever the fetch timing.

The app declares the variables it reads: ``App("merge-order", env=["LOCKGATE_LEFT_TOPIC",
"LOCKGATE_RIGHT_TOPIC"])``.
"""

from __future__ import annotations

import random
import signal
import time
from pathlib import Path
from typing import Any

import orjson
from confluent_kafka import Producer

from tests.integration.apps.merge_order import digest
from tests.support.kafka import create_topic, read_all
from tests.support.procs import AppProcess

SPEC = "tests.integration.apps.merge_order:app"
PARTITIONS = 3


def _produce(bootstrap: str, topic: str, records: list[tuple[str, str, int]]) -> None:
    p = Producer({"bootstrap.servers": bootstrap, "partitioner": "murmur2_random", "linger.ms": 5})
    for key, rid, ts in records:
        p.produce(topic, orjson.dumps({"id": rid}), key.encode(), timestamp=ts)
    assert p.flush(30) == 0


def _stored(bootstrap: str, topic: str, n: int) -> list[Any]:
    msgs = read_all(bootstrap, topic, expected=n, idle=0.5)
    assert len(msgs) == n
    return msgs


def _model(left: list[Any], right: list[Any]) -> dict[str, list[tuple[str, int, str]]]:
    """Per key: (id, n, digest) in the order the interleaving rules give."""
    rank = {0: left, 1: right}
    merged: list[tuple[int, int, int, int, Any]] = []
    for r, msgs in rank.items():
        for m in msgs:
            # Timestamps never decrease within a partition here, so (ts, rank, offset)
            # is the merge order of each key group.
            merged.append((m.partition(), m.timestamp()[1], r, m.offset(), m))
    merged.sort(key=lambda e: e[:4])
    out: dict[str, list[tuple[str, int, str]]] = {}
    state: dict[str, tuple[int, str]] = {}
    for *_, m in merged:
        key = m.key().decode()
        n, d = state.get(key, (0, ""))
        rid = orjson.loads(m.value())["id"]
        d = digest(d, rid)
        state[key] = (n + 1, d)
        out.setdefault(key, []).append((rid, n + 1, d))
    return out


def test_interleaving_is_deterministic_across_fetch_timing_and_kills(  # type: ignore[no-untyped-def]
    kafka_bootstrap: str, names, tmp_path: Path
) -> None:
    rng = random.Random(7)
    env = {
        "LOCKGATE_BOOTSTRAP_SERVERS": kafka_bootstrap,
        "LOCKGATE_APP_NAME": names("merge-order"),
        "LOCKGATE_LEFT_TOPIC": names("left"),
        "LOCKGATE_RIGHT_TOPIC": names("right"),
        "LOCKGATE_OUTPUT_TOPIC": names("merged"),
        "LOCKGATE_STATE_DIR": str(tmp_path / "state"),
        "LOCKGATE_INSTANCE_ID": "i1",
        "LOCKGATE_CHECKPOINT_INTERVAL_MS": "200",
        "LOCKGATE_KAFKA__SESSION_TIMEOUT_MS": "6000",
        "LOCKGATE_KAFKA__HEARTBEAT_INTERVAL_MS": "1000",
        # Small, uneven fetches: the two inputs arrive in many pieces.
        "LOCKGATE_KAFKA__MAX_PARTITION_FETCH_BYTES": "1500",
        "LOCKGATE_CONSUME_BATCH_SIZE": "37",
    }
    for topic in (env["LOCKGATE_LEFT_TOPIC"], env["LOCKGATE_RIGHT_TOPIC"]):
        create_topic(kafka_bootstrap, topic, PARTITIONS)
    keys = [f"k{i}" for i in range(12)]
    per_topic = 1500
    streams: dict[str, list[tuple[str, str, int]]] = {}
    # Recent timestamps: records older than the topic's retention.ms would be deleted by the
    # broker's retention check before the app reads them.
    base = int(time.time() * 1000) - 600_000
    for side in ("L", "R"):
        ts = base
        records = []
        for i in range(per_topic):
            ts += rng.choice([0, 0, 1, 2, 5])  # many equal timestamps across the inputs
            records.append((rng.choice(keys), f"{side}{i}", ts))
        streams[side] = records
    _produce(kafka_bootstrap, env["LOCKGATE_LEFT_TOPIC"], streams["L"])
    _produce(kafka_bootstrap, env["LOCKGATE_RIGHT_TOPIC"], streams["R"])
    left = _stored(kafka_bootstrap, env["LOCKGATE_LEFT_TOPIC"], per_topic)
    right = _stored(kafka_bootstrap, env["LOCKGATE_RIGHT_TOPIC"], per_topic)
    expected = _model(left, right)

    log = tmp_path / "app.log"
    app = AppProcess(SPEC, env, log).start()
    kills = 0
    try:
        for _ in range(3):  # kill -9 while it works through the backlog
            time.sleep(rng.uniform(1.5, 3.0))
            app.signal(signal.SIGKILL)
            app.wait(10)
            kills += 1
            app = AppProcess(SPEC, env, log).start()
        out = read_all(
            kafka_bootstrap,
            env["LOCKGATE_OUTPUT_TOPIC"],
            expected=2 * per_topic,
            idle=2,
            timeout=120,
        )
    finally:
        code = app.terminate()
    got: dict[str, list[tuple[str, int, str]]] = {}
    for m in sorted(out, key=lambda m: (m.partition(), m.offset())):
        v = orjson.loads(m.value())
        got.setdefault(m.key().decode(), []).append((v["id"], v["n"], v["digest"]))
    problems = [_difference(key, got.get(key, []), exp) for key, exp in expected.items()]
    problems = [p for p in problems if p]
    assert problems == [], f"{kills} kills\n" + "\n".join(problems) + "\n" + log.read_text()[-3000:]
    assert code == 0


def _difference(key: str, got: list[Any], expected: list[Any]) -> str:
    if got == expected:
        return ""
    first = next(
        (i for i, (a, b) in enumerate(zip(got, expected, strict=False)) if a != b),
        min(len(got), len(expected)),
    )
    return (
        f"{key}: {len(got)} records, expected {len(expected)}; first difference at #{first}: "
        f"got {got[first : first + 2]}, expected {expected[first : first + 2]}"
    )
