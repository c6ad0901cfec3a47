"""Outputs the broker can never accept stop the instance instead of replaying forever.

* A keyless record to a compacted output: the broker answers INVALID_RECORD in the
  delivery report; the instance exits 1 naming the cause, and nothing of the epoch commits.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.integration._util import committed_offsets
from tests.support.kafka import create_topic, produce_numbers, read_all
from tests.support.procs import AppProcess


def _env(bootstrap: str, names, tmp_path: Path, **extra: str) -> dict[str, str]:  # type: ignore[no-untyped-def]
    env = {
        "LOCKGATE_BOOTSTRAP_SERVERS": bootstrap,
        "LOCKGATE_APP_NAME": names("undeliverable"),
        "LOCKGATE_INPUT_TOPIC": names("undeliverable-in"),
        "LOCKGATE_OUTPUT_TOPIC": names("undeliverable-out"),
        "LOCKGATE_STATE_DIR": str(tmp_path / "state"),
        "LOCKGATE_INSTANCE_ID": "i1",
        "LOCKGATE_CHECKPOINT_INTERVAL_MS": "300",
    }
    env.update(extra)
    return env


@pytest.mark.xfail(
    strict=True,
    reason=(
        "runtime defect: the INVALID_RECORD delivery report is served only inside "
        "_abort_epoch (poll(0)) and then cleared (_epoch.py _abort_epoch: "
        "self._delivery_error = None), and _end_epoch's except AbortEpoch checks "
        "_raise_if_undeliverable() before any poll: the epoch is replayed 11 times and the "
        "instance stops with the generic '11 epochs aborted in a row' message instead"
    ),
)
def test_keyless_record_to_a_compacted_output_stops_with_exit_1(  # type: ignore[no-untyped-def]
    kafka_bootstrap: str, names, tmp_path: Path
) -> None:
    env = _env(kafka_bootstrap, names, tmp_path, KEYLESS_SEQ="-1")
    inp, out, app_name = (env[k] for k in ("LOCKGATE_INPUT_TOPIC", "LOCKGATE_OUTPUT_TOPIC",
                                           "LOCKGATE_APP_NAME"))  # fmt: skip
    create_topic(kafka_bootstrap, inp, 1)
    create_topic(kafka_bootstrap, out, 1, {"cleanup.policy": "compact"})
    produce_numbers(kafka_bootstrap, inp, [("k", 1, i) for i in range(20)])
    app = AppProcess("tests.integration.apps.keyless:app", env, tmp_path / "app.log").start()
    try:
        code = app.wait(60)
    finally:
        if app.alive:
            app.kill9()
    log = app.log_text()
    assert code == 1, log[-3000:]
    assert "a record could not be delivered (INVALID_RECORD" in log, log[-3000:]
    assert "compacted outputs get keys" in log
    assert "epochs aborted in a row" not in log  # stopped at the first failure
    assert log.count("aborting epoch") <= 1, log[-3000:]
    assert "Traceback" not in log
    assert read_all(kafka_bootstrap, out, idle=1, timeout=5) == []
    assert committed_offsets(kafka_bootstrap, app_name, inp, 1)[0].offset < 0
