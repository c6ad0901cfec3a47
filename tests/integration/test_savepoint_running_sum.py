"""Stop-with-savepoint under load from two instances, restore into three fresh ones.

``examples/running_sum.py`` as it is: a savepoint is triggered (``--stop``) while the
input is still being produced; the two instances halt at the savepoint and are
stopped; three new instances with empty state dirs start ``--from-savepoint`` and run
to the end. The committed output is checked against an independent model: exactly the
prefix sums of every key, in order (no loss, no duplicate across the hand-over).
"""

from __future__ import annotations

import json
import random
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from confluent_kafka import Consumer, TopicPartition

from state.savepoint import SavepointStore
from tests.chaos._harness import InputFeeder
from tests.support.checker import check, model
from tests.support.kafka import create_topic, produce_numbers, read_all, read_inputs
from tests.support.ports import free_port
from tests.support.procs import AppProcess, lockgate_cli, wait_until

P = 4
TOTAL = 15000


def _readyz(port: int) -> tuple[int, dict[str, Any]]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=5) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read() or b"{}")


def _metric(port: int, name: str) -> float:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as resp:
        lines = resp.read().decode().splitlines()
    return sum(float(line.rsplit(" ", 1)[1]) for line in lines if line.startswith(name))


def _halted_gauge(port: int) -> float:
    return _metric(port, "lockgate_key_groups_halted")


def _group_lag(bootstrap: str, group: str, topic: str) -> int:
    """High watermark minus the group's committed offset, summed over ``topic``'s partitions."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": group})
    try:
        tps = consumer.committed([TopicPartition(topic, p) for p in range(P)], timeout=30)
        return sum(
            consumer.get_watermark_offsets(tp, timeout=30)[1] - max(tp.offset, 0) for tp in tps
        )
    finally:
        consumer.close()


def test_stop_with_savepoint_then_restore_into_three_instances(  # type: ignore[no-untyped-def]
    kafka_bootstrap: str, names, tmp_path: Path
) -> None:
    app, inp, out = names("sp-sum"), names("sp-sum-in"), names("sp-sum-out")
    create_topic(kafka_bootstrap, inp, P)
    sp_dir = tmp_path / "savepoints"
    base = {
        "LOCKGATE_BOOTSTRAP_SERVERS": kafka_bootstrap,
        "LOCKGATE_APP_NAME": app,
        "LOCKGATE_INPUT_TOPIC": inp,
        "LOCKGATE_OUTPUT_TOPIC": out,
        "LOCKGATE_CHECKPOINT_INTERVAL_MS": "300",
        "LOCKGATE_SAVEPOINT_DIR": str(sp_dir),
    }
    feeder = InputFeeder(kafka_bootstrap, inp, TOTAL, rate=1500, keys=40)
    feeder.start()

    def instance(iid: str, generation: str, **extra: str) -> AppProcess:
        env = {
            **base,
            "LOCKGATE_INSTANCE_ID": iid,
            "LOCKGATE_STATE_DIR": str(tmp_path / f"state-{generation}-{iid}"),
            **extra,
        }
        return AppProcess(
            "examples.running_sum:app", env, tmp_path / f"{generation}-{iid}.log"
        ).start()

    http = {"i1": free_port(), "i2": free_port()}
    first = [
        instance(i, "a", LOCKGATE_HTTP_PORT=str(http[i]), LOCKGATE_HTTP_HOST="127.0.0.1")
        for i in ("i1", "i2")
    ]
    restored: list[AppProcess] = []
    try:
        read_all(kafka_bootstrap, out, expected=1000, timeout=60, idle=0)
        trigger = lockgate_cli(
            base, "savepoint", "trigger", "--app", app, "--stop", "--timeout", "90"
        )
        assert trigger.returncode == 0, trigger.stderr[-3000:] + "".join(
            p.log_text()[-3000:] for p in first
        )
        sp_id = trigger.stdout.strip().splitlines()[-1]
        assert sp_id.startswith("sp-"), trigger.stdout
        assert "key groups" in trigger.stderr  # progress on stderr
        halted_at = len(read_all(kafka_bootstrap, out, timeout=30, idle=2))
        # A halted instance does not look healthy: not ready, naming the savepoint, and
        # every key group counted halted.
        wait_until(
            lambda: sum(_halted_gauge(port) for port in http.values()) == P,
            30,
            what="every key group halted in /metrics",
        )
        for port in http.values():
            status, body = _readyz(port)
            assert status == 503 and body["status"] == "halted", body
            assert body["savepoints"] == [sp_id], body
            assert sp_id in body["resume"], body
        # The lag gauge follows the group's real lag although nothing commits: once the
        # input is all written, it equals high watermark minus committed offset.
        feeder.join(120)
        assert feeder.error is None, feeder.error
        real = _group_lag(kafka_bootstrap, app, inp)
        assert real > 0, real
        wait_until(
            lambda: (
                sum(_metric(port, "lockgate_consumer_lag_records") for port in http.values())
                == real
            ),
            20,
            what=f"the lag gauges summing to the group's lag {real}",
        )
        codes = [p.terminate() for p in first]
        assert codes == [0, 0], [p.log_text()[-3000:] for p in first]
        # Nothing after the savepoint was committed by the stopped instances.
        assert len(read_all(kafka_bootstrap, out, timeout=30, idle=1)) == halted_at
        assert 0 < halted_at < TOTAL, halted_at

        described = lockgate_cli(base, "savepoint", "describe", sp_id, "--json")
        assert described.returncode == 0, described.stderr

        restored = [instance(i, "b", LOCKGATE_FROM_SAVEPOINT=sp_id) for i in ("i1", "i2", "i3")]
        feeder.join(120)
        assert feeder.error is None, feeder.error
        msgs = read_all(kafka_bootstrap, out, expected=TOTAL, timeout=180, idle=2)
    finally:
        for p in [*first, *restored]:
            if p.alive:
                p.terminate()
    logs = "".join(p.log_text()[-3000:] for p in restored)
    assert "seeded from a savepoint" in logs, logs
    stored = read_inputs(kafka_bootstrap, inp, TOTAL)
    assert len(msgs) == TOTAL, (len(msgs), logs)
    assert check(model(stored), msgs) == [], logs
    # The savepoint files are where the descriptor says, one manifest per key group.
    assert sorted(p.name for p in (sp_dir / sp_id / app).iterdir()) == [str(g) for g in range(P)]


def test_restore_cut_short_by_kill9_is_finished_without_the_flag(  # type: ignore[no-untyped-def]
    kafka_bootstrap: str, names, tmp_path: Path
) -> None:
    """A restore is committed in chunks; killed in the middle, the next start finishes it.

    One key group (so the kill always falls inside its restore). The restored instance
    commits the savepoint's entries 3 at a time and SIGKILLs itself after some chunk;
    it is restarted *without* ``--from-savepoint``: the key group's checkpoint record
    says which savepoint is being seeded, so the restore is redone and the sums
    continue exactly. (Key groups whose restore had not begun stay halted without the
    flag: a restarted pod normally keeps it in its environment.)
    """
    app, inp, out = names("sp-seed"), names("sp-seed-in"), names("sp-seed-out")
    create_topic(kafka_bootstrap, inp, 1)
    sp_dir = tmp_path / "savepoints"
    base = {
        "LOCKGATE_BOOTSTRAP_SERVERS": kafka_bootstrap,
        "LOCKGATE_APP_NAME": app,
        "LOCKGATE_INPUT_TOPIC": inp,
        "LOCKGATE_OUTPUT_TOPIC": out,
        "LOCKGATE_CHECKPOINT_INTERVAL_MS": "300",
        "LOCKGATE_SAVEPOINT_DIR": str(sp_dir),
        "LOCKGATE_INSTANCE_ID": "i1",
    }
    rng = random.Random(9)
    batch = [(f"key-{rng.randrange(40)}", rng.randrange(50), i) for i in range(1200)]
    produce_numbers(kafka_bootstrap, inp, batch[:600])
    total = len(batch)

    def start(state: str, **extra: str) -> AppProcess:
        env = {**base, "LOCKGATE_STATE_DIR": str(tmp_path / state), **extra}
        return AppProcess("examples.running_sum:app", env, tmp_path / f"{state}.log").start()

    first = start("a")
    try:
        read_all(kafka_bootstrap, out, expected=600, timeout=60, idle=0)
        trigger = lockgate_cli(
            base, "savepoint", "trigger", "--app", app, "--stop", "--timeout", "60"
        )
        assert trigger.returncode == 0, trigger.stderr[-3000:] + first.log_text()[-3000:]
        sp_id = trigger.stdout.strip().splitlines()[-1]
    finally:
        assert first.terminate() == 0, first.log_text()[-3000:]
    produce_numbers(kafka_bootstrap, inp, batch[600:])  # after the savepoint
    crashing = start(
        "b",
        LOCKGATE_FROM_SAVEPOINT=sp_id,
        LOCKGATE_TEST_SEED_CHUNK="3",
        LOCKGATE_TEST_CRASH_POINTS="mid_seed:0.5",
    )
    code = crashing.wait(120)
    assert code == -9, crashing.log_text()[-3000:]  # killed itself in the middle of the restore
    assert "crash point mid_seed" in crashing.log_text()
    resumed = start("c")  # no --from-savepoint: the checkpoint records say what to finish
    try:
        msgs = read_all(kafka_bootstrap, out, expected=total, timeout=120, idle=2)
    finally:
        assert resumed.terminate() == 0, resumed.log_text()[-3000:]
    assert "finishing an interrupted restore" in resumed.log_text(), resumed.log_text()[-3000:]
    stored = read_inputs(kafka_bootstrap, inp, total)
    assert len(msgs) == total
    assert check(model(stored), msgs) == [], resumed.log_text()[-3000:]


def test_a_stop_request_read_at_a_restore_from_an_older_savepoint_is_not_taken(  # type: ignore[no-untyped-def]
    kafka_bootstrap: str, names, tmp_path: Path
) -> None:
    """A request issued before a restore was aimed at the state the restore replaced.

    sp1 is taken while running, then sp2 with ``--stop``; within the request lookback the
    app restarts ``--from-savepoint sp1`` (restored 3 entries per chunk, so the restore
    spans epochs). It reads sp2's request at start-up, before it is assigned the key group
    (a plain consumer holds it until then); taking it after the restore would export
    sp1's state under sp2's id and halt again. It must ignore it and run on: every key's
    last output is the sum of all its inputs (sp1's state plus everything after sp1's
    offsets).
    """
    app, inp, out = names("sp-old"), names("sp-old-in"), names("sp-old-out")
    create_topic(kafka_bootstrap, inp, 1)
    base = {
        "LOCKGATE_BOOTSTRAP_SERVERS": kafka_bootstrap,
        "LOCKGATE_APP_NAME": app,
        "LOCKGATE_INPUT_TOPIC": inp,
        "LOCKGATE_OUTPUT_TOPIC": out,
        "LOCKGATE_CHECKPOINT_INTERVAL_MS": "300",
        "LOCKGATE_SAVEPOINT_DIR": str(tmp_path / "savepoints"),
        "LOCKGATE_INSTANCE_ID": "i1",
    }
    rng = random.Random(10)
    batch = [(f"key-{rng.randrange(40)}", rng.randrange(50), i) for i in range(1500)]

    def start(state: str, **extra: str) -> AppProcess:
        env = {**base, "LOCKGATE_STATE_DIR": str(tmp_path / state), **extra}
        return AppProcess("examples.running_sum:app", env, tmp_path / f"{state}.log").start()

    produce_numbers(kafka_bootstrap, inp, batch[:500])
    first = start("a")
    try:
        read_all(kafka_bootstrap, out, expected=500, timeout=60, idle=0)
        sp1 = lockgate_cli(base, "savepoint", "trigger", "--app", app, "--timeout", "60")
        assert sp1.returncode == 0, sp1.stderr[-3000:] + first.log_text()[-3000:]
        sp1_id = sp1.stdout.strip().splitlines()[-1]
        produce_numbers(kafka_bootstrap, inp, batch[500:1000])
        read_all(kafka_bootstrap, out, expected=1000, timeout=60, idle=0)
        sp2 = lockgate_cli(base, "savepoint", "trigger", "--app", app, "--stop", "--timeout", "60")
        assert sp2.returncode == 0, sp2.stderr[-3000:] + first.log_text()[-3000:]
    finally:
        assert first.terminate() == 0, first.log_text()[-3000:]
    produce_numbers(kafka_bootstrap, inp, batch[1000:])
    sp2_id = sp2.stdout.strip().splitlines()[-1]
    # A plain member of the app's group holds the only partition, so the restored
    # instance reads sp2's request (start-up lookback) before it is assigned anything.
    holder = Consumer(
        {
            "bootstrap.servers": kafka_bootstrap,
            "group.id": app,
            "partition.assignment.strategy": "cooperative-sticky",
            "enable.auto.commit": False,
        }
    )
    holder.subscribe([inp])
    wait_until(lambda: holder.poll(0.2) is not None or bool(holder.assignment()), 60, what="held")
    port = free_port()
    restored = start(
        "b",
        LOCKGATE_FROM_SAVEPOINT=sp1_id,
        LOCKGATE_TEST_SEED_CHUNK="3",
        LOCKGATE_HTTP_PORT=str(port),
        LOCKGATE_HTTP_HOST="127.0.0.1",
    )
    try:
        wait_until(
            lambda: f"savepoint requested  savepoint={sp2_id}" in restored.log_text(),
            60,
            what="the restored instance reading sp2's request",
        )
        assert "assigned  key_groups=[0]" not in restored.log_text(), restored.log_text()
    finally:
        holder.close()  # leaves the group: key group 0 goes to the restored instance
    expected: dict[str, int] = {}
    for key, value, _ in batch:
        expected[key] = expected.get(key, 0) + value

    def last_sums() -> dict[str, int]:
        sums: dict[str, int] = {}
        for m in read_all(kafka_bootstrap, out, timeout=10, idle=2):
            sums[m.key().decode()] = json.loads(m.value())["sum"]
        return sums

    try:
        wait_until(lambda: last_sums() == expected, 90, interval=3, what="every key's full sum")
        # Input records only: the restore's chunk commits are not records (sp1 was taken
        # at offset 500, so the restored instance processed the 1,000 records after it).
        records_in = _metric(port, "lockgate_records_in_total")
        attempts = _metric(port, "lockgate_records_in_attempts_total")
    finally:
        code = restored.terminate()
    text = restored.log_text()
    assert code == 0, text[-3000:]
    # sp2 was not taken again from sp1's state: its manifest is still the first run's
    # (offset 1000), not a re-export at sp1's offset 500. (Either the request met the
    # restored key group, which refuses it, or a later epoch had passed its checkpoint.)
    manifest = SavepointStore(base["LOCKGATE_SAVEPOINT_DIR"]).read_manifest(sp2_id, app, 0)
    assert manifest["offsets"] == {inp: 1000}, manifest
    ignored = "ignoring a savepoint request issued before this key group's restore"
    print(f"restored instance refused sp2 explicitly: {ignored in text}")
    assert records_in == 1000 and attempts >= records_in, (records_in, attempts)


def test_at_least_once_savepoint_whose_epoch_never_committed_restores_without_loss(  # type: ignore[no-untyped-def]
    kafka_bootstrap: str, names, tmp_path: Path
) -> None:
    """At-least-once: a savepoint reported taken although its epoch never committed.

    Without transactions a manifest is visible once delivered, before the epoch's offsets
    commit. The instance SIGKILLs itself right there (crash point ``after_export``: the
    epoch's records, manifests included, delivered; offsets not committed) while input
    keeps coming, so ``savepoint trigger`` reports success for a cut past the group's
    committed offsets. That is sound because a savepoint is self-contained: its manifest
    names the offsets of exactly the records whose effects its exported state holds (the
    committed state plus the epoch's changes, written before the manifest). A fresh
    instance restored from it must lose nothing: every key's last sum at least the
    model's (at-least-once allows duplicates; from a consistent cut there are none here).
    """
    app, inp, out = names("sp-alo"), names("sp-alo-in"), names("sp-alo-out")
    create_topic(kafka_bootstrap, inp, 2)
    sp_dir = tmp_path / "savepoints"
    base = {
        "LOCKGATE_BOOTSTRAP_SERVERS": kafka_bootstrap,
        "LOCKGATE_APP_NAME": app,
        "LOCKGATE_INPUT_TOPIC": inp,
        "LOCKGATE_OUTPUT_TOPIC": out,
        "LOCKGATE_GUARANTEE": "at_least_once",
        "LOCKGATE_CHECKPOINT_INTERVAL_MS": "300",
        "LOCKGATE_SAVEPOINT_DIR": str(sp_dir),
        "LOCKGATE_INSTANCE_ID": "i1",
    }
    total = 6000
    feeder = InputFeeder(kafka_bootstrap, inp, total, rate=400, keys=40)

    def start(state: str, **extra: str) -> AppProcess:
        env = {**base, "LOCKGATE_STATE_DIR": str(tmp_path / state), **extra}
        return AppProcess("examples.running_sum:app", env, tmp_path / f"{state}.log").start()

    first = start("a", LOCKGATE_TEST_CRASH_POINTS="after_export:1.0")
    feeder.start()
    try:
        read_all(kafka_bootstrap, out, expected=1000, timeout=60, idle=0)
        trigger = lockgate_cli(base, "savepoint", "trigger", "--app", app, "--timeout", "60")
        code = first.wait(60)
    finally:
        if first.alive:
            first.terminate()
    text = first.log_text()
    assert trigger.returncode == 0, trigger.stderr[-3000:] + text[-3000:]
    assert code == -9 and "crash point after_export" in text, text[-3000:]
    sp_id = trigger.stdout.strip().splitlines()[-1]
    store = SavepointStore(str(sp_dir))
    saved = {g: store.read_manifest(sp_id, app, g)["offsets"][inp] for g in (0, 1)}
    # The savepoint's epoch never committed: the group's offsets are behind its cut.
    consumer = Consumer({"bootstrap.servers": kafka_bootstrap, "group.id": app})
    try:
        committed = consumer.committed([TopicPartition(inp, g) for g in (0, 1)], timeout=30)
    finally:
        consumer.close()
    assert any(tp.offset < saved[tp.partition] for tp in committed), (committed, saved)
    print(f"savepoint offsets {saved}, committed {[tp.offset for tp in committed]}")

    restored = start("b", LOCKGATE_FROM_SAVEPOINT=sp_id)
    feeder.join(120)
    assert feeder.error is None, feeder.error
    expected: dict[str, int] = {}
    for key, value, _ in feeder.produced:
        expected[key] = expected.get(key, 0) + value

    def max_sums() -> dict[str, int]:
        sums: dict[str, int] = {}
        for m in read_all(kafka_bootstrap, out, timeout=10, idle=2):
            if m.key() is not None:  # sums only grow (v >= 0): the largest is the last
                key = m.key().decode()
                sums[key] = max(sums.get(key, -1), json.loads(m.value())["sum"])
        return sums

    sums: dict[str, int] = {}

    def nothing_lost() -> bool:
        sums.update(max_sums())
        return all(sums.get(k, -1) >= v for k, v in expected.items())

    try:
        wait_until(nothing_lost, 90, interval=3, what="every key's sum at least the model's")
    except TimeoutError:
        short = {k: (sums.get(k), v) for k, v in expected.items() if sums.get(k, -1) < v}
        raise AssertionError(f"lost input (key: (last sum, model)): {short}") from None
    finally:
        assert restored.terminate() == 0, restored.log_text()[-3000:]
    assert "seeded from a savepoint" in restored.log_text(), restored.log_text()[-3000:]
    print(f"sums equal to the model (no duplicate either): {sums == expected}")


def test_a_helm_savepoint_upgrade_rolls_instances_that_resume_from_their_halt(  # type: ignore[no-untyped-def]
    kafka_bootstrap: str, names, tmp_path: Path
) -> None:
    """The chart's ``upgrade.mode=savepoint`` without a cluster: hook command, then a roll.

    While input flows, the pre-upgrade hook's command (``savepoint trigger --pipeline APP
    --stop --json``) halts both instances at a savepoint; then a rolling update replaces
    them one at a time (same instance ids and state dirs, as a StatefulSet does) with
    ``LOCKGATE_RESUME_FROM_STOP_SAVEPOINT=true`` and no savepoint id anywhere: each new
    instance restores its halted key groups from the savepoint they halted at. A further
    restart with the same environment does not restore again. The output is exact.
    """
    app, inp, out = names("sp-roll"), names("sp-roll-in"), names("sp-roll-out")
    create_topic(kafka_bootstrap, inp, P)
    total = 9000
    base = {
        "LOCKGATE_BOOTSTRAP_SERVERS": kafka_bootstrap,
        "LOCKGATE_APP_NAME": app,
        "LOCKGATE_INPUT_TOPIC": inp,
        "LOCKGATE_OUTPUT_TOPIC": out,
        "LOCKGATE_CHECKPOINT_INTERVAL_MS": "300",
        "LOCKGATE_SAVEPOINT_DIR": str(tmp_path / "savepoints"),
    }
    feeder = InputFeeder(kafka_bootstrap, inp, total, rate=1500, keys=40)
    feeder.start()

    def instance(iid: str, generation: str, **extra: str) -> AppProcess:
        env = {
            **base,
            "LOCKGATE_INSTANCE_ID": iid,
            "LOCKGATE_STATE_DIR": str(tmp_path / f"state-{iid}"),  # the pod's volume
            **extra,
        }
        return AppProcess(
            "examples.running_sum:app", env, tmp_path / f"{generation}-{iid}.log"
        ).start()

    resume = {"LOCKGATE_RESUME_FROM_STOP_SAVEPOINT": "true"}
    old = {i: instance(i, "old") for i in ("i1", "i2")}
    new: dict[str, AppProcess] = {}
    again: list[AppProcess] = []
    try:
        read_all(kafka_bootstrap, out, expected=1000, timeout=60, idle=0)
        hook = lockgate_cli(
            base, "savepoint", "trigger", "--pipeline", app, "--stop", "--json", "--timeout", "90"
        )
        assert hook.returncode == 0, hook.stderr[-3000:]
        descriptor = json.loads(hook.stdout.strip().splitlines()[-1])
        sp_id = descriptor["savepoint"]
        assert descriptor["stop"] is True, descriptor
        # A second release's hook on the halted pipeline (docs/helm.md: one hook per
        # pipeline upgrade) cannot take another savepoint: it fails, and cancels only its own.
        second = lockgate_cli(
            base, "savepoint", "trigger", "--pipeline", app, "--stop", "--json", "--timeout", "8"
        )
        assert second.returncode == 1, second.stdout[-2000:] + second.stderr[-2000:]
        # The roll: one instance at a time, the other still the old, halted one.
        for iid in ("i2", "i1"):
            assert old[iid].terminate() == 0, old[iid].log_text()[-3000:]
            new[iid] = instance(iid, "new", **resume)
            wait_until(
                lambda iid=iid: "seeded from a savepoint" in new[iid].log_text(),  # type: ignore[misc]
                120,
                what=f"{iid} resuming from {sp_id}",
            )
        feeder.join(120)
        assert feeder.error is None, feeder.error
        read_all(kafka_bootstrap, out, expected=total, timeout=180, idle=0)
        codes = [p.terminate() for p in new.values()]
        assert codes == [0, 0], [p.log_text()[-3000:] for p in new.values()]
        # A later restart keeps the setting (it stays in the release): no second restore.
        again = [instance(i, "again", **resume) for i in ("i1", "i2")]
        msgs = read_all(kafka_bootstrap, out, expected=total, timeout=60, idle=3)
    finally:
        for p in [*old.values(), *new.values(), *again]:
            if p.alive:
                p.terminate()
    logs = "".join(p.log_text()[-4000:] for p in new.values())
    assert "LOCKGATE_RESUME_FROM_STOP_SAVEPOINT" in logs, logs
    assert not any("seeded from a savepoint" in p.log_text() for p in again)
    stored = read_inputs(kafka_bootstrap, inp, total)
    assert len(msgs) == total, (len(msgs), logs)
    assert check(model(stored), msgs) == [], logs
