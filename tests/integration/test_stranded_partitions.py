"""Partitions revoked by a member killed before it rejoined are given out again.

Cooperative rebalancing moves partitions in two rounds; a static member SIGKILLed between
revoking and rejoining comes back as a replacement of a stable group, which the coordinator
answers without a rebalance: the revoked partitions belong to nobody (reproduced here with
plain consumers and seen stalling the chaos tests for minutes). The runtime notices a stable
group with unowned partitions and forces a rebalance (processors/_runtime/runner.py
``GroupWatch.stranded_heal``). The crash point ``after_revoke`` places the kill exactly there.
"""

from __future__ import annotations

from pathlib import Path

from tests.support.checker import check, model
from tests.support.kafka import create_topic, produce_numbers, read_all, read_inputs
from tests.support.procs import AppProcess, wait_until

SPEC = "examples.running_sum:app"


def test_partitions_revoked_by_a_killed_member_are_given_out_again(  # type: ignore[no-untyped-def]
    kafka_bootstrap: str, names, tmp_path: Path
) -> None:
    env = {
        "LOCKGATE_BOOTSTRAP_SERVERS": kafka_bootstrap,
        "LOCKGATE_APP_NAME": names("stranded"),
        "LOCKGATE_INPUT_TOPIC": names("numbers"),
        "LOCKGATE_OUTPUT_TOPIC": names("sums"),
        "LOCKGATE_CHECKPOINT_INTERVAL_MS": "200",
        "LOCKGATE_KAFKA__SESSION_TIMEOUT_MS": "60000",  # nothing is healed by a timeout
        "LOCKGATE_KAFKA__HEARTBEAT_INTERVAL_MS": "1000",
    }
    create_topic(kafka_bootstrap, env["LOCKGATE_INPUT_TOPIC"], 4)

    def instance(iid: str, **extra: str) -> AppProcess:
        e = {**env, "LOCKGATE_INSTANCE_ID": iid, "LOCKGATE_STATE_DIR": str(tmp_path / iid)}
        return AppProcess(SPEC, {**e, **extra}, tmp_path / f"{iid}.log").start()

    first = [(f"k{i % 20}", 1, i) for i in range(400)]
    produce_numbers(kafka_bootstrap, env["LOCKGATE_INPUT_TOPIC"], first)
    i1 = instance("i1", LOCKGATE_TEST_CRASH_POINTS="after_revoke:1")
    wait_until(lambda: "assigned  key_groups=[0, 1, 2, 3]" in i1.log_text(), 60, what="i1 owns all")
    i2 = instance("i2")
    try:
        # i2 joins: i1 revokes half and kills itself before rejoining.
        wait_until(lambda: not i1.alive, 60, what="i1 killed after its revoke")
        assert "crash point after_revoke" in i1.log_text()
        i1 = instance("i1")  # a static replacement: the coordinator does not rebalance
        wait_until(
            lambda: "rejoining the group to force a rebalance" in i2.log_text() + i1.log_text(),
            60,
            what="the stranded partitions noticed",
        )
        wait_until(lambda: "assigned" in i2.log_text(), 60, what="i2 assigned after the heal")
        more = [(f"k{i % 20}", 1, i) for i in range(400, 800)]
        produce_numbers(kafka_bootstrap, env["LOCKGATE_INPUT_TOPIC"], more)
        out = read_all(kafka_bootstrap, env["LOCKGATE_OUTPUT_TOPIC"], expected=800, idle=2)
    finally:
        codes = [i1.terminate(), i2.terminate()]
    stored = read_inputs(kafka_bootstrap, env["LOCKGATE_INPUT_TOPIC"], 800)
    assert check(model(stored), out) == [], i1.log_text()[-2000:] + i2.log_text()[-2000:]
    assert codes == [0, 0]
