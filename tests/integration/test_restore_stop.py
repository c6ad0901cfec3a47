"""SIGTERM during a restore stops the instance promptly (exit 0), and the restore resumes.

Before: the restore loop ignored the stop flag (and could wait forever on an open
transaction while /livez said healthy).
"""

from __future__ import annotations

import time
from pathlib import Path

import orjson
from confluent_kafka import Producer

from tests.integration._util import http_get, metric
from tests.support.kafka import create_topic
from tests.support.ports import free_port
from tests.support.procs import AppProcess, wait_until

RECORDS = 600_000


def test_sigterm_during_restore_stops_promptly_and_the_restore_resumes(  # type: ignore[no-untyped-def]
    kafka_bootstrap: str, names, tmp_path: Path
) -> None:
    env = {
        "LOCKGATE_BOOTSTRAP_SERVERS": kafka_bootstrap,
        "LOCKGATE_APP_NAME": names("rst"),
        "LOCKGATE_INPUT_TOPIC": names("rst-in"),
        "LOCKGATE_OUTPUT_TOPIC": names("rst-out"),
        "LOCKGATE_STATE_DIR": str(tmp_path / "state"),
        "LOCKGATE_INSTANCE_ID": "i1",
        "LOCKGATE_RESTORE_BATCH_RECORDS": "5000",
    }
    create_topic(kafka_bootstrap, env["LOCKGATE_INPUT_TOPIC"], 1)
    changelog = f"{env['LOCKGATE_APP_NAME']}.totals.changelog"
    create_topic(kafka_bootstrap, changelog, 1, config={"cleanup.policy": "compact"})
    p = Producer({"bootstrap.servers": kafka_bootstrap, "linger.ms": 50})
    value = orjson.dumps([1, 1])
    for i in range(RECORDS):
        while True:
            try:
                p.produce(changelog, value, f"k{i}".encode(), partition=0)
                break
            except BufferError:
                p.poll(0.1)
    assert p.flush(60) == 0
    port = free_port()
    first = {**env, "LOCKGATE_HTTP_PORT": str(port)}
    app = AppProcess("examples.running_sum:app", first, tmp_path / "app.log").start()

    def restored_some() -> bool:
        status, body = http_get(port, "/metrics", timeout=1)
        # Progress is reported after each applied batch (LOCKGATE_RESTORE_BATCH_RECORDS).
        return status == 200 and (metric(body, "lockgate_restore_records_total") or 0) >= 5000

    wait_until(restored_some, 60, interval=0.02, what="the restore to start applying")
    sent = time.monotonic()
    code = app.terminate(30)
    took = time.monotonic() - sent
    log = app.log_text()
    assert "key group restored" not in log, "the restore finished before SIGTERM: make it bigger"
    assert code == 0, log[-3000:]
    assert took < 10, f"took {took:.1f}s to stop"
    # The part applied before the stop is kept: the next start resumes and completes.
    again = AppProcess("examples.running_sum:app", env, tmp_path / "app2.log").start()
    try:
        wait_until(lambda: "key group restored" in again.log_text(), 120, what="restore")
    finally:
        assert again.terminate(60) == 0
    restored = [ln for ln in again.log_text().splitlines() if "key group restored" in ln]
    count = int(restored[0].split("records=")[1].split()[0])
    assert 0 < count < RECORDS, restored[0]
    print(f"stopped {took:.2f}s after SIGTERM; the restart restored the remaining {count}")
