"""Slow user code (epochs cut short) through SIGTERM restarts and kill -9.

Issue: a cut-short epoch used to commit its changelog and outputs without the input
offsets of the partitions it handed back (``position()`` is INVALID right after a
``seek()``), so the next restart replayed records whose effects were already
committed. Reproduction from the issue: 4 ms per record, 1 s epochs, a 2 s
transaction timeout, 2 partitions, SIGTERM and restart every 2-4 s.
"""

from __future__ import annotations

import os
import random
import time
from pathlib import Path

from tests.chaos._harness import Fleet
from tests.support.checker import check, model
from tests.support.kafka import create_topic, produce_numbers, read_all, read_inputs, unique

RESTARTS = int(os.environ.get("LOCKGATE_CHAOS_SLOW_RESTARTS", "10"))


def test_slow_code_through_sigterm_and_kill9_is_exact(kafka_bootstrap: str, tmp_path: Path) -> None:
    seed = int(os.environ.get("LOCKGATE_CHAOS_SEED", str(time.time_ns() % 10**9)))
    print(f"chaos seed: {seed} (set LOCKGATE_CHAOS_SEED to repeat)")
    rng = random.Random(seed)
    inp, out, app = unique("slow-in"), unique("slow-out"), unique("slow-sum")
    create_topic(kafka_bootstrap, inp, 2)
    total = 5000
    inputs = [(f"key-{rng.randrange(30)}", rng.randrange(-5, 100), i) for i in range(total)]
    produce_numbers(kafka_bootstrap, inp, inputs)
    env = {
        "LOCKGATE_BOOTSTRAP_SERVERS": kafka_bootstrap,
        "LOCKGATE_APP_NAME": app,
        "LOCKGATE_INPUT_TOPIC": inp,
        "LOCKGATE_OUTPUT_TOPIC": out,
        "LOCKGATE_CHECKPOINT_INTERVAL_MS": "1000",
        "LOCKGATE_TRANSACTION_TIMEOUT_MS": "2000",
        "SLOW_APP_SLEEP_MS": "4",
    }
    fleet = Fleet("tests.integration.apps.slow:app", env, tmp_path, ["i1"])
    fleet.start_all()
    codes: list[int] = []
    kills = 0
    try:
        for n in range(RESTARTS):
            time.sleep(rng.uniform(2.0, 4.0))
            proc = fleet.procs["i1"]
            if n % 3 == 2:
                proc.kill9()
                kills += 1
            else:
                codes.append(proc.terminate(60))
            fleet.start("i1")
        outputs = read_all(kafka_bootstrap, out, expected=total, timeout=240, idle=5)
        codes.append(fleet.procs["i1"].terminate(60))
        stored = read_inputs(kafka_bootstrap, inp, total)
        problems = check(model(stored), outputs)
    except BaseException:
        print(fleet.logs())
        raise
    log = fleet.procs["i1"].log_text()
    print(f"slow chaos: {RESTARTS} restarts ({kills} kill -9), {len(outputs)} outputs")
    assert problems == [], f"{len(problems)} problems, e.g.\n" + "\n".join(problems[:10])
    assert codes == [0] * len(codes), (codes, fleet.logs())
    assert "epoch cut short" in log, "the test did not exercise cut-short epochs"
