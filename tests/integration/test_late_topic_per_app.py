"""Two deployments of one window app (two app names) write two late topics.

``examples.window_count`` declares ``late_topic=True``: its late records go to
``<app name>.late`` (its window size and delay come from the variables it declares,
``App("window-count", env=["LOCKGATE_WINDOW_MS", "LOCKGATE_MAX_DELAY_MS"])``). Run under
two ``LOCKGATE_APP_NAME``s over one input, each deployment's late topic holds exactly the
late records, once each (one shared late topic held every late record twice).
"""

from __future__ import annotations

from pathlib import Path

import orjson
from confluent_kafka import Producer

from tests.support.kafka import create_topic, read_all
from tests.support.procs import AppProcess

WINDOW_MS = 1000
# (key, event time), in input order (one partition: one key group).
EVENTS = [
    ("a", 100),
    ("b", 900),
    ("a", 2500),  # watermark 2499: [0, 1000) fires for a and b
    ("b", 300),  # late
    ("c", 2600),  # on time: [2000, 3000) has not fired
    ("a", 5000),  # watermark 4999: [2000, 3000) fires
    ("c", 1999),  # late
    ("a", 10),  # late
    ("b", 5500),  # on time
]


def _late(events: list[tuple[str, int]]) -> set[int]:
    """Indexes of the late events: their window ended at or before the key group's
    watermark (the newest event time before them - 1: no delay allowed)."""
    late, wm = set(), None
    for i, (_, ts) in enumerate(events):
        end = ts - ts % WINDOW_MS + WINDOW_MS
        if wm is not None and end - 1 <= wm:
            late.add(i)
        wm = ts - 1 if wm is None else max(wm, ts - 1)
    return late


LATE = _late(EVENTS)
assert LATE == {3, 6, 7}


def test_two_app_names_write_two_late_topics(  # type: ignore[no-untyped-def]
    kafka_bootstrap: str, names, tmp_path: Path
) -> None:
    inp, out = names("late-in"), names("late-out")
    create_topic(kafka_bootstrap, inp, 1)
    p = Producer({"bootstrap.servers": kafka_bootstrap, "enable.idempotence": True})
    for seq, (key, ts) in enumerate(EVENTS):
        p.produce(inp, orjson.dumps({"ts": ts, "seq": seq}), key.encode())
        p.flush(10)  # one at a time: the input's order is the list's
    assert p.flush(30) == 0
    apps = [names("window-count-eu"), names("window-count-us")]
    procs = []
    for app in apps:
        env = {
            "LOCKGATE_BOOTSTRAP_SERVERS": kafka_bootstrap,
            "LOCKGATE_APP_NAME": app,
            "LOCKGATE_INPUT_TOPIC": inp,
            "LOCKGATE_OUTPUT_TOPIC": out,
            "LOCKGATE_WINDOW_MS": str(WINDOW_MS),
            "LOCKGATE_MAX_DELAY_MS": "0",
            "LOCKGATE_CHECKPOINT_INTERVAL_MS": "200",
            "LOCKGATE_STATE_DIR": str(tmp_path / app),
            "LOCKGATE_INSTANCE_ID": "i1",
        }
        proc = AppProcess("examples.window_count:app", env, tmp_path / f"{app}.log")
        procs.append(proc.start())
    try:
        late = {
            app: read_all(kafka_bootstrap, f"{app}.late", expected=len(LATE), timeout=60, idle=2)
            for app in apps
        }
    finally:
        codes = [proc.terminate() for proc in procs]
    logs = "\n".join(proc.log_text()[-2000:] for proc in procs)
    assert codes == [0, 0], logs
    for app in apps:
        seqs = sorted(orjson.loads(m.value())["seq"] for m in late[app])
        assert seqs == sorted(LATE), f"{app}.late: {seqs}\n{logs}"
