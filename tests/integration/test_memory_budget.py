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

from benchmarks.memory import run_one, storage_peak_in_child
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


def test_a_whole_instance_catching_up_stays_under_its_memory_limit(kafka_bootstrap: str) -> None:
    """Peak RSS of one instance behind a backlog: 16 key groups, 128,000 x 1 KiB records.

    Besides the state layer, the consumer's prefetch (``MemoryPlan.fetch_config``) and the
    epoch size under a backlog (``MemoryPlan.epoch_bytes``) come from the limit. Before
    both, the same run peaked at 573-620 MiB against the 512 MiB limit.
    """
    limit_mib = 512
    result = run_one(kafka_bootstrap, 16, 8000, 1024, limit_mib)
    print(f"whole instance, 16 key groups, 128 MiB of state: peak RSS {result.peak_rss_mib} MiB")
    assert result.peak_rss_mib < limit_mib, result
