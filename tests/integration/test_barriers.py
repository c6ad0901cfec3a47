"""Barrier records on internal outputs and checkpoint records in ``<app>.control``.

At every epoch end, inside the transaction: a barrier (headers ``lockgate-type=barrier``,
``lockgate-ckpt``, ``lockgate-writer=<app>/<g>``, ``lockgate-writers=P``) on every
partition of each output declared ``internal=True``, and one checkpoint record per key
group (key ``ckpt/<g>``, partition ``g`` of the app's own control topic) whose offsets
are the ones committed. Every data record on an internal output names its writer.
"""

from __future__ import annotations

import random
import time
from pathlib import Path

import orjson
from confluent_kafka import Consumer, KafkaError, TopicPartition

from tests.integration._util import committed_offsets
from tests.support.checker import check, model
from tests.support.kafka import create_topic, produce_numbers, read_all, read_inputs, unique
from tests.support.procs import AppProcess

P = 3


def _read_control_since(bootstrap: str, app: str, since_ms: int, prefix: bytes) -> list[dict]:  # type: ignore[type-arg]
    """Records of ``<app>.control`` written after ``since_ms`` with the key prefix."""
    c = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": unique("ctl-reader"),
            "enable.auto.commit": False,
            "isolation.level": "read_committed",
            "enable.partition.eof": True,
        }
    )
    try:
        control = f"{app}.control"
        wanted = [TopicPartition(control, g, since_ms) for g in range(P)]
        starts = [tp for tp in c.offsets_for_times(wanted, timeout=30) if tp.offset >= 0]
        if not starts:  # nothing after since_ms
            return []
        c.assign(starts)
        out = []
        eof: set[int] = set()
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and len(eof) < len(starts):
            m = c.poll(1.0)
            if m is None:
                continue
            if m.error() is not None:
                if m.error().code() == KafkaError._PARTITION_EOF:
                    eof.add(m.partition())
                    continue
                raise RuntimeError(m.error())
            if m.key() is not None and m.key().startswith(prefix):
                out.append(
                    {"key": m.key().decode(), "partition": m.partition(), **orjson.loads(m.value())}
                )
        return out
    finally:
        c.close()


def test_barriers_and_checkpoint_records(kafka_bootstrap: str, names, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    app_name, inp, out = names("barriers"), names("barriers-in"), names("barriers-out")
    env = {
        "LOCKGATE_BOOTSTRAP_SERVERS": kafka_bootstrap,
        "LOCKGATE_APP_NAME": app_name,
        "LOCKGATE_INPUT_TOPIC": inp,
        "LOCKGATE_OUTPUT_TOPIC": out,
        "LOCKGATE_STATE_DIR": str(tmp_path / "state"),
        "LOCKGATE_INSTANCE_ID": "i1",
        "LOCKGATE_CHECKPOINT_INTERVAL_MS": "200",
    }
    since = int(time.time() * 1000) - 1000
    create_topic(kafka_bootstrap, inp, P)
    rng = random.Random(5)
    first = [(f"key-{rng.randrange(30)}", rng.randrange(50), i) for i in range(600)]
    produce_numbers(kafka_bootstrap, inp, first)
    app = AppProcess("tests.integration.apps.internal:app", env, tmp_path / "app.log").start()
    try:
        read_all(kafka_bootstrap, out, expected=600 + 2 * P, idle=0.5)
        # a second batch later: more epochs, so checkpoint ids must increase
        second = [(f"key-{rng.randrange(30)}", rng.randrange(50), 600 + i) for i in range(600)]
        produce_numbers(kafka_bootstrap, inp, second)
        read_all(kafka_bootstrap, out, expected=1200 + 4 * P, idle=1)
    finally:
        code = app.terminate()
    log = app.log_text()
    assert code == 0, log[-3000:]
    msgs = read_all(kafka_bootstrap, out, expected=1200, idle=1)
    stored = read_inputs(kafka_bootstrap, inp, 1200)
    assert check(model(stored), msgs) == [], log[-3000:]

    # Barriers: on every partition, from every key group's writer, checkpoint ids increasing.
    barriers: dict[tuple[int, str], list[int]] = {}
    for m in sorted(msgs, key=lambda m: (m.partition(), m.offset())):
        h = dict(m.headers() or [])
        if "lockgate-type" not in h:
            # Data records name their writer (the key group that produced them).
            g = int(h["lockgate-writer"].decode().rpartition("/")[2])
            assert h["lockgate-writer"] == f"{app_name}/{g}".encode(), h
            continue
        assert h["lockgate-writers"] == str(P).encode()
        assert h["lockgate-type"] == b"barrier"
        assert m.key() is None
        body = orjson.loads(m.value())
        writer = h["lockgate-writer"].decode()
        ckpt = int(h["lockgate-ckpt"])
        assert body["ckpt"] == ckpt and body["writer"] == writer and body["type"] == "barrier"
        barriers.setdefault((m.partition(), writer), []).append(ckpt)
    writers = {f"{app_name}/{g}" for g in range(P)}
    assert set(barriers) == {(p, w) for p in range(P) for w in writers}, sorted(barriers)
    for key, ckpts in barriers.items():
        assert len(ckpts) >= 2, (key, ckpts)
        assert ckpts == sorted(set(ckpts)), (key, ckpts)  # strictly increasing
    # Every epoch writes its barrier to every partition: the same ids everywhere.
    per_writer = {w: {tuple(barriers[(p, w)]) for p in range(P)} for w in writers}
    assert all(len(v) == 1 for v in per_writer.values()), per_writer

    # Checkpoint records: the last one per key group names the committed offsets.
    offsets = committed_offsets(kafka_bootstrap, app_name, inp, P)
    committed = {tp.partition: tp.offset for tp in offsets}
    ckpt_meta = {tp.partition: orjson.loads(tp.metadata)["ckpt"] for tp in offsets}
    assert sum(committed.values()) == 1200
    records = _read_control_since(kafka_bootstrap, app_name, since, b"ckpt/")
    last: dict[int, dict] = {}  # type: ignore[type-arg]
    seen: dict[int, list[int]] = {}
    for r in records:
        g = r["key_group"]
        assert r["key"] == f"ckpt/{g}" and r["partition"] == g
        assert r["app"] == app_name and r["instance"] == "i1"
        seen.setdefault(g, []).append(r["checkpoint"])
        last[g] = r
    assert set(last) == set(range(P)), records[-5:]
    for g in range(P):
        assert seen[g] == sorted(set(seen[g])), seen[g]
        assert last[g]["offsets"] == {inp: committed[g]}, (g, last[g], committed)
        assert last[g]["checkpoint"] == ckpt_meta[g]
        assert barriers[(0, f"{app_name}/{g}")][-1] == ckpt_meta[g]
