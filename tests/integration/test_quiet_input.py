"""Windows that close when the input goes quiet (``Watermarks(..., idle_advance=True)``).

``tests/integration/apps/quiet_windows.py`` on the real broker: records with event times
in the past, then nothing. The last window of every key fires once the input has been
quiet for its ``idle_ms`` (processing time moves the watermark), without a new record;
every window once, committed.
"""

from __future__ import annotations

import time
from collections import Counter
from pathlib import Path

import orjson
from confluent_kafka import Producer

from tests.support.kafka import create_topic, read_all
from tests.support.procs import AppProcess


def test_the_last_window_fires_when_the_input_goes_quiet(  # type: ignore[no-untyped-def]
    kafka_bootstrap: str, names, tmp_path: Path
) -> None:
    inp, out = names("quiet-in"), names("quiet-out")
    create_topic(kafka_bootstrap, inp, 2)
    base = (int(time.time() * 1000) // 1000 - 600) * 1000  # ten minutes ago, on a second
    events = [(k, base + 100 * i) for i in range(35) for k in ("a", "b", "c")]
    p = Producer({"bootstrap.servers": kafka_bootstrap, "partitioner": "murmur2_random"})
    for key, ts in events:
        p.produce(inp, orjson.dumps({"ts": ts}), key.encode())
    assert p.flush(30) == 0
    windows = Counter((k, ts - ts % 1000) for k, ts in events)
    want = Counter({(k, s, s + 1000, n): 1 for (k, s), n in windows.items()})
    env = {
        "LOCKGATE_BOOTSTRAP_SERVERS": kafka_bootstrap,
        "LOCKGATE_APP_NAME": names("quiet"),
        "LOCKGATE_INPUT_TOPIC": inp,
        "LOCKGATE_OUTPUT_TOPIC": out,
        "LOCKGATE_CHECKPOINT_INTERVAL_MS": "300",
        "LOCKGATE_STATE_DIR": str(tmp_path / "state"),
        "LOCKGATE_INSTANCE_ID": "i1",
    }
    proc = AppProcess("tests.integration.apps.quiet_windows:app", env, tmp_path / "q.log").start()
    try:
        got: Counter[tuple[str, int, int, int]] = Counter()
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and got != want:
            got = Counter()
            for m in read_all(kafka_bootstrap, out, timeout=5, idle=1):
                v = orjson.loads(m.value())
                got[(m.key().decode(), v["start"], v["end"], v["count"])] += 1
    finally:
        code = proc.terminate()
    log = proc.log_text()
    assert code == 0, log[-3000:]
    # The last window of each key ([base + 3000, base + 4000)) has no later record: only
    # processing time can have closed it.
    assert {(k, base + 3000, base + 4000, 5) for k in "abc"} <= set(got), (got, log[-2000:])
    assert got == want, (got - want, want - got)
