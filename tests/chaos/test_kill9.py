"""Invariant 1: exactly-once per hop under kill -9 at random moments.

Two instances of examples/running_sum.py share a 6-partition topic while inputs
keep arriving. Instances are killed with SIGKILL at random moments (mid-epoch,
mid-commit, right after a restart while restoring), sometimes losing their local
state dir too, and restarted. At the end the committed output (read_committed)
must equal the independent model: per key exactly the prefix sums in seq order.
"""

from __future__ import annotations

import os
import random
import time
from pathlib import Path

from tests.chaos._harness import Fleet, InputFeeder, chaos_env
from tests.support.checker import check, model
from tests.support.kafka import create_topic, read_all, read_inputs, unique

KILLS = int(os.environ.get("LOCKGATE_CHAOS_KILLS", "8"))


def test_random_kill9_never_loses_or_duplicates(kafka_bootstrap: str, tmp_path: Path) -> None:
    rng = random.Random(int(os.environ.get("LOCKGATE_CHAOS_SEED", str(time.time_ns()))))
    inp, out, app = unique("chaos-in"), unique("chaos-out"), unique("chaos-sum")
    create_topic(kafka_bootstrap, inp, 6)
    total = max(6000, KILLS * 500)
    feeder = InputFeeder(
        kafka_bootstrap, inp, total=total, rate=total / (KILLS * 2.5 + 10), keys=60
    )
    fleet = Fleet(
        "examples.running_sum:app",
        chaos_env(kafka_bootstrap, app, inp, out),
        tmp_path,
        ["i1", "i2"],
    )
    fleet.start_all()
    feeder.start()
    kills = 0
    wipes = 0
    try:
        while kills < KILLS:
            time.sleep(rng.uniform(0.3, 3.0))
            victim = rng.choice(fleet.ids)
            proc = fleet.procs[victim]
            proc.kill9()
            kills += 1
            wipe = rng.random() < 0.25
            wipes += wipe
            time.sleep(rng.uniform(0.0, 1.0))
            fleet.start(victim, wipe_state=wipe)
            if rng.random() < 0.3:  # kill again soon: lands in start-up/restore
                time.sleep(rng.uniform(0.5, 2.5))
                fleet.procs[victim].kill9()
                kills += 1
                fleet.start(victim)
        feeder.join(300)
        assert feeder.error is None, feeder.error
        expected = model(read_inputs(kafka_bootstrap, inp, len(feeder.produced)))
        outputs = read_all(kafka_bootstrap, out, expected=len(feeder.produced), timeout=180, idle=3)
        problems = check(expected, outputs)
        codes = fleet.stop_all()
    except BaseException:
        print(fleet.logs())
        raise
    print(
        f"chaos: {kills} kills ({wipes} with state wiped), {len(feeder.produced)} inputs, "
        f"{len(outputs)} outputs, {fleet.starts} starts"
    )
    assert problems == [], "\n".join(problems[:20]) + "\n" + fleet.logs()
    assert codes == {"i1": 0, "i2": 0}, fleet.logs()
