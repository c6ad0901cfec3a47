"""State memory stays under the budget as key groups per process grow.

* The state layer alone (real RocksDB, the runtime's ``KeyGroup`` and ``RocksDBBackend``,
  epochs of reads, writes, commits and trims; ``benchmarks.memory.storage_peak`` in a
  fresh interpreter): 32 key groups holding about 115 MiB of state stay under a 256 MiB
  ``LOCKGATE_MEMORY_LIMIT_BYTES`` with the shared cache, write-buffer manager and
  read-cache budget; the old defaults (RocksDB's per database, 200k read-cache entries per
  key group) exceed it. The full sweep is ``python -m benchmarks.memory`` (docs/state.md).
* A running instance applies the budget to every key-group database it opens (RocksDB's
  own OPTIONS file of each database shows the memtable size and the cached index blocks).
"""

from __future__ import annotations

import random
import re
from pathlib import Path

from benchmarks.memory import storage_peak_in_child
from tests.support.kafka import create_topic, produce_numbers, read_all
from tests.support.procs import AppProcess

LIMIT_MIB = 256


def test_state_memory_stays_under_the_limit_with_many_key_groups() -> None:
    bounded = storage_peak_in_child("bounded", 32, 3500, 1024, LIMIT_MIB)
    baseline = storage_peak_in_child("baseline", 32, 3500, 1024, LIMIT_MIB)
    assert bounded < LIMIT_MIB, (bounded, baseline)
    assert baseline > LIMIT_MIB, (bounded, baseline)  # the old defaults grow with the state


def test_a_running_instance_opens_every_key_group_with_the_shared_budget(  # type: ignore[no-untyped-def]
    kafka_bootstrap: str, names, tmp_path: Path
) -> None:
    p = 8
    app_name = names("membudget")
    env = {
        "LOCKGATE_BOOTSTRAP_SERVERS": kafka_bootstrap,
        "LOCKGATE_APP_NAME": app_name,
        "LOCKGATE_INPUT_TOPIC": names("membudget-in"),
        "LOCKGATE_OUTPUT_TOPIC": names("membudget-out"),
        "LOCKGATE_STATE_DIR": str(tmp_path / "state"),
        "LOCKGATE_INSTANCE_ID": "i1",
        "LOCKGATE_CHECKPOINT_INTERVAL_MS": "300",
        "LOCKGATE_MEMORY_LIMIT_BYTES": str(LIMIT_MIB * 1024 * 1024),
    }
    create_topic(kafka_bootstrap, env["LOCKGATE_INPUT_TOPIC"], p)
    rng = random.Random(5)
    produce_numbers(
        kafka_bootstrap,
        env["LOCKGATE_INPUT_TOPIC"],
        [(f"key-{rng.randrange(200)}", rng.randrange(100), i) for i in range(400)],
    )
    app = AppProcess("examples.running_sum:app", env, tmp_path / "app.log").start()
    try:
        read_all(kafka_bootstrap, env["LOCKGATE_OUTPUT_TOPIC"], expected=400, idle=1)
    finally:
        code = app.terminate()
    log = app.log_text()
    assert code == 0, log[-3000:]
    # a quarter of the limit each for RocksDB and the read cache
    assert re.search(r"state memory .*limit_from=setting rocksdb_bytes=67108864", log), log
    assert "read_cache_bytes=67108864" in log
    for g in range(p):
        options = sorted((tmp_path / "state" / app_name / str(g)).glob("OPTIONS-*"))[-1]
        text = options.read_text()
        # every column family (default, totals, __meta): a 4 MiB memtable (an eighth of
        # the 32 MiB write-buffer manager, not RocksDB's 64 MiB), index blocks in the cache
        assert text.count("\n  write_buffer_size=4194304\n") == 3, text
        assert text.count("\n  cache_index_and_filter_blocks=true\n") == 3, text
