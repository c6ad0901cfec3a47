"""Processing-time timers on the real broker: each fires once; a failing one is dead-lettered.

tests/integration/apps/proc_timers.py sets a timer 500 ms after each record; 300 records,
every 50th asks its timer to raise. Every other record's reminder is on the output exactly
once (read_committed), the failing ones are on ``<app>.dlq`` with the timer headers, and the
instance goes on and stops cleanly.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import orjson
from confluent_kafka import Producer

from tests.integration._util import app_env
from tests.support.kafka import create_topic, read_all, unique
from tests.support.procs import AppProcess

N = 300


def test_processing_time_timers_fire_once_and_failures_are_dead_lettered(
    kafka_bootstrap: str, tmp_path: Path
) -> None:
    env = app_env(kafka_bootstrap, unique, tmp_path, "pt", LOCKGATE_HTTP_PORT="0")
    inp, out = env["LOCKGATE_INPUT_TOPIC"], env["LOCKGATE_OUTPUT_TOPIC"]
    app = env["LOCKGATE_APP_NAME"]
    create_topic(kafka_bootstrap, inp, 3)
    p = Producer({"bootstrap.servers": kafka_bootstrap, "partitioner": "murmur2_random"})
    for seq in range(N):
        value = {"seq": seq, "boom": seq % 50 == 7}
        p.produce(inp, orjson.dumps(value), f"k{seq % 17}".encode())
    assert p.flush(30) == 0
    proc = AppProcess("tests.integration.apps.proc_timers:app", env, tmp_path / "i1.log").start()
    booms = {seq for seq in range(N) if seq % 50 == 7}
    try:
        got = read_all(kafka_bootstrap, out, expected=N - len(booms), timeout=90, idle=2)
        dead = read_all(kafka_bootstrap, f"{app}.dlq", expected=len(booms), timeout=30, idle=1)
        code = proc.terminate(60)
    except BaseException:
        print(proc.log_text()[-4000:])
        raise
    log = proc.log_text()[-4000:]
    seqs = Counter(orjson.loads(m.value())["seq"] for m in got)
    assert seqs == Counter(set(range(N)) - booms), log
    assert len(dead) == len(booms), log
    names = set()
    for m in dead:
        headers = {k: v.decode() for k, v in m.headers() or []}
        assert headers["lockgate-error-stage"] == "timer"
        assert headers["lockgate-error-type"] == "RuntimeError"
        assert int(headers["lockgate-timer-time"]) > 0
        assert m.value() is None
        names.add(int(headers["lockgate-timer-name"]))
    assert names == booms
    assert code == 0, log
