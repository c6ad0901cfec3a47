"""One record that keeps user code busy longer than the transaction may stay open.

Before: the coordinator aborted the transaction on its timeout, the producer was fenced,
the instance exited 1 with the "instance id used twice" hint, restarted and replayed the
same record forever. Now the record is dead-lettered (on_error=dlq) or the app stops
once naming it (on_error=fail, exit 3).
"""

from __future__ import annotations

import random
from pathlib import Path

from tests.integration._util import app_env, run_to_dead_letter
from tests.support.checker import check, model
from tests.support.kafka import create_topic, produce_numbers, read_inputs
from tests.support.procs import AppProcess, wait_until


def _env(bootstrap: str, names, tmp_path: Path, **extra: str) -> dict[str, str]:  # type: ignore[no-untyped-def]
    return app_env(
        bootstrap, names, tmp_path, "stall",
        LOCKGATE_CHECKPOINT_INTERVAL_MS="500", LOCKGATE_TRANSACTION_TIMEOUT_MS="2000",
        SLOW_APP_SLEEP_MS="0", SLOW_APP_STALL_SEQ="120", SLOW_APP_STALL_MS="5000", **extra,
    )  # fmt: skip


def _inputs(n: int) -> list[tuple[str, int, int]]:
    rng = random.Random(11)
    return [(f"key-{rng.randrange(10)}", rng.randrange(100), i) for i in range(n)]


def test_a_record_slower_than_the_transaction_is_dead_lettered_once(  # type: ignore[no-untyped-def]
    kafka_bootstrap: str, names, tmp_path: Path
) -> None:
    env = _env(kafka_bootstrap, names, tmp_path)
    create_topic(kafka_bootstrap, env["LOCKGATE_INPUT_TOPIC"], 2)
    inputs = _inputs(300)
    produce_numbers(kafka_bootstrap, env["LOCKGATE_INPUT_TOPIC"], inputs)
    dlq, out, log = run_to_dead_letter(
        "tests.integration.apps.slow:app", env, tmp_path, outputs=299
    )
    headers = dict(dlq[0].headers())
    assert headers["lockgate-error-type"] == b"SlowRecordError"
    assert b"kept user code busy" in headers["lockgate-error-message"]
    stored = read_inputs(kafka_bootstrap, env["LOCKGATE_INPUT_TOPIC"], len(inputs))
    slow = [r for r in stored if r[2] == 120]
    assert b'"seq":120' in dlq[0].value()
    # Everything else exactly once, as if the slow record had never been there.
    rest = [r for r in stored if r[2] != 120]
    assert check(model(rest), out) == [], log[-3000:]
    assert len(slow) == 1
    assert "instance ids must be unique" not in log


def test_a_record_slower_than_the_transaction_stops_the_app_under_fail(  # type: ignore[no-untyped-def]
    kafka_bootstrap: str, names, tmp_path: Path
) -> None:
    env = _env(kafka_bootstrap, names, tmp_path, LOCKGATE_ON_ERROR="fail")
    create_topic(kafka_bootstrap, env["LOCKGATE_INPUT_TOPIC"], 2)
    produce_numbers(kafka_bootstrap, env["LOCKGATE_INPUT_TOPIC"], _inputs(300))
    app = AppProcess("tests.integration.apps.slow:app", env, tmp_path / "app.log").start()
    wait_until(lambda: not app.alive, 90, what="the app to stop")
    code = app.wait(1)
    log = app.log_text()
    assert code == 3, log[-3000:]
    assert "kept user code busy" in log
    assert f"{env['LOCKGATE_INPUT_TOPIC']}[" in log  # the record is named
    assert "instance ids must be unique" not in log
