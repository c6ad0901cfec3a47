"""Event time through three stages, with an idle upstream instance, under kill -9.

tests/integration/apps/et_three.py: ``source`` (two instances; every user hashes to key
group 0 of the 2-partition input, so one instance owns a key group that never gets input
and goes idle) re-keys by region; ``middle`` forwards with its watermark; ``last`` counts
each region in 1 s tumbling windows. Events are produced at wall-clock event times while a
random instance of any stage is killed with SIGKILL at random moments (sometimes again at
once, sometimes with its state wiped) and restarted. A final event three windows later
moves the watermark past every earlier window. The committed window results must be
exactly a group-by of the produced events over every window up to the final watermark: each
window once, with its exact count, none late (records are in event-time order per
partition, and watermarks only pass a record once it was processed at every stage).

``LOCKGATE_CHAOS_KILLS`` (default 6) and ``LOCKGATE_CHAOS_SEED`` as in the other chaos tests.
The app declares env=["LOCKGATE_REPART_TOPIC", "LOCKGATE_REPART2_TOPIC", "LOCKGATE_IDLE_MS"].
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
import pytest
from confluent_kafka import Producer

from processors import key_group
from tests.chaos._harness import Fleet, chaos_env, chaos_seed, kill_at_random
from tests.support.kafka import create_topic, read_all, unique

pytestmark = pytest.mark.chaos

KILLS = int(os.environ.get("LOCKGATE_CHAOS_KILLS", "6"))
WINDOW_MS = 1000
SPEC = "tests.integration.apps.et_three:{}"


class EventFeeder(threading.Thread):
    """Produces events at wall-clock event times, ``rate`` per second, until stopped."""

    def __init__(self, bootstrap: str, topic: str, users: list[str], rate: float, seed: int):
        super().__init__(daemon=True)
        self.bootstrap, self.topic, self.users, self.rate = bootstrap, topic, users, rate
        self.rng = random.Random(seed)
        self.events: list[dict[str, Any]] = []
        self.error: BaseException | None = None
        self._halt = threading.Event()

    def stop(self) -> None:
        self._halt.set()

    def run(self) -> None:
        try:
            p = Producer(
                {
                    "bootstrap.servers": self.bootstrap,
                    "partitioner": "murmur2_random",
                    "enable.idempotence": True,
                }
            )
            seq = 0
            while not self._halt.is_set():
                value = {
                    "ts": int(time.time() * 1000),
                    "region": f"r{self.rng.randrange(3)}",
                    "seq": seq,
                }
                p.produce(self.topic, orjson.dumps(value), self.rng.choice(self.users).encode())
                self.events.append(value)
                seq += 1
                p.poll(0)
                self._halt.wait(1 / self.rate)
            assert p.flush(30) == 0
        except BaseException as exc:  # noqa: BLE001 - reported by the test
            self.error = exc


@pytest.mark.parametrize("alignment", ["aligned", "none"])
def test_three_stage_event_time_with_an_idle_source_instance_kill9(
    kafka_bootstrap: str, tmp_path: Path, alignment: str
) -> None:
    seed = chaos_seed()
    rng = random.Random(seed)
    inp, rep, rep2, out = (unique(p) for p in ("etk-in", "etk-rep", "etk-rep2", "etk-out"))
    for topic in (inp, rep, rep2):
        create_topic(kafka_bootstrap, topic, 2)
    users = [u for u in (f"user{i}" for i in range(200)) if key_group(u.encode(), 2) == 0]
    fleets: dict[str, Fleet] = {}
    for app, ids in (("source", ["s1", "s2"]), ("middle", ["m1"]), ("last", ["l1"])):
        env = chaos_env(kafka_bootstrap, unique(app), inp, out)
        env.update(
            {
                "LOCKGATE_REPART_TOPIC": rep,
                "LOCKGATE_REPART2_TOPIC": rep2,
                "LOCKGATE_IDLE_MS": "1500",
                "LOCKGATE_ALIGNMENT": alignment,
            }
        )
        fleets[app] = Fleet(SPEC.format(app), env, tmp_path, [f"{app}-{i}" for i in ids])
    instances = [(app, iid) for app, fleet in fleets.items() for iid in fleet.ids]
    history: list[str] = []
    feeder = EventFeeder(kafka_bootstrap, inp, users, rate=20, seed=seed)

    def about() -> str:
        return f"seed {seed} ({alignment}); kills: {', '.join(history)}"

    def logs() -> str:
        return "\n".join(fleet.tails(40) for fleet in fleets.values())

    started = time.monotonic()
    for fleet in fleets.values():
        fleet.start_all()
    feeder.start()
    try:

        def pick() -> tuple[Fleet, str]:
            app, victim = rng.choice(instances)
            return fleets[app], victim

        kill_at_random(rng, pick, KILLS, history, started)
        time.sleep(2)
        feeder.stop()
        feeder.join(60)
        assert feeder.error is None, feeder.error
        last_ts = int(time.time() * 1000) + 3 * WINDOW_MS
        p = Producer({"bootstrap.servers": kafka_bootstrap, "partitioner": "murmur2_random"})
        flush = {"ts": last_ts, "region": "flush", "seq": -1}
        p.produce(inp, orjson.dumps(flush), users[0].encode())
        assert p.flush(30) == 0
        final_wm = last_ts - 101  # the source's bound is 100 ms
        expected = Counter(
            (v["region"], v["ts"] // WINDOW_MS * WINDOW_MS)
            for v in feeder.events
            if v["ts"] // WINDOW_MS * WINDOW_MS + WINDOW_MS - 1 <= final_wm
        )
        got = read_all(kafka_bootstrap, out, expected=len(expected), timeout=180, idle=10)
        late = read_all(kafka_bootstrap, f"{out}.late", timeout=3, idle=1)
        codes: dict[str, int] = {}
        for fleet in fleets.values():
            codes.update(fleet.stop_all())
    except BaseException:
        print(about())
        print(logs())
        raise
    counts: Counter[tuple[str, int]] = Counter()
    fired: Counter[tuple[str, int]] = Counter()
    for m in got:
        v = orjson.loads(m.value())
        counts[(m.key().decode(), v["start"])] += v["count"]
        fired[(m.key().decode(), v["start"])] += 1
    twice = sorted(w for w, n in fired.items() if n > 1)
    missing = sorted(set(expected) - set(counts))
    wrong = sorted(w for w in expected if w in counts and counts[w] != expected[w])
    print(
        f"event-time chaos {about()}: {len(feeder.events)} events, {len(expected)} windows, "
        f"{sum(f.starts for f in fleets.values())} starts, {time.monotonic() - started:.0f}s"
    )
    assert not twice and not missing and not wrong and not late, (
        f"{about()}\nfired twice {twice[:5]}, missing {missing[:5]}, wrong counts "
        f"{[(w, counts[w], expected[w]) for w in wrong[:5]]}, late {len(late)}\n{logs()}"
    )
    assert counts == expected, about()
    assert set(codes.values()) == {0}, (codes, about(), logs())
