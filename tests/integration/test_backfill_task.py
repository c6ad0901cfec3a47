"""One backfill task (no Spark) against the real broker: the error paths, one by one.

* an output the producer can never write is dead-lettered, and a retried attempt (the first
  one killed mid-transaction) dead-letters the same step without running it, so it
  rebuilds the same state and writes each output once;
* a keyless output to a compacted topic dead-letters that record only;
* a range whose start retention deleted fails the task with the reason (never skips);
* state the store's codec cannot encode fails the task before the transaction commits;
* an output codec whose service is down (a schema registry) fails the task (Spark retries
  it), even when user code swallows the exception; nothing is dead-lettered;
* the input skips control records only (records with or without headers are read), and
  ``ctx.emit`` passes headers and a timestamp through.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import orjson
import pytest
from confluent_kafka import Producer, TopicPartition
from confluent_kafka.admin import AdminClient

from processors._checkpoint.protocol import CONTROL_TYPE
from processors._config.settings import Settings
from processors._spark.backfill_input import kafka_steps
from processors._spark.backfill_outputs import SinkFailed
from processors._spark.backfill_spec import Range, TaskSpec
from processors._spark.backfill_task import run_task
from processors.exceptions import ConfigError
from state.savepoint import SavepointStore, StoreFile, new_savepoint_id
from tests.support.kafka import create_topic, read_all

ROOT = Path(__file__).resolve().parents[2]
SPEC = "tests.integration.apps.backfill_app:app"


def setup(bootstrap: str, names: Any, values: list[dict[str, Any]], compact_out: bool = False):  # type: ignore[no-untyped-def]
    app, inp, out = names("bft"), names("bft-in"), names("bft-out")
    create_topic(bootstrap, inp, 1)
    create_topic(bootstrap, out, 1, {"cleanup.policy": "compact"} if compact_out else None)
    create_topic(bootstrap, f"{app}.dlq", 1)
    create_topic(bootstrap, f"{app}.backfill", 1, {"cleanup.policy": "compact"})
    p = Producer({"bootstrap.servers": bootstrap})
    for i, v in enumerate(values):
        p.produce(inp, orjson.dumps({"i": i, **v}), f"k{v.get('k', 0)}".encode(), partition=0)
    assert p.flush(10) == 0
    os.environ["LOCKGATE_TEST_BF_IN"], os.environ["LOCKGATE_TEST_BF_OUT"] = inp, out
    return app, inp, out


def spec_of(app: str, inp: str, n: int, sp: Path, job: str, every: int = 5) -> TaskSpec:
    return TaskSpec(
        job=job,
        app_spec=SPEC,
        app_name=app,
        key_group=0,
        key_groups=1,
        ranges=(Range(inp, 0, n),),
        savepoint_url=str(sp),
        progress_topic=f"{app}.backfill",
        commit_every=every,
    )


def totals(sp: Path, job: str, app: str) -> dict[bytes, bytes]:
    store = SavepointStore(str(sp))
    m = store.read_manifest(job, app, 0)
    return dict(store.read_store(job, app, 0, "totals", StoreFile.from_dict(m["stores"]["totals"])))


@pytest.fixture(autouse=True)
def _app_module() -> Any:
    sys.modules.pop("tests.integration.apps.backfill_app", None)  # re-read the topics
    yield
    sys.modules.pop("tests.integration.apps.backfill_app", None)


def test_rejected_output_and_a_killed_attempt_rebuild_the_same_state(
    kafka_bootstrap: str, names: Any, tmp_path: Path
) -> None:
    values = [{"v": 1, "pad": 2_000_000 if i == 2 else 0} for i in range(10)]
    app, inp, out = setup(kafka_bootstrap, names, values)
    settings = Settings(bootstrap_servers=kafka_bootstrap, app_name=app)
    job = new_savepoint_id()
    # Attempt 0 dies (os._exit) after step 8: steps 0-4 committed, 5-7 in the open transaction.
    code = (
        "import sys; from processors._spark.backfill_task import *; "
        "from processors._config.settings import Settings; from pathlib import Path; "
        "from tests.integration.test_backfill_task import spec_of; "
        f" run_task(Settings(bootstrap_servers={kafka_bootstrap!r}, app_name={app!r}), "
        f"spec_of({app!r}, {inp!r}, 10, Path({str(tmp_path)!r}), {job!r}), attempt=0)"
    )
    env = {**os.environ, "LOCKGATE_TEST_BACKFILL_CRASH": "0:8", "LOCKGATE_LOG_LEVEL": "ERROR"}
    dead = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, check=False)
    assert dead.returncode == 137
    result = run_task(settings, spec_of(app, inp, 10, tmp_path, job), attempt=1)
    assert (result.resumed_from, result.records, result.dead_letters) == (5, 10, 1)
    assert totals(tmp_path, job, app) == {b"k0": b"9"}  # the rejected record never counted
    outs = [orjson.loads(m.value()) for m in read_all(kafka_bootstrap, out, expected=9, idle=1)]
    assert [(o["i"], o["sum"]) for o in outs] == [(i, i + (i < 2)) for i in range(10) if i != 2]
    dlq = read_all(kafka_bootstrap, f"{app}.dlq", expected=1, idle=0.5)
    assert [orjson.loads(m.value())["i"] for m in dlq] == [2]


def test_keyless_output_to_a_compacted_topic_dead_letters_that_record(
    kafka_bootstrap: str, names: Any, tmp_path: Path
) -> None:
    values = [{"k": i, "nokey": i == 2} for i in range(30)]
    app, inp, out = setup(kafka_bootstrap, names, values, compact_out=True)
    settings = Settings(bootstrap_servers=kafka_bootstrap, app_name=app)
    result = run_task(settings, spec_of(app, inp, 30, tmp_path, new_savepoint_id(), every=30))
    assert result.dead_letters == 1
    outs = read_all(kafka_bootstrap, out, expected=29, idle=1)
    assert sorted(orjson.loads(m.value())["i"] for m in outs) == [i for i in range(30) if i != 2]
    dlq = read_all(kafka_bootstrap, f"{app}.dlq", expected=1, idle=0.5)
    assert [orjson.loads(m.value())["i"] for m in dlq] == [2]
    assert dict(dlq[0].headers())["lockgate-error-type"] == b"_OutputRejected"


def test_a_start_deleted_by_retention_fails_the_task(
    kafka_bootstrap: str, names: Any, tmp_path: Path
) -> None:
    app, inp, _ = setup(kafka_bootstrap, names, [{} for _ in range(100)])
    admin = AdminClient({"bootstrap.servers": kafka_bootstrap})
    admin.delete_records([TopicPartition(inp, 0, 40)])[TopicPartition(inp, 0, 40)].result(30)
    time.sleep(0.5)
    settings = Settings(bootstrap_servers=kafka_bootstrap, app_name=app)
    spec = spec_of(app, inp, 100, tmp_path, new_savepoint_id())
    with pytest.raises(RuntimeError, match="no longer in the log"):
        list(kafka_steps(settings, spec, (inp,)))


def test_unencodable_state_fails_before_the_outputs_commit(
    kafka_bootstrap: str, names: Any, tmp_path: Path
) -> None:
    app, inp, out = setup(kafka_bootstrap, names, [{"bad": i == 7} for i in range(10)])
    settings = Settings(bootstrap_servers=kafka_bootstrap, app_name=app)
    with pytest.raises(ConfigError, match="store 'totals' cannot be encoded"):
        run_task(settings, spec_of(app, inp, 10, tmp_path, new_savepoint_id()))
    outs = read_all(kafka_bootstrap, out, idle=0.5, timeout=5)
    assert [orjson.loads(m.value())["i"] for m in outs] == [0, 1, 2, 3, 4]  # the first chunk


def test_an_unavailable_output_codec_fails_the_task_and_dead_letters_nothing(
    kafka_bootstrap: str, names: Any, tmp_path: Path
) -> None:
    app, inp, out = setup(kafka_bootstrap, names, [{"outage": i == 7} for i in range(10)])
    settings = Settings(bootstrap_servers=kafka_bootstrap, app_name=app)
    with pytest.raises(SinkFailed, match="service is unavailable"):
        run_task(settings, spec_of(app, inp, 10, tmp_path, new_savepoint_id()))
    outs = read_all(kafka_bootstrap, out, idle=0.5, timeout=5)
    assert [orjson.loads(m.value())["i"] for m in outs] == [0, 1, 2, 3, 4]  # the first chunk
    assert read_all(kafka_bootstrap, f"{app}.dlq", idle=0.5, timeout=3) == []


def test_input_skips_control_records_only_and_emit_passes_headers(
    kafka_bootstrap: str, names: Any, tmp_path: Path
) -> None:
    app, inp, out = setup(kafka_bootstrap, names, [{"i": 0}])  # offset 0: no headers
    p = Producer({"bootstrap.servers": kafka_bootstrap})
    p.produce(inp, orjson.dumps({"i": 1}), b"k0", partition=0, headers=[("user", b"u")])
    p.produce(inp, b"", b"k0", partition=0, headers=[(CONTROL_TYPE, b"barrier")])
    p.produce(inp, orjson.dumps({"i": 3, "hdr": True}), b"k0", partition=0, timestamp=5_000)
    assert p.flush(10) == 0
    settings = Settings(bootstrap_servers=kafka_bootstrap, app_name=app)
    spec = spec_of(app, inp, 4, tmp_path, new_savepoint_id())
    steps = list(kafka_steps(settings, spec, (inp,)))
    assert [m.offset() for m in steps] == [0, 1, 3]  # the control record (2) is skipped
    assert steps[1].headers() == [("user", b"u")]
    result = run_task(settings, spec)
    assert (result.records, result.dead_letters) == (3, 0)
    outs = read_all(kafka_bootstrap, out, expected=3, idle=1)
    assert [orjson.loads(m.value())["i"] for m in outs] == [0, 1, 3]
    assert [m.headers() for m in outs] == [None, None, [("h", b"x")]]
    assert outs[2].timestamp()[1] == 5_001
