"""Small helpers shared by the integration tests in this directory."""

from __future__ import annotations

import urllib.error
import urllib.request
from typing import Any

from confluent_kafka import Consumer, TopicPartition


def http_get(port: int, path: str, timeout: float = 5) -> tuple[int, str]:
    """GET ``path``; return (status, body), or (0, "") when nothing answers."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=timeout) as r:  # noqa: S310
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()
    except OSError:
        return 0, ""


def metric(text: str, name: str) -> float | None:
    """Return the value of the first sample of ``name`` (any labels), or None."""
    for line in text.splitlines():
        if line.startswith((name + "{", name + " ")):
            return float(line.rsplit(" ", 1)[1])
    return None


def committed_offsets(
    bootstrap: str, group: str, topic: str, partitions: int
) -> list[TopicPartition]:
    """The committed offsets (with metadata) of ``group`` on every partition of ``topic``."""
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": group})
    try:
        return c.committed([TopicPartition(topic, p) for p in range(partitions)], timeout=30)
    finally:
        c.close()


def log_records(log: str, needle: str) -> list[int]:
    """``records=N`` of every log line containing ``needle`` (console log format)."""
    return [
        int(line.split("records=")[1].split()[0])
        for line in log.splitlines()
        if needle in line and "records=" in line
    ]


def app_env(bootstrap: str, names, tmp_path, prefix: str, **extra: str) -> dict[str, str]:  # type: ignore[no-untyped-def]
    """The environment of one test app instance ``i1`` with unique topic and app names."""
    env = {
        "LOCKGATE_BOOTSTRAP_SERVERS": bootstrap,
        "LOCKGATE_APP_NAME": names(prefix),
        "LOCKGATE_INPUT_TOPIC": names(f"{prefix}-in"),
        "LOCKGATE_OUTPUT_TOPIC": names(f"{prefix}-out"),
        "LOCKGATE_STATE_DIR": str(tmp_path / "state"),
        "LOCKGATE_INSTANCE_ID": "i1",
        "LOCKGATE_CHECKPOINT_INTERVAL_MS": "300",
    }
    env.update(extra)
    return env


def run_to_dead_letter(  # type: ignore[no-untyped-def]
    spec: str, env: dict[str, str], tmp_path, outputs: int, dead: int = 1
) -> tuple[list[Any], list[Any], str]:
    """Run ``spec`` until ``dead`` DLQ records and ``outputs`` outputs committed; SIGTERM it.

    Asserts the clean stop (exit 0) and returns (dlq records, outputs, log).
    """
    from tests.support.kafka import read_all
    from tests.support.procs import AppProcess

    bootstrap = env["LOCKGATE_BOOTSTRAP_SERVERS"]
    app = AppProcess(spec, env, tmp_path / "app.log").start()
    try:
        dlq = read_all(bootstrap, f"{env['LOCKGATE_APP_NAME']}.dlq", expected=dead, timeout=90)
        out = read_all(bootstrap, env["LOCKGATE_OUTPUT_TOPIC"], expected=outputs, idle=2)
    finally:
        code = app.terminate()
    log = app.log_text()
    assert code == 0, log[-3000:]
    assert len(dlq) == dead, log[-3000:]
    return dlq, out, log
