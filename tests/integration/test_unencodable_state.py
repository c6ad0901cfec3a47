"""A state value the store's codec cannot encode is attributed to the record that wrote it.

Before: the codec failed in ``drain()`` at epoch end, outside the user-error path, and
every commit failed the same way forever. Now the epoch is replayed checking each
record's state writes, and that record is dead-lettered (StateEncodeError).
"""

from __future__ import annotations

import random
from pathlib import Path

from tests.integration._util import app_env, run_to_dead_letter
from tests.support.checker import check, model
from tests.support.kafka import create_topic, produce_numbers, read_inputs


def test_an_unencodable_state_value_dead_letters_its_record(  # type: ignore[no-untyped-def]
    kafka_bootstrap: str, names, tmp_path: Path
) -> None:
    env = app_env(kafka_bootstrap, names, tmp_path, "enc", UNENCODABLE_SEQ="60")
    create_topic(kafka_bootstrap, env["LOCKGATE_INPUT_TOPIC"], 2)
    rng = random.Random(4)
    inputs = [(f"key-{rng.randrange(8)}", rng.randrange(100), i) for i in range(200)]
    produce_numbers(kafka_bootstrap, env["LOCKGATE_INPUT_TOPIC"], inputs)
    dlq, out, log = run_to_dead_letter(
        "tests.integration.apps.unencodable:app", env, tmp_path, outputs=199
    )
    headers = dict(dlq[0].headers())
    assert headers["lockgate-error-type"] == b"StateEncodeError", headers
    assert headers["lockgate-error-stage"] == b"state"
    assert b"'notes'" in headers["lockgate-error-message"]
    assert b'"seq":60' in dlq[0].value()
    stored = read_inputs(kafka_bootstrap, env["LOCKGATE_INPUT_TOPIC"], len(inputs))
    assert check(model([r for r in stored if r[2] != 60]), out) == [], log[-3000:]
