"""The Iceberg sink through a file store that hangs: requests accepted, never answered.

examples/iceberg_sink.py with its warehouse on a SeaweedFS server (a real S3-compatible
object store on loopback: tests/support/s3_server.py), reached only through Toxiproxy.
Mid-run the proxy black-holes every connection to the store, both ways, keeping them open
(toxiproxy's ``timeout`` toxic with 0: data is held, not dropped, until the toxic goes) for
twice the Kafka transaction timeout while the second half of the input arrives; then the
toxic is removed. Unlike a refused connection (tests/integration/test_iceberg_sink_s3.py), a
hang leaves the sink's worker thread blocked in a pyarrow S3 call (until the AWS SDK's
request timeout), so the epoch's bound, not an error, ends each attempt; held requests may
still reach the store after the sink gave up on them. The instance must not exit; afterwards
the table must equal the model of the stored input (tests/support/iceberg_model.py): every
event once, no prepare marker and no data file outside the table left."""

from __future__ import annotations

import re
import time
from pathlib import Path

from examples.iceberg_sink import S3_ENDPOINT_ENV, TABLE_ENV, URI_ENV, WAREHOUSE_ENV
from tests.support.iceberg_model import Warehouse, check_table
from tests.support.kafka import create_topic, produce_numbers, read_inputs, unique
from tests.support.ports import free_port
from tests.support.procs import AppProcess
from tests.support.s3_server import ACCESS_KEY, SECRET_KEY, S3Server
from tests.support.toxiproxy import ToxiproxyServer

RECORDS = 2000
KEYS = 40
TXN_TIMEOUT_MS = 4000
#: The hang: twice the transaction timeout.
HANG_S = TXN_TIMEOUT_MS / 1000 * 2


def _inputs(start: int, n: int) -> list[tuple[str, int, int]]:
    return [(f"k{(s * 13) % KEYS}", (s * 7) % 11, s) for s in range(start, start + n)]


def test_iceberg_sink_exact_through_a_hanging_file_store(
    kafka_bootstrap: str, tmp_path: Path
) -> None:
    inp, app = unique("iceh-in"), unique("iceh-sums")
    table = "lockgate." + app.replace("-", "_")
    create_topic(kafka_bootstrap, inp, 3)
    s3 = S3Server(tmp_path / "s3-server.log")
    toxiproxy = ToxiproxyServer(tmp_path / "toxiproxy.log").start()  # builds it on first use
    proc: AppProcess | None = None
    try:
        listen = f"127.0.0.1:{free_port()}"
        proxy = toxiproxy.api.create_proxy("s3", listen, f"127.0.0.1:{s3.port}")
        wh = Warehouse(tmp_path / "iceberg", s3, bucket="lakehouse")
        wh.create(table)
        produce_numbers(kafka_bootstrap, inp, _inputs(0, RECORDS // 2))
        env = {
            "LOCKGATE_BOOTSTRAP_SERVERS": kafka_bootstrap,
            "LOCKGATE_APP_NAME": app,
            "LOCKGATE_INPUT_TOPIC": inp,
            "LOCKGATE_STATE_DIR": str(tmp_path / "state"),
            "LOCKGATE_INSTANCE_ID": "iceh",
            "LOCKGATE_CHECKPOINT_INTERVAL_MS": "200",
            "LOCKGATE_CONSUME_BATCH_SIZE": "100",
            "LOCKGATE_TRANSACTION_TIMEOUT_MS": str(TXN_TIMEOUT_MS),
            URI_ENV: wh.properties["uri"],
            WAREHOUSE_ENV: wh.properties["warehouse"],
            TABLE_ENV: table,
            S3_ENDPOINT_ENV: f"http://{listen}",  # the app reaches the store through the proxy
            "PYICEBERG_CATALOG__DEFAULT__S3__ACCESS_KEY_ID": ACCESS_KEY,
            "PYICEBERG_CATALOG__DEFAULT__S3__SECRET_ACCESS_KEY": SECRET_KEY,
        }
        proc = AppProcess("examples.iceberg_sink:app", env, tmp_path / "iceh.log").start()
        started = time.monotonic()
        deadline = time.monotonic() + 90
        while wh.count(table) < RECORDS // 2 and time.monotonic() < deadline:
            time.sleep(0.3)
        assert wh.count(table) == RECORDS // 2, proc.log_text()[-6000:]
        log_before = len(proc.log_text())
        names = proxy.timeout(0)  # every connection silent and open, data held
        hang_started = time.monotonic()
        step = RECORDS // 2 // 10
        for i in range(10):
            produce_numbers(kafka_bootstrap, inp, _inputs(RECORDS // 2 + i * step, step))
            time.sleep(HANG_S / 10)
        assert proc.alive, proc.log_text()[-6000:]  # the hang does not stop the instance
        for name in names:
            proxy.remove_toxic(name)
        hang_s = time.monotonic() - hang_started
        deadline = time.monotonic() + 120  # then the checker says what is missing
        while wh.count(table) < RECORDS and time.monotonic() < deadline:
            time.sleep(0.3)
        recovered_s = time.monotonic() - hang_started
        # Every marker settled: a held write landing after its rollback would show here.
        while wh.markers(table) and time.monotonic() < deadline:
            time.sleep(0.5)
        time.sleep(1.0)  # anything written twice would show by now
        problems = check_table(wh, table, read_inputs(kafka_bootstrap, inp, RECORDS))
        code = proc.terminate(60)
        log = proc.log_text()
        during = log[log_before:]
    except BaseException:
        if proc is not None:
            print(proc.log_text()[-6000:])
            if proc.alive:
                proc.kill9()
        raise
    finally:
        toxiproxy.stop()
        s3.close()
    aborts = len(re.findall(r"aborting epoch", during))
    sink_aborts = len(re.findall(r"aborting epoch.*iceberg sink 'events'", during))
    pending = len(re.findall(r"iceberg sink: \w+ left pending", during))
    print(
        f"{RECORDS} inputs in {time.monotonic() - started:.1f} s; store hung {hang_s:.1f} s, "
        f"table complete {recovered_s:.1f} s after the hang began; {aborts} aborted epochs "
        f"({sink_aborts} by the sink), {pending} sink calls left pending"
    )
    assert problems == [], "\n".join(problems) + "\n" + log[-6000:]
    assert sink_aborts or pending, during[-6000:]
    assert "epochs aborted in a row" not in log, log[-6000:]
    assert SECRET_KEY not in log
    assert code == 0, log[-6000:]
