"""The Iceberg sink with its warehouse on an S3 API server, through an outage of that store.

examples/iceberg_sink.py runs against the real broker, a pyiceberg SQL catalog on SQLite
and a warehouse ``s3://<bucket>/warehouse`` on a SeaweedFS server
(tests/support/s3_server.py: a real S3-compatible object store on loopback, its data in
volume files that survive the outage). The app reaches it as it would
any S3-compatible store: the endpoint, region and path-style addressing in the catalog's
properties (``LOCKGATE_ICEBERG_S3_*``), the credentials only in pyiceberg's environment
configuration (``PYICEBERG_CATALOG__DEFAULT__S3__*``), never in the declaration.

Mid-run the S3 server stops listening (every request refused) for twice the Kafka
transaction timeout (and, in the long variant, for 45 s: more aborted epochs in a row than
the replay-loop limit, so the sink's back-off must keep the instance up) while the second
half of the input arrives, then listens again with the same data. The epochs meeting the
outage abort and replay (or an append after its Kafka commit stays pending); the instance
must neither exit nor log the secret key, and afterwards the table must equal the model of
the stored input: every event once with its running total, no prepare marker and no data
file outside the table left (tests/support/iceberg_model.py, the checker of the
local-warehouse tests).
"""

from __future__ import annotations

import re
import time
from pathlib import Path

from examples.iceberg_sink import S3_ENDPOINT_ENV, TABLE_ENV, URI_ENV, WAREHOUSE_ENV
from tests.support.iceberg_model import Warehouse, check_table
from tests.support.kafka import create_topic, produce_numbers, read_inputs, unique
from tests.support.procs import AppProcess
from tests.support.s3_server import ACCESS_KEY, SECRET_KEY, S3Server

RECORDS = 2000
KEYS = 40
TXN_TIMEOUT_MS = 4000
#: The file store's outage: twice the transaction timeout.
OUTAGE_S = TXN_TIMEOUT_MS / 1000 * 2
#: A long outage: more sink aborts in a row than the replay-loop limit (10) would allow
#: without the back-off (the instance used to exit after 30-50 s of outage).
LONG_OUTAGE_S = 45.0


def _inputs(start: int, n: int) -> list[tuple[str, int, int]]:
    return [(f"k{(s * 13) % KEYS}", (s * 7) % 11, s) for s in range(start, start + n)]


def test_iceberg_sink_on_s3_exactly_once_through_a_file_store_outage(
    kafka_bootstrap: str, tmp_path: Path
) -> None:
    _through_an_outage(kafka_bootstrap, tmp_path, OUTAGE_S)


def test_iceberg_sink_on_s3_stays_up_through_a_long_file_store_outage(
    kafka_bootstrap: str, tmp_path: Path
) -> None:
    """Longer than ten aborted epochs: the instance backs off and stays up (no crash loop)."""
    log = _through_an_outage(kafka_bootstrap, tmp_path, LONG_OUTAGE_S)
    waits = re.findall(r"a sink could not take the epoch: waiting before the replay", log)
    assert waits, log[-6000:]
    print(f"{len(waits)} back-offs during the {LONG_OUTAGE_S:.0f} s outage")


def _through_an_outage(kafka_bootstrap: str, tmp_path: Path, outage_s: float) -> str:
    """Run the example through an outage of ``outage_s``; check it; return its log."""
    inp, app = unique("ices3-in"), unique("ices3-sums")
    table = "lockgate." + app.replace("-", "_")
    create_topic(kafka_bootstrap, inp, 3)
    s3 = S3Server(tmp_path / "s3-server.log")
    proc: AppProcess | None = None
    try:
        wh = Warehouse(tmp_path / "iceberg", s3, bucket="lakehouse")
        wh.create(table)
        assert wh.properties["warehouse"] == "s3://lakehouse/warehouse"
        produce_numbers(kafka_bootstrap, inp, _inputs(0, RECORDS // 2))
        env = {
            "LOCKGATE_BOOTSTRAP_SERVERS": kafka_bootstrap,
            "LOCKGATE_APP_NAME": app,
            "LOCKGATE_INPUT_TOPIC": inp,
            "LOCKGATE_STATE_DIR": str(tmp_path / "state"),
            "LOCKGATE_INSTANCE_ID": "ices3",
            "LOCKGATE_CHECKPOINT_INTERVAL_MS": "200",
            "LOCKGATE_CONSUME_BATCH_SIZE": "100",
            "LOCKGATE_TRANSACTION_TIMEOUT_MS": str(TXN_TIMEOUT_MS),
            URI_ENV: wh.properties["uri"],
            WAREHOUSE_ENV: wh.properties["warehouse"],
            TABLE_ENV: table,
            S3_ENDPOINT_ENV: s3.endpoint,
            # The credentials: pyiceberg's environment configuration of the catalog only.
            "PYICEBERG_CATALOG__DEFAULT__S3__ACCESS_KEY_ID": ACCESS_KEY,
            "PYICEBERG_CATALOG__DEFAULT__S3__SECRET_ACCESS_KEY": SECRET_KEY,
        }
        proc = AppProcess("examples.iceberg_sink:app", env, tmp_path / "ices3.log").start()
        started = time.monotonic()
        deadline = time.monotonic() + 90
        while wh.count(table) < RECORDS // 2 and time.monotonic() < deadline:
            time.sleep(0.3)
        assert wh.count(table) == RECORDS // 2, proc.log_text()[-6000:]
        # The outage: the second half arrives, in steps, while the store refuses everything.
        log_before = len(proc.log_text())
        s3.stop()
        outage_started = time.monotonic()
        step = RECORDS // 2 // 10
        for i in range(10):
            produce_numbers(kafka_bootstrap, inp, _inputs(RECORDS // 2 + i * step, step))
            time.sleep(outage_s / 10)
        assert proc.alive, proc.log_text()[-6000:]  # the outage does not stop the instance
        s3.start()
        outage_s = time.monotonic() - outage_started
        during = proc.log_text()[log_before:]
        # The back-off after the outage is at most 10 s; then the checker says what is missing.
        deadline = time.monotonic() + 90
        while wh.count(table) < RECORDS and time.monotonic() < deadline:
            time.sleep(0.3)
        recovered_s = time.monotonic() - outage_started
        time.sleep(1.0)  # anything written twice would show by now
        problems = check_table(wh, table, read_inputs(kafka_bootstrap, inp, RECORDS))
        code = proc.terminate(60)
        log = proc.log_text()
        snapshots = len(wh.catalog().load_table(table).metadata.snapshots)
    except BaseException:
        if proc is not None:
            print(proc.log_text()[-6000:])
            if proc.alive:
                proc.kill9()
        raise
    finally:
        s3.close()
    aborts = len(re.findall(r"aborting epoch", during))
    sink_aborts = len(re.findall(r"aborting epoch.*iceberg sink 'events'", during))
    pending = during.count("commit left pending")
    print(
        f"{RECORDS} inputs in {time.monotonic() - started:.1f} s, {snapshots} snapshots; "
        f"store down {outage_s:.1f} s, table complete {recovered_s:.1f} s after the outage "
        f"began; during it {aborts} aborted epochs ({sink_aborts} by the sink), "
        f"{pending} appends left pending"
    )
    assert problems == [], "\n".join(problems) + "\n" + log[-6000:]
    # The outage was met (an epoch aborted by the sink, or an append after the Kafka commit
    # left pending), the errors stayed bounded (no replay loop: the instance never exited),
    # and the secret key was never logged.
    assert sink_aborts or pending, during[-6000:]
    assert "outlived its timeout" not in log, log[-6000:]
    assert "epochs aborted in a row" not in log, log[-6000:]
    assert SECRET_KEY not in log
    assert "iceberg sink: table loaded" in log and "s3://lakehouse/warehouse" in log, log[:6000]
    assert code == 0, log[-6000:]
    return log
