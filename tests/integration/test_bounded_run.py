"""Bounded runs (``LOCKGATE_UNTIL`` / ``lockgate run --until``) on the real broker.

``examples.window_count`` (``App("window-count", env=["LOCKGATE_WINDOW_MS",
"LOCKGATE_MAX_DELAY_MS"])``) over a two-partition input, half of it written in producer
transactions (so a partition can end in a transaction marker, not a record):

* two bounded runs back to back — ``offsets:`` for the first part without the drain, then
  ``now`` with the drain — each exits 0 by itself, and the committed output equals an
  independent model of one uninterrupted run whose event time ends at the end: every
  window once, the last ones included (they fire only from the final watermark);
* a run with nothing left exits 0 at once and writes nothing;
* a malformed bound exits 2 with the reason.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import orjson
from confluent_kafka import Producer

from tests.support.kafka import create_topic, read_all
from tests.support.procs import AppProcess

WINDOW_MS = 1000
PARTITIONS = 2
KEYS = ["a", "b", "c", "d", "e", "f"]


def _events(start: int, count: int) -> list[tuple[str, int, int]]:
    """(key, event time, seq): increasing time, so nothing is late."""
    return [(KEYS[i % len(KEYS)], 100 * (start + i), start + i) for i in range(count)]


def _produce(bootstrap: str, topic: str, events: list[tuple[str, int, int]], txn: str) -> None:
    """Half plain, half in transactions of 7 records (partitions end in markers)."""
    plain = Producer({"bootstrap.servers": bootstrap, "partitioner": "murmur2_random"})
    tx = Producer(
        {
            "bootstrap.servers": bootstrap,
            "partitioner": "murmur2_random",
            "transactional.id": txn,
        }
    )
    tx.init_transactions(30)
    half = len(events) // 2
    for key, ts, seq in events[:half]:
        plain.produce(topic, orjson.dumps({"ts": ts, "seq": seq}), key.encode())
    assert plain.flush(30) == 0
    rest = events[half:]
    for i in range(0, len(rest), 7):
        tx.begin_transaction()
        for key, ts, seq in rest[i : i + 7]:
            tx.produce(topic, orjson.dumps({"ts": ts, "seq": seq}), key.encode())
        tx.commit_transaction(30)


def _model(events: list[tuple[str, int, int]]) -> Counter[tuple[str, int, int, int]]:
    """Every (key, start, end, count) window of one run over all events, drained."""
    per = Counter((key, ts - ts % WINDOW_MS) for key, ts, _ in events)
    return Counter({(k, s, s + WINDOW_MS, n): 1 for (k, s), n in per.items()})


def _env(bootstrap: str, names, tmp_path: Path, inp: str, out: str, **extra: str) -> dict[str, str]:  # type: ignore[no-untyped-def]
    return {
        "LOCKGATE_BOOTSTRAP_SERVERS": bootstrap,
        "LOCKGATE_APP_NAME": names("bounded"),
        "LOCKGATE_INPUT_TOPIC": inp,
        "LOCKGATE_OUTPUT_TOPIC": out,
        "LOCKGATE_WINDOW_MS": str(WINDOW_MS),
        "LOCKGATE_MAX_DELAY_MS": "0",
        "LOCKGATE_CHECKPOINT_INTERVAL_MS": "300",
        "LOCKGATE_STATE_DIR": str(tmp_path / "state"),
        "LOCKGATE_INSTANCE_ID": "i1",
        **extra,
    }


def _run(env: dict[str, str], log: Path, timeout: float = 120) -> tuple[int, str]:
    proc = AppProcess("examples.window_count:app", env, log).start()
    try:
        code = proc.wait(timeout)
    except Exception:
        proc.kill9()
        raise
    return code, proc.log_text()


def _outputs(bootstrap: str, out: str) -> Counter[tuple[str, int, int, int]]:
    got: Counter[tuple[str, int, int, int]] = Counter()
    for m in read_all(bootstrap, out, timeout=20, idle=2):
        v = orjson.loads(m.value())
        got[(m.key().decode(), v["start"], v["end"], v["count"])] += 1
    return got


def test_two_bounded_runs_equal_one_drained_run(  # type: ignore[no-untyped-def]
    kafka_bootstrap: str, names, tmp_path: Path
) -> None:
    inp, out = names("bounded-in"), names("bounded-out")
    create_topic(kafka_bootstrap, inp, PARTITIONS)
    first, second = _events(0, 120), _events(120, 120)
    _produce(kafka_bootstrap, inp, first, names("bounded-tx1"))
    _produce(kafka_bootstrap, inp, second, names("bounded-tx2"))
    # The first run ends right after the first part's last record of each partition
    # (found by reading: transaction markers sit between the records).
    offsets = _offsets_after(kafka_bootstrap, inp, {seq for _, _, seq in first})
    bound = "offsets:" + inp + ":" + ",".join(f"{p}={o}" for p, o in sorted(offsets.items()))
    env = _env(kafka_bootstrap, names, tmp_path, inp, out)
    code, log = _run(
        {**env, "LOCKGATE_UNTIL": bound, "LOCKGATE_UNTIL_DRAIN": "false"}, tmp_path / "a.log"
    )
    assert code == 0, log[-3000:]
    assert "bounded run complete" in log, log[-3000:]
    after_first = _outputs(kafka_bootstrap, out)
    # Without the drain, each key's last window of the first part is still open.
    assert after_first and sum(after_first.values()) < sum(_model(first).values())
    assert all(n == 1 for n in after_first.values()), after_first

    code, log = _run({**env, "LOCKGATE_UNTIL": "now"}, tmp_path / "b.log")
    assert code == 0, log[-3000:]
    got = _outputs(kafka_bootstrap, out)
    assert got == _model(first + second), (
        got - _model(first + second),
        _model(first + second) - got,
    )

    # Nothing left: exits 0 at once and writes nothing more.
    code, log = _run({**env, "LOCKGATE_UNTIL": "now"}, tmp_path / "c.log", timeout=60)
    assert code == 0, log[-3000:]
    assert _outputs(kafka_bootstrap, out) == got


def _offsets_after(bootstrap: str, topic: str, seqs: set[int]) -> dict[int, int]:
    """Per partition, the offset after the last record whose seq is in ``seqs``."""
    last: dict[int, int] = {p: 0 for p in range(PARTITIONS)}
    for m in read_all(bootstrap, topic, timeout=20, idle=2):
        if orjson.loads(m.value())["seq"] in seqs:
            last[m.partition()] = max(last[m.partition()], m.offset() + 1)
    return last


def test_a_malformed_bound_exits_2(  # type: ignore[no-untyped-def]
    kafka_bootstrap: str, names, tmp_path: Path
) -> None:
    inp, out = names("bounded-bad-in"), names("bounded-bad-out")
    create_topic(kafka_bootstrap, inp, 1)
    env = _env(kafka_bootstrap, names, tmp_path, inp, out, LOCKGATE_UNTIL="yesterday")
    code, log = _run(env, tmp_path / "bad.log", timeout=60)
    assert code == 2, log[-3000:]
    assert "expected now, a time" in log, log[-3000:]
