"""Bounded runs that end with a savepoint (``lockgate run --until BOUND --savepoint``).

``tests/integration/apps/bounded_totals.py`` (``App("bounded-totals",
env=["LOCKGATE_WINDOW_MS"])``: a value store ``totals`` per key and tumbling event-time
windows) over a four-partition input, half of it written in producer
transactions, run by two instances of one bounded run on the real broker:

* both exit 0, each printing the same savepoint id; ``lockgate savepoint list --json``
  lists exactly that one, complete; its window stores are empty (taken after the drain:
  every window fired) and the committed output equals an independent model (every
  window once); a fresh instance restored from it (``LOCKGATE_FROM_SAVEPOINT``) answers
  every key's total as the model computes it from the input; a rerun of the finished run
  takes no second savepoint and prints the same id;
* an unusable location fails the run: exit 1 with the reason, within a bound, no hang;
* one instance SIGKILLs itself in the savepoint phase (crash point ``after_export``: its
  manifests exported, not committed) and is started again: both end with exit 0, one
  complete savepoint, exact output and restored state;
* the same kill with the killed instance NOT started again: the survivor takes over its
  key groups (short session timeout), takes the savepoint for them too (the key groups
  it drained after the request are not "past" it: a committed manifest decides) and
  exits 0 with one complete savepoint and exact output.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections import Counter
from pathlib import Path
from typing import Any

import orjson
from confluent_kafka import Producer

from tests.support.kafka import create_topic, read_all
from tests.support.ports import free_port
from tests.support.procs import AppProcess, lockgate_cli, wait_until

SPEC = "tests.integration.apps.bounded_totals:app"
WINDOW_MS = 1000
PARTITIONS = 4
KEYS = [f"k{i}" for i in range(10)]


def _events(count: int) -> list[tuple[str, int, int, int]]:
    """(key, event time, v, seq): increasing time, so nothing is late."""
    return [(KEYS[i % len(KEYS)], 50 * i, i % 7 + 1, i) for i in range(count)]


def _produce(bootstrap: str, topic: str, events: list[tuple[str, int, int, int]], txn: str) -> None:
    """Half plain, half in transactions of 9 records (partitions end in markers)."""
    plain = Producer({"bootstrap.servers": bootstrap, "partitioner": "murmur2_random"})
    tx = Producer(
        {"bootstrap.servers": bootstrap, "partitioner": "murmur2_random", "transactional.id": txn}
    )
    tx.init_transactions(30)
    half = len(events) // 2
    for key, ts, v, seq in events[:half]:
        plain.produce(topic, orjson.dumps({"ts": ts, "v": v, "seq": seq}), key.encode())
    assert plain.flush(30) == 0
    rest = events[half:]
    for i in range(0, len(rest), 9):
        tx.begin_transaction()
        for key, ts, v, seq in rest[i : i + 9]:
            tx.produce(topic, orjson.dumps({"ts": ts, "v": v, "seq": seq}), key.encode())
        tx.commit_transaction(30)


def _window_model(events: list[tuple[str, int, int, int]]) -> Counter[tuple[str, int, int, int]]:
    """Every (key, start, end, count) window of one drained run over all events, once."""
    per = Counter((key, ts - ts % WINDOW_MS) for key, ts, _, _ in events)
    return Counter({(k, s, s + WINDOW_MS, n): 1 for (k, s), n in per.items()})


def _totals_model(events: list[tuple[str, int, int, int]]) -> dict[str, list[int]]:
    model: dict[str, list[int]] = {}
    for key, _, v, _ in events:
        s, c = model.get(key, [0, 0])
        model[key] = [s + v, c + 1]
    return model


def _outputs(bootstrap: str, out: str) -> Counter[tuple[str, int, int, int]]:
    got: Counter[tuple[str, int, int, int]] = Counter()
    for m in read_all(bootstrap, out, timeout=20, idle=2):
        v = orjson.loads(m.value())
        got[(m.key().decode(), v["start"], v["end"], v["count"])] += 1
    return got


class _Run:
    """The topics, names and environment of one test's bounded run."""

    def __init__(self, bootstrap: str, names: Any, tmp_path: Path, events: int = 600) -> None:  # noqa: ANN401
        self.bootstrap = bootstrap
        self.tmp = tmp_path
        self.inp, self.out = names("bsp-in"), names("bsp-out")
        self.app = names("bsp")
        self.sp_dir = str(tmp_path / "savepoints")
        create_topic(bootstrap, self.inp, PARTITIONS)
        self.events = _events(events)
        _produce(bootstrap, self.inp, self.events, names("bsp-tx"))

    def env(self, instance: str, **extra: str) -> dict[str, str]:
        return {
            "LOCKGATE_BOOTSTRAP_SERVERS": self.bootstrap,
            "LOCKGATE_APP_NAME": self.app,
            "LOCKGATE_INPUT_TOPIC": self.inp,
            "LOCKGATE_OUTPUT_TOPIC": self.out,
            "LOCKGATE_WINDOW_MS": str(WINDOW_MS),
            "LOCKGATE_CHECKPOINT_INTERVAL_MS": "300",
            "LOCKGATE_STATE_DIR": str(self.tmp / f"state-{instance}"),
            "LOCKGATE_INSTANCE_ID": instance,
            "LOCKGATE_SAVEPOINT_DIR": self.sp_dir,
            # Slow enough that both instances own key groups before the bound.
            "LOCKGATE_TEST_BSP_SLEEP_MS": "15",
            **extra,
        }

    def instance(
        self, instance: str, log: str, args: tuple[str, ...] = (), **extra: str
    ) -> AppProcess:
        return AppProcess(SPEC, self.env(instance, **extra), self.tmp / log, args).start()

    def savepoints(self) -> list[dict[str, Any]]:
        done = lockgate_cli(
            {"LOCKGATE_BOOTSTRAP_SERVERS": self.bootstrap, "LOCKGATE_SAVEPOINT_DIR": self.sp_dir},
            "savepoint",
            "list",
            "--json",
        )
        assert done.returncode == 0, done.stderr
        rows: list[dict[str, Any]] = json.loads(done.stdout)
        return rows

    def describe(self, sp_id: str) -> dict[str, Any]:
        done = lockgate_cli(
            {"LOCKGATE_BOOTSTRAP_SERVERS": self.bootstrap, "LOCKGATE_SAVEPOINT_DIR": self.sp_dir},
            "savepoint",
            "describe",
            sp_id,
            "--json",
        )
        assert done.returncode == 0, done.stderr
        d: dict[str, Any] = json.loads(done.stdout)
        return d


def _wait_all(procs: list[AppProcess], timeout: float) -> list[int]:
    codes = []
    try:
        for p in procs:
            codes.append(p.wait(timeout))
    except Exception:
        for p in procs:
            p.kill9()
        raise
    return codes


def _logs(procs: list[AppProcess]) -> str:
    return "\n=====\n".join(p.log_text()[-4000:] for p in procs)


def _get(port: int, path: str) -> tuple[int, Any]:
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}")  # noqa: S310 - test URL
    try:
        with urllib.request.urlopen(req, timeout=10) as r:  # noqa: S310
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read() or b"{}")
    except OSError:
        return 0, {}


def _check_savepoint(run: _Run, sp_id: str) -> None:
    """One complete bounded-run savepoint: every key group, taken after the drain."""
    rows = run.savepoints()
    assert [r["savepoint"] for r in rows] == [sp_id], rows
    assert rows[0]["apps"] == [run.app] and not rows[0]["stop"]
    d = run.describe(sp_id)
    assert d["bounded"]["until"] == "now", d.get("bounded")
    manifests = d["apps"][run.app]["manifests"]
    assert sorted(m["key_group"] for m in manifests) == list(range(PARTITIONS))
    keys = 0
    windows = 0
    for m in manifests:
        assert set(m["stores"]) >= {"totals", "lockgate.time"}, m["stores"]
        for name, st in m["stores"].items():
            if name == "totals":
                keys += st["entries"]
            elif name.startswith("window-"):
                # Every window fired at the final watermark (and was purged).
                assert st["entries"] == 0, (name, st)
                windows += 1
    assert keys == len(KEYS)
    assert windows == PARTITIONS


def _check_restore(run: _Run, sp_id: str) -> None:
    """A fresh instance restored from the savepoint holds the model's totals."""
    port = free_port()
    restored = run.instance(
        "r1",
        "restored.log",
        LOCKGATE_FROM_SAVEPOINT=sp_id,
        LOCKGATE_HTTP_PORT=str(port),
        LOCKGATE_QUERY_ENABLED="true",
    )
    try:
        model = _totals_model(run.events)
        answers: dict[str, Any] = {}

        def all_answered() -> bool:
            for key in KEYS:
                if key not in answers:
                    code, body = _get(port, f"/state/totals/{key}")
                    if code != 200:
                        return False
                    answers[key] = body["value"]
            return True

        wait_until(all_answered, 120, what="the restored instance answers every key")
        assert answers == model, (answers, model)
        assert "key group seeded from a savepoint" in restored.log_text()
    finally:
        assert restored.terminate(60) == 0, restored.log_text()[-3000:]


def test_two_instances_end_with_one_complete_savepoint(  # type: ignore[no-untyped-def]
    kafka_bootstrap: str, names, tmp_path: Path
) -> None:
    run = _Run(kafka_bootstrap, names, tmp_path)
    # One instance by the flags, one by the environment.
    a = run.instance("i1", "i1.log", ("--until", "now", "--savepoint"))
    b = run.instance("i2", "i2.log", LOCKGATE_UNTIL="now", LOCKGATE_UNTIL_SAVEPOINT="default")
    codes = _wait_all([a, b], 300)
    assert codes == [0, 0], _logs([a, b])
    rows = run.savepoints()
    assert len(rows) == 1, rows
    sp_id = rows[0]["savepoint"]
    for p in (a, b):
        assert sp_id in p.log_text(), p.log_text()[-3000:]
    # `lockgate run` prints the id as its last line on stdout.
    assert a.log_text().rstrip().splitlines()[-1] == sp_id
    _check_savepoint(run, sp_id)
    assert _outputs(kafka_bootstrap, run.out) == _window_model(run.events)

    # The same bounded run again: nothing left, the state is the savepoint's: no second
    # savepoint, the same id.
    again = run.instance("i1", "again.log", ("--until", "now", "--savepoint"))
    assert _wait_all([again], 180) == [0], again.log_text()[-3000:]
    assert again.log_text().rstrip().splitlines()[-1] == sp_id
    assert "no new savepoint is taken" in again.log_text()
    assert [r["savepoint"] for r in run.savepoints()] == [sp_id]
    assert _outputs(kafka_bootstrap, run.out) == _window_model(run.events)

    _check_restore(run, sp_id)


def test_an_unusable_location_fails_the_run(  # type: ignore[no-untyped-def]
    kafka_bootstrap: str, names, tmp_path: Path
) -> None:
    run = _Run(kafka_bootstrap, names, tmp_path, events=120)
    blocker = tmp_path / "blocker"
    blocker.write_text("a file, not a directory")
    location = str(blocker / "savepoints")
    p = run.instance("i1", "bad.log", ("--until", "now", "--savepoint", location))
    code = _wait_all([p], 180)[0]
    log = p.log_text()
    assert code == 1, log[-3000:]
    assert "bounded run" in log and "savepoint" in log and str(blocker) in log, log[-3000:]
    assert "Not a directory" in log or "cannot write" in log, log[-3000:]


def test_savepoint_without_until_is_a_usage_error(tmp_path: Path) -> None:
    done = lockgate_cli(
        {"LOCKGATE_BOOTSTRAP_SERVERS": "127.0.0.1:1", "LOCKGATE_SAVEPOINT_DIR": str(tmp_path)},
        "run",
        SPEC,
        "--savepoint",
        timeout=60,
    )
    assert done.returncode == 2, done.stderr
    assert "--savepoint needs --until" in done.stderr


def test_kill_in_the_savepoint_phase_and_rerun(  # type: ignore[no-untyped-def]
    kafka_bootstrap: str, names, tmp_path: Path
) -> None:
    run = _Run(kafka_bootstrap, names, tmp_path)
    a = run.instance("i1", "i1.log", ("--until", "now", "--savepoint"))
    # i2 SIGKILLs itself with its savepoint manifests exported, not committed.
    b = run.instance(
        "i2",
        "i2.log",
        ("--until", "now", "--savepoint"),
        LOCKGATE_TEST_CRASH_POINTS="after_export:1",
    )
    try:
        assert b.wait(240) == -9, b.log_text()[-3000:]
    except Exception:
        a.kill9()
        raise
    assert "crash point after_export" in b.log_text()
    assert a.alive, a.log_text()[-3000:]  # still waiting for i2's key groups
    assert run.savepoints() == []
    b2 = run.instance("i2", "i2-again.log", ("--until", "now", "--savepoint"))
    codes = _wait_all([a, b2], 300)
    assert codes == [0, 0], _logs([a, b2])
    rows = run.savepoints()
    assert len(rows) == 1, rows
    sp_id = rows[0]["savepoint"]
    assert a.log_text().rstrip().splitlines()[-1] == sp_id
    assert b2.log_text().rstrip().splitlines()[-1] == sp_id
    _check_savepoint(run, sp_id)
    assert _outputs(kafka_bootstrap, run.out) == _window_model(run.events)
    _check_restore(run, sp_id)


def test_kill_in_the_savepoint_phase_and_survivor_takes_over(  # type: ignore[no-untyped-def]
    kafka_bootstrap: str, names, tmp_path: Path
) -> None:
    run = _Run(kafka_bootstrap, names, tmp_path)
    short = {
        "LOCKGATE_KAFKA__SESSION_TIMEOUT_MS": "10000",
        "LOCKGATE_KAFKA__HEARTBEAT_INTERVAL_MS": "1000",
        "LOCKGATE_UNTIL_SAVEPOINT_TIMEOUT_MS": "120000",
    }
    a = run.instance("i1", "i1.log", ("--until", "now", "--savepoint"), **short)
    # i2 SIGKILLs itself with its savepoint manifests exported, not committed; it is not
    # started again: i1 is assigned its key groups after the session timeout.
    b = run.instance(
        "i2",
        "i2.log",
        ("--until", "now", "--savepoint"),
        LOCKGATE_TEST_CRASH_POINTS="after_export:1",
        **short,
    )
    try:
        assert b.wait(240) == -9, b.log_text()[-3000:]
    except Exception:
        a.kill9()
        raise
    assert "crash point after_export" in b.log_text()
    codes = _wait_all([a], 200)
    assert codes == [0], _logs([a, b])
    rows = run.savepoints()
    assert len(rows) == 1, rows
    sp_id = rows[0]["savepoint"]
    assert a.log_text().rstrip().splitlines()[-1] == sp_id
    _check_savepoint(run, sp_id)
    assert _outputs(kafka_bootstrap, run.out) == _window_model(run.events)
