"""``lockgate backfill`` (Spark, local mode) as an app's principal against the SASL_SSL broker.

In the Spark tier (Spark never runs beside the chaos tests); `make test-security` runs it too.
"""

from __future__ import annotations

import random
import uuid
from pathlib import Path

from confluent_kafka.admin import AclOperation, ResourcePatternType, ResourceType

from tests.security.support import Acl, SecureKafka, app_acls, lockgate_cli
from tests.support.checker import check, model
from tests.support.kafka import create_topic, produce_numbers, read_all, read_inputs, unique


def test_backfill_as_the_apps_principal_is_exact(secure_kafka: SecureKafka, tmp_path: Path) -> None:
    admin = secure_kafka.admin_conf
    app, inp, out = unique("bfsum"), unique("numbers"), unique("sums")
    user, password = unique("user"), uuid.uuid4().hex
    for topic in (inp, out):
        create_topic(secure_kafka.bootstrap, topic, 2, client=admin)
    secure_kafka.add_user(user, password)
    backfill_ids = Acl(
        ResourceType.TRANSACTIONAL_ID,
        f"{app}.backfill.",
        ResourcePatternType.PREFIXED,
        AclOperation.WRITE,
        "the backfill tasks' transactions <app>.backfill.<job>.<key group>",
    )
    secure_kafka.grant(user, [*app_acls(app, [inp], [out]), backfill_ids])
    rng = random.Random(5)
    inputs = [(f"k{rng.randrange(20)}", rng.randrange(50), i) for i in range(1500)]
    produce_numbers(secure_kafka.bootstrap, inp, inputs, client=admin)
    env = {
        **secure_kafka.app_env(user, password),
        "LOCKGATE_APP_NAME": app,
        "LOCKGATE_INPUT_TOPIC": inp,
        "LOCKGATE_OUTPUT_TOPIC": out,
        "LOCKGATE_SAVEPOINT_DIR": str(tmp_path / "sp"),
        "LOCKGATE_LOG_LEVEL": "WARNING",
    }
    r = lockgate_cli(
        env, "backfill", "examples.running_sum:app", "--master", "local[2]", timeout=300
    )
    assert r.returncode == 0, (r.stdout + r.stderr)[-4000:]
    assert password not in r.stdout + r.stderr
    got = read_all(secure_kafka.bootstrap, out, expected=len(inputs), idle=1, client=admin)
    stored = read_inputs(secure_kafka.bootstrap, inp, len(inputs), client=admin)
    assert check(model(stored), got) == []
