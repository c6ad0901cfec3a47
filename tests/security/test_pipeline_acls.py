"""examples/click_pipeline.py with two principals, each holding only its own app's ACLs."""

from __future__ import annotations

import uuid
from pathlib import Path

from tests.chaos._pipeline import (
    CLICK_SPEC,
    REGION_SPEC,
    Model,
    Topics,
    check_pipeline,
    data_records,
    pipeline_env,
    produce_clicks,
    random_clicks,
    read_clicks,
    read_topic,
)
from tests.security.support import SecureKafka, app_acls
from tests.support.kafka import create_topic, unique
from tests.support.procs import AppProcess, wait_until

N = 1000
PARTITIONS = 2


def _start(spec: str, env: dict[str, str], tmp_path: Path, name: str) -> AppProcess:
    env = {
        **env,
        "LOCKGATE_INSTANCE_ID": "i1",
        "LOCKGATE_STATE_DIR": str(tmp_path / name),
        "LOCKGATE_CHECKPOINT_INTERVAL_MS": "300",
    }
    return AppProcess(spec, env, tmp_path / f"{name}.log").start()


def test_click_pipeline_exactly_once_each_app_with_its_own_principal(
    secure_kafka: SecureKafka, tmp_path: Path
) -> None:
    admin = secure_kafka.admin_conf
    topics = Topics.fresh("sec")
    for topic in (topics.clicks, topics.counts, topics.totals):
        create_topic(secure_kafka.bootstrap, topic, PARTITIONS, client=admin)
    users = {name: (unique(name), uuid.uuid4().hex) for name in ("click", "region")}
    acls = {
        "click": app_acls(topics.click_app, [topics.clicks], [topics.counts]),
        "region": app_acls(topics.region_app, [topics.counts], [topics.totals]),
    }
    for name, (user, password) in users.items():
        secure_kafka.add_user(user, password)
        secure_kafka.grant(user, acls[name])
    envs = {
        "click": pipeline_env(secure_kafka.bootstrap, topics, topics.click_app),
        "region": pipeline_env(secure_kafka.bootstrap, topics, topics.region_app),
    }
    for name, (user, password) in users.items():
        envs[name].update(secure_kafka.app_env(user, password))

    # The region app's principal may not run the click app (not its group, topics or ids).
    wrong = _start(CLICK_SPEC, {**envs["click"], **envs["region"]} | {
        "LOCKGATE_APP_NAME": topics.click_app}, tmp_path, "wrong")  # fmt: skip
    assert wrong.wait(90) == 2, wrong.log_text()[-3000:]
    assert f"not authorized: User:{users['region'][0]} lacks" in wrong.log_text()

    clicks = random_clicks(N, users=20, regions=4, seed=3)
    produce_clicks(secure_kafka.bootstrap, topics.clicks, clicks, client=admin)
    apps = {
        "click": _start(CLICK_SPEC, envs["click"], tmp_path, "click"),
        "region": _start(REGION_SPEC, envs["region"], tmp_path, "region"),
    }
    try:
        for app in apps.values():
            wait_until(lambda a=app: "started" in a.log_text() or not a.alive, 60, what="start")
        counts = read_topic(
            secure_kafka.bootstrap, topics.counts, expected=N, timeout=90, idle=2, client=admin
        )
        totals = read_topic(
            secure_kafka.bootstrap, topics.totals, expected=N, timeout=60, idle=2, client=admin
        )
    finally:
        codes = {name: app.terminate() for name, app in apps.items()}
    logs = "\n".join(app.log_text()[-3000:] for app in apps.values())
    stored = read_clicks(secure_kafka.bootstrap, topics.clicks, N, client=admin)
    assert sorted(stored) == sorted(clicks)
    problems = check_pipeline(Model.of(stored), counts, totals)
    assert problems == [], "\n".join(problems[:20]) + "\n" + logs
    assert len(data_records(counts)) == N and len(data_records(totals)) == N
    assert codes == {"click": 0, "region": 0}, logs
    for _, password in users.values():
        assert password not in logs
