"""Watermarks across apps: a downstream window fires on its upstream writers' barriers.

The upstream reads a 3-partition topic of which only partitions 0 and 1 get records:
its key group 2 never sees an event time. With an idleness timeout it announces itself
idle in its barriers, the downstream leaves it out of the minimum and its windows fire;
the counts must equal a group-by of the input. Without idleness key group 2 holds every
downstream watermark back, and nothing fires. (The apps, tests/integration/apps/et_pipeline.py,
declare env=["LOCKGATE_REPART_TOPIC", "LOCKGATE_IDLE_MS"]; apps/et_three.py
env=["LOCKGATE_REPART_TOPIC", "LOCKGATE_REPART2_TOPIC"].)
"""

from __future__ import annotations

import random
import re
import time
from collections import Counter
from pathlib import Path

import orjson
import pytest
from confluent_kafka import Producer

from processors import key_group
from tests.support.kafka import create_topic, read_all, unique
from tests.support.procs import AppProcess

PARTITIONS = 3
WINDOW_MS = 1000


def _users(parts: set[int]) -> list[str]:
    return [
        u for u in (f"user{i}" for i in range(200)) if key_group(u.encode(), PARTITIONS) in parts
    ]


def _start(module: str, apps: tuple[str, ...], env: dict[str, str], tmp: Path) -> list[AppProcess]:
    """Start one instance of each app of ``tests/integration/apps/<module>.py``."""
    return [
        AppProcess(
            f"tests.integration.apps.{module}:{name}",
            {**env, "LOCKGATE_APP_NAME": unique(name), "LOCKGATE_STATE_DIR": str(tmp / name)},
            tmp / f"{name}.log",
        ).start()
        for name in apps
    ]


def _produce(bootstrap: str, topic: str, records: list[tuple[str, dict[str, object]]]) -> None:
    p = Producer({"bootstrap.servers": bootstrap, "partitioner": "murmur2_random", "linger.ms": 5})
    for key, value in records:
        p.produce(topic, orjson.dumps(value), key.encode())
    assert p.flush(30) == 0


@pytest.mark.parametrize("idle_ms", [2000, 0])
def test_downstream_windows_fire_on_upstream_watermarks(
    kafka_bootstrap: str, tmp_path: Path, idle_ms: int
) -> None:
    inp, repart, out = unique("et-in"), unique("et-rep"), unique("et-out")
    create_topic(kafka_bootstrap, inp, PARTITIONS)
    create_topic(kafka_bootstrap, repart, 2)
    rng = random.Random(7)
    users = _users({0, 1})
    base = (int(time.time() * 1000) - 600_000) // WINDOW_MS * WINDOW_MS
    records = []
    for seq in range(1500):
        ts = base + seq * 7  # in order: nothing is late anywhere
        records.append(
            (rng.choice(users), {"ts": ts, "region": f"r{rng.randrange(4)}", "seq": seq})
        )
    flush = base + 1500 * 7 + 10 * WINDOW_MS
    for g in (0, 1):  # push both active partitions' watermarks past the data
        user = next(u for u in users if key_group(u.encode(), PARTITIONS) == g)
        records.append((user, {"ts": flush, "region": "flush", "seq": -1 - g}))
    _produce(kafka_bootstrap, inp, records)
    expected = Counter(
        (v["region"], v["ts"] // WINDOW_MS * WINDOW_MS)
        for _, v in records
        if v["region"] != "flush"
    )
    env = {
        "LOCKGATE_BOOTSTRAP_SERVERS": kafka_bootstrap,
        "LOCKGATE_INPUT_TOPIC": inp,
        "LOCKGATE_REPART_TOPIC": repart,
        "LOCKGATE_OUTPUT_TOPIC": out,
        "LOCKGATE_IDLE_MS": str(idle_ms),
        "LOCKGATE_CHECKPOINT_INTERVAL_MS": "300",
        "LOCKGATE_INSTANCE_ID": "i1",
    }
    procs = _start("et_pipeline", ("upstream", "downstream"), env, tmp_path)
    try:
        if idle_ms:
            got = read_all(kafka_bootstrap, out, expected=len(expected), timeout=90, idle=3)
        else:
            got = read_all(kafka_bootstrap, out, expected=None, timeout=12, idle=12)
        late = read_all(kafka_bootstrap, f"{out}.late", timeout=5, idle=1)
        codes = [p.terminate(60) for p in procs]
    except BaseException:
        for p in procs:
            print(p.log_text()[-3000:])
        raise
    logs = "\n".join(p.log_text()[-3000:] for p in procs)
    assert codes == [0, 0], logs
    if not idle_ms:
        assert got == [], f"{len(got)} windows fired while upstream key group 2 held the watermark"
        return
    counts = Counter()
    for m in got:
        v = orjson.loads(m.value())
        assert v["end"] == v["start"] + WINDOW_MS
        counts[(m.key().decode(), v["start"])] += v["count"]
    late_info = [(m.key(), m.value(), m.headers()) for m in late[:5]]
    assert late == [], f"{len(late)} late records downstream, e.g. {late_info}"
    missing = sorted(set(expected) - set(counts))
    assert len(got) == len(expected), (
        f"{len(got)} windows for {len(expected)} expected; missing {missing} (base {base})\n{logs}"
    )
    assert counts == expected, logs


def test_three_stages_forward_the_final_watermark(kafka_bootstrap: str, tmp_path: Path) -> None:
    """A middle stage re-announces a watermark that moved after its last barrier.

    The source is never idle: after its data it sends no barrier any more, and its last
    barrier moves the middle's watermark only after the middle forwarded that barrier.
    Only a re-announced barrier lets the last stage fire its final windows.
    """
    inp, rep, rep2, out = (unique(p) for p in ("et3-in", "et3-rep", "et3-rep2", "et3-out"))
    create_topic(kafka_bootstrap, inp, PARTITIONS)
    create_topic(kafka_bootstrap, rep, 2)
    create_topic(kafka_bootstrap, rep2, 2)
    rng = random.Random(8)
    users = _users({0, 1, 2})
    base = (int(time.time() * 1000) - 600_000) // WINDOW_MS * WINDOW_MS
    records = [
        (rng.choice(users), {"ts": base + seq * 7, "region": f"r{rng.randrange(3)}", "seq": seq})
        for seq in range(1200)
    ]
    _produce(kafka_bootstrap, inp, records)
    # The source's watermark ends at the last ts - 101: every window but the last fires.
    last_ts = base + 1199 * 7
    expected = Counter(
        (v["region"], v["ts"] // WINDOW_MS * WINDOW_MS)
        for _, v in records
        if v["ts"] // WINDOW_MS * WINDOW_MS + WINDOW_MS - 1 <= last_ts - 101
    )
    env = {
        "LOCKGATE_BOOTSTRAP_SERVERS": kafka_bootstrap,
        "LOCKGATE_INPUT_TOPIC": inp,
        "LOCKGATE_REPART_TOPIC": rep,
        "LOCKGATE_REPART2_TOPIC": rep2,
        "LOCKGATE_OUTPUT_TOPIC": out,
        "LOCKGATE_CHECKPOINT_INTERVAL_MS": "300",
        "LOCKGATE_INSTANCE_ID": "i1",
        "LOCKGATE_HTTP_PORT": "0",
    }
    procs = _start("et_three", ("source", "middle", "last"), env, tmp_path)
    try:
        got = read_all(kafka_bootstrap, out, expected=len(expected), timeout=90, idle=3)
        late = read_all(kafka_bootstrap, f"{out}.late", timeout=3, idle=1)
        codes = [p.terminate(60) for p in procs]
    except BaseException:
        for p in procs:
            print(p.log_text()[-3000:])
        raise
    logs = "\n".join(p.log_text()[-2000:] for p in procs)
    assert late == [], logs
    counts: Counter[tuple[str, int]] = Counter()
    for m in got:
        v = orjson.loads(m.value())
        counts[(m.key().decode(), v["start"])] += v["count"]
    assert len(got) == len(expected), f"{sorted(set(expected) - set(counts))}\n{logs}"
    assert counts == expected, logs
    assert codes == [0, 0, 0], logs


@pytest.mark.parametrize("alignment", ["aligned", "none"])
def test_an_idle_source_instance_does_not_freeze_three_stages(
    kafka_bootstrap: str, tmp_path: Path, alignment: str
) -> None:
    """Two source instances, one of which owns only a key group that never gets input.

    Its key group goes idle (``idle_ms``) and its instance processes nothing, yet it must
    keep ending barrier-only epochs: otherwise the middle's checkpoints never complete
    past its last barrier, the active writer's watermarks wait for that completion, and
    the last stage's windows stop firing (issue 25, hole 1). Live input at wall-clock
    times for about 12 s; every window up to the final watermark must fire with the
    right count.
    """
    inp, rep, rep2, out = (unique(p) for p in ("eti-in", "eti-rep", "eti-rep2", "eti-out"))
    create_topic(kafka_bootstrap, inp, 2)
    create_topic(kafka_bootstrap, rep, 2)
    create_topic(kafka_bootstrap, rep2, 2)
    users = [u for u in (f"user{i}" for i in range(200)) if key_group(u.encode(), 2) == 0]
    env = {
        "LOCKGATE_BOOTSTRAP_SERVERS": kafka_bootstrap,
        "LOCKGATE_INPUT_TOPIC": inp,
        "LOCKGATE_REPART_TOPIC": rep,
        "LOCKGATE_REPART2_TOPIC": rep2,
        "LOCKGATE_OUTPUT_TOPIC": out,
        "LOCKGATE_IDLE_MS": "1500",
        "LOCKGATE_CHECKPOINT_INTERVAL_MS": "300",
        "LOCKGATE_ALIGNMENT": alignment,
        "LOCKGATE_HTTP_PORT": "0",
    }
    names = {app: unique(app) for app in ("source", "middle", "last")}

    def instance(app: str, iid: str) -> AppProcess:
        return AppProcess(
            f"tests.integration.apps.et_three:{app}",
            {
                **env,
                "LOCKGATE_APP_NAME": names[app],
                "LOCKGATE_INSTANCE_ID": iid,
                "LOCKGATE_STATE_DIR": str(tmp_path / f"{app}-{iid}"),
            },
            tmp_path / f"{app}-{iid}.log",
        ).start()

    procs = [instance("source", "i1"), instance("source", "i2")]
    procs += [instance("middle", "i1"), instance("last", "i1")]

    def owned(p: AppProcess) -> set[int]:
        found: set[int] = set()
        for groups in re.findall(r"assigned  key_groups=\[([0-9, ]*)\]", p.log_text()):
            found |= {int(g) for g in groups.split(",") if g.strip()}
        return found

    try:
        deadline = time.monotonic() + 90
        while not (owned(procs[0]) and owned(procs[1])):
            assert time.monotonic() < deadline, "both source instances never held a key group"
            time.sleep(0.5)
        idle_one = 0 if 1 in owned(procs[0]) else 1
        print(f"source i{idle_one + 1} owns the idle key group 1")
        rng = random.Random(11)
        records = []
        p = Producer({"bootstrap.servers": kafka_bootstrap, "partitioner": "murmur2_random"})
        for seq in range(240):  # 20 per second for 12 s, at wall-clock event times
            value = {"ts": int(time.time() * 1000), "region": f"r{rng.randrange(3)}", "seq": seq}
            records.append(value)
            p.produce(inp, orjson.dumps(value), rng.choice(users).encode())
            p.poll(0)
            time.sleep(0.05)
        last_ts = int(time.time() * 1000) + 3 * WINDOW_MS
        p.produce(
            inp, orjson.dumps({"ts": last_ts, "region": "flush", "seq": -1}), users[0].encode()
        )
        assert p.flush(30) == 0
        final_wm = last_ts - 101  # the source's bound is 100 ms
        expected = Counter(
            (v["region"], v["ts"] // WINDOW_MS * WINDOW_MS)
            for v in records
            if v["ts"] // WINDOW_MS * WINDOW_MS + WINDOW_MS - 1 <= final_wm
        )
        got = read_all(kafka_bootstrap, out, expected=len(expected), timeout=60, idle=10)
        late = read_all(kafka_bootstrap, f"{out}.late", timeout=3, idle=1)
        codes = [p.terminate(60) for p in procs]
    except BaseException:
        for proc in procs:
            print(proc.log_text()[-3000:])
        raise
    logs = "\n".join(proc.log_text()[-2000:] for proc in procs)
    counts: Counter[tuple[str, int]] = Counter()
    for m in got:
        v = orjson.loads(m.value())
        counts[(m.key().decode(), v["start"])] += v["count"]
    assert late == [], logs
    missing = sorted(set(expected) - set(counts))
    assert len(got) == len(expected), f"{len(got)} of {len(expected)} windows; missing {missing}"
    assert counts == expected, logs
    assert codes == [0, 0, 0, 0], logs
