"""A timer whose state cannot be encoded is dead-lettered, not a crash loop.

tests/integration/apps/bad_timer_state.py: every record sets an event-time timer 10 ms
later; the timer of key ``poison`` stores a set under the JSON codec. The epoch's commit
fails to encode it, the runtime replays the epoch checking each record's and each timer's
writes, and dead-letters that timer (stage ``timer``, ``StateEncodeError``) while every
other timer's output commits exactly once and the instance stops cleanly.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import orjson
from confluent_kafka import Producer

from tests.integration._util import app_env
from tests.support.kafka import create_topic, read_all, unique
from tests.support.procs import AppProcess


def test_a_timer_with_unencodable_state_is_dead_lettered(
    kafka_bootstrap: str, tmp_path: Path
) -> None:
    env = app_env(kafka_bootstrap, unique, tmp_path, "tp", LOCKGATE_HTTP_PORT="0")
    inp, out = env["LOCKGATE_INPUT_TOPIC"], env["LOCKGATE_OUTPUT_TOPIC"]
    app = env["LOCKGATE_APP_NAME"]
    create_topic(kafka_bootstrap, inp, 1)
    p = Producer({"bootstrap.servers": kafka_bootstrap})
    base = 1_700_000_000_000
    keys = ["a", "b", "poison", "c"]
    for i in range(40):
        key = keys[i % 4]
        p.produce(inp, orjson.dumps({"seq": i}), key.encode(), timestamp=base + i * 100)
    assert p.flush(30) == 0
    spec = "tests.integration.apps.bad_timer_state:app"
    proc = AppProcess(spec, env, tmp_path / "i1.log").start()
    # Record i's timer (at base + i*100 + 10) fires once record i+1 moves the watermark.
    expected = Counter(
        (keys[i % 4], base + i * 100 + 10) for i in range(39) if keys[i % 4] != "poison"
    )
    poisoned = {base + i * 100 + 10 for i in range(39) if keys[i % 4] == "poison"}
    try:
        got = read_all(kafka_bootstrap, out, expected=sum(expected.values()), timeout=60, idle=2)
        dead = read_all(kafka_bootstrap, f"{app}.dlq", expected=len(poisoned), timeout=30, idle=1)
        code = proc.terminate(60)
    except BaseException:
        print(proc.log_text()[-4000:])
        raise
    log = proc.log_text()[-4000:]
    assert Counter((m.key().decode(), orjson.loads(m.value())["t"]) for m in got) == expected, log
    times = set()
    for m in dead:
        headers = {k: v.decode() for k, v in m.headers() or []}
        assert headers["lockgate-error-stage"] == "timer", headers
        assert headers["lockgate-error-type"] == "StateEncodeError", headers
        assert m.key() == b"poison"
        times.add(int(headers["lockgate-timer-time"]))
    assert times == poisoned, log
    assert code == 0, log
