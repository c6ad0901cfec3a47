"""Event time under kill -9: windows and timers fire exactly once, late records too.

Two instances of tests/integration/apps/window_timers.py (tumbling 1 s windows,
200 ms bounded out-of-orderness; every fired window sets an event-time timer a
second later) read a 4-partition topic while a feeder writes records with bounded
disorder and a few far-late ones. Instances are SIGKILLed at random moments (a
quarter of the restarts with the state dir wiped) and restarted. A last record per
partition pushes every watermark past the data. The committed outputs (read_committed)
must equal an independent model computed from the input topic as stored (per
partition, in offset order): every window result, every timer and every late record
exactly once, none missing, nothing else. (The app declares
env=["LOCKGATE_TIMERS_TOPIC"].)
"""

from __future__ import annotations

import os
import random
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import orjson
from confluent_kafka import Producer

from processors import key_group
from tests.chaos._harness import (
    Fleet,
    chaos_env,
    describe_group,
    kill_at_random,
    stop_feeding_soon,
)
from tests.support.kafka import create_topic, read_all, unique

KILLS = int(os.environ.get("LOCKGATE_CHAOS_KILLS", "6"))
PARTITIONS = 4
KEYS = 24
WINDOW_MS, DELAY_MS, TIMER_AFTER_MS = 1000, 200, 1000


class EventFeeder(threading.Thread):
    """Produces ``{"ts", "seq"}`` records with bounded disorder and ~3% far-late ones.

    ``total`` is an upper bound: :meth:`stop` ends the input earlier (the records that
    carry every watermark past the data are sent either way).
    """

    def __init__(self, bootstrap: str, topic: str, total: int, seconds: float, seed: int) -> None:
        super().__init__(daemon=True)
        self.bootstrap, self.topic, self.total, self.seconds = bootstrap, topic, total, seconds
        self.rng = random.Random(seed)
        self.base = (int(time.time() * 1000) - 3_600_000) // WINDOW_MS * WINDOW_MS
        self.error: BaseException | None = None
        self.max_ts = self.base
        self._halt = threading.Event()
        self.produced = 0  # events (the watermark-passing records not counted)

    def stop(self) -> None:
        """Produce no more events (the watermark-passing records still come); ``join()``."""
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
                key = f"k{self.rng.randrange(KEYS)}"
                ts = self.base + seq * 5
                if self.rng.random() < 0.03:
                    ts -= self.rng.randrange(500, 2500)  # far behind: late, or just in time
                else:
                    ts -= self.rng.randrange(0, DELAY_MS)  # within the bound: on time
                self.max_ts = max(self.max_ts, ts)
                p.produce(self.topic, orjson.dumps({"ts": ts, "seq": seq}), key.encode())
                self.produced += 1
                ahead = seq * self.seconds / self.total - (time.monotonic() - started)
                if ahead > 0:
                    self._halt.wait(ahead)
                p.poll(0)
            # One record per partition far ahead: every watermark passes the data.
            flush = self.max_ts + 10 * WINDOW_MS
            for g in range(PARTITIONS):
                key = next(
                    f"flush{i}"
                    for i in range(1000)
                    if key_group(f"flush{i}".encode(), PARTITIONS) == g
                )
                p.produce(self.topic, orjson.dumps({"ts": flush, "seq": -1 - g}), key.encode())
            assert p.flush(60) == 0
        except BaseException as exc:  # noqa: BLE001 - reported by the test
            self.error = exc


def model(records: list[Any]) -> tuple[Counter[Any], Counter[Any], Counter[Any]]:
    """Expected (window results, timer firings, late records) of the input as stored.

    Independent of processors/windows.py: per partition, in offset order, a record is
    late when its window's end - 1 is at or below the watermark before it; after each
    record the watermark (newest ts - delay - 1) may rise, firing every window and timer
    at or below it.
    """
    by_part: dict[int, list[Any]] = {}
    for m in sorted(records, key=lambda m: (m.partition(), m.offset())):
        by_part.setdefault(m.partition(), []).append(m)
    windows: Counter[Any] = Counter()
    timers: Counter[Any] = Counter()
    late: Counter[Any] = Counter()
    for msgs in by_part.values():
        wm = -(2**63)
        newest = -(2**63)
        open_: dict[tuple[str, int], int] = {}
        pending: set[tuple[str, int, str]] = set()
        for m in msgs:
            key = m.key().decode()
            ts = orjson.loads(m.value())["ts"]
            start = ts - ts % WINDOW_MS
            if start + WINDOW_MS - 1 <= wm:
                late[(key, m.value())] += 1
            else:
                open_[(key, start)] = open_.get((key, start), 0) + 1
            if ts > newest:
                newest = ts
                wm = max(wm, ts - DELAY_MS - 1)
                for (k, s), n in sorted(open_.items()):
                    if s + WINDOW_MS - 1 <= wm:
                        windows[(k, s, s + WINDOW_MS, n)] += 1
                        del open_[(k, s)]
                        pending.add((k, s + WINDOW_MS - 1 + TIMER_AFTER_MS, f"after-{s}"))
                for t in sorted(pending):
                    if t[1] <= wm:
                        timers[t] += 1
                        pending.discard(t)
    return windows, timers, late


def test_windows_and_timers_exactly_once_under_kill9(kafka_bootstrap: str, tmp_path: Path) -> None:
    seed = int(os.environ.get("LOCKGATE_CHAOS_SEED", str(time.time_ns() % 10**9)))
    print(f"chaos seed: {seed} (set LOCKGATE_CHAOS_SEED={seed} to repeat)")
    rng = random.Random(seed)
    inp, out, tmr, app = (unique(p) for p in ("win-in", "win-out", "win-tmr", "win-app"))
    create_topic(kafka_bootstrap, inp, PARTITIONS)
    total = 6000
    feeder = EventFeeder(kafka_bootstrap, inp, total, seconds=KILLS * 2.5 + 10, seed=seed)
    env = {**chaos_env(kafka_bootstrap, app, inp, out), "LOCKGATE_TIMERS_TOPIC": tmr}
    fleet = Fleet("tests.integration.apps.window_timers:app", env, tmp_path, ["i1", "i2"])
    history: list[str] = []
    started = time.monotonic()
    fleet.start_all()
    feeder.start()
    try:
        kill_at_random(rng, lambda: (fleet, rng.choice(fleet.ids)), KILLS, history, started)
        stop_feeding_soon(feeder)
        feeder.join(300)
        assert feeder.error is None, feeder.error
        inputs = read_all(kafka_bootstrap, inp, expected=feeder.produced + PARTITIONS, idle=0.5)
        windows, timers, late = model(inputs)
        assert windows and timers and late, "the input must make windows, timers and late records"
        got_w = read_all(kafka_bootstrap, out, expected=sum(windows.values()), timeout=180, idle=3)
        got_t = read_all(kafka_bootstrap, tmr, expected=sum(timers.values()), timeout=60, idle=2)
        got_l = read_all(
            kafka_bootstrap, f"{out}.late", expected=sum(late.values()), timeout=60, idle=2
        )
        codes = fleet.stop_all()
    except BaseException:
        print(f"chaos seed: {seed}; kills: {history}")
        print(describe_group(kafka_bootstrap, app))
        print(fleet.tails(40))
        raise

    def counted(msgs: list[Any], fn: Any) -> Counter[Any]:
        return Counter(fn(m) for m in msgs)

    w = counted(got_w, lambda m: (m.key().decode(), *orjson.loads(m.value()).values()))
    t = counted(got_t, lambda m: (m.key().decode(), *orjson.loads(m.value()).values()))
    lt = counted(got_l, lambda m: (m.key().decode(), m.value()))
    report = (
        f"seed {seed}, kills {history}: windows {sum(w.values())}/{sum(windows.values())}, "
        f"timers {sum(t.values())}/{sum(timers.values())}, late {sum(lt.values())}/"
        f"{sum(late.values())}"
    )
    print(report)
    problems = []
    for name, want, have in (("window", windows, w), ("timer", timers, t), ("late", late, lt)):
        missing, extra = want - have, have - want
        if missing:
            problems.append(f"{name}: {sum(missing.values())} missing, e.g. {list(missing)[:3]}")
        if extra:
            problems.append(
                f"{name}: {sum(extra.values())} extra/duplicated, e.g. {list(extra)[:3]}"
            )
    assert not problems, report + "\n" + "\n".join(problems) + "\n" + fleet.tails(40)
    assert codes == {"i1": 0, "i2": 0}, fleet.tails(40)
