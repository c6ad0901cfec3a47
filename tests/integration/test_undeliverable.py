"""Outputs the broker can never accept stop the instance instead of replaying forever.

* A keyless record to a compacted output: the broker would answer INVALID_RECORD in the
  delivery report (and the replay would fail the same way); lockgate refuses it at emit
  time and dead-letters the record that made it.
"""

from __future__ import annotations

from pathlib import Path

import orjson

from tests.integration._util import app_env, committed_offsets, run_to_dead_letter
from tests.support.kafka import create_topic, produce_numbers


def test_a_keyless_record_to_a_compacted_output_is_dead_lettered(  # type: ignore[no-untyped-def]
    kafka_bootstrap: str, names, tmp_path: Path
) -> None:
    # The broker would refuse it (INVALID_RECORD in the delivery report, the transaction
    # abortable): lockgate knows the output is compacted and rejects it at emit time, so
    # the record that made it is dead-lettered and everything else commits.
    env = app_env(kafka_bootstrap, names, tmp_path, "undeliverable", KEYLESS_SEQ="5")
    inp, out, app_name = (env[k] for k in ("LOCKGATE_INPUT_TOPIC", "LOCKGATE_OUTPUT_TOPIC",
                                           "LOCKGATE_APP_NAME"))  # fmt: skip
    create_topic(kafka_bootstrap, inp, 1)
    create_topic(kafka_bootstrap, out, 1, {"cleanup.policy": "compact"})
    produce_numbers(kafka_bootstrap, inp, [("k", 1, i) for i in range(20)])
    dlq, outputs, _ = run_to_dead_letter(
        "tests.integration.apps.keyless:app", env, tmp_path, outputs=19
    )
    headers = dict(dlq[0].headers())
    assert headers["lockgate-error-type"] == b"RecordRejected"
    assert b"has no key" in headers["lockgate-error-message"]
    assert headers["lockgate-source-offset"] == b"5"
    seqs = [orjson.loads(m.value())["seq"] for m in outputs]
    assert seqs == [i for i in range(20) if i != 5]
    # The dead-lettered record's state change never committed: sums skip it.
    assert [orjson.loads(m.value())["count"] for m in outputs] == list(range(1, 20))
    assert committed_offsets(kafka_bootstrap, app_name, inp, 1)[0].offset == 20
