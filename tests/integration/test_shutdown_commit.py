"""SIGTERM commits the open epoch: nothing was committed before it, everything after it.

test_running_sum_exact_output reads the output before SIGTERM, so it cannot tell whether
the shutdown commit works. Here epochs are 60 s long: the app processes every input, the
committed output is still empty, and only the SIGTERM's final commit makes it exact.
"""

from __future__ import annotations

import random
import signal
import time
from pathlib import Path

from tests.integration._util import app_env, committed_offsets, http_get, metric
from tests.support.checker import check, model
from tests.support.kafka import create_topic, produce_numbers, read_all, read_inputs
from tests.support.ports import free_port
from tests.support.procs import AppProcess, wait_until

N = 1000


def test_sigterm_commits_the_open_epoch(kafka_bootstrap: str, names, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    port = free_port()
    app_name, inp, out = names("shutdown"), names("shutdown-in"), names("shutdown-out")
    env = {
        "LOCKGATE_BOOTSTRAP_SERVERS": kafka_bootstrap,
        "LOCKGATE_APP_NAME": app_name,
        "LOCKGATE_INPUT_TOPIC": inp,
        "LOCKGATE_OUTPUT_TOPIC": out,
        "LOCKGATE_STATE_DIR": str(tmp_path / "state"),
        "LOCKGATE_INSTANCE_ID": "i1",
        "LOCKGATE_CHECKPOINT_INTERVAL_MS": "60000",
        "LOCKGATE_TRANSACTION_TIMEOUT_MS": "120000",
        "LOCKGATE_HTTP_PORT": str(port),
        "LOCKGATE_HTTP_HOST": "127.0.0.1",
    }
    create_topic(kafka_bootstrap, inp, 2)
    rng = random.Random(7)
    inputs = [(f"key-{rng.randrange(20)}", rng.randrange(-5, 50), i) for i in range(N)]
    produce_numbers(kafka_bootstrap, inp, inputs)
    app = AppProcess("examples.running_sum:app", env, tmp_path / "app.log").start()
    try:
        wait_until(
            lambda: (
                metric(http_get(port, "/metrics")[1], "lockgate_records_in_attempts_total") == N
            ),
            60,
            what=f"{N} records processed",
        )
        text = http_get(port, "/metrics")[1]
        assert metric(text, "lockgate_records_in_total") == 0  # committed counter
        assert metric(text, "lockgate_epochs_committed_total") == 0
        # Processed and produced inside the open transaction, but not committed.
        assert read_all(kafka_bootstrap, out, idle=1, timeout=5) == []
        uncommitted = read_all(
            kafka_bootstrap, out, expected=N, idle=0.5, timeout=20, isolation="read_uncommitted"
        )
        assert len(uncommitted) == N
        assert all(tp.offset < 0 for tp in committed_offsets(kafka_bootstrap, app_name, inp, 2))
        code = app.terminate(60)
    finally:
        if app.alive:
            app.kill9()
    log = app.log_text()
    assert code == 0, log[-3000:]
    assert "stopping: finishing the open epoch" in log
    outputs = read_all(kafka_bootstrap, out, expected=N, idle=1)
    stored = read_inputs(kafka_bootstrap, inp, N)
    assert check(model(stored), outputs) == [], log[-3000:]
    offsets = committed_offsets(kafka_bootstrap, app_name, inp, 2)
    counts = {p: 0 for p in range(2)}
    for m in read_all(kafka_bootstrap, inp, expected=N, idle=0.5):
        counts[m.partition()] += 1
    assert {tp.partition: tp.offset for tp in offsets} == counts


def test_sigterm_while_the_app_module_loads_stops_cleanly(
    kafka_bootstrap: str,
    names,  # type: ignore[no-untyped-def]
    tmp_path: Path,
) -> None:
    """A SIGTERM during the app's import is honoured once the runner starts: exit 0.

    (It used to kill the process by the default action, exit -15, before any handler.) A
    second signal during the import takes the default action at once.
    """
    env = app_env(kafka_bootstrap, names, tmp_path, "early-stop", PYTHONPATH=str(tmp_path))
    create_topic(kafka_bootstrap, env["LOCKGATE_INPUT_TOPIC"], 2)
    marker = tmp_path / "importing"
    (tmp_path / "slow_import_app.py").write_text(
        "import pathlib, time\n"
        f"pathlib.Path({str(marker)!r}).touch()\n"
        "time.sleep(8)  # a heavy import\n"
        "from examples.running_sum import app  # noqa: E402\n"
    )
    app = AppProcess("slow_import_app:app", env, tmp_path / "app.log").start()
    try:
        wait_until(marker.exists, 60, what="the app module importing")
        app.signal(signal.SIGTERM)
        code = app.wait(90)
    finally:
        if app.alive:
            app.kill9()
    log = app.log_text()
    assert code == 0, log[-3000:]
    assert "stop requested while starting" in log, log[-3000:]

    # Asked twice while the import still runs (say it hangs): the default action at once.
    marker.unlink()
    again = AppProcess("slow_import_app:app", env, tmp_path / "again.log").start()
    try:
        wait_until(marker.exists, 60, what="the app module importing")
        again.signal(signal.SIGTERM)
        time.sleep(1)
        again.signal(signal.SIGTERM)
        code = again.wait(5)  # the import sleeps 8 s: this is the second signal's doing
    finally:
        if again.alive:
            again.kill9()
    assert code == -signal.SIGTERM, again.log_text()[-3000:]
