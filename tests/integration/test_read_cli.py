"""``lockgate read``: committed records as JSON lines, against the real broker.

A topic gets a committed transaction, an aborted one and a committed one holding a
lockgate control record and a record that is not UTF-8. ``lockgate read`` must show
exactly the committed records (never the aborted ones), skip the control record unless
``--all``, honour ``--max``, ``--partition`` and ``--from``, decode with the app's codecs
with ``--app`` (a pickled input; Avro through the real Schema Registry), follow new
commits until SIGINT or SIGTERM, and refuse a missing topic with exit 2.

Every record carries a recent timestamp. A first version of this test wrote timestamps
of 1970 (``1000 + i``); the broker rolls a new segment when a batch's timestamp is
``segment.ms`` past the segment's first one, so those records sat in a closed segment
whose largest timestamp was 1970, and its retention check (every 5 minutes) deleted
that segment whenever it ran during the test: a read after it saw only the last
transaction's records.
"""

from __future__ import annotations

import os
import pickle
import queue
import signal
import subprocess
import threading
import time
import uuid
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import orjson
import pytest
from confluent_kafka import Producer

from tests.integration._util import app_env
from tests.support.kafka import create_topic
from tests.support.procs import LOCKGATE, ROOT, lockgate_cli

PICKLED = "tests.integration.apps.pickled:app"
AVRO = "tests.integration.apps.avro_sum:app"


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


def _env(bootstrap: str, names: Any, tmp_path: Path, prefix: str) -> dict[str, str]:
    return app_env(bootstrap, names, tmp_path, prefix, LOCKGATE_LOG_LEVEL="ERROR")


@pytest.fixture
def mixed_topic(kafka_bootstrap: str, names: Any, tmp_path: Path) -> tuple[dict[str, str], int]:
    """A 2-partition topic: committed, aborted and control records; (env, base time).

    Partition 0: k0 k2 k4 | commit | 3 aborted | abort | barrier | commit.
    Partition 1: k1 k3 k5 | commit | raw (not UTF-8) | commit.
    Record ``k<i>`` has timestamp ``base + i`` s; ``raw`` ``base + 10`` s.
    """
    env = _env(kafka_bootstrap, names, tmp_path, "read")
    topic = env["LOCKGATE_INPUT_TOPIC"]
    create_topic(kafka_bootstrap, topic, 2)
    base = (int(time.time()) - 600) * 1000  # ten minutes ago: well within retention
    producer = _transactional(kafka_bootstrap)
    producer.begin_transaction()
    for i in range(6):
        value = orjson.dumps({"v": i, "seq": i})
        producer.produce(topic, value, f"k{i}".encode(), partition=i % 2, timestamp=base + i * 1000)
    producer.commit_transaction(30)
    producer.begin_transaction()
    for _ in range(3):
        producer.produce(topic, b'{"v": 99, "seq": 99}', b"aborted", partition=0)
    producer.flush(30)
    producer.abort_transaction(30)
    producer.begin_transaction()
    producer.produce(topic, b"\xff\x00raw", b"raw", partition=1, timestamp=base + 10_000)
    producer.produce(topic, b"{}", None, partition=0, headers=[("lockgate-type", b"barrier")])
    producer.commit_transaction(30)
    return env, base


def test_read_committed_records_and_options(mixed_topic: tuple[dict[str, str], int]) -> None:
    env, base = mixed_topic
    topic = env["LOCKGATE_INPUT_TOPIC"]

    everything = _lines(lockgate_cli(env, "read", topic))
    assert sorted(r["key"] for r in everything) == ["k0", "k1", "k2", "k3", "k4", "k5", "raw"]
    by_key = {r["key"]: r for r in everything}
    assert by_key["k3"]["value"] == {"v": 3, "seq": 3}
    assert by_key["k3"]["partition"] == 1 and by_key["k3"]["timestamp"] == base + 3000
    assert set(by_key["k3"]) == {"partition", "offset", "timestamp", "key", "value", "headers"}
    assert by_key["raw"]["value"] == {"base64": "/wByYXc="}  # not UTF-8: base64
    for p in (0, 1):  # by partition in offset order
        offsets = [r["offset"] for r in everything if r["partition"] == p]
        assert offsets == sorted(offsets)

    # --all: the control record too, and still none of the aborted transaction.
    with_control = _lines(lockgate_cli(env, "read", topic, "--all"))
    assert len(with_control) == 8, with_control
    control = [r for r in with_control if r["headers"].get("lockgate-type") == "barrier"]
    assert len(control) == 1 and control[0]["partition"] == 0
    assert all(r["key"] != "aborted" for r in with_control)

    assert len(_lines(lockgate_cli(env, "read", topic, "--max", "2"))) == 2
    only_1 = _lines(lockgate_cli(env, "read", topic, "--partition", "1"))
    assert [r["key"] for r in only_1] == ["k1", "k3", "k5", "raw"]
    # --from: ms since the epoch, or ISO 8601 (UTC without a zone).
    late = _lines(lockgate_cli(env, "read", topic, "--from", str(base + 4000)))
    assert sorted(r["key"] for r in late) == ["k4", "k5", "raw"]
    iso = datetime.fromtimestamp((base + 5000) / 1000, tz=UTC).strftime("%Y-%m-%dT%H:%M:%S")
    assert sorted(r["key"] for r in _lines(lockgate_cli(env, "read", topic, "--from", iso))) == [
        "k5",
        "raw",
    ]
    future = _lines(lockgate_cli(env, "read", topic, "--from", str(int(time.time() + 3600) * 1000)))
    assert future == []

    missing = lockgate_cli(env, "read", f"no-such-topic-{uuid.uuid4().hex[:6]}")
    assert missing.returncode == 2 and "does not exist" in missing.stderr
    assert missing.stdout == ""
    wrong = lockgate_cli(env, "read", topic, "--partition", "7")
    assert wrong.returncode == 2 and "partitions 0..1" in wrong.stderr
    bad_time = lockgate_cli(env, "read", topic, "--from", "yesterday")
    assert bad_time.returncode == 2 and "ISO 8601" in bad_time.stderr
    both = lockgate_cli(env, "read", topic, "--from", "1", "--from-beginning")
    assert both.returncode == 2


def test_read_all_is_stable(mixed_topic: tuple[dict[str, str], int]) -> None:
    """``--all`` returns the same 8 records on every read (it once returned the last 2)."""
    env, _base = mixed_topic
    topic = env["LOCKGATE_INPUT_TOPIC"]
    runs = int(os.environ.get("LOCKGATE_TEST_READ_REPEAT", "3"))
    first = _lines(lockgate_cli(env, "read", topic, "--all"))
    assert len(first) == 8
    for _ in range(runs - 1):
        assert _lines(lockgate_cli(env, "read", topic, "--all")) == first


def test_read_decodes_with_the_app_codecs(kafka_bootstrap: str, names: Any, tmp_path: Path) -> None:
    env = _env(kafka_bootstrap, names, tmp_path, "readapp")
    topic = env["LOCKGATE_INPUT_TOPIC"]
    create_topic(kafka_bootstrap, topic, 1)
    producer = _transactional(kafka_bootstrap)
    producer.begin_transaction()
    producer.produce(topic, pickle.dumps({"n": 1, "tags": ["a"]}), b"p1", partition=0)
    producer.produce(topic, b"not a pickle", b"bad", partition=0)
    producer.commit_transaction(30)

    plain = _lines(lockgate_cli(env, "read", topic))
    assert "base64" in plain[0]["value"]  # pickled bytes: unreadable without the codec
    decoded = _lines(lockgate_cli(env, "read", topic, "--app", PICKLED))
    assert decoded[0]["key"] == "p1" and decoded[0]["value"] == {"n": 1, "tags": ["a"]}
    assert "value_error" not in decoded[0]
    # A value its codec cannot decode is shown undecoded with the reason; the read goes on.
    assert decoded[1]["value"] == "not a pickle" and "value_error" in decoded[1]

    # A topic that is not the app's: exit 2, naming the app's topics.
    other = lockgate_cli(env, "read", env["LOCKGATE_APP_NAME"], "--app", PICKLED)
    assert other.returncode == 2 and topic in other.stderr


class _Follower:
    """``lockgate read --follow`` as a subprocess; its stdout lines in a queue."""

    def __init__(self, env: dict[str, str], *args: str) -> None:
        self.proc = subprocess.Popen(
            [str(LOCKGATE), "read", *args, "--follow"],
            cwd=ROOT,
            env={**os.environ, **env},
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        self.lines: queue.Queue[dict[str, Any]] = queue.Queue()
        assert self.proc.stdout is not None
        stdout = self.proc.stdout
        threading.Thread(target=self._pump, args=(stdout,), daemon=True).start()

    def _pump(self, stdout: Any) -> None:
        for line in stdout:
            if line.strip():
                self.lines.put(orjson.loads(line))

    def take(self, n: int, timeout: float = 60) -> list[dict[str, Any]]:
        deadline = time.monotonic() + timeout
        return [self.lines.get(timeout=max(0.1, deadline - time.monotonic())) for _ in range(n)]

    def stop(self, sig: int) -> tuple[int, str]:
        self.proc.send_signal(sig)
        try:
            _out, err = self.proc.communicate(timeout=20)
        finally:
            if self.proc.poll() is None:
                self.proc.kill()
        return self.proc.returncode, err


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["sigint", "sigterm"])
def test_read_follow_prints_commits_until_stopped(
    kafka_bootstrap: str, names: Any, tmp_path: Path, sig: int
) -> None:
    env = _env(kafka_bootstrap, names, tmp_path, "follow")
    topic = env["LOCKGATE_INPUT_TOPIC"]
    create_topic(kafka_bootstrap, topic, 2)
    producer = _transactional(kafka_bootstrap)
    producer.begin_transaction()
    producer.produce(topic, b'{"v": -1, "seq": -1}', b"before", partition=0)
    producer.commit_transaction(30)

    follower = _Follower(env, topic)
    try:
        assert follower.take(1)[0]["key"] == "before"  # what was there, then it waits
        time.sleep(1)
        assert follower.proc.poll() is None
        for i in range(3):  # one record per transaction, as they commit
            producer.begin_transaction()
            producer.produce(topic, orjson.dumps({"v": i, "seq": i}), b"f", partition=i % 2)
            producer.commit_transaction(30)
            assert follower.take(1)[0]["value"] == {"v": i, "seq": i}
        producer.begin_transaction()  # an aborted transaction is never shown
        producer.produce(topic, b'{"v": 99, "seq": 99}', b"aborted", partition=0)
        producer.flush(30)
        producer.abort_transaction(30)
        producer.begin_transaction()
        producer.produce(topic, b'{"v": 3, "seq": 3}', b"after", partition=0)
        producer.commit_transaction(30)
        assert follower.take(1)[0]["key"] == "after"
        started = time.monotonic()
        code, err = follower.stop(sig)
        assert code == 0, err[-3000:]
        assert time.monotonic() - started < 5
        assert "Traceback" not in err
        assert follower.lines.empty()
    finally:
        if follower.proc.poll() is None:
            follower.proc.kill()


def test_read_follow_ends_at_max(kafka_bootstrap: str, names: Any, tmp_path: Path) -> None:
    env = _env(kafka_bootstrap, names, tmp_path, "followmax")
    topic = env["LOCKGATE_INPUT_TOPIC"]
    create_topic(kafka_bootstrap, topic, 1)
    follower = _Follower(env, topic, "--max", "2")
    try:
        time.sleep(2)  # at the end of an empty topic, waiting
        assert follower.proc.poll() is None
        producer = _transactional(kafka_bootstrap)
        for i in range(3):
            producer.begin_transaction()
            producer.produce(topic, orjson.dumps({"v": i, "seq": i}), b"m", partition=0)
            producer.commit_transaction(30)
        assert [r["value"]["v"] for r in follower.take(2)] == [0, 1]
        assert follower.proc.wait(30) == 0
    finally:
        if follower.proc.poll() is None:
            follower.proc.kill()


def test_read_decodes_avro_with_the_schema_registry(
    kafka_bootstrap: str, names: Any, tmp_path: Path, schema_registry: Any
) -> None:
    """``--app`` with Schema Registry codecs: the writer schema is fetched by id."""
    from state.schema_registry import Avro, SchemaRegistry

    env = _env(kafka_bootstrap, names, tmp_path, "readavro")
    env["LOCKGATE_TEST_SCHEMA_REGISTRY_URL"] = schema_registry.url
    topic = env["LOCKGATE_INPUT_TOPIC"]
    create_topic(kafka_bootstrap, topic, 1)
    registry = SchemaRegistry(schema_registry.url)
    key = Avro(registry, '"string"').bind(topic, "key")
    schema = orjson.dumps(
        {
            "type": "record",
            "name": "Amount",
            "namespace": "lockgate.test",
            "fields": [{"name": "amount", "type": "long"}],
        }
    ).decode()
    value = Avro(registry, schema).bind(topic, "value")
    producer = _transactional(kafka_bootstrap)
    producer.begin_transaction()
    producer.produce(topic, value.encode({"amount": 5}), key.encode("acct-1"), partition=0)
    producer.commit_transaction(30)

    decoded = _lines(lockgate_cli(env, "read", topic, "--app", AVRO))
    assert [(r["key"], r["value"]) for r in decoded] == [("acct-1", {"amount": 5})]
    assert "value_error" not in decoded[0] and "key_error" not in decoded[0]
    plain = _lines(lockgate_cli(env, "read", topic))
    assert plain[0]["value"] != {"amount": 5}  # the wire format, not the record
