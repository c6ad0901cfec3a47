"""Restoring a savepoint into code whose window declarations were reordered.

Window stores and timers are numbered by declaration order (``window-<n>``,
``w<n>:...``); a savepoint records each operator's id with its stores, and a restore
gives every operator the state saved under its id. ``reordered_windows:v1`` counts
clicks in 1000 ms and views in 1500 ms tumbling windows, declared in that order; after
a stop-with-savepoint with windows open (state and timers pending),
``reordered_windows:v2`` — the same windows declared the other way round — restores
from it, and every window's count continues exactly (an independent model over the
event times), none swapped between the operators.
"""

from __future__ import annotations

import random
import subprocess
import time
from collections import Counter
from pathlib import Path
from typing import Any

import orjson
import pytest
from confluent_kafka import Producer

from state.savepoint import SavepointStore
from tests.integration.apps import reordered_windows
from tests.support.kafka import create_topic, read_all
from tests.support.procs import AppProcess, lockgate_cli

SIZES = {"clicks": 1000, "views": 1500}
KEYS = [f"user-{i}" for i in range(5)]

Event = tuple[str, int]  # (key, event time)
Window = tuple[str, str, int, int, int]  # (op, key, start, end, count)


def _events(rng: random.Random, start: int, n: int, step: int) -> list[Event]:
    """``n`` events at increasing event times from ``start`` (monotonous per input)."""
    out = []
    ts = start
    for _ in range(n):
        ts += rng.randrange(1, step)
        out.append((rng.choice(KEYS), ts))
    return out


def _produce(bootstrap: str, topic: str, events: list[Event], seq0: int) -> None:
    p = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5, "enable.idempotence": True})
    for i, (key, ts) in enumerate(events):
        p.produce(topic, orjson.dumps({"ts": ts, "seq": seq0 + i}), key.encode())
    assert p.flush(30) == 0


def _model(clicks: list[Event], views: list[Event]) -> Counter[Window]:
    """Every window fired by the watermark after all events (one partition).

    The key group's watermark is the minimum over its inputs of their newest event time
    minus one (monotonous): a window fires once that reaches its last millisecond. No
    event is late (event times increase per input).
    """
    wm = min(clicks[-1][1], views[-1][1]) - 1
    out: Counter[Window] = Counter()
    for op, events in (("clicks", clicks), ("views", views)):
        size = SIZES[op]
        counts = Counter((key, ts - ts % size) for key, ts in events)
        for (key, start), n in counts.items():
            if start + size - 1 <= wm:
                out[(op, key, start, start + size, n)] += 1
    return out


def _windows(msgs: list[Any]) -> Counter[Window]:
    out: Counter[Window] = Counter()
    for m in msgs:
        if m.value() is None or any(k == "lockgate-type" for k, _ in m.headers() or ()):
            continue
        v = orjson.loads(m.value())
        out[(v["op"], m.key().decode(), v["start"], v["end"], v["value"])] += 1
    return out


@pytest.mark.parametrize(
    ("restore", "legacy"),
    [("v2", False), ("v1", True)],
    ids=["reordered", "savepoint-without-ids-into-the-same-order"],
)
def test_reordered_window_declarations_restore_their_own_state(  # type: ignore[no-untyped-def]
    kafka_bootstrap: str, names, tmp_path: Path, restore: str, legacy: bool
) -> None:
    """``legacy``: the savepoint's ids are removed first (as one taken before they were
    recorded); restored into the code it was taken with, it continues as before, by
    store name, with a warning."""
    app = names("reordered")
    clicks_topic, views_topic, out = names("clicks"), names("views"), names("reordered-out")
    for topic in (clicks_topic, views_topic):
        create_topic(kafka_bootstrap, topic, 1)
    sp_dir = tmp_path / "sp"
    base = {
        "LOCKGATE_BOOTSTRAP_SERVERS": kafka_bootstrap,
        "LOCKGATE_APP_NAME": app,
        reordered_windows.CLICKS_ENV: clicks_topic,
        reordered_windows.VIEWS_ENV: views_topic,
        "LOCKGATE_OUTPUT_TOPIC": out,
        "LOCKGATE_CHECKPOINT_INTERVAL_MS": "300",
        "LOCKGATE_SAVEPOINT_DIR": str(sp_dir),
        "LOCKGATE_INSTANCE_ID": "i1",
    }
    rng = random.Random(25)
    clicks = _events(rng, 0, 300, 20)  # up to ~3 s of event time
    views = _events(rng, 0, 200, 30)
    _produce(kafka_bootstrap, clicks_topic, clicks, 0)
    _produce(kafka_bootstrap, views_topic, views, 0)

    def start(version: str, state: str, **extra: str) -> AppProcess:
        env = {**base, "LOCKGATE_STATE_DIR": str(tmp_path / state), **extra}
        spec = f"tests.integration.apps.reordered_windows:{version}"
        return AppProcess(spec, env, tmp_path / f"{version}-{state}.log").start()

    first = _model(clicks, views)
    assert first, "no window fires: produce more"
    v1 = start("v1", "s1")
    try:
        msgs = read_all(kafka_bootstrap, out, expected=sum(first.values()), timeout=60, idle=1)
        assert _windows(msgs) == first, v1.log_text()[-3000:]
        cli_env = {k: base[k] for k in ("LOCKGATE_BOOTSTRAP_SERVERS", "LOCKGATE_SAVEPOINT_DIR")}
        trig = lockgate_cli(
            cli_env, "savepoint", "trigger", "--app", app, "--stop", "--timeout", "60"
        )
        assert trig.returncode == 0, trig.stderr + v1.log_text()[-3000:]
        sp_id = trig.stdout.strip().splitlines()[-1]
    finally:
        assert v1.terminate() == 0, v1.log_text()[-3000:]
    # Windows open at the cut: both operators' state and their timers are in it.
    saved = SavepointStore(str(sp_dir)).read_descriptor(sp_id)["apps"][app]["manifests"][0]
    for store in ("window-1", "window-2", "lockgate.time"):
        assert saved["stores"][store]["entries"] > 0, saved

    more_clicks = _events(rng, clicks[-1][1], 300, 20)
    more_views = _events(rng, views[-1][1], 200, 30)
    _produce(kafka_bootstrap, clicks_topic, more_clicks, len(clicks))
    _produce(kafka_bootstrap, views_topic, more_views, len(views))
    expected = _model(clicks + more_clicks, views + more_views)
    if legacy:
        path = sp_dir / sp_id / "_savepoint.json"
        descriptor = orjson.loads(path.read_bytes())
        for manifest in descriptor["apps"][app]["manifests"]:
            for entry in manifest["stores"].values():
                entry.pop("operator", None)
                entry.pop("timers", None)
        path.write_bytes(orjson.dumps(descriptor))
    v2 = start(restore, "s2", LOCKGATE_FROM_SAVEPOINT=sp_id)
    try:
        msgs = read_all(kafka_bootstrap, out, expected=sum(expected.values()), timeout=90, idle=2)
    finally:
        assert v2.terminate() == 0, v2.log_text()[-3000:]
    assert "seeded from a savepoint" in v2.log_text(), v2.log_text()[-3000:]
    got = _windows(msgs)
    missing, extra = expected - got, got - expected
    assert not missing and not extra, (
        f"{sum(missing.values())} windows missing, e.g. {sorted(missing)[:5]}; "
        f"{sum(extra.values())} unexpected, e.g. {sorted(extra)[:5]}\n" + v2.log_text()[-3000:]
    )
    assert ("records no operator ids" in v2.log_text()) == legacy, v2.log_text()[-3000:]
    # The savepoint named the operators of the stores.
    assert saved["stores"]["window-1"]["operator"] == f"window({clicks_topic})"
    assert saved["stores"]["window-2"]["operator"] == f"window({views_topic})"


def test_a_restart_into_reordered_windows_is_refused(  # type: ignore[no-untyped-def]
    kafka_bootstrap: str, names, tmp_path: Path
) -> None:
    """Without a savepoint the changelogs, numbered by declaration order, would swap state."""
    app = names("reordered")
    clicks_topic, views_topic, out = names("clicks"), names("views"), names("reordered-out")
    for topic in (clicks_topic, views_topic):
        create_topic(kafka_bootstrap, topic, 1)
    base = {
        "LOCKGATE_BOOTSTRAP_SERVERS": kafka_bootstrap,
        "LOCKGATE_APP_NAME": app,
        reordered_windows.CLICKS_ENV: clicks_topic,
        reordered_windows.VIEWS_ENV: views_topic,
        "LOCKGATE_OUTPUT_TOPIC": out,
        "LOCKGATE_CHECKPOINT_INTERVAL_MS": "300",
        "LOCKGATE_INSTANCE_ID": "i1",
        "LOCKGATE_STATE_DIR": str(tmp_path / "state"),
    }
    rng = random.Random(26)
    clicks, views = _events(rng, 0, 300, 20), _events(rng, 0, 200, 30)
    _produce(kafka_bootstrap, clicks_topic, clicks, 0)
    _produce(kafka_bootstrap, views_topic, views, 0)
    first = _model(clicks, views)
    assert first, "no window fires: produce more"
    spec = "tests.integration.apps.reordered_windows"
    v1 = AppProcess(f"{spec}:v1", base, tmp_path / "v1.log").start()
    try:
        msgs = read_all(kafka_bootstrap, out, expected=sum(first.values()), timeout=60, idle=1)
        assert _windows(msgs) == first, v1.log_text()[-3000:]
    finally:
        assert v1.terminate() == 0, v1.log_text()[-3000:]
    v2 = AppProcess(f"{spec}:v2", base, tmp_path / "v2.log").start()
    code: int | None = None
    try:
        code = v2.wait(60)
    except subprocess.TimeoutExpired:
        pass  # it runs: on state restored into the other operator
    finally:
        if v2.alive:
            v2.kill9()
    log = v2.log_text()
    assert code == 2, f"the reordered app started on swapped state (exit {code})\n{log[-3000:]}"
    assert f"window-1 (state of 'window({clicks_topic})', now 'window({views_topic})')" in log, log
    assert "--from-savepoint" in log, log
    # the same code restarts (the ids own the same stores)
    again = AppProcess(f"{spec}:v1", base, tmp_path / "v1-again.log").start()
    try:
        time.sleep(5)
        assert again.alive, again.log_text()[-3000:]
    finally:
        assert again.terminate() == 0, again.log_text()[-3000:]
    # what the refusal is based on: the ids and their stores, as v1 registered them
    registry = read_all(kafka_bootstrap, "lockgate.registry", timeout=20, idle=3)
    registered = [orjson.loads(m.value()) for m in registry if m.key() == f"app/{app}".encode()]
    assert registered, "no registration"
    assert registered[-1]["operators"] == {
        f"window({clicks_topic})": ["window-1"],
        f"window({views_topic})": ["window-2"],
    }, registered
