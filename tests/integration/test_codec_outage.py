"""A codec whose service is down (a schema registry) stops the instance; nothing is lost.

The records are not dead-lettered (it is not their fault), the open epoch does not commit
(even when user code swallows the exception), and after the service is back a restart
produces exactly the running sums of every input, once.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.checker import check, model
from tests.support.kafka import create_topic, produce_numbers, read_all, read_inputs, unique
from tests.support.procs import AppProcess


@pytest.mark.parametrize("swallow", ["0", "1"])
def test_an_output_codec_outage_stops_without_loss_or_dead_letters(
    kafka_bootstrap: str, tmp_path: Path, swallow: str
) -> None:
    inp, out, name = unique("co-in"), unique("co-out"), unique("co")
    create_topic(kafka_bootstrap, inp, 2)
    flag = tmp_path / "outage"
    env = {
        "LOCKGATE_BOOTSTRAP_SERVERS": kafka_bootstrap,
        "LOCKGATE_APP_NAME": name,
        "LOCKGATE_INPUT_TOPIC": inp,
        "LOCKGATE_OUTPUT_TOPIC": out,
        "LOCKGATE_STATE_DIR": str(tmp_path / "s"),
        "LOCKGATE_INSTANCE_ID": "i1",
        "LOCKGATE_CHECKPOINT_INTERVAL_MS": "300",
        "OUTAGE_FLAG": str(flag),
        "OUTAGE_SWALLOW": swallow,
    }
    produce_numbers(kafka_bootstrap, inp, [(f"k{i % 7}", i % 5, i) for i in range(300)])
    app = AppProcess("tests.integration.apps.codec_outage:app", env, tmp_path / "a.log").start()
    try:
        assert len(read_all(kafka_bootstrap, out, expected=300, idle=0.5)) == 300
        flag.touch()  # the registry goes down
        produce_numbers(kafka_bootstrap, inp, [(f"k{i % 7}", i % 5, i) for i in range(300, 400)])
        code = app.wait(60)
    finally:
        if app.alive:
            app.kill9()
    log = app.log_text()
    assert code == 1, log[-3000:]
    assert "registry.invalid" in log
    assert read_all(kafka_bootstrap, f"{name}.dlq", timeout=5, idle=0.5) == []
    flag.unlink()  # back: a restart processes the rest exactly once
    again = AppProcess("tests.integration.apps.codec_outage:app", env, tmp_path / "b.log").start()
    try:
        got = read_all(kafka_bootstrap, out, expected=400, idle=1)
    finally:
        assert again.terminate() == 0
    problems = check(model(read_inputs(kafka_bootstrap, inp, 400)), got)
    assert problems == [] and len(got) == 400, problems[:5]
