"""running_sum end to end against the real broker, as a subprocess."""

from __future__ import annotations

import random
import signal
import time
from pathlib import Path

import orjson
import pytest
from confluent_kafka import Consumer, Producer, TopicPartition

from tests.support.checker import check, model
from tests.support.kafka import create_topic, produce_numbers, read_all, read_inputs
from tests.support.procs import AppProcess, wait_until


def _inputs(n: int, keys: int, seed: int, start_seq: int = 0) -> list[tuple[str, int, int]]:
    rng = random.Random(seed)
    return [(f"key-{rng.randrange(keys)}", rng.randrange(-5, 100), start_seq + i) for i in range(n)]


def _env(bootstrap: str, names, tmp_path: Path, **extra: str) -> dict[str, str]:  # type: ignore[no-untyped-def]
    env = {
        "LOCKGATE_BOOTSTRAP_SERVERS": bootstrap,
        "LOCKGATE_APP_NAME": names("running-sum"),
        "LOCKGATE_INPUT_TOPIC": names("numbers"),
        "LOCKGATE_OUTPUT_TOPIC": names("sums"),
        "LOCKGATE_STATE_DIR": str(tmp_path / "state"),
        "LOCKGATE_INSTANCE_ID": "i1",
        "LOCKGATE_CHECKPOINT_INTERVAL_MS": "300",
    }
    env.update(extra)
    return env


@pytest.mark.parametrize(
    ("guarantee", "protocol"),
    [("exactly_once", "classic"), ("at_least_once", "classic"), ("exactly_once", "consumer")],
)
def test_running_sum_exact_output(  # type: ignore[no-untyped-def]
    kafka_bootstrap: str, names, tmp_path: Path, guarantee: str, protocol: str
) -> None:
    env = _env(
        kafka_bootstrap, names, tmp_path, LOCKGATE_GUARANTEE=guarantee,
        LOCKGATE_GROUP_PROTOCOL=protocol,
    )  # fmt: skip
    create_topic(kafka_bootstrap, env["LOCKGATE_INPUT_TOPIC"], 3)
    inputs = _inputs(3000, 40, seed=1)
    produce_numbers(kafka_bootstrap, env["LOCKGATE_INPUT_TOPIC"], inputs)
    app = AppProcess("examples.running_sum:app", env, tmp_path / "app.log").start()
    try:
        out = read_all(kafka_bootstrap, env["LOCKGATE_OUTPUT_TOPIC"], expected=len(inputs), idle=2)
    finally:
        code = app.terminate()
    stored = read_inputs(kafka_bootstrap, env["LOCKGATE_INPUT_TOPIC"], len(inputs))
    assert sorted(stored) == sorted(inputs)
    assert check(model(stored), out) == [], app.log_text()[-3000:]
    assert code == 0, app.log_text()[-3000:]
    assert "stopped" in app.log_text()


@pytest.mark.parametrize("guarantee", ["exactly_once", "at_least_once"])
def test_restart_resumes_from_local_state_and_from_changelog_only(  # type: ignore[no-untyped-def]
    kafka_bootstrap: str, names, tmp_path: Path, guarantee: str
) -> None:
    env = _env(kafka_bootstrap, names, tmp_path, LOCKGATE_GUARANTEE=guarantee)
    create_topic(kafka_bootstrap, env["LOCKGATE_INPUT_TOPIC"], 4)
    all_inputs: list[tuple[str, int, int]] = []
    restored: list[int] = []  # changelog records replayed by each run
    for round_no, state_dir in enumerate(["a", "a", "b"]):  # b: empty dir -> changelog only
        batch = _inputs(1500, 30, seed=10 + round_no, start_seq=len(all_inputs))
        produce_numbers(kafka_bootstrap, env["LOCKGATE_INPUT_TOPIC"], batch)
        all_inputs += batch
        run_env = {**env, "LOCKGATE_STATE_DIR": str(tmp_path / state_dir)}
        log = tmp_path / f"app-{round_no}.log"
        app = AppProcess("examples.running_sum:app", run_env, log).start()
        try:
            out = read_all(
                kafka_bootstrap, env["LOCKGATE_OUTPUT_TOPIC"], expected=len(all_inputs), idle=2
            )
        finally:
            assert app.terminate() == 0
        stored = read_inputs(kafka_bootstrap, env["LOCKGATE_INPUT_TOPIC"], len(all_inputs))
        assert check(model(stored), out) == [], f"round {round_no}"
        restored.append(
            sum(
                int(line.split("records=")[1].split()[0])
                for line in log.read_text().splitlines()
                if "key group restored" in line
            )
        )
    # run 2 reopened an up-to-date local DB: nothing to replay (the recorded changelog
    # offsets are right); run 3 had no local state: one record per key (compacted or not,
    # at least the 30 keys' latest values) came from the changelog.
    assert restored[0] == 0 and restored[1] == 0, restored
    assert restored[2] >= 30, restored


def test_missing_input_topic_is_a_clear_error(kafka_bootstrap: str, names, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    env = _env(kafka_bootstrap, names, tmp_path, LOCKGATE_INPUT_WAIT_MS="2000")
    started = time.monotonic()
    app = AppProcess("examples.running_sum:app", env, tmp_path / "app.log").start()
    code = app.wait(60)
    assert code == 2
    assert time.monotonic() - started >= 2.0  # it waited LOCKGATE_INPUT_WAIT_MS first
    text = app.log_text()
    assert "waiting for input topics to be created" in text, text
    assert f"input topic(s) {env['LOCKGATE_INPUT_TOPIC']} do not exist" in text, text


def test_an_input_created_while_waiting_is_used(
    kafka_bootstrap: str, names, tmp_path: Path
) -> None:  # type: ignore[no-untyped-def]
    """A pipeline deployed at once: the input appears a few seconds after the start."""
    env = _env(kafka_bootstrap, names, tmp_path, LOCKGATE_INPUT_WAIT_MS="60000")
    app = AppProcess("examples.running_sum:app", env, tmp_path / "app.log").start()
    try:
        wait_until(
            lambda: "waiting for input topics to be created" in app.log_text(), 60, what="waiting"
        )
        create_topic(kafka_bootstrap, env["LOCKGATE_INPUT_TOPIC"], 2)
        produce_numbers(kafka_bootstrap, env["LOCKGATE_INPUT_TOPIC"], [("k", 4, 0), ("k", 6, 1)])
        out = read_all(kafka_bootstrap, env["LOCKGATE_OUTPUT_TOPIC"], expected=2, timeout=60)
    finally:
        code = app.terminate()
    assert code == 0, app.log_text()[-3000:]
    assert [orjson.loads(m.value())["sum"] for m in out] == [4, 10]


def test_bad_configuration_exits_2(kafka_bootstrap: str, names, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    env = _env(kafka_bootstrap, names, tmp_path, LOCKGATE_GUARANTEE="twice")
    app = AppProcess("examples.running_sum:app", env, tmp_path / "app.log").start()
    assert app.wait(60) == 2
    assert "LOCKGATE_GUARANTEE" in app.log_text()


def _dlq_inputs(topic: str, bootstrap: str) -> list[tuple[str, int, int]]:
    """Good records, negative ones (user code raises), and undecodable ones."""
    p = Producer({"bootstrap.servers": bootstrap, "partitioner": "murmur2_random"})
    good: list[tuple[str, int, int]] = []
    for seq in range(600):
        key = f"k{seq % 7}"
        if seq % 97 == 5:
            p.produce(topic, b"{not json", key.encode())
            continue
        v = -1 if seq % 89 == 3 else seq % 11
        p.produce(topic, orjson.dumps({"v": v, "seq": seq}), key.encode())
        if v >= 0:
            good.append((key, v, seq))
    p.flush()
    return good


@pytest.mark.parametrize("guarantee", ["exactly_once", "at_least_once"])
def test_bad_records_go_to_dlq_and_partial_effects_never_commit(
    kafka_bootstrap: str,
    names,
    tmp_path: Path,
    guarantee: str,  # type: ignore[no-untyped-def]
) -> None:
    env = _env(kafka_bootstrap, names, tmp_path, LOCKGATE_GUARANTEE=guarantee)
    create_topic(kafka_bootstrap, env["LOCKGATE_INPUT_TOPIC"], 2)
    good = _dlq_inputs(env["LOCKGATE_INPUT_TOPIC"], kafka_bootstrap)
    bad = 600 - len(good)
    app = AppProcess("tests.integration.apps.faulty:app", env, tmp_path / "app.log").start()
    try:
        dlq = read_all(kafka_bootstrap, f"{env['LOCKGATE_APP_NAME']}.dlq", expected=bad, idle=2)
        out = read_all(kafka_bootstrap, env["LOCKGATE_OUTPUT_TOPIC"], expected=len(good), idle=2)
    finally:
        assert app.terminate() == 0
    by_source = {
        (
            dict(m.headers())["lockgate-source-partition"],
            dict(m.headers())["lockgate-source-offset"],
        ): m
        for m in dlq
    }
    if guarantee == "exactly_once":
        assert len(by_source) == len(dlq)  # each bad record dead-lettered exactly once
    else:
        dlq = list(by_source.values())  # at-least-once: replays may repeat DLQ records
    stages = sorted(dict(m.headers())["lockgate-error-stage"].decode() for m in dlq)
    assert stages.count("deserialize") == sum(1 for s in range(600) if s % 97 == 5)
    assert stages.count("process") == sum(1 for s in range(600) if s % 89 == 3 and s % 97 != 5)
    first = next(m for m in dlq if dict(m.headers())["lockgate-error-stage"] == b"process")
    h = dict(first.headers())
    assert h["lockgate-error-type"] == b"ValueError"
    assert b"negative value" in h["lockgate-error-message"]
    assert h["lockgate-source-topic"].decode() == env["LOCKGATE_INPUT_TOPIC"]
    assert int(h["lockgate-source-offset"]) >= 0
    stored = read_inputs(kafka_bootstrap, env["LOCKGATE_INPUT_TOPIC"], 600)
    problems = check(model([r for r in stored if r[1] >= 0]), out)
    if guarantee == "exactly_once":
        assert problems == []  # failing records changed neither state nor output
    else:
        # at-least-once: the aborted records' effects are not in the state either, but
        # emits made before the failure may have been sent: only duplicates, never loss.
        got = {(m.key(), orjson.loads(m.value())["seq"]) for m in out}
        assert all((k.encode(), s) in got for k, _, s in good)


def test_on_error_fail_stops_with_exit_3_and_commits_nothing_after(
    kafka_bootstrap: str,
    names,
    tmp_path: Path,  # type: ignore[no-untyped-def]
) -> None:
    # Records 0..39 are produced first and must commit (exact running sums); only then
    # records 40..49 arrive, 40 fails under on_error=fail: exit 3, and nothing of 40..49
    # may commit (neither outputs nor the input offset).
    env = _env(kafka_bootstrap, names, tmp_path, LOCKGATE_ON_ERROR="fail")
    topic, app_name = env["LOCKGATE_INPUT_TOPIC"], env["LOCKGATE_APP_NAME"]
    create_topic(kafka_bootstrap, topic, 1)
    p = Producer({"bootstrap.servers": kafka_bootstrap})

    def produce(seqs: range) -> None:
        for seq in seqs:
            p.produce(topic, orjson.dumps({"v": -1 if seq == 40 else seq, "seq": seq}), b"k")
        assert p.flush(30) == 0

    produce(range(40))
    app = AppProcess("tests.integration.apps.faulty:app", env, tmp_path / "app.log").start()
    try:
        before = read_all(kafka_bootstrap, env["LOCKGATE_OUTPUT_TOPIC"], expected=40, idle=0.5)
        assert len(before) == 40, app.log_text()[-3000:]
        produce(range(40, 50))
        code = app.wait(90)
    finally:
        if app.alive:
            app.kill9()
    log = app.log_text()
    assert code == 3, log[-3000:]
    assert "LOCKGATE_ON_ERROR=fail" in log
    assert f"{topic}[0]@40" in log  # the failing record is named
    out = read_all(kafka_bootstrap, env["LOCKGATE_OUTPUT_TOPIC"], idle=2, timeout=10)
    got = [orjson.loads(m.value()) for m in out]
    # exactly the committed prefix 0..39 with its running sums, nothing after
    assert got == [{"sum": sum(range(i + 1)), "count": i + 1, "seq": i} for i in range(40)], got[
        -5:
    ]
    c = Consumer({"bootstrap.servers": kafka_bootstrap, "group.id": app_name})
    try:
        committed = c.committed([TopicPartition(topic, 0)], timeout=30)
    finally:
        c.close()
    assert committed[0].offset == 40  # the input offset stops before the failing record


def test_sigint_also_stops_cleanly(kafka_bootstrap: str, names, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    env = _env(kafka_bootstrap, names, tmp_path)
    create_topic(kafka_bootstrap, env["LOCKGATE_INPUT_TOPIC"], 1)
    app = AppProcess("examples.running_sum:app", env, tmp_path / "app.log").start()
    wait_until(lambda: "assigned" in app.log_text(), 60, what="assignment")
    app.signal(signal.SIGINT)
    assert app.wait(60) == 0


def test_slow_user_code_cuts_epochs_short_inside_the_transaction_timeout(
    kafka_bootstrap: str,
    names,
    tmp_path: Path,  # type: ignore[no-untyped-def]
) -> None:
    # 1000-record batches at 5 ms/record take 5 s: longer than half of a 2 s transaction
    # timeout. Epochs must be cut short (no aborts) and the output must stay exact.
    env = _env(
        kafka_bootstrap, names, tmp_path, LOCKGATE_TRANSACTION_TIMEOUT_MS="2000",
        LOCKGATE_CHECKPOINT_INTERVAL_MS="500",
    )  # fmt: skip
    create_topic(kafka_bootstrap, env["LOCKGATE_INPUT_TOPIC"], 2)
    inputs = _inputs(1200, 20, seed=5)
    produce_numbers(kafka_bootstrap, env["LOCKGATE_INPUT_TOPIC"], inputs)
    app = AppProcess("tests.integration.apps.slow:app", env, tmp_path / "app.log").start()
    try:
        out = read_all(
            kafka_bootstrap, env["LOCKGATE_OUTPUT_TOPIC"], expected=1200, idle=2, timeout=120
        )
    finally:
        assert app.terminate() == 0
    stored = read_inputs(kafka_bootstrap, env["LOCKGATE_INPUT_TOPIC"], 1200)
    assert check(model(stored), out) == []
    log = app.log_text()
    assert "epoch cut short" in log
    assert "aborting epoch" not in log
