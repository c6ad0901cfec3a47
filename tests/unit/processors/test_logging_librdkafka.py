"""librdkafka's log lines reach Python logging as structured records, not raw stderr."""

from __future__ import annotations

import json
import logging
import re
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

from processors._config.log_setup import LIBRDKAFKA_LOGGER, JsonFormatter, librdkafka_logger

ROOT = Path(__file__).resolve().parents[3]
RAW_LINE = re.compile(r"^%\d\|", re.MULTILINE)

# A producer pointed at a port where nothing listens: librdkafka logs "Connect to ...
# failed: Connection refused" (FAIL, syslog level 3) without any debug context.
_SCRIPT = textwrap.dedent(
    """
    import sys, time
    from confluent_kafka import Producer
    from processors._config.log_setup import configure, librdkafka_logger

    configure("INFO", "json")
    conf = {"bootstrap.servers": "127.0.0.1:1", "client.id": "probe-test"}
    if sys.argv[1] == "logger":
        conf["logger"] = librdkafka_logger("producer")
    p = Producer(conf)
    deadline = time.monotonic() + 2.5
    while time.monotonic() < deadline:
        p.poll(0.1)
    """
)


def _run(mode: str) -> str:
    proc = subprocess.run(
        [sys.executable, "-c", _SCRIPT, mode],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    assert proc.stdout == ""
    return proc.stderr


def test_real_producer_logs_arrive_as_json_not_raw_stderr() -> None:
    stderr = _run("logger")
    assert not RAW_LINE.search(stderr), f"raw librdkafka line on stderr:\n{stderr}"
    records = [json.loads(line) for line in stderr.splitlines() if line.strip()]
    refused = [
        r for r in records if r["logger"] == LIBRDKAFKA_LOGGER and "Connection refused" in r["msg"]
    ]
    assert refused, f"no connection-refused record in:\n{stderr}"
    r = refused[0]
    assert r["level"] == "error"
    assert r["facility"] == "FAIL"
    assert r["client"] == "producer"
    assert r["rdkafka_name"].startswith("probe-test#producer-")
    assert r["rdkafka_thread"].startswith("127.0.0.1:1/")
    assert not r["msg"].startswith("[thrd:")


def test_without_the_logger_librdkafka_writes_raw_lines() -> None:
    # The control case: shows the assertion above can fail.
    assert RAW_LINE.search(_run("plain"))


class _Capture(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


@pytest.fixture
def captured() -> Iterator[list[logging.LogRecord]]:
    parent = logging.getLogger(LIBRDKAFKA_LOGGER)
    handler = _Capture()
    old_level, old_propagate = parent.level, parent.propagate
    parent.addHandler(handler)
    parent.setLevel(logging.INFO)
    parent.propagate = False
    try:
        yield handler.records
    finally:
        parent.removeHandler(handler)
        parent.setLevel(old_level)
        parent.propagate = old_propagate


def _rdkafka_call(logger: logging.Logger, level: int, fac: str, buf: str) -> None:
    # Exactly how confluent-kafka's C log callback calls the logger.
    logger.log(level, "%s [%s] %s", fac, "app-producer#producer-1", buf)


def test_record_fields(captured: list[logging.LogRecord]) -> None:
    logger = librdkafka_logger("producer")
    assert isinstance(logger, logging.Logger)
    assert logger.name == LIBRDKAFKA_LOGGER
    _rdkafka_call(
        logger,
        logging.ERROR,
        "TXNERR",
        "[thrd:main]: Current transaction failed in state InTransaction: 100% broken",
    )
    (rec,) = captured
    assert rec.levelno == logging.ERROR
    assert rec.getMessage() == "Current transaction failed in state InTransaction: 100% broken"
    data = json.loads(JsonFormatter().format(rec))
    assert data["logger"] == "lockgate.librdkafka"
    assert data["level"] == "error"
    assert data["facility"] == "TXNERR"
    assert data["client"] == "producer"
    assert data["rdkafka_name"] == "app-producer#producer-1"
    assert data["rdkafka_thread"] == "main"


def test_line_without_thread_prefix_is_kept_whole(captured: list[logging.LogRecord]) -> None:
    _rdkafka_call(librdkafka_logger("admin"), logging.WARNING, "CONFWARN", "Configuration x")
    (rec,) = captured
    assert rec.getMessage() == "Configuration x"
    assert not hasattr(rec, "rdkafka_thread")
    assert rec.client == "admin"  # type: ignore[attr-defined]


def test_level_of_the_named_logger_applies_even_when_changed_later(
    captured: list[logging.LogRecord],
) -> None:
    logger = librdkafka_logger("consumer")
    _rdkafka_call(logger, logging.INFO, "CONSUMER", "seen")  # cached as enabled?
    logging.getLogger(LIBRDKAFKA_LOGGER).setLevel(logging.WARNING)
    _rdkafka_call(logger, logging.INFO, "CONSUMER", "dropped")
    _rdkafka_call(logger, logging.WARNING, "CONSUMER", "kept")
    assert [r.getMessage() for r in captured] == ["seen", "kept"]


def test_other_calls_pass_through(captured: list[logging.LogRecord]) -> None:
    librdkafka_logger("producer").log(logging.WARNING, "plain %d", 3)
    (rec,) = captured
    assert rec.getMessage() == "plain 3"
    assert not hasattr(rec, "facility")
