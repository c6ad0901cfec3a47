"""The shipped pytest plugin (processors/pytest_plugin.py), used as users use it.

The broker is the plugin's session ``lockgate_kafka`` (here: lockgate's Kafka image on the
host network, as the plugin's ``auto`` mode picks in a checkout without an image registry).
running_sum runs through ``lockgate_app``: as a ``lockgate run`` subprocess (killed with
kill -9 and restarted on its state) and as the processor container. Committed outputs are
compared with the independent model of tests/support/checker.py.
"""

from __future__ import annotations

import os
import random
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from processors import pytest_plugin as pp
from processors.pytest_plugin import AppFactory, LockgateKafka, OutputRecord, TopicFactory
from tests.support import docker as dk
from tests.support.checker import model

pytestmark = pytest.mark.containers

SPEC = "examples.running_sum:app"
ROOT = Path(__file__).resolve().parents[2]


def _inputs(start: int, n: int, keys: int = 13) -> list[tuple[str, int, int]]:
    rnd = random.Random(start)
    return [(f"k{rnd.randrange(keys)}", rnd.randrange(-50, 100), start + i) for i in range(n)]


def _by_key(records: list[OutputRecord]) -> dict[str, list[dict[str, Any]]]:
    out: dict[str, list[dict[str, Any]]] = {}
    for r in records:  # (partition, offset) order: per key, the order it was committed
        out.setdefault(r.key, []).append(r.value)
    return out


def _send(kafka: LockgateKafka, topic: str, rows: list[tuple[str, int, int]]) -> None:
    kafka.produce(topic, [(k, {"v": v, "seq": s}) for k, v, s in rows])


def test_readme_example(
    lockgate_kafka: LockgateKafka, lockgate_topics: TopicFactory, lockgate_app: AppFactory
) -> None:
    # The test of README.md "Testing your app", verbatim (checked below).
    t = lockgate_topics({"numbers": 4, "sums": 4})  # created with unique names
    lockgate_kafka.produce(t["numbers"], [("a", {"v": 2, "seq": 0}), ("a", {"v": 5, "seq": 1})])
    lockgate_app(
        "examples.running_sum:app",  # a `lockgate run` process, ready
        env={"LOCKGATE_INPUT_TOPIC": t["numbers"], "LOCKGATE_OUTPUT_TOPIC": t["sums"]},
    )
    out = lockgate_kafka.read_committed(t["sums"], 2)  # read_committed consumer
    assert [r.value["sum"] for r in out] == [2, 7]


def test_running_sum_kill9_restart_exactly_once(
    lockgate_kafka: LockgateKafka, lockgate_topics: TopicFactory, lockgate_app: AppFactory
) -> None:
    t = lockgate_topics({"in": 4, "out": 4})
    env = {"LOCKGATE_INPUT_TOPIC": t["in"], "LOCKGATE_OUTPUT_TOPIC": t["out"]}
    sent = _inputs(0, 800)
    _send(lockgate_kafka, t["in"], sent)
    run = lockgate_app(SPEC, env=env)
    first = lockgate_kafka.read_committed(t["out"], 400, timeout=60, idle=0)
    run.kill()  # kill -9 mid-stream (or after): nothing committed may repeat or vanish
    assert run.returncode in (-9, 137)
    more = _inputs(800, 400)
    _send(lockgate_kafka, t["in"], more)
    sent += more
    lockgate_app(SPEC, env=env, app_name=run.app_name, instance_id="i1")
    out = lockgate_kafka.read_committed(t["out"], len(sent), timeout=60)
    assert len(first) >= 400
    assert _by_key(out) == model(sent)


def test_running_sum_as_processor_container(
    lockgate_kafka: LockgateKafka, lockgate_topics: TopicFactory, lockgate_app: AppFactory
) -> None:
    processor_image, _ = dk.ensure_images()
    t = lockgate_topics({"in": 2, "out": 2})
    sent = _inputs(5000, 300, keys=7)
    _send(lockgate_kafka, t["in"], sent)
    run = lockgate_app(
        SPEC,
        env={"LOCKGATE_INPUT_TOPIC": t["in"], "LOCKGATE_OUTPUT_TOPIC": t["out"]},
        image=processor_image,
    )
    out = lockgate_kafka.read_committed(t["out"], len(sent), timeout=60)
    assert _by_key(out) == model(sent)
    assert run.stop() == 0, run.logs()[-3000:]


def test_user_project_against_an_existing_broker(
    lockgate_kafka: LockgateKafka, tmp_path: Path
) -> None:
    """A user's project (no conftest) runs the README test on ``LOCKGATE_TEST_BOOTSTRAP``."""
    tested = Path(__file__).read_text()
    body = tested.split("verbatim (checked below).\n", 1)[1].split("\n\n", 1)[0]
    head = "def test_running_sum(lockgate_kafka, lockgate_topics, lockgate_app):\n"
    (tmp_path / "test_user_app.py").write_text(head + body + "\n")
    env = {
        **os.environ,
        "LOCKGATE_TEST_BOOTSTRAP": lockgate_kafka.bootstrap,
        "PYTHONPATH": str(ROOT),  # the user's app package (here: examples/)
    }
    env.pop("LOCKGATE_TEST_KAFKA", None)
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(tmp_path)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )
    out = done.stdout + done.stderr
    assert done.returncode == 0, out[-4000:]
    assert "1 passed" in out and f"external broker at {lockgate_kafka.bootstrap}" in out, out


def test_official_image_configuration() -> None:
    """The official image's KRaft settings (not started here: no image registry)."""
    container = pp._official_container(pp.OFFICIAL_IMAGE, 40123)
    assert container.ports == {"40123/tcp": ("127.0.0.1", 40123)}
    env = container.env
    assert env["KAFKA_ADVERTISED_LISTENERS"] == "PLAINTEXT://127.0.0.1:40123"
    assert env["KAFKA_LISTENERS"].startswith("PLAINTEXT://0.0.0.0:40123,")
    for name in (
        "KAFKA_OFFSETS_TOPIC_REPLICATION_FACTOR",
        "KAFKA_TRANSACTION_STATE_LOG_REPLICATION_FACTOR",
        "KAFKA_TRANSACTION_STATE_LOG_MIN_ISR",
    ):
        assert env[name] == "1"
