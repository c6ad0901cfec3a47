"""`lockgate topics|send|dlq|reset` against the real broker (the CLI as a subprocess).

Dead letters are written the way the runtime writes them: in a transaction, the input
record's key and value with the headers of ``processors._checkpoint.protocol.record_error_headers``
built from the real input record read back from Kafka.
"""

from __future__ import annotations

import signal
import time
import uuid
from pathlib import Path
from typing import Any

import orjson
from confluent_kafka import Producer
from confluent_kafka.admin import (  # type: ignore[attr-defined]
    AdminClient,
    ConfigResource,
    ResourceType,
)

from processors._checkpoint.protocol import record_error_headers
from processors._dsl.partitioner import key_group
from tests.integration._util import app_env
from tests.support.kafka import create_topic, produce_numbers, read_all
from tests.support.procs import AppProcess, lockgate_cli

SPEC = "examples.running_sum:app"


def _env(bootstrap: str, names: Any, tmp_path: Path, prefix: str, **extra: str) -> dict[str, str]:
    return app_env(
        bootstrap,
        names,
        tmp_path,
        prefix,
        LOCKGATE_LOG_LEVEL="ERROR",
        LOCKGATE_STATIC_MEMBERSHIP="false",  # a stopped instance leaves the group at once
        **extra,
    )


def _json(result: Any) -> Any:
    assert result.stdout, result.stderr
    return orjson.loads(result.stdout)


def _config(bootstrap: str, topic: str) -> dict[str, str]:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    res = ConfigResource(ResourceType.TOPIC, topic)
    return {k: v.value for k, v in admin.describe_configs([res])[res].result(30).items()}


# ------------------------------------------------------------------ topics


def _partitions(bootstrap: str, topic: str) -> int | None:
    md = AdminClient({"bootstrap.servers": bootstrap}).list_topics(topic, timeout=30)
    tmd = md.topics.get(topic)
    return None if tmd is None or tmd.error is not None else len(tmd.partitions)


def test_topics_create_makes_any_topic_and_never_changes_one(
    kafka_bootstrap: str, names: Any
) -> None:
    env = {"LOCKGATE_BOOTSTRAP_SERVERS": kafka_bootstrap, "LOCKGATE_LOG_LEVEL": "ERROR"}
    a, b = names("tc-a"), names("tc-b")
    made = lockgate_cli(
        env,
        "topics",
        "create",
        a,
        b,
        "--partitions",
        "3",
        "--compact",
        "--config",
        "retention.ms=86400000",
    )
    assert made.returncode == 0, made.stderr
    assert (
        f"created {a} (3 partitions, retention.ms=86400000, cleanup.policy=compact)" in made.stderr
    )
    for topic in (a, b):
        assert _partitions(kafka_bootstrap, topic) == 3
        conf = _config(kafka_bootstrap, topic)
        assert conf["cleanup.policy"] == "compact" and conf["retention.ms"] == "86400000"
    again = lockgate_cli(env, "topics", "create", a, "--partitions", "3")
    assert again.returncode == 0 and f"{a} exists (3 partitions): unchanged" in again.stderr
    other = lockgate_cli(env, "topics", "create", a, "--partitions", "5")
    assert other.returncode == 2, other.stderr
    assert f"{a} exists with 3 partitions, not 5: unchanged" in other.stderr
    assert _partitions(kafka_bootstrap, a) == 3
    bad = lockgate_cli(env, "topics", "create", "no spaces", "--partitions", "1")
    assert bad.returncode == 2 and "invalid topic name" in bad.stderr, bad.stderr
    clash = lockgate_cli(
        env,
        "topics",
        "create",
        b,
        "--partitions",
        "3",
        "--compact",
        "--config",
        "cleanup.policy=delete",
    )
    assert clash.returncode == 2 and "disagree" in clash.stderr, clash.stderr


def test_topics_create_inputs_for_a_first_run(
    kafka_bootstrap: str, names: Any, tmp_path: Path
) -> None:
    env = _env(kafka_bootstrap, names, tmp_path, "first")
    inp = env["LOCKGATE_INPUT_TOPIC"]
    no_count = lockgate_cli(env, "topics", "--app", SPEC, "--create-inputs")
    assert no_count.returncode == 2 and "give --partitions N" in no_count.stderr, no_count.stderr
    made = lockgate_cli(env, "topics", "--app", SPEC, "--create-inputs", "--partitions", "2")
    assert made.returncode == 0, made.stdout + made.stderr
    assert f"created {inp} (2 partitions)" in made.stderr, made.stderr
    assert _partitions(kafka_bootstrap, inp) == 2
    assert _partitions(kafka_bootstrap, env["LOCKGATE_OUTPUT_TOPIC"]) == 2
    produce_numbers(kafka_bootstrap, inp, [("k", 5, 0), ("k", 7, 1)])
    proc = AppProcess(SPEC, env, tmp_path / "first.log").start()
    try:
        out = read_all(kafka_bootstrap, env["LOCKGATE_OUTPUT_TOPIC"], expected=2, timeout=60)
    finally:
        assert proc.terminate() == 0, proc.log_text()[-2000:]
    assert [orjson.loads(m.value())["sum"] for m in out] == [5, 12]


def test_topics_reports_creates_and_finds_mismatches(
    kafka_bootstrap: str, names: Any, tmp_path: Path
) -> None:
    env = _env(kafka_bootstrap, names, tmp_path, "topics")
    app, inp, out = (
        env["LOCKGATE_APP_NAME"],
        env["LOCKGATE_INPUT_TOPIC"],
        env["LOCKGATE_OUTPUT_TOPIC"],
    )
    changelog = f"{app}.totals.changelog"

    missing_input = lockgate_cli(env, "topics", "--app", SPEC, "--create", "--json")
    assert missing_input.returncode == 2, missing_input.stderr
    assert "create the inputs first" in missing_input.stderr

    create_topic(kafka_bootstrap, inp, 3)
    report = lockgate_cli(env, "topics", "--app", SPEC, "--json")
    assert report.returncode == 2, report.stderr
    rows = {r["topic"]: r for r in _json(report)["topics"]}
    assert rows[inp]["exists"] and rows[inp]["partitions"] == 3 and not rows[inp]["problems"]
    assert "cleanup.policy" in rows[inp]["config"]
    for topic in (out, changelog, f"{app}.dlq", f"{app}.control"):
        assert not rows[topic]["exists"] and rows[topic]["problems"], topic

    dry = lockgate_cli(env, "topics", "--app", SPEC, "--create", "--dry-run")
    assert dry.returncode == 2, dry.stderr
    assert f"would create {changelog} (3 partitions, cleanup.policy=compact" in dry.stderr
    assert (
        changelog
        not in AdminClient({"bootstrap.servers": kafka_bootstrap}).list_topics(timeout=10).topics
    )

    created = lockgate_cli(env, "topics", "--app", SPEC, "--create", "--json")
    assert created.returncode == 0, created.stdout + created.stderr
    data = _json(created)
    assert data["ok"] and changelog in data["created"] and data["key_groups"] == 3
    rows = {r["topic"]: r for r in data["topics"]}
    assert rows[changelog]["partitions"] == 3
    assert rows[changelog]["config"]["cleanup.policy"] == "compact"
    assert rows[f"{app}.control"]["partitions"] == 3

    again = lockgate_cli(env, "topics", "--app", SPEC)
    assert again.returncode == 0, again.stdout + again.stderr
    assert "PROBLEM" not in again.stdout

    # A changelog with the wrong partition count and policy, and inputs of another app
    # that are not co-partitioned with its own: mismatches, exit 2.
    bad = _env(kafka_bootstrap, names, tmp_path, "topics-bad")
    bad_changelog = f"{bad['LOCKGATE_APP_NAME']}.totals.changelog"
    create_topic(kafka_bootstrap, bad["LOCKGATE_INPUT_TOPIC"], 2)
    create_topic(kafka_bootstrap, bad_changelog, 3, {"cleanup.policy": "delete"})
    mismatch = lockgate_cli(bad, "topics", "--app", SPEC, "--create")
    assert mismatch.returncode == 2, mismatch.stdout + mismatch.stderr
    assert "3 partitions, expected 2" in mismatch.stdout
    assert "cleanup.policy=delete, must be compact" in mismatch.stdout
    assert _config(kafka_bootstrap, bad_changelog)["cleanup.policy"] == "delete"  # untouched


# ------------------------------------------------------------------ send


def test_send_validates_every_line_then_produces(
    kafka_bootstrap: str, names: Any, tmp_path: Path
) -> None:
    env = _env(kafka_bootstrap, names, tmp_path, "send")
    inp = env["LOCKGATE_INPUT_TOPIC"]
    create_topic(kafka_bootstrap, inp, 4)

    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"key": "a", "value": {"v": 1, "seq": 0}}\n{"key": "b", "value": \n')
    refused = lockgate_cli(env, "send", inp, "--app", SPEC, "--file", str(bad))
    assert refused.returncode == 2, refused.stderr
    assert "line 2:" in refused.stderr and "nothing was produced" in refused.stderr
    assert read_all(kafka_bootstrap, inp, expected=None, timeout=5, idle=1) == []

    good = tmp_path / "good.jsonl"
    lines: list[dict[str, Any]] = [
        {"key": f"k{i}", "value": {"v": i, "seq": i}, "headers": {"trace": f"t{i}"}}
        for i in range(20)
    ]
    lines.append(
        {"value": {"v": 99, "seq": 20, "id": "from-field"}, "timestamp": 1_700_000_000_000}
    )
    good.write_text("\n".join(orjson.dumps(x).decode() for x in lines) + "\n")
    sent = lockgate_cli(env, "send", inp, "--app", SPEC, "--file", str(good), "--key-field", "id")
    assert sent.returncode == 0, sent.stderr
    assert "produced 21 record(s)" in sent.stdout

    msgs = read_all(kafka_bootstrap, inp, expected=21, timeout=20, idle=1)
    assert len(msgs) == 21
    by_key = {m.key().decode(): m for m in msgs}
    for i in range(20):
        m = by_key[f"k{i}"]
        assert orjson.loads(m.value()) == {"v": i, "seq": i}
        assert m.headers() == [("trace", f"t{i}".encode())]
        assert m.partition() == key_group(f"k{i}".encode(), 4)  # murmur2, like Java clients
    assert by_key["from-field"].timestamp()[1] == 1_700_000_000_000

    unknown = lockgate_cli(env, "send", "no-such-topic", "--app", SPEC, "--file", str(good))
    assert unknown.returncode == 2 and "not an input, output" in unknown.stderr


# ------------------------------------------------------------------ dlq


def _dead_letters(bootstrap: str, app: str, source: str, n: int) -> list[Any]:
    """Produce ``n`` inputs to ``source`` and dead-letter each (one transaction), plus an
    aborted dead letter; return the input records as read back."""
    create_topic(bootstrap, source, 2)
    create_topic(bootstrap, f"{app}.dlq", 2)
    produce_numbers(bootstrap, source, [(f"key-{i}", i, i) for i in range(n)])
    inputs = read_all(bootstrap, source, expected=n, timeout=20, idle=0.5)
    tx = Producer({"bootstrap.servers": bootstrap, "transactional.id": f"t-{uuid.uuid4().hex}"})
    tx.init_transactions(30)
    tx.begin_transaction()
    tx.produce(f"{app}.dlq", b"aborted", b"x", partition=0)
    tx.abort_transaction(30)
    tx.begin_transaction()
    for m in inputs:
        headers = record_error_headers(m, ValueError(f"bad {m.key().decode()}"), "process")
        tx.produce(f"{app}.dlq", m.value(), m.key(), partition=m.partition(), headers=list(headers))
    tx.commit_transaction(30)
    return inputs


def _replayed(bootstrap: str, source: str, expected: int) -> dict[str, list[Any]]:
    """Records of ``source`` (read_committed) with a replayed-from header, by key."""
    out: dict[str, list[Any]] = {}
    for m in read_all(bootstrap, source, expected=expected, timeout=20, idle=1):
        if any(k == "lockgate-replayed-from" for k, _ in m.headers() or []):
            out.setdefault(m.key().decode(), []).append(m)
    return out


def test_dlq_list_and_replay_exactly_once(kafka_bootstrap: str, names: Any, tmp_path: Path) -> None:
    env = _env(kafka_bootstrap, names, tmp_path, "dlq")
    app, source = env["LOCKGATE_APP_NAME"], env["LOCKGATE_INPUT_TOPIC"]
    inputs = _dead_letters(kafka_bootstrap, app, source, 6)

    listed = lockgate_cli(env, "dlq", "list", "--app", app, "--json")
    assert listed.returncode == 0, listed.stderr
    rows = _json(listed)["records"]
    assert len(rows) == 6  # the aborted dead letter is not shown
    coords = {(m.partition(), m.offset()) for m in inputs}
    assert {(r["source_partition"], r["source_offset"]) for r in rows} == coords
    assert all(r["source_topic"] == source and r["error_type"] == "ValueError" for r in rows)
    assert all(r["error_stage"] == "process" and r["value"].startswith('{"v"') for r in rows)
    text = lockgate_cli(env, "dlq", "list", "--app", app, "--limit", "2")
    assert text.returncode == 0 and text.stdout.count("    source ") == 2, text.stdout

    dry = lockgate_cli(env, "dlq", "replay", "--app", app, "--all", "--dry-run")
    assert dry.returncode == 0 and "6 record(s) would be replayed" in dry.stdout, dry.stderr
    assert _replayed(kafka_bootstrap, source, 6) == {}

    first = rows[0]
    one = lockgate_cli(
        env, "dlq", "replay", "--app", app, "--offsets", f"{first['partition']}:{first['offset']}"
    )
    assert one.returncode == 0 and "replayed 1 record(s)" in one.stdout, one.stderr
    rest = lockgate_cli(env, "dlq", "replay", "--app", app, "--all")
    assert rest.returncode == 0 and "replayed 5 record(s)" in rest.stdout, rest.stderr
    again = lockgate_cli(env, "dlq", "replay", "--app", app, "--all")
    assert again.returncode == 0 and "replayed 0 record(s)" in again.stdout, again.stderr
    repeat = lockgate_cli(
        env, "dlq", "replay", "--app", app, "--offsets", f"{first['partition']}:{first['offset']}"
    )
    assert repeat.returncode == 0 and "already replayed" in repeat.stderr, repeat.stderr
    assert "replayed 0 record(s)" in repeat.stdout

    replayed = _replayed(kafka_bootstrap, source, 12)
    assert sorted(replayed) == sorted(m.key().decode() for m in inputs)
    originals = {m.key().decode(): m for m in inputs}
    for key, msgs in replayed.items():
        assert len(msgs) == 1, key
        m, orig = msgs[0], originals[key]
        assert m.value() == orig.value() and m.partition() == orig.partition()
        assert m.timestamp()[1] == orig.timestamp()[1]
        names_ = [k for k, _ in m.headers()]
        assert not any(k.startswith(("lockgate-error-", "lockgate-source-")) for k in names_)

    listed_after = _json(lockgate_cli(env, "dlq", "list", "--app", app, "--json"))
    assert all(r["replayed"] for r in listed_after["records"])


def test_dlq_replay_killed_before_commit_then_retried(
    kafka_bootstrap: str, names: Any, tmp_path: Path
) -> None:
    env = _env(kafka_bootstrap, names, tmp_path, "dlqkill")
    app, source = env["LOCKGATE_APP_NAME"], env["LOCKGATE_INPUT_TOPIC"]
    inputs = _dead_letters(kafka_bootstrap, app, source, 5)

    crash = {**env, "LOCKGATE_TEST_CRASH_POINTS": "dlq_replay_before_commit"}
    killed = lockgate_cli(crash, "dlq", "replay", "--app", app, "--all")
    assert killed.returncode == -signal.SIGKILL, killed.stdout + killed.stderr
    # The records reached the broker in the open transaction: visible read_uncommitted only.
    uncommitted = read_all(
        kafka_bootstrap, source, expected=10, timeout=20, idle=1, isolation="read_uncommitted"
    )
    assert len(uncommitted) == 10
    assert _replayed(kafka_bootstrap, source, 5) == {}

    started = time.monotonic()
    retried = lockgate_cli(env, "dlq", "replay", "--app", app, "--all")
    assert retried.returncode == 0 and "replayed 5 record(s)" in retried.stdout, retried.stderr
    assert time.monotonic() - started < 20  # the retry fences the dead transaction at once
    replayed = _replayed(kafka_bootstrap, source, 10)
    assert {k: len(v) for k, v in replayed.items()} == {m.key().decode(): 1 for m in inputs}
    again = lockgate_cli(env, "dlq", "replay", "--app", app, "--all")
    assert "replayed 0 record(s)" in again.stdout, again.stderr


# ------------------------------------------------------------------ reset


def _sums(bootstrap: str, topic: str, expected: int) -> list[tuple[str, int, int]]:
    msgs = read_all(bootstrap, topic, expected=expected, timeout=25, idle=1)
    msgs.sort(key=lambda m: (m.partition(), m.offset()))
    return [
        (m.key().decode(), orjson.loads(m.value())["seq"], orjson.loads(m.value())["sum"])
        for m in msgs
    ]


def test_reset_refused_while_running_then_recomputes(
    kafka_bootstrap: str, names: Any, tmp_path: Path
) -> None:
    env = _env(kafka_bootstrap, names, tmp_path, "reset")
    app, inp, out = (
        env["LOCKGATE_APP_NAME"],
        env["LOCKGATE_INPUT_TOPIC"],
        env["LOCKGATE_OUTPUT_TOPIC"],
    )
    create_topic(kafka_bootstrap, inp, 2)
    produce_numbers(kafka_bootstrap, inp, [(f"k{i % 5}", i, i) for i in range(40)])
    proc = AppProcess(SPEC, {**env, "LOCKGATE_LOG_LEVEL": "INFO"}, tmp_path / "app1.log").start()
    try:
        first = _sums(kafka_bootstrap, out, 40)
        assert len(first) == 40, proc.log_text()[-2000:]
        running = lockgate_cli(env, "reset", "--app", SPEC, "--to", "earliest", "--yes")
        assert running.returncode == 2, running.stdout + running.stderr
        assert f"app {app} is running" in running.stderr and f"{app}-i1" in running.stderr
    finally:
        assert proc.terminate() == 0, proc.log_text()[-2000:]
    assert (tmp_path / "state" / app).exists()

    dry = lockgate_cli(env, "reset", "--app", SPEC, "--to", "earliest", "--dry-run")
    assert dry.returncode == 0, dry.stderr
    assert f"input {inp}[0]: committed offset -> 0" in dry.stdout
    assert f"changelog {app}.totals.changelog[" in dry.stdout and "dry run" in dry.stdout
    future = lockgate_cli(env, "reset", "--app", SPEC, "--to", "2099-01-01T00:00:00Z", "--dry-run")
    assert future.returncode == 0, future.stderr
    targets = [int(x.rsplit("-> ", 1)[1]) for x in future.stdout.splitlines() if "-> " in x]
    assert len(targets) == 2 and sum(targets) == 40  # no record that late: the ends
    no_tty = lockgate_cli(env, "reset", "--app", SPEC, "--to", "earliest")
    assert no_tty.returncode == 2 and "non-interactive" in no_tty.stderr, no_tty.stderr

    done = lockgate_cli(env, "reset", "--app", SPEC, "--to", "earliest", "--yes")
    assert done.returncode == 0, done.stdout + done.stderr
    assert not (tmp_path / "state" / app).exists()
    assert _config(kafka_bootstrap, f"{app}.totals.changelog")["cleanup.policy"] == "compact"

    proc = AppProcess(SPEC, {**env, "LOCKGATE_LOG_LEVEL": "INFO"}, tmp_path / "app2.log").start()
    try:
        both = _sums(kafka_bootstrap, out, 80)
    finally:
        assert proc.terminate() == 0, proc.log_text()[-2000:]
    assert len(both) == 80, proc.log_text()[-2000:]
    # Recomputed from the start with empty state: the same sums again, not doubled.
    firsts = sorted(first)
    seconds = sorted(both)
    assert seconds == sorted(firsts + firsts)
