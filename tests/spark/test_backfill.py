"""``lockgate backfill`` on Spark (local mode), against the real broker.

* backfill -> live hand-over of ``examples/running_sum.py`` is exact: the output topic
  holds exactly the prefix sums of every record, once (independent model), while the
  Python worker of one Spark task is killed mid-transaction (``os._exit``) and the
  retried task resumes from its last commit; bad records are dead-lettered once;
* ``examples/window_count.py``: a live run and a backfill over the same input give the
  same outputs, late records and final state (byte for byte, per key group); archived
  Parquet input with Parquet output gives them too.

The input is written by a transactional producer with an aborted transaction in the
middle, so the reader meets transaction markers and aborted records.

The window app reads its own variables (App(..., env=["LOCKGATE_WINDOW_MS",
"LOCKGATE_MAX_DELAY_MS"])).
"""

from __future__ import annotations

import random
import subprocess
from pathlib import Path
from typing import Any

import orjson
import pyarrow as pa
import pyarrow.parquet as pq
from confluent_kafka import Consumer, Producer, TopicPartition

from state.savepoint import SavepointStore, StoreFile
from tests.integration._util import committed_offsets
from tests.support.checker import check, model
from tests.support.kafka import create_topic, read_all, read_inputs
from tests.support.procs import AppProcess, lockgate_cli, wait_until

P = 2
KEYS = [f"k{i}" for i in range(25)]


def produce_txn(bootstrap: str, topic: str, first_seq: int, count: int, seed: int) -> None:
    """Produce running_sum inputs in transactions; one extra transaction is aborted."""
    rng = random.Random(seed)
    p = Producer(
        {
            "bootstrap.servers": bootstrap,
            "partitioner": "murmur2_random",
            "transactional.id": f"feeder-{topic}-{seed}",
            "linger.ms": 5,
        }
    )
    p.init_transactions(30)
    seq = first_seq
    batch = 500
    while seq < first_seq + count:
        p.begin_transaction()
        for _ in range(min(batch, first_seq + count - seq)):
            key = rng.choice(KEYS)
            p.produce(topic, orjson.dumps({"v": rng.randint(-5, 50), "seq": seq}), key.encode())
            seq += 1
        p.commit_transaction(30)
        if seq - first_seq == batch:  # an aborted transaction: never part of the input
            p.begin_transaction()
            for i in range(50):
                p.produce(topic, orjson.dumps({"v": 10_000, "seq": -1 - i}), b"k0")
            p.abort_transaction(30)
    p.flush(30)


def backfill(
    env: dict[str, str], *args: str, timeout: float = 300
) -> subprocess.CompletedProcess[str]:
    return lockgate_cli(env, "backfill", *args, timeout=timeout)


def savepoint_id(result: subprocess.CompletedProcess[str]) -> str:
    assert result.returncode == 0, result.stderr[-4000:]
    return result.stdout.strip().splitlines()[-1]


def state_of(sp_dir: Path, sp: str, app: str, store: str) -> dict[int, dict[bytes, bytes]]:
    location = SavepointStore(str(sp_dir))
    d = location.read_descriptor(sp)
    out: dict[int, dict[bytes, bytes]] = {}
    for m in d["apps"][app]["manifests"]:
        g = m["key_group"]
        out[g] = dict(
            location.read_store(sp, app, g, store, StoreFile.from_dict(m["stores"][store]))
        )
    return out


def base_env(bootstrap: str, app: str, inp: str, out: str, sp_dir: Path) -> dict[str, str]:
    return {
        "LOCKGATE_BOOTSTRAP_SERVERS": bootstrap,
        "LOCKGATE_APP_NAME": app,
        "LOCKGATE_INPUT_TOPIC": inp,
        "LOCKGATE_OUTPUT_TOPIC": out,
        "LOCKGATE_SAVEPOINT_DIR": str(sp_dir),
        "LOCKGATE_LOG_LEVEL": "WARNING",
    }


def test_backfill_with_a_task_killed_then_live_is_exact(
    kafka_bootstrap: str, names: Any, tmp_path: Path
) -> None:
    app, inp, out = names("bf-sum"), names("bf-sum-in"), names("bf-sum-out")
    create_topic(kafka_bootstrap, inp, P)
    env = base_env(kafka_bootstrap, app, inp, out, tmp_path / "sp")
    produce_txn(kafka_bootstrap, inp, 0, 3000, seed=1)
    bad = Producer({"bootstrap.servers": kafka_bootstrap, "partitioner": "murmur2_random"})
    for i in range(3):  # user code raises (no "v"): dead-lettered, not summed
        bad.produce(inp, orjson.dumps({"seq": 90_000 + i}), f"k{i}".encode())
    assert bad.flush(10) == 0
    produce_txn(kafka_bootstrap, inp, 3000, 1000, seed=3)
    # The Python worker running key group 0 dies after 1500 records (two commits of 700
    # done, the third transaction open); local[2,4] lets Spark retry the task.
    result = backfill(
        {**env, "LOCKGATE_TEST_BACKFILL_CRASH": "0:1500"},
        "examples.running_sum:app",
        "--commit-every",
        "700",
        "--master",
        "local[2,4]",
        "--json",
    )
    sp = savepoint_id(result)
    summary = orjson.loads(result.stdout[: result.stdout.rindex(sp)])
    tasks = {t["key_group"]: t for t in summary["tasks"]}
    assert tasks[0]["resumed_from"] == 1400, tasks  # the retry replayed 2 commits silently
    assert tasks[1]["resumed_from"] == 0
    assert summary["records"] == 4003
    assert summary["dead_letters"] == 3
    assert "backfill " + sp in result.stderr  # progress lines
    first = read_all(kafka_bootstrap, out, expected=4000, idle=1)
    problems = check(model(read_inputs(kafka_bootstrap, inp, 4000)), first)
    assert problems == [], problems[:5]
    dlq = read_all(kafka_bootstrap, f"{app}.dlq", expected=3, idle=0.5, timeout=20)
    assert sorted(orjson.loads(m.value())["seq"] for m in dlq) == [90_000, 90_001, 90_002]
    assert {dict(m.headers())["lockgate-error-type"] for m in dlq} == {b"KeyError"}

    produce_txn(kafka_bootstrap, inp, 4000, 2000, seed=2)
    live = AppProcess(
        "examples.running_sum:app",
        {
            **env,
            "LOCKGATE_INSTANCE_ID": "i1",
            "LOCKGATE_STATE_DIR": str(tmp_path / "state"),
            "LOCKGATE_FROM_SAVEPOINT": sp,
            "LOCKGATE_CHECKPOINT_INTERVAL_MS": "300",
        },
        tmp_path / "live.log",
    ).start()
    try:
        got = read_all(kafka_bootstrap, out, expected=6000, timeout=90, idle=2)
    finally:
        live.terminate()
    inputs = read_inputs(kafka_bootstrap, inp, 6000)
    assert len(inputs) == 6000
    problems = check(model(inputs), got)
    assert problems == [], problems[:5]
    assert len(got) == 6000, live.log_text()[-3000:]
    assert len(read_all(kafka_bootstrap, f"{app}.dlq", idle=0.5, timeout=10)) == 3


def window_input(bootstrap: str, topic: str, count: int) -> None:
    """Events with bounded disorder (and some records late for their window)."""
    rng = random.Random(7)
    p = Producer({"bootstrap.servers": bootstrap, "partitioner": "murmur2_random"})
    base = 1_700_000_000_000
    for i in range(count):
        ts = base + i * 40 - (rng.randint(0, 6000) if rng.random() < 0.1 else rng.randint(0, 300))
        p.produce(topic, orjson.dumps({"ts": ts}), rng.choice(KEYS).encode())
        if i % 500 == 0:
            p.poll(0)
    assert p.flush(30) == 0


def by_partition(msgs: list[Any]) -> dict[int, list[tuple[bytes, bytes]]]:
    out: dict[int, list[tuple[bytes, bytes]]] = {}
    for m in sorted(msgs, key=lambda m: (m.partition(), m.offset())):
        out.setdefault(m.partition(), []).append((m.key(), m.value()))
    return out


def test_window_backfill_equals_live_and_archive(
    kafka_bootstrap: str, names: Any, tmp_path: Path
) -> None:
    app, inp = names("bf-win"), names("bf-win-in")
    live_out, bf_out = names("bf-win-live"), names("bf-win-bf")
    create_topic(kafka_bootstrap, inp, P)
    window_input(kafka_bootstrap, inp, 3000)
    sp_dir = tmp_path / "sp"
    common = {
        "LOCKGATE_BOOTSTRAP_SERVERS": kafka_bootstrap,
        "LOCKGATE_APP_NAME": app,
        "LOCKGATE_INPUT_TOPIC": inp,
        "LOCKGATE_SAVEPOINT_DIR": str(sp_dir),
        "LOCKGATE_WINDOW_MS": "2000",
        "LOCKGATE_MAX_DELAY_MS": "500",
    }
    # The live run, to the end of the input, then a savepoint of its state there.
    live_env = {
        **common,
        "LOCKGATE_OUTPUT_TOPIC": live_out,
        "LOCKGATE_INSTANCE_ID": "i1",
        "LOCKGATE_STATE_DIR": str(tmp_path / "state"),
        "LOCKGATE_CHECKPOINT_INTERVAL_MS": "300",
    }
    live = AppProcess("examples.window_count:app", live_env, tmp_path / "live.log").start()
    try:
        ends = {g: 0 for g in range(P)}
        c = Consumer({"bootstrap.servers": kafka_bootstrap, "group.id": names("ends")})
        for g in range(P):
            ends[g] = c.get_watermark_offsets(TopicPartition(inp, g), timeout=10)[1]
        c.close()
        wait_until(
            lambda: (
                [tp.offset for tp in committed_offsets(kafka_bootstrap, app, inp, P)]
                == [ends[g] for g in range(P)]
            ),
            timeout=90,
            what="the live run to commit the whole input",
        )
        ops = {k: v for k, v in common.items() if "WINDOW" not in k and "DELAY" not in k}
        trigger = lockgate_cli(
            ops, "savepoint", "trigger", "--app", app, "--stop", "--timeout", "60"
        )
        assert trigger.returncode == 0, trigger.stderr[-3000:]
        live_sp = trigger.stdout.strip().splitlines()[-1]
    finally:
        live.terminate()
    live_outputs = read_all(kafka_bootstrap, live_out, idle=1)
    # The late topic is per app (``<app>.late``): the backfill, under the same app name,
    # appends to the one the live run wrote. Its records are those past the live run's.
    late_topic = f"{app}.late"
    live_late = read_all(kafka_bootstrap, late_topic, idle=0.5, timeout=20)
    assert live_outputs and live_late
    live_end = {m.partition(): m.offset() for m in live_late}  # last offset per partition

    # A backfill of the same input, outputs to Kafka.
    bf = backfill({**common, "LOCKGATE_OUTPUT_TOPIC": bf_out}, "examples.window_count:app")
    bf_sp = savepoint_id(bf)
    bf_outputs = read_all(kafka_bootstrap, bf_out, expected=len(live_outputs), idle=1)
    bf_late = [
        m
        for m in read_all(kafka_bootstrap, late_topic, expected=2 * len(live_late), idle=0.5)
        if m.offset() > live_end.get(m.partition(), -1)
    ]
    assert by_partition(bf_outputs) == by_partition(live_outputs)
    assert by_partition(bf_late) == by_partition(live_late)
    stores = list(SavepointStore(str(sp_dir)).read_descriptor(bf_sp)["apps"][app]["stores"])
    assert "lockgate.time" in stores
    for store in stores:
        assert state_of(sp_dir, bf_sp, app, store) == state_of(sp_dir, live_sp, app, store), store

    # The same input archived as Parquet, outputs to Parquet.
    records = read_all(kafka_bootstrap, inp, expected=3000, idle=0.5)
    archive = tmp_path / "archive.parquet"
    pq.write_table(
        pa.table(
            {
                "key": [m.key() for m in records],
                "value": [m.value() for m in records],
                "timestamp": [m.timestamp()[1] for m in records],
                "partition": [m.partition() for m in records],
                "offset": [m.offset() for m in records],
            }
        ),
        archive,
    )
    out_dir = tmp_path / "parquet-out"
    ar = backfill(
        {**common, "LOCKGATE_OUTPUT_TOPIC": bf_out},
        "examples.window_count:app",
        "--archive",
        str(archive),
        "--live-from",
        "now",
        "--output-parquet",
        str(out_dir),
    )
    ar_sp = savepoint_id(ar)
    for g in range(P):
        rows = pq.read_table(out_dir / f"key_group={g}" / "part-0.parquet").to_pylist()
        assert [r["seq"] for r in rows] == list(range(len(rows)))
        outs = [(r["key"], r["value"]) for r in rows if r["topic"] == bf_out]
        late = [(r["key"], r["value"]) for r in rows if r["topic"] == late_topic]
        assert outs == by_partition(live_outputs).get(g, [])
        assert late == by_partition(live_late).get(g, [])
    for store in stores:
        assert state_of(sp_dir, ar_sp, app, store) == state_of(sp_dir, live_sp, app, store), store
    manifests = SavepointStore(str(sp_dir)).read_descriptor(ar_sp)["apps"][app]["manifests"]
    assert {m["key_group"]: m["offsets"][inp] for m in manifests} == ends


def test_backfill_refusals(kafka_bootstrap: str, names: Any, tmp_path: Path) -> None:
    app, inp, out = names("bf-ref"), names("bf-ref-in"), names("bf-ref-out")
    create_topic(kafka_bootstrap, inp, P)
    env = base_env(kafka_bootstrap, app, inp, out, tmp_path / "sp")
    cases = [
        (["--until", "earliest"], "--until earliest reads nothing"),
        (["--from", "yesterday"], "is not earliest, now"),
        (["--archive", "x.parquet"], "--archive needs --live-from"),
        (["--from", "offsets:0=5,1=0"], "after --until"),
        (["--until", "offsets:0=0"], "no offset for"),
    ]
    for args, message in cases:
        r = backfill(env, "examples.running_sum:app", *args, timeout=60)
        assert r.returncode == 2, (args, r.stderr[-2000:])
        assert message in r.stderr, (args, r.stderr[-2000:])
        assert "Traceback" not in r.stderr
