"""Fresh-volume failover from state snapshots (LOCKGATE_STATE_SNAPSHOT_DIR), real broker.

running_sum, two key groups, a snapshot at most every 5 s per key group. The first
instance processes 1200 records over 300 keys; an interval later a few records for both key
groups make each key group snapshot its whole state; then more input goes through (within
the interval: it only reaches the changelog) and the instance is killed with SIGKILL. Its
state directory is deleted (a pod on a new volume): the next instance downloads each key
group's snapshot and replays only the changelog after it, and the output stays exact. Then
every snapshot is broken (a missing file in one key group, unparsable manifests in the
other): the next fresh instance restores the whole changelog, exact again.
"""

from __future__ import annotations

import random
import shutil
import time
from pathlib import Path

from tests.support.checker import check, model
from tests.support.kafka import create_topic, produce_numbers, read_all, read_inputs
from tests.support.procs import AppProcess, wait_until

KEYS = 300  # the first batch touches every key; later batches a few of them
INTERVAL_MS = 5000


def _inputs(n: int, keys: list[str], seed: int, start_seq: int) -> list[tuple[str, int, int]]:
    rng = random.Random(seed)
    return [(rng.choice(keys), rng.randrange(-5, 100), start_seq + i) for i in range(n)]


def _restored_records(text: str) -> list[int]:
    return [
        int(line.split("records=")[1].split()[0])
        for line in text.splitlines()
        if "key group restored" in line
    ]


def test_fresh_volume_restores_from_snapshot_plus_tail_and_a_broken_one_from_the_changelog(  # type: ignore[no-untyped-def]
    kafka_bootstrap: str, names, tmp_path: Path
) -> None:
    snaps = tmp_path / "snapshots"
    env = {
        "LOCKGATE_BOOTSTRAP_SERVERS": kafka_bootstrap,
        "LOCKGATE_APP_NAME": names("snap-sum"),
        "LOCKGATE_INPUT_TOPIC": names("numbers"),
        "LOCKGATE_OUTPUT_TOPIC": names("sums"),
        "LOCKGATE_INSTANCE_ID": "i1",
        "LOCKGATE_CHECKPOINT_INTERVAL_MS": "200",
        "LOCKGATE_STATE_SNAPSHOT_DIR": str(snaps),
        "LOCKGATE_STATE_SNAPSHOT_INTERVAL_MS": str(INTERVAL_MS),
    }
    app_name, topic, out_topic = (
        env["LOCKGATE_APP_NAME"],
        env["LOCKGATE_INPUT_TOPIC"],
        env["LOCKGATE_OUTPUT_TOPIC"],
    )
    create_topic(kafka_bootstrap, topic, 2)
    all_keys = [f"key-{i}" for i in range(KEYS)]
    few = all_keys[:6]
    sent: list[tuple[str, int, int]] = []

    def produce(batch: list[tuple[str, int, int]]) -> None:
        produce_numbers(kafka_bootstrap, topic, batch)
        sent.extend(batch)

    def start(volume: str) -> AppProcess:
        run_env = {**env, "LOCKGATE_STATE_DIR": str(tmp_path / volume)}
        return AppProcess("examples.running_sum:app", run_env, tmp_path / f"{volume}.log").start()

    def run_until_caught_up(app: AppProcess) -> None:
        out = read_all(kafka_bootstrap, out_topic, expected=len(sent), idle=1.0)
        stored = read_inputs(kafka_bootstrap, topic, len(sent))
        assert check(model(stored), out) == [], app.log_text()[-3000:]

    # 1. snapshots of the whole state, more input after them, then kill -9
    produce(_inputs(KEYS * 4, all_keys, 1, 0))
    first = start("a")
    try:
        run_until_caught_up(first)
        time.sleep(INTERVAL_MS / 1000 + 0.5)  # the next commit with writes snapshots
        uploaded = first.log_text().count("state snapshot uploaded")
        produce(_inputs(20, all_keys[:20], 5, len(sent)))  # both key groups
        run_until_caught_up(first)
        wait_until(
            lambda: first.log_text().count("state snapshot uploaded") >= uploaded + 2,
            30,
            what="snapshots",
        )
        produce(_inputs(200, few, 2, len(sent)))  # the tail
        run_until_caught_up(first)
    finally:
        first.kill9()
    shutil.rmtree(tmp_path / "a")  # the pod comes back on a fresh volume

    # 2. fresh volume: each key group from its snapshot plus the changelog tail
    produce(_inputs(100, few, 3, len(sent)))
    second = start("b")
    try:
        run_until_caught_up(second)
    finally:
        assert second.terminate() == 0, second.log_text()[-3000:]
    text = second.log_text()
    assert text.count("key group state downloaded from a snapshot") == 2, text[-3000:]
    tails = _restored_records(text)
    assert len(tails) == 2, text[-3000:]
    # only the tail: the 6 keys' epochs after the snapshot, never the 300 keys' values
    assert 0 < sum(tails) < KEYS // 2, (tails, text[-3000:])

    # 3. every snapshot broken: a full changelog restore, exact
    groups = sorted(p.name for p in (snaps / app_name).iterdir())
    assert groups == ["0", "1"], groups
    broken_files = snaps / app_name / "0" / "objects"
    shutil.rmtree(broken_files)
    broken_files.mkdir()
    for manifest in (snaps / app_name / "1" / "manifests").iterdir():
        manifest.write_bytes(b'{"format": 1, "files": [')
    produce(_inputs(100, few, 4, len(sent)))
    third = start("c")
    try:
        run_until_caught_up(third)
    finally:
        assert third.terminate() == 0, third.log_text()[-3000:]
    text = third.log_text()
    assert "key group state downloaded from a snapshot" not in text, text[-3000:]
    assert "is missing" in text and "snapshot manifest unreadable" in text, text[-3000:]
    # the new owner's prune deleted the unparsable manifests (warned about once each)
    assert text.count("snapshot manifest unreadable") <= 2 * 2, text[-3000:]
    assert sum(_restored_records(text)) >= KEYS, text[-3000:]  # every key's latest value
