"""The operator commands as principals holding exactly the ACLs docs/security.md lists.

One running_sum app (its own principal, exactly :func:`app_acls`) serves every command, so
the set-up is paid once: the group probe child (a principal with the app's ACLs describes
the group, one without gets an error text, not a crash), ``lockgate console`` (the app's
ACLs show the app; an app it may not read is shown with an error, the others still),
``lockgate savepoint trigger`` (the app's ACLs), ``lockgate dlq list|replay``
(:func:`dlq_acls` more) and, with the app stopped, ``lockgate reset`` (:func:`reset_acls`
more; without them refused before anything changes).
"""

from __future__ import annotations

import os
import subprocess
import uuid
from pathlib import Path
from typing import Any

import orjson
from confluent_kafka import Consumer, Producer, TopicPartition

from processors._checkpoint.protocol import record_error_headers
from processors._kafka.group_probe import GroupProbe
from tests.integration._util import http_get
from tests.security.support import (
    SecureKafka,
    app_acls,
    dlq_acls,
    lockgate_cli,
    reset_acls,
)
from tests.support.kafka import create_topic, produce_numbers, read_all, unique
from tests.support.ports import free_port
from tests.support.procs import LOCKGATE, ROOT, AppProcess, wait_until

SPEC = "examples.running_sum:app"
N = 200


def _clean(r: subprocess.CompletedProcess[str], password: str) -> str:
    """The command's output; asserts it holds no stack trace and no password."""
    out = r.stdout + r.stderr
    assert "Traceback" not in out, out[-3000:]
    assert password not in out
    return out


def _dead_letters(kafka: SecureKafka, app: str, source: str) -> list[Any]:
    """Dead-letter the first 4 records of ``source`` into ``<app>.dlq`` as the runtime does."""
    conf = {**kafka.admin_conf, "bootstrap.servers": kafka.bootstrap}
    inputs = read_all(kafka.bootstrap, source, expected=N, idle=0.5, client=kafka.admin_conf)[:4]
    tx = Producer({**conf, "transactional.id": f"t-{uuid.uuid4().hex}"})
    tx.init_transactions(30)
    tx.begin_transaction()
    for m in inputs:
        headers = record_error_headers(m, ValueError("bad"), "process")
        tx.produce(f"{app}.dlq", m.value(), m.key(), partition=m.partition(), headers=headers)
    tx.commit_transaction(30)
    return inputs


def _committed(kafka: SecureKafka, group: str, tps: list[TopicPartition]) -> dict[int, int]:
    c = Consumer({**kafka.admin_conf, "bootstrap.servers": kafka.bootstrap, "group.id": group})
    try:
        return {tp.partition: tp.offset for tp in c.committed(tps, timeout=30)}
    finally:
        c.close()


def _console(env: dict[str, str], port: int, log: Path) -> subprocess.Popen[bytes]:
    with log.open("wb") as out:
        return subprocess.Popen(
            [str(LOCKGATE), "console", "--port", str(port), "--refresh", "0.5"],
            cwd=ROOT,
            env={**os.environ, **env, "LOCKGATE_LOG_FORMAT": "console"},
            stdout=out,
            stderr=subprocess.STDOUT,
        )


def test_operator_commands_with_exactly_the_documented_acls(
    secure_kafka: SecureKafka, tmp_path: Path
) -> None:
    kafka, admin = secure_kafka, secure_kafka.admin_conf
    app, inp, out = unique("ops"), unique("numbers"), unique("sums")
    other = unique("other")  # another app's registration: the console may not read it
    for topic in (inp, out):
        create_topic(kafka.bootstrap, topic, 2, client=admin)
    user, password = unique("user"), uuid.uuid4().hex
    kafka.add_user(user, password)
    kafka.grant(user, app_acls(app, [inp], [out]))
    stranger, stranger_pw = unique("stranger"), uuid.uuid4().hex  # no ACL at all
    kafka.add_user(stranger, stranger_pw)
    env = {
        **kafka.app_env(user, password),
        "LOCKGATE_APP_NAME": app,
        "LOCKGATE_INPUT_TOPIC": inp,
        "LOCKGATE_OUTPUT_TOPIC": out,
        "LOCKGATE_STATE_DIR": str(tmp_path / "state"),
        "LOCKGATE_SAVEPOINT_DIR": str(tmp_path / "savepoints"),
        "LOCKGATE_INSTANCE_ID": "i1",
        "LOCKGATE_CHECKPOINT_INTERVAL_MS": "300",
        "LOCKGATE_STATIC_MEMBERSHIP": "false",  # a stopped instance leaves the group at once
    }
    # A registration of an app whose topics the principal may not read (the console).
    reg = {"app": other, "inputs": [inp], "outputs": [], "internal_outputs": [], "key_groups": 2}
    p = Producer({**admin, "bootstrap.servers": kafka.bootstrap})
    p.produce("lockgate.registry", orjson.dumps(reg), f"app/{other}".encode(), partition=0)
    assert p.flush(30) == 0
    produce_numbers(kafka.bootstrap, inp, [(f"k{i % 7}", i, i) for i in range(N)], client=admin)

    running = AppProcess(SPEC, env, tmp_path / "app.log").start()
    console: subprocess.Popen[bytes] | None = None
    try:
        wait_until(lambda: "started" in running.log_text() or not running.alive, 60, what="start")
        assert running.alive, running.log_text()[-3000:]
        read_all(kafka.bootstrap, out, expected=N, idle=0.5, client=admin)

        # The group probe child (the runtime's and `reset`'s group descriptions).
        conf = {**kafka.client_conf(user, password), "bootstrap.servers": kafka.bootstrap}
        probe = GroupProbe(conf)
        try:
            answer = probe.describe(app, 10.0, lambda: None)
        finally:
            probe.close()
        assert not isinstance(answer, str), answer
        assert set(answer[1]) != set() and probe.crashes == 0, answer
        conf = {**kafka.client_conf(stranger, stranger_pw), "bootstrap.servers": kafka.bootstrap}
        probe = GroupProbe(conf)
        try:
            refused = probe.describe(app, 10.0, lambda: None)
        finally:
            probe.close()
        assert isinstance(refused, str) and "GROUP_AUTHORIZATION_FAILED" in refused, refused
        assert probe.crashes == 0

        # The console as the app's principal: its app, and the other app with an error.
        port = free_port()
        console = _console(env, port, tmp_path / "console.log")

        def overview() -> dict[str, Any]:
            code, body = http_get(port, "/api/overview")
            return orjson.loads(body) if code == 200 else {}

        def shown() -> bool:
            apps = overview().get("apps", [])
            return any(a["name"] == app and a.get("checkpoints") for a in apps)

        wait_until(lambda: shown() or console.poll() is not None, 60, what="the console")
        assert console.poll() is None, (tmp_path / "console.log").read_text()[-3000:]
        snap = overview()
        assert snap.get("error") is None, snap.get("error")
        mine = next(a for a in snap["apps"] if a["name"] == app)
        assert mine["key_groups"] == 2 and mine["lag_total"] == 0, mine
        theirs = next(a for a in snap["apps"] if a["name"] == other)
        assert "not authorized" in str(theirs.get("error")), theirs

        # savepoint trigger: the app's own ACLs.
        r = lockgate_cli(env, "savepoint", "trigger", "--app", app, "--timeout", "60")
        text = _clean(r, password)
        assert r.returncode == 0, text[-3000:]
        assert r.stdout.strip().splitlines()[-1].startswith("sp-"), text

        # dlq list/replay: dlq_acls more (first without the transactional id).
        dead = _dead_letters(kafka, app, inp)
        r = lockgate_cli(env, "dlq", "list", "--app", app, "--json")
        text = _clean(r, password)
        assert r.returncode == 2, text[-3000:]
        assert f"lacks the DESCRIBE ACL on GROUP {app}.dlq-replay" in r.stderr, text[-3000:]
        replay_acls = dlq_acls(app, [inp])
        kafka.grant(user, [a for a in replay_acls if a.resource.name != "TRANSACTIONAL_ID"])
        r = lockgate_cli(env, "dlq", "list", "--app", app, "--json")
        text = _clean(r, password)
        assert r.returncode == 0, text[-3000:]
        assert len(orjson.loads(r.stdout)["records"]) == len(dead)
        r = lockgate_cli(env, "dlq", "replay", "--app", app, "--all")
        text = _clean(r, password)
        assert r.returncode == 2, text[-3000:]
        assert f"lacks the WRITE ACL on TRANSACTIONAL_ID {app}.dlq-replay" in r.stderr, text
        kafka.grant(user, replay_acls)
        r = lockgate_cli(env, "dlq", "replay", "--app", app, "--all")
        text = _clean(r, password)
        assert r.returncode == 0 and f"replayed {len(dead)} record(s)" in r.stdout, text[-3000:]
        read_all(kafka.bootstrap, out, expected=N + len(dead), idle=0.5, client=admin)
    finally:
        if console is not None:
            console.terminate()
            console.wait(30)
        code = running.terminate()
    assert code == 0, running.log_text()[-3000:]
    assert password not in running.log_text()

    # reset: refused before it changes anything without reset_acls, done with them.
    group_tps = [TopicPartition(inp, g) for g in range(2)]
    before = _committed(kafka, app, group_tps)
    assert sum(before.values()) == N + len(dead), before
    r = lockgate_cli(env, "reset", "--app", SPEC, "--to", "earliest", "--yes")
    text = _clean(r, password)
    assert r.returncode == 2, text[-3000:]
    changelog = f"{app}.totals.changelog"
    assert f"ALTER_CONFIGS on TOPIC {changelog}; DELETE on TOPIC {changelog}" in r.stderr, text
    assert _committed(kafka, app, group_tps) == before
    kafka.grant(user, reset_acls(app, ["totals"]))
    r = lockgate_cli(env, "reset", "--app", SPEC, "--to", "earliest", "--yes")
    text = _clean(r, password)
    assert r.returncode == 0, text[-3000:]
    assert _committed(kafka, app, group_tps) == {0: 0, 1: 0}
    logs = read_all(kafka.bootstrap, changelog, idle=0.5, client=admin)
    assert logs == [], len(logs)
