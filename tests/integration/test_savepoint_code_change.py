"""Restoring a savepoint into changed code: state is addressed by store name.

A stop-with-savepoint of ``versioned:v1`` (stores ``totals`` and ``seen``), then:
* ``v3`` declares ``totals`` as a list store: refused (exit 2) naming the store;
* ``v2`` drops ``seen``: refused (exit 2) without ``--allow-non-restored-state``;
* ``v2`` with it: ``totals`` is restored, ``seen`` dropped, the new ``last_seq``
  starts empty, and the running sums continue exactly (independent model).
"""

from __future__ import annotations

import random
from pathlib import Path

from tests.support.checker import check, model
from tests.support.kafka import create_topic, produce_numbers, read_all, read_inputs
from tests.support.procs import AppProcess, lockgate_cli

P = 3


def test_restore_after_a_code_change_keeps_state_by_store_name(  # type: ignore[no-untyped-def]
    kafka_bootstrap: str, names, tmp_path: Path
) -> None:
    app, inp, out = names("versioned"), names("versioned-in"), names("versioned-out")
    create_topic(kafka_bootstrap, inp, P)
    sp_dir = tmp_path / "sp"
    base = {
        "LOCKGATE_BOOTSTRAP_SERVERS": kafka_bootstrap,
        "LOCKGATE_APP_NAME": app,
        "LOCKGATE_INPUT_TOPIC": inp,
        "LOCKGATE_OUTPUT_TOPIC": out,
        "LOCKGATE_CHECKPOINT_INTERVAL_MS": "300",
        "LOCKGATE_SAVEPOINT_DIR": str(sp_dir),
        "LOCKGATE_INSTANCE_ID": "i1",
    }
    rng = random.Random(3)
    first = [(f"key-{rng.randrange(20)}", rng.randrange(50), i) for i in range(800)]
    produce_numbers(kafka_bootstrap, inp, first)

    def start(version: str, state: str, **extra: str) -> AppProcess:
        env = {**base, "LOCKGATE_STATE_DIR": str(tmp_path / state), **extra}
        spec = f"tests.integration.apps.versioned:{version}"
        return AppProcess(spec, env, tmp_path / f"{version}-{state}.log").start()

    v1 = start("v1", "s1")
    try:
        read_all(kafka_bootstrap, out, expected=800, timeout=60, idle=0.5)
        cli_env = {k: base[k] for k in ("LOCKGATE_BOOTSTRAP_SERVERS", "LOCKGATE_SAVEPOINT_DIR")}
        trig = lockgate_cli(
            cli_env, "savepoint", "trigger", "--app", app, "--stop", "--timeout", "60"
        )
        assert trig.returncode == 0, trig.stderr + v1.log_text()[-3000:]
        sp_id = trig.stdout.strip().splitlines()[-1]
    finally:
        assert v1.terminate() == 0, v1.log_text()[-3000:]

    incompatible = start("v3", "s3", LOCKGATE_FROM_SAVEPOINT=sp_id)
    assert incompatible.wait(90) == 2, incompatible.log_text()[-3000:]
    assert "store 'totals'" in incompatible.log_text(), incompatible.log_text()[-3000:]

    dropped = start("v2", "s2a", LOCKGATE_FROM_SAVEPOINT=sp_id)
    assert dropped.wait(90) == 2, dropped.log_text()[-3000:]
    assert "--allow-non-restored-state" in dropped.log_text(), dropped.log_text()[-3000:]

    second = [(f"key-{rng.randrange(20)}", rng.randrange(50), 800 + i) for i in range(800)]
    produce_numbers(kafka_bootstrap, inp, second)
    v2 = start("v2", "s2b", LOCKGATE_FROM_SAVEPOINT=sp_id, LOCKGATE_ALLOW_NON_RESTORED_STATE="true")
    try:
        msgs = read_all(kafka_bootstrap, out, expected=1600, timeout=90, idle=1)
    finally:
        assert v2.terminate() == 0, v2.log_text()[-3000:]
    assert "seeded from a savepoint" in v2.log_text()
    stored = read_inputs(kafka_bootstrap, inp, 1600)
    assert check(model(stored), msgs) == [], v2.log_text()[-3000:]
