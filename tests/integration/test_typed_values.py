"""Typed values and TopicConfig outputs on the real broker, the app run as a process."""

from __future__ import annotations

from pathlib import Path

import orjson
from confluent_kafka import Producer
from confluent_kafka.admin import (  # type: ignore[attr-defined]  # re-exported in cimpl
    AdminClient,
    ConfigResource,
    ResourceType,
)

from tests.integration._util import app_env, run_to_dead_letter
from tests.support.kafka import create_topic
from tests.support.procs import AppProcess

APP = "tests.integration.apps.typed:app"


def _produce(bootstrap: str, topic: str, records: list[tuple[str, bytes]]) -> None:
    p = Producer({"bootstrap.servers": bootstrap, "partitioner": "murmur2_random"})
    for key, value in records:
        p.produce(topic, value, key.encode())
    assert p.flush(30) == 0


def test_a_record_that_does_not_validate_is_dead_lettered_naming_the_field(  # type: ignore[no-untyped-def]
    kafka_bootstrap: str, names, tmp_path: Path
) -> None:
    env = app_env(kafka_bootstrap, names, tmp_path, "typed")
    create_topic(kafka_bootstrap, env["LOCKGATE_INPUT_TOPIC"], 2)
    records = [(f"c{i % 3}", orjson.dumps({"id": f"o{i}", "qty": i})) for i in range(12)]
    records.insert(5, ("c1", b'{"id": "o-bad", "qty": "x"}'))
    _produce(kafka_bootstrap, env["LOCKGATE_INPUT_TOPIC"], records)

    dlq, out, log = run_to_dead_letter(APP, env, tmp_path, outputs=12)

    headers = {k: v.decode() for k, v in dlq[0].headers()}
    assert headers["lockgate-error-stage"] == "deserialize", headers
    assert headers["lockgate-error-type"] == "DecodeError", headers
    message = headers["lockgate-error-message"]
    assert message.startswith("Order.qty: Input should be a valid integer"), message
    assert message.endswith("(got 'x')"), message
    assert dlq[0].value() == b'{"id": "o-bad", "qty": "x"}'
    last = {m.key().decode(): orjson.loads(m.value()) for m in out}
    assert len(out) == 12, log[-3000:]
    assert last == {
        f"c{c}": {
            "orders": 4,
            "qty": sum(i for i in range(12) if i % 3 == c),
            "last": f"o{9 + c}",
        }
        for c in range(3)
    }
    assert "Traceback" not in log

    # The output was created from its TopicConfig.
    admin = AdminClient({"bootstrap.servers": kafka_bootstrap})
    topic = env["LOCKGATE_OUTPUT_TOPIC"]
    assert len(admin.list_topics(topic, timeout=10).topics[topic].partitions) == 3
    res = ConfigResource(ResourceType.TOPIC, topic)
    conf = admin.describe_configs([res])[res].result(30)
    assert conf["cleanup.policy"].value == "delete"
    assert conf["retention.ms"].value == str(3 * 86_400_000)
    assert conf["max.message.bytes"].value == "2000000"


def test_an_output_topic_unlike_its_topic_config_is_refused(  # type: ignore[no-untyped-def]
    kafka_bootstrap: str, names, tmp_path: Path
) -> None:
    env = app_env(kafka_bootstrap, names, tmp_path, "typedcfg")
    create_topic(kafka_bootstrap, env["LOCKGATE_INPUT_TOPIC"], 2)
    out = env["LOCKGATE_OUTPUT_TOPIC"]
    create_topic(kafka_bootstrap, out, 2, {"cleanup.policy": "compact"})
    app = AppProcess(APP, env, tmp_path / "app.log").start()
    code = app.wait(60)
    log = app.log_text()
    assert code == 2, log[-3000:]
    assert f"output topic {out} has 2 partitions, TopicConfig declares 3" in log, log[-3000:]
    assert f"output topic {out} has cleanup.policy=compact, TopicConfig declares delete" in log
    assert "Traceback" not in log
