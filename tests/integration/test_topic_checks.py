"""Topic layouts that would silently lose state are refused with what to do."""

from __future__ import annotations

import time
from pathlib import Path

from confluent_kafka.admin import AdminClient, NewPartitions, NewTopic

from tests.support.kafka import create_topic, produce_numbers
from tests.support.procs import AppProcess, wait_until


def _env(bootstrap: str, names, tmp_path: Path) -> dict[str, str]:  # type: ignore[no-untyped-def]
    return {
        "LOCKGATE_BOOTSTRAP_SERVERS": bootstrap,
        "LOCKGATE_APP_NAME": names("topics"),
        "LOCKGATE_INPUT_TOPIC": names("topics-in"),
        "LOCKGATE_OUTPUT_TOPIC": names("topics-out"),
        "LOCKGATE_STATE_DIR": str(tmp_path / "state"),
        "LOCKGATE_INSTANCE_ID": "i1",
        "LOCKGATE_CHECKPOINT_INTERVAL_MS": "300",
    }


def test_a_changelog_that_is_not_compacted_is_refused(  # type: ignore[no-untyped-def]
    kafka_bootstrap: str, names, tmp_path: Path
) -> None:
    env = _env(kafka_bootstrap, names, tmp_path)
    create_topic(kafka_bootstrap, env["LOCKGATE_INPUT_TOPIC"], 2)
    changelog = f"{env['LOCKGATE_APP_NAME']}.totals.changelog"
    admin = AdminClient({"bootstrap.servers": kafka_bootstrap})
    new = NewTopic(changelog, 2, 1, config={"cleanup.policy": "delete"})
    admin.create_topics([new])[changelog].result(30)
    app = AppProcess("examples.running_sum:app", env, tmp_path / "app.log").start()
    code = app.wait(60)
    log = app.log_text()
    assert code == 2, log[-3000:]
    assert f"changelog {changelog} has cleanup.policy=delete" in log
    assert "Traceback" not in log


def test_partitions_added_to_the_input_stop_the_app_with_what_to_do(  # type: ignore[no-untyped-def]
    kafka_bootstrap: str, names, tmp_path: Path
) -> None:
    env = _env(kafka_bootstrap, names, tmp_path)
    env["LOCKGATE_KAFKA__TOPIC_METADATA_REFRESH_INTERVAL_MS"] = "1000"
    create_topic(kafka_bootstrap, env["LOCKGATE_INPUT_TOPIC"], 2)
    produce_numbers(kafka_bootstrap, env["LOCKGATE_INPUT_TOPIC"], [("a", 1, 0), ("b", 2, 1)])
    app = AppProcess("examples.running_sum:app", env, tmp_path / "app.log").start()
    wait_until(lambda: "assigned" in app.log_text(), 60, what="the first assignment")
    admin = AdminClient({"bootstrap.servers": kafka_bootstrap})
    admin.create_partitions([NewPartitions(env["LOCKGATE_INPUT_TOPIC"], 3)])[
        env["LOCKGATE_INPUT_TOPIC"]
    ].result(30)
    started = time.monotonic()
    wait_until(lambda: not app.alive, 90, what="the app to stop")
    code = app.wait(1)
    log = app.log_text()
    assert code == 2, log[-3000:]
    assert "input partitions [2] appeared after start" in log, log[-3000:]
    print(f"stopped {time.monotonic() - started:.1f}s after the partition was added")
