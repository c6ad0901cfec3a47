"""A state value the store's codec cannot encode is attributed to the record that wrote it.

Before: the codec failed in ``drain()`` at epoch end, outside the user-error path, and
every commit failed the same way forever. Now the epoch is replayed checking each
record's state writes, and that record is dead-lettered (StateEncodeError).
"""

from __future__ import annotations

import random
from pathlib import Path

from tests.support.checker import check, model
from tests.support.kafka import create_topic, produce_numbers, read_all, read_inputs
from tests.support.procs import AppProcess


def test_an_unencodable_state_value_dead_letters_its_record(  # type: ignore[no-untyped-def]
    kafka_bootstrap: str, names, tmp_path: Path
) -> None:
    env = {
        "LOCKGATE_BOOTSTRAP_SERVERS": kafka_bootstrap,
        "LOCKGATE_APP_NAME": names("enc"),
        "LOCKGATE_INPUT_TOPIC": names("enc-in"),
        "LOCKGATE_OUTPUT_TOPIC": names("enc-out"),
        "LOCKGATE_STATE_DIR": str(tmp_path / "state"),
        "LOCKGATE_INSTANCE_ID": "i1",
        "LOCKGATE_CHECKPOINT_INTERVAL_MS": "300",
        "UNENCODABLE_SEQ": "60",
    }
    create_topic(kafka_bootstrap, env["LOCKGATE_INPUT_TOPIC"], 2)
    rng = random.Random(4)
    inputs = [(f"key-{rng.randrange(8)}", rng.randrange(100), i) for i in range(200)]
    produce_numbers(kafka_bootstrap, env["LOCKGATE_INPUT_TOPIC"], inputs)
    app = AppProcess("tests.integration.apps.unencodable:app", env, tmp_path / "app.log").start()
    try:
        dlq = read_all(kafka_bootstrap, f"{env['LOCKGATE_APP_NAME']}.dlq", expected=1, timeout=60)
        out = read_all(kafka_bootstrap, env["LOCKGATE_OUTPUT_TOPIC"], expected=199, idle=2)
    finally:
        code = app.terminate()
    log = app.log_text()
    assert code == 0, log[-3000:]
    assert len(dlq) == 1, log[-3000:]
    headers = dict(dlq[0].headers())
    assert headers["lockgate-error-type"] == b"StateEncodeError", headers
    assert headers["lockgate-error-stage"] == b"state"
    assert b"'notes'" in headers["lockgate-error-message"]
    assert b'"seq":60' in dlq[0].value()
    stored = read_inputs(kafka_bootstrap, env["LOCKGATE_INPUT_TOPIC"], len(inputs))
    assert check(model([r for r in stored if r[2] != 60]), out) == [], log[-3000:]
