"""Savepoint requests that arrive together are all served (issue 25, hole 7).

Requests and cancels are plain records on partition 0 of an app's control topic; a running
instance reads them in batches. Here they are written in one producer flush, so the
instance reads them in one batch:

1. two requests: both savepoints are taken (one at a time, in order) — before, the second
   replaced the first, which was never taken;
2. a cancel of a stop-with-savepoint that halted the app, together with a new request: the
   halted key groups resume *and* the new savepoint is taken — before, the cancel's rewind
   dropped the rest of the batch, the new request with it.

Against the real broker with ``examples/running_sum.py``; the savepoints' manifests are
read from the savepoint location, and the output is checked against the model at the end.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import orjson
from confluent_kafka import Producer

from processors._checkpoint.control_topics import (
    REQUEST_PARTITION,
    cancel_key,
    control_topic,
    request_key,
)
from processors._ops.catalog import choose_checkpoint, savepoint_request
from state.savepoint import SavepointError, SavepointStore, new_savepoint_id
from tests.support.checker import check, model
from tests.support.kafka import create_topic, produce_numbers, read_all, read_inputs
from tests.support.procs import AppProcess, lockgate_cli, wait_until

P = 2


def _write(bootstrap: str, app: str, records: list[tuple[bytes, dict[str, Any]]]) -> None:
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 50})
    for key, value in records:
        producer.produce(control_topic(app), orjson.dumps(value), key, partition=REQUEST_PARTITION)
    assert producer.flush(30) == 0


def _request(app: str, after: int | None = None) -> tuple[str, dict[str, Any]]:
    """A request as ``lockgate savepoint trigger`` writes it (past checkpoint ``after``)."""
    now = int(time.time() * 1000)
    sp_id = new_savepoint_id(now)
    checkpoint = choose_checkpoint(now, [] if after is None else [after])
    return sp_id, savepoint_request(sp_id, checkpoint, False, [app], now)


def _taken(store: SavepointStore, sp_id: str, app: str) -> bool:
    try:
        return all(store.read_manifest(sp_id, app, g).get("error") is None for g in range(P))
    except SavepointError:
        return False


def test_requests_in_one_batch_are_all_served(  # type: ignore[no-untyped-def]
    kafka_bootstrap: str, names, tmp_path: Path
) -> None:
    app, inp, out = names("sp-req"), names("sp-req-in"), names("sp-req-out")
    create_topic(kafka_bootstrap, inp, P)
    sp_dir = tmp_path / "savepoints"
    env = {
        "LOCKGATE_BOOTSTRAP_SERVERS": kafka_bootstrap,
        "LOCKGATE_APP_NAME": app,
        "LOCKGATE_INPUT_TOPIC": inp,
        "LOCKGATE_OUTPUT_TOPIC": out,
        "LOCKGATE_CHECKPOINT_INTERVAL_MS": "300",
        "LOCKGATE_SAVEPOINT_DIR": str(sp_dir),
        "LOCKGATE_INSTANCE_ID": "i1",
        "LOCKGATE_STATE_DIR": str(tmp_path / "state"),
    }
    batch = [(f"key-{i % 17}", i % 7, i) for i in range(900)]
    produce_numbers(kafka_bootstrap, inp, batch[:300])
    proc = AppProcess("examples.running_sum:app", env, tmp_path / "i1.log").start()
    store = SavepointStore(str(sp_dir))
    try:
        read_all(kafka_bootstrap, out, expected=300, timeout=60, idle=0)

        # 1. Two requests in one batch.
        first, first_req = _request(app)
        second, second_req = _request(app, after=first_req["checkpoint"])
        _write(
            kafka_bootstrap,
            app,
            [(request_key(first), first_req), (request_key(second), second_req)],
        )
        wait_until(
            lambda: _taken(store, first, app) and _taken(store, second, app),
            40,
            interval=0.5,
            what="both savepoints taken",
        )

        # 2. A stop-with-savepoint halts the app; its cancel arrives with a new request.
        halt = lockgate_cli(env, "savepoint", "trigger", "--app", app, "--stop", "--timeout", "60")
        assert halt.returncode == 0, halt.stderr[-3000:] + proc.log_text()[-3000:]
        halted_at = halt.stdout.strip().splitlines()[-1]
        produce_numbers(kafka_bootstrap, inp, batch[300:600])  # waits while halted
        described = lockgate_cli(env, "savepoint", "describe", halted_at, "--json")
        assert described.returncode == 0, described.stderr
        third, third_req = _request(app, after=int(orjson.loads(described.stdout)["checkpoint"]))
        cancel = {"savepoint": halted_at, "cancelled_ms": int(time.time() * 1000)}
        _write(
            kafka_bootstrap, app, [(cancel_key(halted_at), cancel), (request_key(third), third_req)]
        )
        wait_until(lambda: _taken(store, third, app), 40, interval=0.5, what="the third savepoint")
        produce_numbers(kafka_bootstrap, inp, batch[600:])
        outputs = read_all(kafka_bootstrap, out, expected=len(batch), timeout=60, idle=3)
    finally:
        code = proc.terminate()
    log = proc.log_text()
    assert code == 0, log[-3000:]
    assert "savepoint cancelled: key groups resume" in log, log[-3000:]
    assert check(model(read_inputs(kafka_bootstrap, inp, len(batch))), outputs) == [], log[-3000:]


def test_cancel_halted_resumes_without_naming_the_savepoint(  # type: ignore[no-untyped-def]
    kafka_bootstrap: str, names, tmp_path: Path
) -> None:
    """``lockgate savepoint cancel --halted`` (the chart's savepoint-cancel Job).

    A stop-with-savepoint halts the app (nothing more is committed while input arrives);
    ``cancel --halted --pipeline APP`` finds the savepoint in the key groups' latest
    committed checkpoint records, prints its id and cancels it: the app resumes and the
    whole output is exact. Run again once resumed, it finds nothing halted (exit 0, no id).
    """
    app, inp, out = names("sp-cxh"), names("sp-cxh-in"), names("sp-cxh-out")
    create_topic(kafka_bootstrap, inp, P)
    sp_dir = tmp_path / "savepoints"
    env = {
        "LOCKGATE_BOOTSTRAP_SERVERS": kafka_bootstrap,
        "LOCKGATE_APP_NAME": app,
        "LOCKGATE_INPUT_TOPIC": inp,
        "LOCKGATE_OUTPUT_TOPIC": out,
        "LOCKGATE_CHECKPOINT_INTERVAL_MS": "300",
        "LOCKGATE_SAVEPOINT_DIR": str(sp_dir),
        "LOCKGATE_INSTANCE_ID": "i1",
        "LOCKGATE_STATE_DIR": str(tmp_path / "state"),
    }
    cli_env = {"LOCKGATE_BOOTSTRAP_SERVERS": kafka_bootstrap, "LOCKGATE_SAVEPOINT_DIR": str(sp_dir)}
    batch = [(f"key-{i % 17}", i % 7, i) for i in range(900)]
    produce_numbers(kafka_bootstrap, inp, batch[:300])
    proc = AppProcess("examples.running_sum:app", env, tmp_path / "i1.log").start()
    try:
        read_all(kafka_bootstrap, out, expected=300, timeout=60, idle=0)
        nothing = lockgate_cli(cli_env, "savepoint", "cancel", "--halted", "--pipeline", app)
        assert nothing.returncode == 0, nothing.stderr
        assert nothing.stdout == "" and "nothing to cancel" in nothing.stderr, nothing
        halt = lockgate_cli(
            cli_env, "savepoint", "trigger", "--pipeline", app, "--stop", "--timeout", "60"
        )
        assert halt.returncode == 0, halt.stderr[-3000:] + proc.log_text()[-3000:]
        sp_id = halt.stdout.strip().splitlines()[-1]
        produce_numbers(kafka_bootstrap, inp, batch[300:600])
        time.sleep(2)  # halted: none of these is processed
        assert len(read_all(kafka_bootstrap, out, expected=600, timeout=3, idle=1)) == 300
        cancel = lockgate_cli(cli_env, "savepoint", "cancel", "--halted", "--pipeline", app)
        assert cancel.returncode == 0, cancel.stderr
        assert cancel.stdout.split() == [sp_id], (cancel.stdout, cancel.stderr)
        assert "key group(s) 0,1" in cancel.stderr, cancel.stderr
        produce_numbers(kafka_bootstrap, inp, batch[600:])
        outputs = read_all(kafka_bootstrap, out, expected=len(batch), timeout=60, idle=3)
        again = lockgate_cli(cli_env, "savepoint", "cancel", "--halted", "--app", app)
        assert again.returncode == 0, again.stderr
        assert again.stdout == "" and "nothing to cancel" in again.stderr, again
    finally:
        code = proc.terminate()
    log = proc.log_text()
    assert code == 0, log[-3000:]
    assert "savepoint cancelled: key groups resume" in log, log[-3000:]
    assert check(model(read_inputs(kafka_bootstrap, inp, len(batch))), outputs) == [], log[-3000:]
