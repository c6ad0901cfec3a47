"""Probes and metrics served by a running instance."""

from __future__ import annotations

import socket
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
        assert _get(port, "/startupz")[0] == 200
        assert _get(port, "/livez")[0] == 200
        assert _get(port, "/nope")[0] == 404
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
    finally:
        assert app.terminate() == 0


def _metric(text: str, name: str) -> float:
    for line in text.splitlines():
        if line.startswith(name + "{"):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"{name} missing")
