"""``lockgate savepoint rescale``: running_sum from 2 to 4 key groups, exactly once.

``examples/running_sum.py`` runs on a 2-partition input; a stop-with-savepoint halts it
and more input arrives on the old topic after the savepoint's cut (the app is halted).
``lockgate savepoint rescale`` copies the input into a new 4-partition topic (records
before the cut first) and rewrites the savepoint to 4 key groups on Spark; the rest of
the input is produced into the new topic, and two instances of the app (under a new
name: the old one's changelogs have 2 partitions) run on it from the new savepoint.
The committed output must be exactly the prefix sums of every key, once (independent
model over the input as stored), the same results as a run on 4 partitions.

The input is written in transactions (one aborted), so the copy meets transaction
markers and aborted records; records carry a header, and the copy keeps keys, values,
timestamps and headers, puts every record in its murmur2 partition among 4, and its
cut offsets separate the records before the savepoint from those after it.
"""

from __future__ import annotations

from pathlib import Path

import orjson
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient

from processors._dsl.partitioner import key_group
from state.savepoint import SavepointStore
from tests.support.checker import check, model
from tests.support.kafka import create_topic, produce_numbers, read_all, read_inputs
from tests.support.procs import AppProcess, lockgate_cli

KEYS = 37
BEFORE, AFTER, LATER = 1000, 500, 1000  # processed before the savepoint / on the old
# topic after it / on the new topic


def numbers(first: int, count: int) -> list[tuple[str, int, int]]:
    return [(f"key-{(s * 7919) % KEYS}", (s * 31) % 17, s) for s in range(first, first + count)]


def produce_in_transactions(
    bootstrap: str, topic: str, records: list[tuple[str, int, int]]
) -> None:
    """Produce ``records`` in transactions of 200, with an aborted one after the first."""
    p = Producer(
        {
            "bootstrap.servers": bootstrap,
            "partitioner": "murmur2_random",
            "transactional.id": f"feeder-{topic}-{records[0][2]}",
            "linger.ms": 5,
        }
    )
    p.init_transactions(30)
    for i in range(0, len(records), 200):
        p.begin_transaction()
        for key, v, seq in records[i : i + 200]:
            value = orjson.dumps({"v": v, "seq": seq})
            p.produce(topic, value, key.encode(), headers=[("origin", b"feeder")])
        p.commit_transaction(30)
        if i == 0:  # never part of the input
            p.begin_transaction()
            for j in range(30):
                p.produce(topic, orjson.dumps({"v": 10_000, "seq": -1 - j}), b"key-1")
            p.abort_transaction(30)


def test_rescale_running_sum_from_2_to_4_key_groups(  # type: ignore[no-untyped-def]
    kafka_bootstrap: str, names, tmp_path: Path
) -> None:
    app, app4 = names("rescale"), names("rescale4")
    inp, inp4, out = names("rescale-in"), names("rescale-in4"), names("rescale-out")
    create_topic(kafka_bootstrap, inp, 2)
    sp_dir = tmp_path / "savepoints"
    base = {
        "LOCKGATE_BOOTSTRAP_SERVERS": kafka_bootstrap,
        "LOCKGATE_OUTPUT_TOPIC": out,
        "LOCKGATE_CHECKPOINT_INTERVAL_MS": "300",
        "LOCKGATE_SAVEPOINT_DIR": str(sp_dir),
    }
    old_env = {**base, "LOCKGATE_APP_NAME": app, "LOCKGATE_INPUT_TOPIC": inp}

    def instance(env: dict[str, str], iid: str, generation: str) -> AppProcess:
        env = {
            **env,
            "LOCKGATE_INSTANCE_ID": iid,
            "LOCKGATE_STATE_DIR": str(tmp_path / f"state-{generation}-{iid}"),
        }
        return AppProcess("examples.running_sum:app", env, tmp_path / f"{generation}-{iid}.log")

    produce_in_transactions(kafka_bootstrap, inp, numbers(0, BEFORE))
    first = instance(old_env, "i1", "a").start()
    try:
        assert len(read_all(kafka_bootstrap, out, expected=BEFORE, timeout=60, idle=0)) >= BEFORE
        trigger = lockgate_cli(old_env, "savepoint", "trigger", "--app", app, "--stop")
        assert trigger.returncode == 0, trigger.stderr[-3000:] + first.log_text()[-3000:]
        sp_id = trigger.stdout.strip().splitlines()[-1]
        # The app is halted: these stay after the savepoint's cut in the old topic.
        produce_in_transactions(kafka_bootstrap, inp, numbers(BEFORE, AFTER))
    finally:
        assert first.terminate() == 0, first.log_text()[-3000:]
    assert len(read_all(kafka_bootstrap, out, timeout=10, idle=0.5)) == BEFORE

    # Mistakes and the plan change nothing.
    rescale = ("savepoint", "rescale", "--app", app, sp_id, "--key-groups", "4")
    bad = lockgate_cli(old_env, *rescale, "--topic", f"other={inp4}", "--as", app4)
    assert bad.returncode == 2, bad.stderr
    assert f"no --topic for input(s) {inp}" in bad.stderr and "Traceback" not in bad.stderr
    same_name = lockgate_cli(old_env, *rescale, "--topic", f"{inp}={inp4}")
    assert same_name.returncode == 2, same_name.stderr
    assert "internal topics with another partition count" in same_name.stderr
    assert "--as NEW_NAME" in same_name.stderr and "Traceback" not in same_name.stderr
    plan = lockgate_cli(old_env, *rescale, "--topic", f"{inp}={inp4}", "--as", app4, "--dry-run")
    assert plan.returncode == 0, plan.stderr
    assert f"copy {inp} (2 partitions) -> {inp4} (4 partitions)" in plan.stdout
    admin = AdminClient({"bootstrap.servers": kafka_bootstrap})
    assert inp4 not in admin.list_topics(timeout=10).topics

    done = lockgate_cli(old_env, *rescale, "--topic", f"{inp}={inp4}", "--as", app4, timeout=240)
    assert done.returncode == 0, done.stderr[-5000:]
    assert "Traceback" not in done.stderr and "Logging error" not in done.stderr, done.stderr
    assert f"copied {BEFORE + AFTER} records" in done.stderr  # progress on stderr
    new_id = done.stdout.strip().splitlines()[-1]
    assert new_id.startswith("sp-") and new_id != sp_id, done.stdout
    again = lockgate_cli(old_env, *rescale, "--topic", f"{inp}={inp4}", "--as", app4)
    assert again.returncode == 2 and "already holds records" in again.stderr, again.stderr

    # The new savepoint: 4 key groups of app4 reading inp4, from the copy's cut offsets.
    info = SavepointStore(str(sp_dir)).read_descriptor(new_id)["apps"][app4]
    assert info["key_groups"] == 4 and info["inputs"] == [inp4]
    cut = {m["key_group"]: m["offsets"][inp4] for m in info["manifests"]}
    assert sorted(cut) == [0, 1, 2, 3]
    entries = sum(m["stores"]["totals"]["entries"] for m in info["manifests"])
    assert entries == len({k for k, _, _ in numbers(0, BEFORE)})
    # The source savepoint is untouched and still restorable as it was.
    assert SavepointStore(str(sp_dir)).read_descriptor(sp_id)["apps"][app]["key_groups"] == 2

    # The copy: every committed record once, murmur2-placed among 4, with its timestamp
    # and headers, and the cut offsets separate the savepoint's records from the rest.
    originals = {
        orjson.loads(m.value())["seq"]: m
        for m in read_all(kafka_bootstrap, inp, expected=BEFORE + AFTER, idle=0.5)
    }
    copies = read_all(kafka_bootstrap, inp4, expected=BEFORE + AFTER, idle=0.5)
    assert sorted(orjson.loads(m.value())["seq"] for m in copies) == list(range(BEFORE + AFTER))
    for m in copies:
        seq = orjson.loads(m.value())["seq"]
        assert m.partition() == key_group(m.key(), 4)
        assert (m.offset() < cut[m.partition()]) == (seq < BEFORE), (seq, m.offset(), cut)
        assert m.key() == originals[seq].key() and m.timestamp() == originals[seq].timestamp()
        assert m.headers() == [("origin", b"feeder")]

    # Producers switch to the new topic; two instances continue from the new savepoint.
    produce_numbers(kafka_bootstrap, inp4, numbers(BEFORE + AFTER, LATER))
    new_env = {
        **base,
        "LOCKGATE_APP_NAME": app4,
        "LOCKGATE_INPUT_TOPIC": inp4,
        "LOCKGATE_FROM_SAVEPOINT": new_id,
    }
    total = BEFORE + AFTER + LATER
    restored = [instance(new_env, i, "b").start() for i in ("i1", "i2")]
    try:
        msgs = read_all(kafka_bootstrap, out, expected=total, timeout=120, idle=1.5)
    finally:
        codes = [p.terminate() for p in restored]
    logs = "".join(p.log_text()[-3000:] for p in restored)
    assert codes == [0, 0], logs
    assert "seeded from a savepoint" in logs, logs
    stored = read_inputs(kafka_bootstrap, inp, BEFORE + AFTER)
    stored += [r for r in read_inputs(kafka_bootstrap, inp4, total) if r[2] >= BEFORE + AFTER]
    assert len(stored) == total
    assert len(msgs) == total, logs
    assert check(model(stored), msgs) == [], logs
