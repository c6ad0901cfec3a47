"""Invariant 4: a paused (SIGSTOP) instance whose partitions moved commits nothing."""

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
        wait_until(lambda: "assigned" in fleet.procs["z2"].log_text(), 60, what="z2 assignment")
        time.sleep(4)
        zombie = fleet.procs["z1"]
        zombie.signal(signal.SIGSTOP)
        # z2 takes every key group once z1's session times out.
        wait_until(lambda: fleet.procs["z2"].log_text().count("assigned") >= 2, 90, what="takeover")
        time.sleep(3)
        zombie.signal(signal.SIGCONT)
        feeder.join(120)
        assert feeder.error is None
        outputs = read_all(kafka_bootstrap, out, expected=len(feeder.produced), timeout=180, idle=5)
        problems = check(model(read_inputs(kafka_bootstrap, inp, len(feeder.produced))), outputs)
        if not zombie.alive:  # a fenced zombie may exit non-zero: the orchestrator restarts it
            fleet.start("z1")
        codes = fleet.stop_all()
    except BaseException:
        print(fleet.logs())
        raise
    zlog = fleet.procs["z1"].log_text() if fleet.procs["z1"] is zombie else zombie.log_text()
    assert problems == [], "\n".join(problems[:20]) + fleet.logs()
    assert any(s in zlog for s in ("partitions lost", "aborting epoch", "fatal")), zlog[-4000:]
    assert codes["z2"] == 0, fleet.logs()
