"""`lockgate checkpoints` and `lockgate savepoint` against the real broker.

The runtime is simulated: the tests write the registry, the checkpoint records (in
transactions, some aborted) and the savepoint manifests the runtime would write, then
run the CLI in-process with click's CliRunner.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest
from click.testing import CliRunner, Result
from confluent_kafka import Consumer, KafkaError, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from processors.cli import main

REGISTRY = "lockgate.registry"


@pytest.fixture(autouse=True)
def _env(monkeypatch: pytest.MonkeyPatch, kafka_bootstrap: str, tmp_path: Path) -> None:
    import os

    for name in list(os.environ):
        if name.upper().startswith("LOCKGATE_") and not name.upper().startswith("LOCKGATE_TEST_"):
            monkeypatch.delenv(name)
    monkeypatch.setenv("LOCKGATE_BOOTSTRAP_SERVERS", kafka_bootstrap)
    monkeypatch.setenv("LOCKGATE_SAVEPOINT_DIR", str(tmp_path / "savepoints"))
    monkeypatch.setenv("LOCKGATE_INSTANCE_ID", "ops-test")
    monkeypatch.setenv("LOCKGATE_LOG_LEVEL", "ERROR")


def _ensure_topic(bootstrap: str, name: str, partitions: int) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    futs = admin.create_topics(
        [NewTopic(name, partitions, 1, config={"cleanup.policy": "compact"})]
    )
    for fut in futs.values():
        try:
            fut.result(30)
        except Exception as exc:
            if exc.args[0].code() != KafkaError.TOPIC_ALREADY_EXISTS:
                raise
    deadline = time.monotonic() + 30
    while True:
        md = admin.list_topics(name, timeout=10).topics.get(name)
        if (
            md is not None
            and md.error is None
            and all(p.leader >= 0 for p in md.partitions.values())
        ):
            return
        assert time.monotonic() < deadline, name
        time.sleep(0.1)


class Sim:
    """The runtime's writes for some apps: registry, checkpoints, manifests."""

    def __init__(self, bootstrap: str) -> None:
        self.bootstrap = bootstrap
        self.tx = Producer(
            {"bootstrap.servers": bootstrap, "transactional.id": f"ops-test-{uuid.uuid4().hex}"}
        )
        self.tx.init_transactions(30)
        self.plain = Producer({"bootstrap.servers": bootstrap, "acks": "all"})

    def register(
        self, app: str, p: int, inputs: list[str], internal: tuple[str, ...] = (), **extra: Any
    ) -> None:
        _ensure_topic(self.bootstrap, REGISTRY, 1)
        _ensure_topic(self.bootstrap, f"{app}.control", p)
        value = {
            "app": app,
            "inputs": inputs,
            "outputs": [f"{app}-out"],
            "internal_outputs": list(internal),
            "key_groups": p,
            "stores": {"counts": {"kind": "value", "codec": "json"}},
            "state_version": "1",
            "instance": "i1",
            "ts": int(time.time() * 1000),
            **extra,
        }
        self.plain.produce(REGISTRY, orjson.dumps(value), f"app/{app}".encode(), partition=0)
        assert self.plain.flush(30) == 0

    def txn(self, records: list[tuple[str, int, str, dict[str, Any]]], commit: bool = True) -> None:
        """Write (topic, partition, key, value) records in one transaction."""
        self.tx.begin_transaction()
        for topic, part, key, value in records:
            self.tx.produce(topic, orjson.dumps(value), key.encode(), partition=part)
        if commit:
            self.tx.commit_transaction(30)
        else:
            self.tx.flush(30)
            self.tx.abort_transaction(30)

    def ckpt(self, app: str, g: int, c: int, commit: bool = True, **extra: Any) -> None:
        value = {
            "app": app,
            "key_group": g,
            "checkpoint": c,
            "instance": "i1",
            "offsets": {f"{app}-in": c // 1000},
            "align": {},
            "aligned": True,
            "origin": None,
            "halted": None,
            "ts": c,
            **extra,
        }
        self.txn([(f"{app}.control", g, f"ckpt/{g}", value)], commit)

    def manifest(
        self, app: str, sp: str, g: int, c: int, error: str | None = None
    ) -> tuple[str, int, str, dict[str, Any]]:
        value = {
            "savepoint": sp,
            "app": app,
            "key_group": g,
            "checkpoint": c,
            "offsets": {f"{app}-in": 10 + g},
            "align": {},
            "stores": {
                "counts": {
                    "kind": "value",
                    "codec": "json",
                    "file": "counts.lgs",
                    "sha256": "ab" * 32,
                    "entries": 3 + g,
                    "bytes": 100 + g,
                }
            },
            "error": error,
            "stop": False,
            "ts": int(time.time() * 1000),
        }
        return (f"{app}.control", g, f"savepoint/{sp}/{g}", value)

    def close(self) -> None:
        self.plain.flush(10)
        self.tx.flush(10)


@pytest.fixture
def sim(kafka_bootstrap: str) -> Iterator[Sim]:
    s = Sim(kafka_bootstrap)
    yield s
    s.close()


def run(*args: str) -> Result:
    return CliRunner().invoke(main, list(args), catch_exceptions=False)


def wait_request(bootstrap: str, app: str, timeout: float = 30) -> dict[str, Any]:
    """Return the first savepoint request written to ``<app>.control`` partition 0."""
    c = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": "ops-test",
            "enable.auto.commit": False,
            "isolation.level": "read_committed",
        }
    )
    c.assign([TopicPartition(f"{app}.control", 0, 0)])
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            for m in c.consume(100, 0.2):
                if m.error() is None and m.key().startswith(b"savepoint-request/"):
                    return orjson.loads(m.value())
    finally:
        c.close()
    raise AssertionError(f"no savepoint request on {app}.control")


def uniq(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


# ---------------------------------------------------------------- checkpoints


def test_checkpoints_list_counts_committed_records_only(sim: Sim) -> None:
    app = uniq("ops-ck")
    sim.register(app, 2, [f"{app}-in"])
    base = 1_700_000_000_000
    sim.ckpt(app, 0, base + 1000)
    sim.ckpt(app, 1, base + 1000)
    sim.ckpt(app, 0, base + 2000)
    sim.ckpt(app, 1, base + 2000)
    sim.ckpt(app, 0, base + 3000)
    sim.ckpt(app, 1, base + 3000, commit=False)  # aborted: 3000 is not complete
    sim.ckpt(app, 0, base + 4000, commit=False)  # aborted on both
    sim.ckpt(app, 1, base + 4000, commit=False)

    res = run("checkpoints", "list", "--app", app, "--json")
    assert res.exit_code == 0, res.stderr
    out = orjson.loads(res.stdout)
    assert [r["checkpoint"] for r in out["checkpoints"]] == [base + 2000, base + 1000]
    assert out["checkpoints"][0]["time"] == "2023-11-14T22:13:22.000Z"
    assert [r["checkpoint"] for r in out["apps"][app]["latest"]] == [base + 3000, base + 2000]
    assert out["newest"]["checkpoint"] == base + 2000
    offsets = out["newest"]["key_groups"][app]
    assert offsets[1] == {
        "key_group": 1,
        "checkpoint": base + 2000,
        "offsets": {f"{app}-in": (base + 2000) // 1000},
    }
    assert offsets[0]["checkpoint"] == base + 2000

    res = run("checkpoints", "list", "--app", app, "--limit", "1")
    assert res.exit_code == 0, res.stderr
    assert f"  {base + 2000}  " in res.stdout
    assert str(base + 1000) not in res.stdout
    assert f"{app}/1 (checkpoint {base + 2000})" in res.stdout


def test_checkpoints_list_reads_back_past_newer_records(sim: Sim) -> None:
    app = uniq("ops-long")
    sim.register(app, 2, [f"{app}-in"])
    base = 1_700_000_000_000
    # key group 0 is 500 checkpoints ahead: the complete ones are far from its end
    sim.txn(
        [
            (
                f"{app}.control",
                0,
                "ckpt/0",
                {"checkpoint": base + i, "ts": base + i, "aligned": True},
            )
            for i in range(1, 601)
        ]
    )
    sim.txn(
        [
            (
                f"{app}.control",
                1,
                "ckpt/1",
                {"checkpoint": base + i, "ts": base + i, "aligned": True},
            )
            for i in range(1, 101)
        ]
    )
    res = run("checkpoints", "list", "--app", app, "--limit", "3", "--json")
    assert res.exit_code == 0, res.stderr
    out = orjson.loads(res.stdout)
    assert [r["checkpoint"] for r in out["checkpoints"]] == [base + 100, base + 99, base + 98]
    assert [r["checkpoint"] for r in out["apps"][app]["latest"]] == [base + 600, base + 100]


def test_checkpoints_list_pipeline_halted_and_restored(sim: Sim) -> None:
    up, down, other = uniq("ops-up"), uniq("ops-down"), uniq("ops-other")
    internal = f"{up}-internal"
    sim.register(up, 2, [f"{up}-in"], [internal])
    sim.register(down, 1, [internal])
    sim.register(other, 1, [f"{up}-in"])
    base = 1_700_000_100_000
    for c in (base + 1000, base + 2000):
        sim.ckpt(up, 0, c)
        sim.ckpt(up, 1, c, halted="sp-20231114T221500Z-aaaaaa" if c == base + 2000 else None)
    sim.ckpt(down, 0, base + 1000, origin="sp-20231114T221400Z-bbbbbb")
    sim.ckpt(other, 0, base + 5000)

    res = run("checkpoints", "list", "--pipeline", down, "--json")
    assert res.exit_code == 0, res.stderr
    out = orjson.loads(res.stdout)
    assert list(out["apps"]) == [up, down]  # upstream first, the unconnected app left out
    assert [r["checkpoint"] for r in out["checkpoints"]] == [base + 1000]
    assert out["apps"][up]["halted"] == {"1": "sp-20231114T221500Z-aaaaaa"}
    assert out["apps"][down]["restored"] == {"0": "sp-20231114T221400Z-bbbbbb"}

    res = run("checkpoints", "list", "--pipeline", up)
    assert res.exit_code == 0
    assert "halted at savepoint sp-20231114T221500Z-aaaaaa" in res.stdout
    assert "restored from sp-20231114T221400Z-bbbbbb" in res.stdout


def test_checkpoints_list_usage_errors(sim: Sim) -> None:
    res = run("checkpoints", "list")
    assert res.exit_code == 2
    assert "--app" in res.stderr
    res = run("checkpoints", "list", "--pipeline", uniq("ops-ghost"))
    assert res.exit_code == 2
    assert "not in the registry" in res.stderr
    res = run("checkpoints", "list", "--app", uniq("ops-ghost"))
    assert res.exit_code == 2
    assert "has it run?" in res.stderr


def test_checkpoints_list_nothing_complete(sim: Sim) -> None:
    app = uniq("ops-none")
    sim.register(app, 3, [f"{app}-in"])
    sim.ckpt(app, 0, 1_700_000_000_000)
    res = run("checkpoints", "list", "--app", app)
    assert res.exit_code == 0
    assert "no completed checkpoint" in res.stdout
    assert "key group 1: no committed checkpoint" in res.stdout


# ---------------------------------------------------------------- savepoints


def test_trigger_needs_a_savepoint_dir(sim: Sim, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("LOCKGATE_SAVEPOINT_DIR")
    res = run("savepoint", "trigger", "--app", "x")
    assert res.exit_code == 2
    assert "LOCKGATE_SAVEPOINT_DIR is not set" in res.stderr


def test_trigger_refuses_a_reader_without_its_writer(sim: Sim) -> None:
    up, down = uniq("ops-up"), uniq("ops-down")
    sim.register(up, 1, [f"{up}-in"], [f"{up}-internal"])
    sim.register(down, 1, [f"{up}-internal"])
    res = run("savepoint", "trigger", "--app", down, "--timeout", "1")
    assert res.exit_code == 2
    assert f"{down} reads {up}-internal, written by {up}" in res.stderr
    assert "--pipeline" in res.stderr


def test_trigger_times_out_naming_missing_key_groups(sim: Sim, kafka_bootstrap: str) -> None:
    app = uniq("ops-to")
    sim.register(app, 3, [f"{app}-in"])
    latest = int(time.time() * 1000) + 3_600_000  # a checkpoint ahead of the clock
    sim.ckpt(app, 0, latest)
    res = run("savepoint", "trigger", "--app", app, "--timeout", "2")
    assert res.exit_code == 1, res.output
    assert "timed out" in res.stderr
    assert f"{app} key group(s) 0-2" in res.stderr
    assert res.stdout == ""
    req = wait_request(kafka_bootstrap, app)
    assert req["checkpoint"] == latest + 60_000  # past the latest checkpoint, not the clock
    assert req["apps"] == [app] and req["stop"] is False
    assert req["expires_ms"] - req["requested_ms"] == 50_000


def _answer(
    sim: Sim,
    bootstrap: str,
    apps: dict[str, int],
    source: str,
    errors: dict[tuple[str, int], str] | None = None,
) -> threading.Thread:
    """Answer the first request on ``source`` with committed manifests of every key group."""
    seen: dict[str, Any] = {}

    def answer() -> None:
        req = wait_request(bootstrap, source)
        seen.update(req)
        recs = []
        for app, p in apps.items():
            for g in range(p):
                err = (errors or {}).get((app, g))
                recs.append(sim.manifest(app, req["savepoint"], g, req["checkpoint"], err))
        # an aborted attempt first (must be ignored), then the committed one
        sim.txn([sim.manifest(a, req["savepoint"], 0, 1, "aborted") for a in apps], commit=False)
        sim.txn(recs[: len(recs) // 2])
        time.sleep(0.5)
        sim.txn(recs[len(recs) // 2 :])

    t = threading.Thread(target=answer, daemon=True)
    t.start()
    t.seen = seen  # type: ignore[attr-defined]
    return t


def test_trigger_pipeline_writes_the_descriptor(
    sim: Sim, kafka_bootstrap: str, tmp_path: Path
) -> None:
    up, down = uniq("ops-up"), uniq("ops-down")
    sim.register(up, 2, [f"{up}-in"], [f"{up}-internal"])
    sim.register(down, 3, [f"{up}-internal"])
    t = _answer(sim, kafka_bootstrap, {up: 2, down: 3}, up)
    res = run("savepoint", "trigger", "--pipeline", down, "--stop", "--timeout", "60")
    t.join(10)
    assert res.exit_code == 0, res.stderr
    sp = res.stdout.strip().splitlines()[-1]
    assert sp == t.seen["savepoint"]  # type: ignore[attr-defined]
    assert f"savepoint {sp}: 5/5 key groups ({up} 2/2, {down} 3/3)" in res.stderr
    assert t.seen["stop"] is True and t.seen["apps"] == [up, down]  # type: ignore[attr-defined]

    desc = orjson.loads((tmp_path / "savepoints" / sp / "_savepoint.json").read_bytes())
    assert desc["savepoint"] == sp and desc["stop"] is True
    assert desc["checkpoint"] == t.seen["checkpoint"]  # type: ignore[attr-defined]
    assert desc["apps"][up]["source"] is True and desc["apps"][down]["source"] is False
    assert desc["apps"][down]["inputs"] == [f"{up}-internal"]
    assert [m["key_group"] for m in desc["apps"][down]["manifests"]] == [0, 1, 2]
    assert desc["apps"][down]["manifests"][2]["stores"]["counts"]["entries"] == 5

    # the request went to the source app only
    with pytest.raises(AssertionError):
        wait_request(kafka_bootstrap, down, timeout=2)

    res = run("savepoint", "list", "--json")
    assert res.exit_code == 0
    rows = orjson.loads(res.stdout)
    assert [r["savepoint"] for r in rows] == [sp]
    assert rows[0]["apps"] == sorted([up, down]) and rows[0]["stop"] is True

    res = run("savepoint", "list")
    assert sp in res.stdout and "(stop)" in res.stdout

    res = run("savepoint", "describe", sp)
    assert res.exit_code == 0
    assert f"app {down}: 3 key groups" in res.stdout
    assert "store counts: 5 entries, 102 bytes, sha256 " + "ab" * 32 in res.stdout
    res = run("savepoint", "describe", sp, "--json")
    assert orjson.loads(res.stdout) == desc

    res = run("savepoint", "describe", "sp-20200101T000000Z-000000")
    assert res.exit_code == 2 and "no savepoint" in res.stderr
    res = run("savepoint", "describe", "../etc")
    assert res.exit_code == 2 and "invalid savepoint id" in res.stderr


def test_trigger_fails_on_a_manifest_error(sim: Sim, kafka_bootstrap: str, tmp_path: Path) -> None:
    app = uniq("ops-err")
    sim.register(app, 2, [f"{app}-in"])
    t = _answer(sim, kafka_bootstrap, {app: 2}, app, {(app, 1): "alignment timed out"})
    res = run("savepoint", "trigger", "--app", app, "--timeout", "60")
    t.join(10)
    assert res.exit_code == 1
    assert f"{app} key group 1: alignment timed out" in res.stderr
    assert "aborted" not in res.stderr
    assert not (tmp_path / "savepoints").exists() or not any((tmp_path / "savepoints").iterdir())
