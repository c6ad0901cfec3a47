"""Unencodable state around timers is dead-lettered on the right culprit, never a crash loop.

tests/integration/apps/bad_timer_state.py, one partition, records 100 ms apart in blocks
``a, poison, raise, mixed, mixed(bad), b``. The epoch's commit fails to encode the sets;
the runtime replays it checking each record's and each timer's writes:

- ``poison``'s timer (stores a set) and ``raise``'s (stores a set, then raises) are
  dead-lettered (stage ``timer``, ``StateEncodeError``);
- the bad ``mixed`` record is dead-lettered (stage ``state``), and the timer of the good
  ``mixed`` record right before it — which that bad record's watermark fires, after the bad
  write — is not blamed: its output commits once;
- every other timer's output commits exactly once, and the instance stops cleanly.
"""

from __future__ import annotations

import time
from collections import Counter
from pathlib import Path

import orjson
from confluent_kafka import Producer

from tests.integration._util import app_env
from tests.support.kafka import create_topic, read_all, unique
from tests.support.procs import AppProcess

BLOCK = [
    ("a", False),
    ("poison", False),
    ("raise", False),
    ("mixed", False),
    ("mixed", True),
    ("b", False),
]


def test_unencodable_state_around_timers_is_dead_lettered(
    kafka_bootstrap: str, tmp_path: Path
) -> None:
    env = app_env(kafka_bootstrap, unique, tmp_path, "tp", LOCKGATE_HTTP_PORT="0")
    inp, out = env["LOCKGATE_INPUT_TOPIC"], env["LOCKGATE_OUTPUT_TOPIC"]
    app = env["LOCKGATE_APP_NAME"]
    create_topic(kafka_bootstrap, inp, 1)
    p = Producer({"bootstrap.servers": kafka_bootstrap})
    # Recent event times: the broker's time retention (7 days, checked every 5 min)
    # deletes a segment whose records are all older, input and outputs alike, and
    # once did so mid-test (the consumer reset to an empty log: no output at all).
    base = (int(time.time()) - 600) * 1000
    records = [(key, bad) for _ in range(7) for key, bad in BLOCK]
    for i, (key, bad) in enumerate(records):
        value = orjson.dumps({"seq": i, "bad": bad})
        p.produce(inp, value, key.encode(), timestamp=base + i * 100)
    assert p.flush(30) == 0
    # Record i's timer (base + i*100 + 10) fires once a later record moves the watermark.
    last = len(records) - 1
    timers = [
        (key, base + i * 100 + 10) for i, (key, bad) in enumerate(records) if not bad and i < last
    ]
    expected = Counter(t for t in timers if t[0] not in ("poison", "raise"))
    poisoned = {t for t in timers if t[0] in ("poison", "raise")}
    bad_records = {i for i, (_, bad) in enumerate(records) if bad}
    proc = AppProcess(
        "tests.integration.apps.bad_timer_state:app", env, tmp_path / "i1.log"
    ).start()
    n_dead = len(poisoned) + len(bad_records)
    try:
        got = read_all(kafka_bootstrap, out, expected=sum(expected.values()), timeout=60, idle=2)
        dead = read_all(kafka_bootstrap, f"{app}.dlq", expected=n_dead, timeout=30, idle=2)
        code = proc.terminate(60)
    except BaseException:
        print(proc.log_text()[-4000:])
        raise
    log = proc.log_text()[-4000:]
    assert Counter((m.key().decode(), orjson.loads(m.value())["t"]) for m in got) == expected, log
    dead_timers, dead_records = set(), set()
    for m in dead:
        headers = {k: v.decode() for k, v in m.headers() or []}
        assert headers["lockgate-error-type"] == "StateEncodeError", headers
        if headers["lockgate-error-stage"] == "timer":
            dead_timers.add((m.key().decode(), int(headers["lockgate-timer-time"])))
        else:
            assert headers["lockgate-error-stage"] == "state", headers
            dead_records.add(orjson.loads(m.value())["seq"])
    assert dead_timers == poisoned, log
    assert dead_records == bad_records, log
    assert len(dead) == n_dead, log
    assert code == 0, log
