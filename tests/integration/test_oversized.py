"""An output that can never be written is attributed to the record that made it.

Before: one 2 MB output value aborted the epoch 11 times, exited 1, restarted and
failed the same way forever. Now the record is dead-lettered with a RecordRejected
error (even when user code catches the emit error), and everything else is exact.
"""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from tests.integration._util import app_env, run_to_dead_letter
from tests.support.checker import check, model
from tests.support.kafka import create_topic, produce_numbers, read_inputs


@pytest.mark.parametrize("swallow", ["0", "1"])
def test_an_oversized_output_dead_letters_its_record(  # type: ignore[no-untyped-def]
    kafka_bootstrap: str, names, tmp_path: Path, swallow: str
) -> None:
    env = app_env(
        kafka_bootstrap, names, tmp_path, "big", OVERSIZED_SEQ="50", OVERSIZED_SWALLOW=swallow
    )
    create_topic(kafka_bootstrap, env["LOCKGATE_INPUT_TOPIC"], 2)
    rng = random.Random(3)
    inputs = [(f"key-{rng.randrange(8)}", rng.randrange(100), i) for i in range(200)]
    produce_numbers(kafka_bootstrap, env["LOCKGATE_INPUT_TOPIC"], inputs)
    dlq, out, log = run_to_dead_letter(
        "tests.integration.apps.oversized:app", env, tmp_path, outputs=199
    )
    headers = dict(dlq[0].headers())
    assert headers["lockgate-error-type"] == b"RecordRejected"
    assert b"MSG_SIZE_TOO_LARGE" in headers["lockgate-error-message"]
    assert b'"seq":50' in dlq[0].value()
    stored = read_inputs(kafka_bootstrap, env["LOCKGATE_INPUT_TOPIC"], len(inputs))
    assert check(model([r for r in stored if r[2] != 50]), out) == [], log[-3000:]
    assert "stopping" not in log.replace("stopping: finishing the open epoch", "")
