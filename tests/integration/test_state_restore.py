"""State backends and local databases that must be rebuilt from the changelog.

* ``LOCKGATE_STATE_BACKEND=memory``: exact output; a restart restores every key group from
  the changelog (nothing survives the process) and stays exact.
* A local RocksDB *ahead* of its changelog (the changelog topic was deleted and recreated)
  is wiped and rebuilt, not trusted.
* A local RocksDB *too old* (``updated_ms`` older than 80% of the changelog's
  ``delete.retention.ms``: compaction may have dropped tombstones since) is rebuilt.
"""

from __future__ import annotations

import random
import time
from pathlib import Path

from confluent_kafka.admin import AdminClient

from state.base.store import META_UPDATED_MS
from state.rocksdb.store import RocksDBKeyGroupStore
from tests.integration._util import log_records
from tests.support.checker import check, model
from tests.support.kafka import create_topic, produce_numbers, read_all, read_inputs
from tests.support.procs import AppProcess, wait_until

P = 2
REBUILD = "rebuilding it from the changelog"


def _env(bootstrap: str, names, tmp_path: Path, **extra: str) -> dict[str, str]:  # type: ignore[no-untyped-def]
    env = {
        "LOCKGATE_BOOTSTRAP_SERVERS": bootstrap,
        "LOCKGATE_APP_NAME": names("restore"),
        "LOCKGATE_INPUT_TOPIC": names("restore-in"),
        "LOCKGATE_OUTPUT_TOPIC": names("restore-out"),
        "LOCKGATE_STATE_DIR": str(tmp_path / "state"),
        "LOCKGATE_INSTANCE_ID": "i1",
        "LOCKGATE_CHECKPOINT_INTERVAL_MS": "300",
    }
    env.update(extra)
    return env


def _batch(n: int, seed: int, start: int) -> list[tuple[str, int, int]]:
    rng = random.Random(seed)
    return [(f"key-{rng.randrange(25)}", rng.randrange(-5, 60), start + i) for i in range(n)]


def _run(
    bootstrap: str, env: dict[str, str], log: Path, total: int, output: str | None = None
) -> tuple[int, str, list]:  # type: ignore[type-arg]
    """Run until ``total`` outputs are committed, SIGTERM; return (code, log, outputs)."""
    out_topic = output or env["LOCKGATE_OUTPUT_TOPIC"]
    app = AppProcess("examples.running_sum:app", env, log).start()
    try:
        wait_until(lambda: app.log_text().count("key group restored") >= P, 60, what="restore")
        out = read_all(bootstrap, out_topic, expected=total, idle=1.5)
    finally:
        code = app.terminate()
    return code, app.log_text(), out


def test_memory_backend_exact_and_restored_from_the_changelog(  # type: ignore[no-untyped-def]
    kafka_bootstrap: str, names, tmp_path: Path
) -> None:
    env = _env(kafka_bootstrap, names, tmp_path, LOCKGATE_STATE_BACKEND="memory")
    inp = env["LOCKGATE_INPUT_TOPIC"]
    create_topic(kafka_bootstrap, inp, P)
    first = _batch(800, 1, 0)
    produce_numbers(kafka_bootstrap, inp, first)
    code, log, out = _run(kafka_bootstrap, env, tmp_path / "a.log", 800)
    assert code == 0, log[-3000:]
    assert check(model(read_inputs(kafka_bootstrap, inp, 800)), out) == []
    assert sum(log_records(log, "key group restored")) == 0  # first run: nothing to restore
    assert not (tmp_path / "state").exists()  # nothing on disk

    second = _batch(800, 2, 800)
    produce_numbers(kafka_bootstrap, inp, second)
    code, log, out = _run(kafka_bootstrap, env, tmp_path / "b.log", 1600)
    assert code == 0, log[-3000:]
    # the running sums continue from the restored state: exact over both runs
    assert check(model(read_inputs(kafka_bootstrap, inp, 1600)), out) == [], log[-3000:]
    restored = log_records(log, "key group restored")
    assert len(restored) == P and sum(restored) >= 25, restored  # at least one per key


def test_local_state_ahead_of_a_recreated_changelog_is_rebuilt(  # type: ignore[no-untyped-def]
    kafka_bootstrap: str, names, tmp_path: Path
) -> None:
    # dynamic membership: the stopped instance leaves the group, so the group can be deleted
    env = _env(kafka_bootstrap, names, tmp_path, LOCKGATE_STATIC_MEMBERSHIP="false")
    inp, app_name = env["LOCKGATE_INPUT_TOPIC"], env["LOCKGATE_APP_NAME"]
    create_topic(kafka_bootstrap, inp, P)
    produce_numbers(kafka_bootstrap, inp, _batch(600, 3, 0))
    code, log, _ = _run(kafka_bootstrap, env, tmp_path / "a.log", 600)
    assert code == 0, log[-3000:]

    # The changelog and the group's offsets are gone (e.g. a reset); the local DB stays.
    admin = AdminClient({"bootstrap.servers": kafka_bootstrap})
    changelog = f"{app_name}.totals.changelog"
    for fut in admin.delete_topics([changelog]).values():
        fut.result(30)
    for fut in admin.delete_consumer_groups([app_name]).values():
        fut.result(30)
    deadline = time.monotonic() + 30
    while changelog in admin.list_topics(timeout=10).topics:
        assert time.monotonic() < deadline, "changelog deletion"
        time.sleep(0.2)

    # Everything is processed again into a new output: with the old local sums kept, every
    # running sum would start from the first run's totals.
    fresh_out = names("restore-out2")
    env2 = {**env, "LOCKGATE_OUTPUT_TOPIC": fresh_out}
    code, log, out = _run(kafka_bootstrap, env2, tmp_path / "b.log", 600)
    assert code == 0, log[-3000:]
    assert log.count(REBUILD) == P, log[-3000:]
    assert "local state is ahead of the changelog" in log
    assert check(model(read_inputs(kafka_bootstrap, inp, 600)), out) == [], log[-3000:]


def test_local_state_older_than_the_tombstone_retention_is_rebuilt(  # type: ignore[no-untyped-def]
    kafka_bootstrap: str, names, tmp_path: Path
) -> None:
    env = _env(kafka_bootstrap, names, tmp_path)
    inp, app_name = env["LOCKGATE_INPUT_TOPIC"], env["LOCKGATE_APP_NAME"]
    create_topic(kafka_bootstrap, inp, P)
    produce_numbers(kafka_bootstrap, inp, _batch(600, 4, 0))
    code, log, _ = _run(kafka_bootstrap, env, tmp_path / "a.log", 600)
    assert code == 0, log[-3000:]

    # While the app is stopped: the local DBs were last complete two days ago.
    two_days_ago = str(int(time.time() * 1000) - 2 * 24 * 3600 * 1000).encode()
    for g in range(P):
        db = RocksDBKeyGroupStore(tmp_path / "state" / app_name / str(g), g, ["totals"])
        try:
            assert db.get_meta(META_UPDATED_MS) is not None
            db.apply({}, {META_UPDATED_MS: two_days_ago})
        finally:
            db.close()

    produce_numbers(kafka_bootstrap, inp, _batch(600, 5, 600))
    code, log, out = _run(kafka_bootstrap, env, tmp_path / "b.log", 1200)
    assert code == 0, log[-3000:]
    assert log.count(REBUILD) == P, log[-3000:]
    assert "local state is older than the changelog's tombstone retention" in log
    restored = log_records(log, "key group restored")
    assert len(restored) == P and all(r > 0 for r in restored), restored  # really replayed
    assert check(model(read_inputs(kafka_bootstrap, inp, 1200)), out) == [], log[-3000:]
    # After the rebuild the local DB is fresh again: a third run replays nothing.
    code, log, _ = _run(kafka_bootstrap, env, tmp_path / "c.log", 1200)
    assert code == 0 and REBUILD not in log, log[-3000:]
    assert log_records(log, "key group restored") == [0] * P
