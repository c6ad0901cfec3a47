"""Exactly-once when the process dies inside the commit sequence and mid-restore.

Random kill -9 rarely lands in the few milliseconds of a commit. Here the instances
SIGKILL themselves at the protocol's hardest points (processors/_kafka/faults.py):
after producing changelog/outputs but before sending offsets, after sending offsets but
before committing, after committing but before writing RocksDB, and between restore
batches. A supervisor restarts whatever died, like Kubernetes does. The committed output
must still equal the independent model.
"""

from __future__ import annotations

import os
import random
import time
from pathlib import Path

from tests.chaos._harness import Fleet, InputFeeder, chaos_env
from tests.support.checker import check, model
from tests.support.kafka import create_topic, read_all, read_inputs, unique

POINTS = "before_send_offsets:0.08,before_commit:0.08,after_commit:0.1,mid_restore:0.1"
MIN_CRASHES = int(os.environ.get("LOCKGATE_CHAOS_MIN_CRASHES", "6"))


def test_crashes_inside_the_commit_sequence_and_restore(
    kafka_bootstrap: str, tmp_path: Path
) -> None:
    seed = int(os.environ.get("LOCKGATE_CHAOS_SEED", str(time.time_ns() % 10**9)))
    print(f"chaos seed: {seed} (set LOCKGATE_CHAOS_SEED={seed} to repeat)")
    rng = random.Random(seed)
    inp, out, app = unique("crash-in"), unique("crash-out"), unique("crash-sum")
    create_topic(kafka_bootstrap, inp, 4)
    env = chaos_env(kafka_bootstrap, app, inp, out)
    # The crash decisions are made inside the instances (processors/_kafka/faults.py draws from
    # the global ``random``): a sitecustomize seeds it per start from the chaos seed.
    seeded = tmp_path / "seeded"
    seeded.mkdir()
    (seeded / "sitecustomize.py").write_text(
        "import os, random\n"
        "if os.environ.get('CHAOS_PROCESS_SEED'):\n"
        "    random.seed(os.environ['CHAOS_PROCESS_SEED'])\n"
    )
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(seeded), os.environ.get("PYTHONPATH")]))
    env["LOCKGATE_TEST_CRASH_POINTS"] = POINTS
    env["LOCKGATE_RESTORE_BATCH_RECORDS"] = "25"
    env["LOCKGATE_CHECKPOINT_INTERVAL_MS"] = "150"
    # Input flows at least 30 s and until MIN_CRASHES crashes happened: a restart after a
    # crash before the commit can take ~10 s (the new producer's init_transactions waits
    # for the old transaction's abort), and a fixed 20 s of input gave only 5 crashes once.
    limit_s = max(300, 40 * MIN_CRASHES)
    feeder = InputFeeder(kafka_bootstrap, inp, total=400 * (limit_s + 60), rate=400, keys=400)
    fleet = Fleet("examples.running_sum:app", env, tmp_path, ["c1", "c2"])
    for iid in fleet.ids:
        fleet.env["CHAOS_PROCESS_SEED"] = str(rng.getrandbits(64))
        fleet.start(iid)
    feeder.start()
    crashes: dict[str, int] = {}
    started = time.monotonic()
    deadline = started + limit_s
    try:
        while feeder.is_alive():
            now = time.monotonic()
            assert now < deadline, f"only {crashes} after {now - started:.0f} s"
            if sum(crashes.values()) >= MIN_CRASHES and now - started >= 30:
                feeder.stop()
                feeder.join(60)
                break
            time.sleep(0.3)
            for iid in fleet.ids:
                proc = fleet.procs[iid]
                if not proc.alive:
                    code = proc.wait(1)
                    assert code == -9, proc.log_text()[-3000:]
                    point = proc.log_text().rsplit("crash point ", 1)[-1].split(":", 1)[0]
                    crashes[point] = crashes.get(point, 0) + 1
                    fleet.env["CHAOS_PROCESS_SEED"] = str(rng.getrandbits(64))
                    fleet.start(iid)
        assert feeder.error is None, feeder.error
        # stop injecting: restart everyone without crash points and let it finish
        fleet.env = {k: v for k, v in env.items() if k != "LOCKGATE_TEST_CRASH_POINTS"}
        for iid in fleet.ids:
            fleet.procs[iid].kill9()
            fleet.start(iid)
        outputs = read_all(kafka_bootstrap, out, expected=len(feeder.produced), timeout=240, idle=3)
        problems = check(model(read_inputs(kafka_bootstrap, inp, len(feeder.produced))), outputs)
        codes = fleet.stop_all()
    except BaseException:
        print(f"chaos seed: {seed}")
        print(fleet.logs())
        for proc in fleet.procs.values():
            if proc.alive:
                proc.kill9()
        raise
    finally:
        feeder.stop()
    print(f"chaos seed {seed}: crash points hit: {crashes}")
    print(f"{len(feeder.produced)} inputs, {len(outputs)} outputs")
    assert problems == [], f"seed {seed}\n" + "\n".join(problems[:20]) + fleet.logs()
    assert sum(crashes.values()) >= MIN_CRASHES, f"seed {seed}: only {crashes}"
    assert codes == {"c1": 0, "c2": 0}, fleet.logs()
