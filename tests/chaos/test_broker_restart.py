"""A broker restart (clean stop, then kill -9) while input flows.

Issue: one instance hung in ``send_offsets_to_transaction`` retries for minutes (its
open transaction pinned the outputs' last stable offset and SIGTERM was ignored); the
other exited 1 on ``list_offsets: FENCED_LEADER_EPOCH`` with the "instance id used
twice" hint. Now every blocking call is bounded by the transaction timeout, leader-epoch
and coordinator errors are retried, and every instance must end with a clean SIGTERM
(exit 0) and an exact committed output.

This test runs its own broker (the session broker is shared by other tests).
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

from tests.chaos._harness import Fleet, InputFeeder, chaos_env, stop_feeding_soon
from tests.conftest import BROKER, _free_port_pair
from tests.support.checker import check, model
from tests.support.kafka import create_topic, read_all, read_inputs, unique
from tests.support.procs import wait_until


class Broker:
    """A private broker started and stopped with docker/kafka/broker.sh."""

    def __init__(self, data_dir: Path) -> None:
        self.port = _free_port_pair()
        self.data_dir = data_dir
        self.env = {
            **os.environ,
            "LOCKGATE_KAFKA_PORT": str(self.port),
            "LOCKGATE_KAFKA_CONTROLLER_PORT": str(self.port + 1),
            "LOCKGATE_KAFKA_DATA_DIR": str(data_dir),
            "LOCKGATE_KAFKA_PYTHON": sys.executable,
            # A JVM start after a kill -9 (log recovery) on a loaded machine can be slow.
            "LOCKGATE_KAFKA_READY_TIMEOUT": "240",
        }
        self.bootstrap = f"127.0.0.1:{self.port}"

    def up(self, fresh: bool = False) -> None:
        args = [str(BROKER), "up"] + (["--fresh"] if fresh else [])
        subprocess.run(args, env=self.env, check=True, stdout=subprocess.DEVNULL)

    def down(self) -> None:
        subprocess.run([str(BROKER), "down"], env=self.env, check=False)

    def kill9(self) -> None:
        pid = int((self.data_dir / "broker.pid").read_text().strip())
        os.kill(pid, signal.SIGKILL)
        for _ in range(100):
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                return
            time.sleep(0.1)


def test_broker_restarts_while_input_flows(tmp_path: Path) -> None:
    seed = int(os.environ.get("LOCKGATE_CHAOS_SEED", str(time.time_ns() % 10**9)))
    print(f"chaos seed: {seed} (set LOCKGATE_CHAOS_SEED to repeat)")
    rng = random.Random(seed)
    broker = Broker(tmp_path / "kafka")
    broker.up(fresh=True)
    bootstrap = broker.bootstrap
    fleet: Fleet | None = None
    feeder: InputFeeder | None = None
    try:
        inp, out, app = unique("brk-in"), unique("brk-out"), unique("brk-sum")
        create_topic(bootstrap, inp, 4)
        env = chaos_env(bootstrap, app, inp, out)
        env["LOCKGATE_CHECKPOINT_INTERVAL_MS"] = "500"
        env["LOCKGATE_TRANSACTION_TIMEOUT_MS"] = "15000"
        fleet = Fleet("examples.running_sum:app", env, tmp_path, ["i1", "i2"])
        fleet.start_all()
        # Input flows through every restart however long start-up and the broker's starts
        # take: stopped a few seconds after the last one (the total only bounds a runaway).
        feeder = InputFeeder(bootstrap, inp, total=100 * 3600, rate=100, keys=40)
        feeder.start()
        # The broker goes away once both instances run (past start-up: a start against a
        # broker that is down is not what this test is about).
        wait_until(
            lambda: all("assigned" in p.log_text() for p in fleet.procs.values()),
            90,
            what="both instances assigned",
        )
        time.sleep(rng.uniform(3, 6))
        broker.down()  # clean stop
        time.sleep(rng.uniform(2, 6))
        broker.up()
        time.sleep(rng.uniform(6, 10))
        broker.kill9()  # crash
        time.sleep(rng.uniform(2, 6))
        broker.up()
        stop_feeding_soon(feeder)
        feeder.join(240)
        assert feeder.error is None, feeder.error
        stored = read_inputs(bootstrap, inp, len(feeder.produced))
        outputs = read_all(bootstrap, out, expected=len(stored), timeout=180, idle=5)
        alive = {iid: p.alive for iid, p in fleet.procs.items()}
        codes = fleet.stop_all()
        problems = check(model(stored), outputs)
        print(
            f"broker restarts: {len(stored)} inputs, {len(outputs)} outputs, "
            f"alive before SIGTERM {alive}, exit codes {codes}"
        )
        assert problems == [], "\n".join(problems[:10]) + fleet.logs()
        assert alive == {"i1": True, "i2": True}, fleet.logs()
        assert codes == {"i1": 0, "i2": 0}, fleet.logs()
    except BaseException:
        if fleet is not None:
            print(fleet.logs())
        raise
    finally:
        if feeder is not None:
            feeder.stop()
        if fleet is not None:
            for p in fleet.procs.values():
                if p.alive:
                    p.kill9()
        broker.down()
