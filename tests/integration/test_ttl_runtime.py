"""Processing-time TTL through the runtime (not only the TestDriver).

An expired key reads as absent; keys that are never read again are swept by the runtime
at epoch ends, which writes tombstones to the changelog (so a restore drops them too).
"""

from __future__ import annotations

import time
from pathlib import Path

import orjson

from tests.support.kafka import create_topic, produce_numbers, read_all
from tests.support.procs import AppProcess

TTL_MS = 2000


def test_ttl_expires_on_read_and_the_sweep_writes_tombstones(  # type: ignore[no-untyped-def]
    kafka_bootstrap: str, names, tmp_path: Path
) -> None:
    app_name, inp, out = names("ttl"), names("ttl-in"), names("ttl-out")
    env = {
        "LOCKGATE_BOOTSTRAP_SERVERS": kafka_bootstrap,
        "LOCKGATE_APP_NAME": app_name,
        "LOCKGATE_INPUT_TOPIC": inp,
        "LOCKGATE_OUTPUT_TOPIC": out,
        "LOCKGATE_STATE_DIR": str(tmp_path / "state"),
        "LOCKGATE_INSTANCE_ID": "i1",
        "LOCKGATE_CHECKPOINT_INTERVAL_MS": "200",
        "TTL_APP_TTL_MS": str(TTL_MS),
    }
    changelog = f"{app_name}.last.changelog"
    create_topic(kafka_bootstrap, inp, 2)
    swept = [f"once-{i}" for i in range(20)]  # written once, never read again
    produce_numbers(
        kafka_bootstrap,
        inp,
        [("a", 1, 0), ("a", 2, 1)] + [(k, 7, 2 + i) for i, k in enumerate(swept)],
    )
    app = AppProcess("tests.integration.apps.ttl:app", env, tmp_path / "app.log").start()
    try:
        first = read_all(kafka_bootstrap, out, expected=22, idle=0.5)
        written = time.monotonic()
        by_seq = {orjson.loads(m.value())["seq"]: orjson.loads(m.value()) for m in first}
        assert by_seq[0]["prev"] is None
        assert by_seq[1]["prev"] == 1  # within the TTL: the value is there
        # The changelog got the 21 written values (TTL envelopes) first.
        live = read_all(kafka_bootstrap, changelog, expected=21, idle=0.3)
        firsts: dict[str, bytes | None] = {}
        for m in sorted(live, key=lambda m: (m.partition(), m.offset())):
            firsts.setdefault(m.key().decode(), m.value())
        assert set(firsts) == {"a", *swept}
        assert all(v is not None for v in firsts.values())

        time.sleep(max(0.0, TTL_MS / 1000 + 0.5 - (time.monotonic() - written)))
        produce_numbers(kafka_bootstrap, inp, [("a", 3, 100)])
        after = read_all(kafka_bootstrap, out, expected=23, idle=0.5)
        last = [orjson.loads(m.value()) for m in after if orjson.loads(m.value())["seq"] == 100]
        assert last == [{"prev": None, "seq": 100}]  # expired: reads as absent

        # The sweep runs every epoch (200 ms): every key never read again gets a tombstone
        # within a few epochs of its expiry (record timestamps are the producer's clock).
        msgs = read_all(kafka_bootstrap, changelog, expected=21 + 21 + 1, idle=0.3, timeout=20)
        history: dict[str, list[tuple[int, bytes | None]]] = {}
        for m in sorted(msgs, key=lambda m: (m.partition(), m.offset())):
            history.setdefault(m.key().decode(), []).append((m.timestamp()[1], m.value()))
        for k in swept:
            (_, written_value), (ts, tombstone) = history[k][:2]
            assert tombstone is None, history[k]
            expires = orjson.loads(written_value)[0]
            assert 0 <= ts - expires <= 1000, (k, ts - expires)
        # seq 100 wrote "a" again after it expired: that value is in the changelog
        values = [orjson.loads(v)[1] for _, v in history["a"] if v is not None]
        assert values[-1] == 3, history["a"]
    finally:
        code = app.terminate()
    assert code == 0, app.log_text()[-3000:]
