"""``lockgate read``: committed records as JSON lines, against the real broker.

A topic gets committed records, an aborted transaction's records, a lockgate control
record and a record that is not JSON; ``lockgate read`` must show exactly the committed
ones (never the aborted ones), skip the control record unless ``--all``, honour
``--max``, ``--partition`` and ``--from``, decode with the app's codecs with ``--app``,
and refuse a missing topic with exit 2.
"""

from __future__ import annotations

import os
import subprocess
import time
import uuid
from pathlib import Path
from typing import Any

import orjson
from confluent_kafka import Producer

from tests.integration._util import app_env
from tests.support.kafka import create_topic
from tests.support.procs import LOCKGATE, ROOT, lockgate_cli

SPEC = "examples.running_sum:app"


def _lines(result: Any) -> list[dict[str, Any]]:
    assert result.returncode == 0, result.stderr[-3000:]
    return [orjson.loads(line) for line in result.stdout.splitlines() if line.strip()]


def _transactional(bootstrap: str) -> Producer:
    producer = Producer(
        {
            "bootstrap.servers": bootstrap,
            "transactional.id": f"read-test-{uuid.uuid4().hex[:8]}",
            "partitioner": "murmur2_random",
        }
    )
    producer.init_transactions(30)
    return producer


def test_read_shows_committed_records_only(
    kafka_bootstrap: str, names: Any, tmp_path: Path
) -> None:
    env = app_env(kafka_bootstrap, names, tmp_path, "read", LOCKGATE_LOG_LEVEL="ERROR")
    topic = env["LOCKGATE_INPUT_TOPIC"]
    create_topic(kafka_bootstrap, topic, 2)
    producer = _transactional(kafka_bootstrap)
    producer.begin_transaction()
    for i in range(6):
        value = orjson.dumps({"v": i, "seq": i})
        producer.produce(topic, value, f"k{i}".encode(), partition=i % 2, timestamp=1000 + i)
    producer.commit_transaction(30)
    producer.begin_transaction()
    for _ in range(3):
        producer.produce(topic, b'{"v": 99, "seq": 99}', b"aborted", partition=0)
    producer.flush(30)
    producer.abort_transaction(30)
    producer.begin_transaction()
    producer.produce(topic, b"\xff\x00raw", b"raw", partition=1, timestamp=5000)
    producer.produce(topic, b"{}", None, partition=0, headers=[("lockgate-type", b"barrier")])
    producer.commit_transaction(30)

    everything = _lines(lockgate_cli(env, "read", topic))
    assert sorted(r["key"] for r in everything) == ["k0", "k1", "k2", "k3", "k4", "k5", "raw"]
    by_key = {r["key"]: r for r in everything}
    assert by_key["k3"]["value"] == {"v": 3, "seq": 3}
    assert by_key["k3"]["partition"] == 1 and by_key["k3"]["timestamp"] == 1003
    assert set(by_key["k3"]) == {"partition", "offset", "timestamp", "key", "value", "headers"}
    assert by_key["raw"]["value"] == {"base64": "/wByYXc="}  # not UTF-8: base64

    with_control = _lines(lockgate_cli(env, "read", topic, "--all"))
    control = [r for r in with_control if r["headers"].get("lockgate-type") == "barrier"]
    assert len(with_control) == 8 and len(control) == 1

    assert len(_lines(lockgate_cli(env, "read", topic, "--max", "2"))) == 2
    only_1 = _lines(lockgate_cli(env, "read", topic, "--partition", "1"))
    assert {r["partition"] for r in only_1} == {1} and len(only_1) == 4
    late = _lines(lockgate_cli(env, "read", topic, "--from", "4000"))
    assert [r["key"] for r in late] == ["raw"]

    # With the app: its input codecs (string keys, JSON values); a value its codec cannot
    # decode is shown undecoded with the reason, the read goes on.
    decoded = _lines(lockgate_cli(env, "read", topic, "--app", SPEC))
    assert {r["key"]: r["value"] for r in decoded}["k5"] == {"v": 5, "seq": 5}
    bad = next(r for r in decoded if r["key"] == "raw")
    assert "value_error" in bad and bad["value"] == {"base64": "/wByYXc="}

    missing = lockgate_cli(env, "read", f"no-such-topic-{uuid.uuid4().hex[:6]}")
    assert missing.returncode == 2 and "does not exist" in missing.stderr
    wrong = lockgate_cli(env, "read", topic, "--partition", "7")
    assert wrong.returncode == 2 and "partitions 0..1" in wrong.stderr
    bad_time = lockgate_cli(env, "read", topic, "--from", "yesterday")
    assert bad_time.returncode == 2 and "ISO-8601" in bad_time.stderr


def test_read_follow_prints_records_as_they_commit(
    kafka_bootstrap: str, names: Any, tmp_path: Path
) -> None:
    env = app_env(kafka_bootstrap, names, tmp_path, "follow", LOCKGATE_LOG_LEVEL="ERROR")
    topic = env["LOCKGATE_INPUT_TOPIC"]
    create_topic(kafka_bootstrap, topic, 1)
    proc = subprocess.Popen(
        [str(LOCKGATE), "read", topic, "--follow", "--max", "3"],
        cwd=ROOT,
        env={**os.environ, **env},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        time.sleep(3)  # reading, at the end, waiting
        assert proc.poll() is None
        producer = _transactional(kafka_bootstrap)
        for i in range(3):
            producer.begin_transaction()
            producer.produce(topic, orjson.dumps({"v": i, "seq": i}), b"f", partition=0)
            producer.commit_transaction(30)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, err[-3000:]
    values = [orjson.loads(line)["value"]["v"] for line in out.splitlines()]
    assert values == [0, 1, 2]
