"""Invariant 4: a paused (SIGSTOP) instance whose partitions moved commits nothing.

The zombie is resumed only after its session (6 s) and its transaction timeout (10 s) have
passed, so its way back is deterministic (see the assertions at the end).
"""

from __future__ import annotations

import signal
import time
from pathlib import Path

from tests.chaos._harness import Fleet, InputFeeder, chaos_env
from tests.support.checker import check, model
from tests.support.kafka import create_topic, read_all, read_inputs, unique
from tests.support.procs import wait_until


def test_sigstopped_instance_cannot_commit_after_its_partitions_moved(
    kafka_bootstrap: str, tmp_path: Path
) -> None:
    inp, out, app = unique("zombie-in"), unique("zombie-out"), unique("zombie-sum")
    create_topic(kafka_bootstrap, inp, 4)
    env = chaos_env(kafka_bootstrap, app, inp, out)
    env["LOCKGATE_CHECKPOINT_INTERVAL_MS"] = "2000"  # the zombie holds an open epoch
    fleet = Fleet("examples.running_sum:app", env, tmp_path, ["z1", "z2"])
    fleet.start_all()
    feeder = InputFeeder(kafka_bootstrap, inp, total=6000, rate=300, keys=40)
    feeder.start()
    try:
        # Both hold key groups (a late joiner's two-round handover is over) before the
        # pause: z1 must own some when it is stopped.
        wait_until(
            lambda: all("assigned" in p.log_text() for p in fleet.procs.values()),
            60,
            what="z1 and z2 assignments",
        )
        time.sleep(4)
        zombie = fleet.procs["z1"]
        zombie.signal(signal.SIGSTOP)
        stopped_at = time.monotonic()
        base = fleet.procs["z2"].log_text().count("assigned")
        # z2 takes every key group once z1's session times out.
        wait_until(
            lambda: fleet.procs["z2"].log_text().count("assigned") > base, 90, what="takeover"
        )
        # Resume only once the coordinator has aborted the zombie's open transaction
        # (transaction timeout 10 s): what the zombie then meets is deterministic.
        time.sleep(max(3.0, 12.0 - (time.monotonic() - stopped_at)))
        resumed_at = len(zombie.log_text())  # before SIGCONT: its first lines come at once
        zombie.signal(signal.SIGCONT)
        feeder.join(120)
        assert feeder.error is None
        outputs = read_all(kafka_bootstrap, out, expected=len(feeder.produced), timeout=180, idle=5)
        problems = check(model(read_inputs(kafka_bootstrap, inp, len(feeder.produced))), outputs)

        def rejoined() -> bool:
            after = zombie.log_text()[resumed_at:]
            return "assigned" in after.split("partitions lost", 1)[-1] or not zombie.alive

        # The zombie's way back (loss, abort, new producer, rejoin) may take longer than
        # the others' catch-up on a loaded machine: waited for before the SIGTERM.
        wait_until(rejoined, 60, what="the zombie rejoining")
        zombie_survived = zombie.alive  # checked before SIGTERM: it must not have exited
        codes = fleet.stop_all()
    except BaseException:
        print(fleet.logs())
        for proc in fleet.procs.values():
            if proc.alive:
                proc.signal(signal.SIGCONT)
                proc.kill9()
        raise
    zlog = zombie.log_text()
    after = zlog[resumed_at:]
    assert problems == [], "\n".join(problems[:20]) + fleet.logs()
    # Exactly what the zombie meets, paused longer than its session (6 s) and its
    # transaction timeout (10 s): librdkafka finds its session expired and reports the
    # partitions lost; the runtime releases them and aborts the open epoch if it holds one
    # (then the abort is refused when the coordinator already aborted the transaction, and
    # the producer is replaced); the instance rejoins, gets key groups back, and keeps
    # running until SIGTERM, which it answers with exit 0. It never exits on its own.
    assert zombie_survived, after[-4000:]
    assert "partitions lost: aborting the open epoch" in after, after[-4000:]
    lost_at = after.index("partitions lost")
    assert "assigned" in after[lost_at:], after[-4000:]  # rejoined after the loss
    assert "stopping on a fatal error" not in zlog, after[-4000:]
    assert "instance ids must be unique" not in zlog
    assert codes == {"z1": 0, "z2": 0}, fleet.logs()
