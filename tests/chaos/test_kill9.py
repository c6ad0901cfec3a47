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
from collections import defaultdict
from pathlib import Path
from typing import Any

import orjson

from tests.chaos._harness import Fleet, InputFeeder, chaos_env, chaos_seed, stop_feeding_soon
from tests.support.checker import check, model
from tests.support.kafka import create_topic, read_all, read_inputs, unique

KILLS = int(os.environ.get("LOCKGATE_CHAOS_KILLS", "8"))


def test_random_kill9_never_loses_or_duplicates(kafka_bootstrap: str, tmp_path: Path) -> None:
    seed = chaos_seed()
    rng = random.Random(seed)
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
        stop_feeding_soon(feeder)
        feeder.join(300)
        assert feeder.error is None, feeder.error
        expected = model(read_inputs(kafka_bootstrap, inp, len(feeder.produced)))
        outputs = read_all(kafka_bootstrap, out, expected=len(feeder.produced), timeout=180, idle=3)
        problems = check(expected, outputs)
        codes = fleet.stop_all()
    except BaseException:
        print(f"chaos seed: {seed}")
        print(fleet.logs())
        raise
    print(
        f"chaos seed {seed}: {kills} kills ({wipes} with state wiped), "
        f"{len(feeder.produced)} inputs, "
        f"{len(outputs)} outputs, {fleet.starts} starts"
    )
    assert problems == [], f"seed {seed}\n" + "\n".join(problems[:20]) + "\n" + fleet.logs()
    assert codes == {"i1": 0, "i2": 0}, f"seed {seed}\n" + fleet.logs()


def check_at_least_once(inputs: list[tuple[str, int, int]], messages: list[Any]) -> list[str]:
    """Check running_sum outputs under at-least-once against a replay model.

    Per key, inputs ``s_1, s_2, ...`` (partition order); outputs are read in order. Every
    output is ``state + v`` for a state the key really had: within a run of consecutive
    records (``s_i`` right after ``s_{i-1}``) the state is the previous output's; at a
    replay (any other step) the state comes from the changelog, which holds at least every
    committed record, so it counts at least the ``i - 1`` records before ``s_i`` and, when
    it counts exactly those, its sum is their sum. And no input is without an output.
    """
    order: dict[str, list[int]] = defaultdict(list)
    value: dict[int, int] = {}
    for key, v, seq in inputs:
        order[key].append(seq)
        value[seq] = v
    index = {seq: i for seqs in order.values() for i, seq in enumerate(seqs)}
    got: dict[str, list[dict[str, int]]] = defaultdict(list)
    for m in messages:
        got[m.key().decode()].append(orjson.loads(m.value()))
    problems = []
    for key, seqs in order.items():
        prefix = [0]
        for seq in seqs:
            prefix.append(prefix[-1] + value[seq])
        outs = got.get(key, [])
        missing = set(seqs) - {o["seq"] for o in outs}
        if missing:
            problems.append(f"key {key}: {len(missing)} inputs without output, e.g. {min(missing)}")
        prev: dict[str, int] | None = None
        for n, o in enumerate(outs):
            i = index.get(o["seq"])
            if i is None or seqs[i] != o["seq"]:
                problems.append(f"key {key}: output {n} names seq {o['seq']} of another key")
                break
            state_sum, state_count = o["sum"] - value[o["seq"]], o["count"] - 1
            follows = prev is not None and i > 0 and seqs[i - 1] == prev["seq"]
            if (
                follows
                and prev is not None
                and (state_sum, state_count) != (prev["sum"], prev["count"])
            ):
                problems.append(f"key {key}: output {n} {o} does not continue {prev}")
                break
            if not follows and (state_count < i or (state_count == i and state_sum != prefix[i])):
                problems.append(f"key {key}: output {n} {o} replays from a lost state")
                break
            prev = o
        if outs and outs[-1]["count"] < len(seqs):
            problems.append(f"key {key}: final count {outs[-1]['count']} < {len(seqs)} inputs")
    return problems


def test_at_least_once_under_kill9_loses_nothing(kafka_bootstrap: str, tmp_path: Path) -> None:
    seed = chaos_seed()
    rng = random.Random(seed)
    inp, out, app = unique("alo-in"), unique("alo-out"), unique("alo-sum")
    create_topic(kafka_bootstrap, inp, 4)
    kills = int(os.environ.get("LOCKGATE_CHAOS_ALO_KILLS", "4"))
    total = 4000
    feeder = InputFeeder(kafka_bootstrap, inp, total=total, rate=total / (kills * 2.0 + 6), keys=40)
    env = chaos_env(kafka_bootstrap, app, inp, out)
    env["LOCKGATE_GUARANTEE"] = "at_least_once"
    fleet = Fleet("examples.running_sum:app", env, tmp_path, ["a1", "a2"])
    fleet.start_all()
    feeder.start()
    try:
        for _ in range(kills):
            time.sleep(rng.uniform(0.5, 2.5))
            victim = rng.choice(fleet.ids)
            fleet.procs[victim].kill9()
            time.sleep(rng.uniform(0.0, 0.5))
            fleet.start(victim, wipe_state=rng.random() < 0.25)
        stop_feeding_soon(feeder)
        feeder.join(120)
        assert feeder.error is None, feeder.error
        stored = read_inputs(kafka_bootstrap, inp, len(feeder.produced))
        outputs = read_all(kafka_bootstrap, out, expected=len(stored), timeout=120, idle=3)
        problems = check_at_least_once(stored, outputs)
        codes = fleet.stop_all()
    except BaseException:
        print(f"chaos seed: {seed}")
        print(fleet.logs())
        raise
    print(f"alo chaos seed {seed}: {kills} kills, {len(stored)} inputs, {len(outputs)} outputs")
    assert problems == [], f"seed {seed}\n" + "\n".join(problems[:20]) + "\n" + fleet.logs()
    assert len(outputs) >= len(stored)
    assert codes == {"a1": 0, "a2": 0}, f"seed {seed}\n" + fleet.logs()
