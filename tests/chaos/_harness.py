"""Shared machinery of the chaos tests: a steady input producer and an app fleet."""

from __future__ import annotations

import os
import random
import shutil
import signal
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson
from confluent_kafka import Producer

from tests.support.procs import AppProcess


class InputFeeder(threading.Thread):
    """Produces running_sum inputs at a steady rate; remembers them for the model.

    Idempotent producer: per-partition order is the order of ``self.produced``.
    ``total`` is an upper bound: :meth:`stop` ends the input earlier (once the faults a
    test plans are over, rather than at a total sized for their longest possible run).
    """

    def __init__(self, bootstrap: str, topic: str, total: int, rate: float, keys: int) -> None:
        super().__init__(daemon=True)
        self.bootstrap = bootstrap
        self.topic = topic
        self.total = total
        self.rate = rate
        self.keys = keys
        self.produced: list[tuple[str, int, int]] = []
        self.error: BaseException | None = None
        self._halt = threading.Event()

    def stop(self) -> None:
        """Produce nothing more (what was produced is flushed); then ``join()``."""
        self._halt.set()

    def run(self) -> None:
        try:
            p = Producer(
                {
                    "bootstrap.servers": self.bootstrap,
                    "partitioner": "murmur2_random",
                    "enable.idempotence": True,
                    "linger.ms": 5,
                }
            )
            started = time.monotonic()
            for seq in range(self.total):
                if self._halt.is_set():
                    break
                key = f"key-{(seq * 7919) % self.keys}"
                v = (seq * 31) % 17
                p.produce(self.topic, orjson.dumps({"v": v, "seq": seq}), key.encode())
                self.produced.append((key, v, seq))
                ahead = seq / self.rate - (time.monotonic() - started)
                if ahead > 0:
                    self._halt.wait(ahead)
                p.poll(0)
            assert p.flush(60) == 0
        except BaseException as exc:  # noqa: BLE001 - reported by the test
            self.error = exc


#: After the last planned fault, input keeps flowing this long (into the restarts and
#: restores the fault caused); then a test stops its feeder instead of waiting out a
#: feeding duration sized for a slow run of its faults.
FLOW_AFTER_FAULTS_S = 4.0


def stop_feeding_soon(feeder: InputFeeder | Any) -> None:
    """Let input flow :data:`FLOW_AFTER_FAULTS_S` more seconds, then stop ``feeder``."""
    time.sleep(FLOW_AFTER_FAULTS_S)
    feeder.stop()


class Fleet:
    """Instances of one app, each with its own instance id and state dir."""

    def __init__(self, spec: str, env: dict[str, str], root: Path, ids: list[str]) -> None:
        self.spec = spec
        self.env = env
        self.root = root
        self.procs: dict[str, AppProcess] = {}
        self.ids = ids
        self.starts = 0

    def state_dir(self, iid: str) -> Path:
        return self.root / f"state-{iid}"

    def start(self, iid: str, wipe_state: bool = False) -> AppProcess:
        if wipe_state:
            shutil.rmtree(self.state_dir(iid), ignore_errors=True)
        env = {
            **self.env,
            "LOCKGATE_INSTANCE_ID": iid,
            "LOCKGATE_STATE_DIR": str(self.state_dir(iid)),
        }
        proc = AppProcess(self.spec, env, self.root / f"{iid}.log").start()
        self.procs[iid] = proc
        self.starts += 1
        return proc

    def start_all(self) -> None:
        for iid in self.ids:
            self.start(iid)

    def stop_all(self) -> dict[str, int]:
        codes = {}
        for proc in self.procs.values():
            proc.signal(15)
        for iid, proc in self.procs.items():
            codes[iid] = proc.wait(90) if proc.alive else proc.wait(1)
        return codes

    def logs(self) -> str:
        """Every instance's log tail, without librdkafka's lines.

        A broker that is down fills a log with librdkafka's connection errors; the
        runtime's own lines (why an instance stopped) would fall out of the tail.
        """
        parts = []
        for iid, p in self.procs.items():
            lines = p.log_text().splitlines()
            own = [ln for ln in lines if "lockgate.librdkafka" not in ln]
            tail = "\n".join(own)[-6000:]
            parts.append(
                f"===== {iid} ({len(lines) - len(own)} librdkafka lines left out) =====\n{tail}"
            )
        return "\n".join(parts)

    def report_and_kill(self) -> None:
        """On a failure: print every instance's log tail and SIGKILL the live ones."""
        print(self.logs())
        for proc in self.procs.values():
            if proc.alive:
                proc.kill9()

    def logs_full(self) -> str:
        """The whole logs of the current processes (one per instance id)."""
        return "\n".join(p.log_text() for p in self.procs.values())

    def dump_stacks(self) -> None:
        """Make every live instance print its threads' stacks to its log (SIGUSR2)."""
        for proc in self.procs.values():
            proc.signal(signal.SIGUSR2)

    def tails(self, lines: int = 25) -> str:
        """The last ``lines`` log lines of every instance (compact, for failure reports)."""
        return "\n".join(
            f"===== {iid} (tail) =====\n" + "\n".join(p.log_text().splitlines()[-lines:])
            for iid, p in self.procs.items()
        )


def chaos_seed() -> int:
    """The run's seed: ``LOCKGATE_CHAOS_SEED`` or a fresh one, printed so a run can be repeated."""
    seed = int(os.environ.get("LOCKGATE_CHAOS_SEED", str(time.time_ns() % 10**9)))
    print(f"chaos seed: {seed} (set LOCKGATE_CHAOS_SEED={seed} to repeat)")
    return seed


def kill_at_random(
    rng: random.Random,
    pick: Callable[[], tuple[Fleet, str]],
    kills: int,
    history: list[str],
    started: float,
) -> None:
    """SIGKILL ``kills`` times an instance ``pick()`` names, at random moments; restart it.

    Each victim is restarted after up to 1 s, a quarter of the time with its state dir
    wiped; 30% of the time it is killed again 0.5-2.5 s later (into start-up or restore)
    and restarted. ``history`` gets one line per kill (seconds since ``started``).
    """
    done = 0
    while done < kills:
        time.sleep(rng.uniform(0.3, 3.0))
        fleet, victim = pick()
        fleet.procs[victim].kill9()
        done += 1
        wipe = rng.random() < 0.25
        history.append(
            f"{time.monotonic() - started:.1f}s {victim}{' (state wiped)' if wipe else ''}"
        )
        time.sleep(rng.uniform(0.0, 1.0))
        fleet.start(victim, wipe_state=wipe)
        if rng.random() < 0.3:  # kill again soon: lands in start-up or restore
            time.sleep(rng.uniform(0.5, 2.5))
            fleet.procs[victim].kill9()
            done += 1
            history.append(f"{time.monotonic() - started:.1f}s {victim} (again)")
            fleet.start(victim)


def describe_group(bootstrap: str, group: str) -> str:
    """One line on a consumer group's state and members (for failure reports)."""
    from confluent_kafka.admin import AdminClient

    try:
        admin = AdminClient({"bootstrap.servers": bootstrap})
        desc = admin.describe_consumer_groups([group])[group].result(timeout=10)
        members = [
            f"{m.group_instance_id or m.member_id}:"
            + ",".join(f"{tp.topic[-6:]}[{tp.partition}]" for tp in m.assignment.topic_partitions)
            for m in desc.members
        ]
        return f"group {group}: state={desc.state} members={members}"
    except Exception as exc:  # noqa: BLE001 - a report must not hide the failure
        return f"group {group}: describe failed: {exc}"


def chaos_env(bootstrap: str, app: str, inp: str, out: str) -> dict[str, str]:
    return {
        "LOCKGATE_BOOTSTRAP_SERVERS": bootstrap,
        "LOCKGATE_APP_NAME": app,
        "LOCKGATE_INPUT_TOPIC": inp,
        "LOCKGATE_OUTPUT_TOPIC": out,
        "LOCKGATE_CHECKPOINT_INTERVAL_MS": os.environ.get("LOCKGATE_CHAOS_INTERVAL_MS", "250"),
        "LOCKGATE_TRANSACTION_TIMEOUT_MS": "10000",
        "LOCKGATE_KAFKA__SESSION_TIMEOUT_MS": "6000",
        "LOCKGATE_KAFKA__HEARTBEAT_INTERVAL_MS": "1000",
        "LOCKGATE_GROUP_PROTOCOL": os.environ.get("LOCKGATE_CHAOS_GROUP_PROTOCOL", "classic"),
    }


class Supervisor(threading.Thread):
    """Restarts every instance of ``fleet`` that is not running (like an orchestrator)."""

    def __init__(self, fleet: Fleet, rng: random.Random) -> None:
        super().__init__(daemon=True)
        self.fleet = fleet
        self.rng = rng
        self.restarts: list[str] = []
        self.halt = threading.Event()
        self.lock = threading.Lock()

    def run(self) -> None:
        while not self.halt.wait(0.3):
            with self.lock:
                for iid in self.fleet.ids:
                    proc = self.fleet.procs[iid]
                    if proc.alive:
                        continue
                    code = proc.wait(1)
                    wipe = self.rng.random() < 0.25
                    self.restarts.append(f"{iid} exit {code}{' (wiped)' if wipe else ''}")
                    self.fleet.start(iid, wipe_state=wipe)

    def stop(self) -> None:
        self.halt.set()
        self.join(10)
