"""The ``lockgate topics`` and ``lockgate send`` commands as an app's principal."""

from __future__ import annotations

import json
import uuid
from pathlib import Path

from tests.security.support import SecureKafka, app_acls, lockgate_cli, topics_command_acls
from tests.support.kafka import create_topic, read_all, unique

SPEC = "examples.running_sum:app"


def test_topics_and_send_as_the_apps_principal(secure_kafka: SecureKafka, tmp_path: Path) -> None:
    app, inp, out = unique("rsum"), unique("numbers"), unique("sums")
    user, password = unique("user"), uuid.uuid4().hex
    for topic in (inp, out):
        create_topic(secure_kafka.bootstrap, topic, 2, client=secure_kafka.admin_conf)
    secure_kafka.add_user(user, password)
    secure_kafka.grant(user, app_acls(app, [inp], [out]))
    env = {
        **secure_kafka.app_env(user, password),
        "LOCKGATE_APP_NAME": app,
        "LOCKGATE_INPUT_TOPIC": inp,
        "LOCKGATE_OUTPUT_TOPIC": out,
        "LOCKGATE_STATE_DIR": str(tmp_path / "state"),
    }

    # The app's own ACLs do not let `topics` read the inputs' configuration: one message.
    r = lockgate_cli(env, "topics", "--app", SPEC)
    assert r.returncode == 2, r.stderr
    assert "not authorized" in r.stderr and "TOPIC_AUTHORIZATION_FAILED" in r.stderr, r.stderr
    assert "Traceback" not in r.stderr and password not in r.stderr + r.stdout

    secure_kafka.grant(user, topics_command_acls([inp]))
    r = lockgate_cli(env, "topics", "--app", SPEC, "--create")
    assert r.returncode == 0, r.stdout + r.stderr
    assert f"created {app}.control" in r.stdout + r.stderr, r.stdout + r.stderr
    r = lockgate_cli(env, "topics", "--app", SPEC)
    assert r.returncode == 0, r.stdout + r.stderr

    # send: WRITE on the topic. The app may write its output, not its input.
    line = json.dumps({"key": "a", "value": {"sum": 1, "count": 1, "seq": 0}}) + "\n"
    r = lockgate_cli(env, "send", out, "--app", SPEC, stdin=line)
    assert r.returncode == 0, r.stdout + r.stderr
    assert (
        len(read_all(secure_kafka.bootstrap, out, expected=1, client=secure_kafka.admin_conf)) == 1
    )
    line = json.dumps({"key": "a", "value": {"v": 1, "seq": 0}}) + "\n"
    r = lockgate_cli(env, "send", inp, "--app", SPEC, stdin=line)
    assert r.returncode != 0, r.stdout + r.stderr
    assert "TOPIC_AUTHORIZATION_FAILED" in r.stderr and inp in r.stderr, r.stderr
    assert "Traceback" not in r.stderr and password not in r.stderr + r.stdout
