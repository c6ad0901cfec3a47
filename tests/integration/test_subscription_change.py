"""A change of the subscribed input is refused while the old version runs (no split ownership).

Members of one group that subscribe different topics would each be given their own topic's
partitions, so an old and a new instance would both own key group g (its state, changelog
partition and outputs). An instance therefore refuses to join while live members are assigned
a topic it does not subscribe — after waiting out members that only linger (static members of
a stopped version stay listed until their session times out).
"""

from __future__ import annotations

import time
from pathlib import Path

from tests.support.kafka import create_topic
from tests.support.procs import AppProcess, wait_until

SPEC = "examples.running_sum:app"


def test_new_subscription_refused_while_old_members_live_then_accepted(  # type: ignore[no-untyped-def]
    kafka_bootstrap: str, names, tmp_path: Path
) -> None:
    app_name = names("subscription")
    old_topic, new_topic = names("numbers-old"), names("numbers-new")
    for topic in (old_topic, new_topic):
        create_topic(kafka_bootstrap, topic, 2)
    base = {
        "LOCKGATE_BOOTSTRAP_SERVERS": kafka_bootstrap,
        "LOCKGATE_APP_NAME": app_name,
        "LOCKGATE_OUTPUT_TOPIC": names("sums"),
        "LOCKGATE_KAFKA__SESSION_TIMEOUT_MS": "6000",
        "LOCKGATE_KAFKA__HEARTBEAT_INTERVAL_MS": "1000",
    }
    old = AppProcess(
        SPEC,
        {**base, "LOCKGATE_INPUT_TOPIC": old_topic, "LOCKGATE_INSTANCE_ID": "old-0",
         "LOCKGATE_STATE_DIR": str(tmp_path / "old")},
        tmp_path / "old.log",
    ).start()  # fmt: skip
    new_env = {
        **base,
        "LOCKGATE_INPUT_TOPIC": new_topic,
        "LOCKGATE_INSTANCE_ID": "new-0",
        "LOCKGATE_STATE_DIR": str(tmp_path / "new"),
    }
    try:
        wait_until(lambda: "assigned" in old.log_text(), 60, what="old version assigned")
        started = time.monotonic()
        refused = AppProcess(SPEC, new_env, tmp_path / "refused.log").start()
        code = refused.wait(90)
        waited = time.monotonic() - started
        text = refused.log_text()
        assert code == 2, text[-2000:]
        assert "consume another topic" in text  # it waited first
        assert f"live members of group '{app_name}' consume" in text, text[-2000:]
        assert "assigned" not in text  # never joined
        assert waited >= 6, waited  # at least the session timeout of waiting
    finally:
        assert old.terminate() == 0, old.log_text()[-2000:]
    # The old version stopped (its static member lingers until its session expires): the new
    # version waits that out and joins.
    new = AppProcess(SPEC, new_env, tmp_path / "new.log").start()
    try:
        wait_until(lambda: "assigned" in new.log_text(), 60, what="new version assigned")
    finally:
        assert new.terminate() == 0, new.log_text()[-2000:]
