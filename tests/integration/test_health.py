"""Probes and metrics served by a running instance."""

from __future__ import annotations

import json
import socket
import time
import urllib.error
import urllib.request
from pathlib import Path

from tests.support.kafka import create_topic, produce_numbers, read_all, unique
from tests.support.procs import AppProcess, wait_until


def _get(port: int, path: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as r:  # noqa: S310
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()
    except OSError:
        return 0, ""


def test_probes_and_metrics(kafka_bootstrap: str, tmp_path: Path) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    inp, out = unique("h-in"), unique("h-out")
    create_topic(kafka_bootstrap, inp, 2)
    produce_numbers(kafka_bootstrap, inp, [(f"k{i % 5}", 1, i) for i in range(500)])
    env = {
        "LOCKGATE_BOOTSTRAP_SERVERS": kafka_bootstrap,
        "LOCKGATE_APP_NAME": unique("health"),
        "LOCKGATE_INPUT_TOPIC": inp,
        "LOCKGATE_OUTPUT_TOPIC": out,
        "LOCKGATE_STATE_DIR": str(tmp_path / "s"),
        "LOCKGATE_HTTP_PORT": str(port),
        "LOCKGATE_HTTP_HOST": "127.0.0.1",
    }
    app = AppProcess("examples.running_sum:app", env, tmp_path / "app.log").start()
    try:
        wait_until(lambda: _get(port, "/readyz")[0] == 200, 60, what="/readyz")
        assert json.loads(_get(port, "/readyz")[1]) == {"status": "ready", "key_groups": 2}
        assert _get(port, "/startupz") == (200, '{"status":"started"}\n')
        code, body = _get(port, "/livez")
        assert code == 200
        assert json.loads(body)["status"] == "ok"
        assert _get(port, "/nope")[0] == 404

        # A second instance on this host with the same port stops with a clear message
        # (exit 2, configuration error) instead of an OSError traceback.
        second = AppProcess(
            "examples.running_sum:app",
            {**env, "LOCKGATE_INSTANCE_ID": "second", "LOCKGATE_STATE_DIR": str(tmp_path / "s2")},
            tmp_path / "second.log",
        ).start()
        assert second.wait(60) == 2
        log = second.log_text()
        assert f"LOCKGATE_HTTP_PORT={port}" in log
        assert "already in use" in log
        assert "Traceback" not in log
        assert _get(port, "/readyz")[0] == 200  # the first one still serves

        assert len(read_all(kafka_bootstrap, out, expected=500, idle=1)) == 500
        wait_until(lambda: "lockgate_records_in_total" in _get(port, "/metrics")[1], 10)
        wait_until(
            lambda: (
                "lockgate_records_out_total{" in _get(port, "/metrics")[1]
                and _metric(_get(port, "/metrics")[1], "lockgate_records_out_total") == 500
            ),
            20,
            what="records_out == 500",
        )
        text = _get(port, "/metrics")[1]
        assert _metric(text, "lockgate_records_in_total") == 500
        assert _metric(text, "lockgate_epochs_committed_total") >= 1
        assert _metric(text, "lockgate_key_groups_assigned") == 2
        assert _metric(text, "lockgate_last_checkpoint_id") > 0
        assert "# TYPE lockgate_dlq_records_total counter" in text
        commits = _metric(text, "lockgate_epoch_commit_seconds_count")
        assert commits >= 1
        assert _metric(text, "lockgate_epoch_commit_seconds_bucket", le="+Inf") == commits
        assert _metric(text, "lockgate_epoch_commit_seconds_sum") > 0
        assert _metric(text, "lockgate_key_groups_restoring") == 0
        assert _metric(text, "lockgate_last_progress_age_seconds") < 5
    finally:
        assert app.terminate() == 0


def _metric(text: str, name: str, le: str | None = None) -> float:
    for line in text.splitlines():
        if line.startswith(name + "{") and (le is None or f'le="{le}"' in line):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"{name} missing")


def test_a_long_batch_of_slow_records_is_progress_not_a_stall(
    kafka_bootstrap: str, tmp_path: Path
) -> None:
    """Each handled record is progress: a batch longer than the liveness timeout stays live.

    60 records of 80 ms each run in one epoch (checkpoint interval 8 s) and one consume
    batch: about 5 s without a loop iteration, against a 1 s liveness timeout.
    """
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    inp, out = unique("lb-in"), unique("lb-out")
    create_topic(kafka_bootstrap, inp, 1)
    env = {
        "LOCKGATE_BOOTSTRAP_SERVERS": kafka_bootstrap,
        "LOCKGATE_APP_NAME": unique("longbatch"),
        "LOCKGATE_INPUT_TOPIC": inp,
        "LOCKGATE_OUTPUT_TOPIC": out,
        "LOCKGATE_STATE_DIR": str(tmp_path / "s"),
        "LOCKGATE_HTTP_PORT": str(port),
        "LOCKGATE_HTTP_HOST": "127.0.0.1",
        "LOCKGATE_LIVENESS_TIMEOUT_MS": "1000",
        "LOCKGATE_CHECKPOINT_INTERVAL_MS": "8000",
        "LOCKGATE_TRANSACTION_TIMEOUT_MS": "30000",
        "SLOW_APP_SLEEP_MS": "80",
    }
    app = AppProcess("tests.integration.apps.slow:app", env, tmp_path / "app.log").start()
    try:
        wait_until(lambda: _get(port, "/readyz")[0] == 200, 60, what="/readyz")
        produce_numbers(kafka_bootstrap, inp, [(f"k{i % 3}", 1, i) for i in range(60)])
        codes = []
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            codes.append(_get(port, "/livez")[0])
            uncommitted = read_all(
                kafka_bootstrap, out, expected=60, timeout=0.3, idle=0, isolation="read_uncommitted"
            )
            if len(uncommitted) >= 60:
                break
        assert len(codes) >= 5 and set(codes) == {200}, codes
        assert len(read_all(kafka_bootstrap, out, expected=60, idle=0.5)) == 60
    finally:
        assert app.terminate() == 0
