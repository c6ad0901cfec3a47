"""Outputs the broker can never accept stop the instance instead of replaying forever.

* A keyless record to a compacted output: the broker would answer INVALID_RECORD in the
  delivery report (and the replay would fail the same way); lockgate refuses it at emit
  time and dead-letters the record that made it.
"""

from __future__ import annotations

from pathlib import Path

import orjson

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


def test_a_keyless_record_to_a_compacted_output_is_dead_lettered(  # type: ignore[no-untyped-def]
    kafka_bootstrap: str, names, tmp_path: Path
) -> None:
    # The broker would refuse it (INVALID_RECORD in the delivery report, the transaction
    # abortable): lockgate knows the output is compacted and rejects it at emit time, so
    # the record that made it is dead-lettered and everything else commits.
    env = _env(kafka_bootstrap, names, tmp_path, KEYLESS_SEQ="5")
    inp, out, app_name = (env[k] for k in ("LOCKGATE_INPUT_TOPIC", "LOCKGATE_OUTPUT_TOPIC",
                                           "LOCKGATE_APP_NAME"))  # fmt: skip
    create_topic(kafka_bootstrap, inp, 1)
    create_topic(kafka_bootstrap, out, 1, {"cleanup.policy": "compact"})
    produce_numbers(kafka_bootstrap, inp, [("k", 1, i) for i in range(20)])
    app = AppProcess("tests.integration.apps.keyless:app", env, tmp_path / "app.log").start()
    try:
        dlq = read_all(kafka_bootstrap, f"{app_name}.dlq", expected=1, timeout=60)
        outputs = read_all(kafka_bootstrap, out, expected=19, idle=2, timeout=60)
    finally:
        code = app.terminate()
    log = app.log_text()
    assert code == 0, log[-3000:]
    assert len(dlq) == 1, log[-3000:]
    headers = dict(dlq[0].headers())
    assert headers["lockgate-error-type"] == b"RecordRejected"
    assert b"has no key" in headers["lockgate-error-message"]
    assert headers["lockgate-source-offset"] == b"5"
    seqs = [orjson.loads(m.value())["seq"] for m in outputs]
    assert seqs == [i for i in range(20) if i != 5]
    # The dead-lettered record's state change never committed: sums skip it.
    assert [orjson.loads(m.value())["count"] for m in outputs] == list(range(1, 20))
    assert committed_offsets(kafka_bootstrap, app_name, inp, 1)[0].offset == 20
