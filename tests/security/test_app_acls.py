"""running_sum against a SASL_SSL broker with ACLs: exactly the documented set suffices,
one missing ACL is refused at start with a message naming it, bad credentials and an
untrusted CA each give one clear error."""

from __future__ import annotations

import random
import subprocess
import uuid
from pathlib import Path

import pytest

from tests.security.support import REGISTRY_TOPIC, Acl, SecureKafka, app_acls, lockgate_cli
from tests.support.checker import check, model
from tests.support.kafka import create_topic, produce_numbers, read_all, read_inputs, unique
from tests.support.procs import AppProcess, wait_until


def _inputs(n: int, keys: int, seed: int) -> list[tuple[str, int, int]]:
    rng = random.Random(seed)
    return [(f"key-{rng.randrange(keys)}", rng.randrange(-5, 100), i) for i in range(n)]


class _Setup:
    """An app name, its topics (created by the admin) and a principal for it."""

    def __init__(self, kafka: SecureKafka, tmp_path: Path, partitions: int = 2) -> None:
        self.kafka = kafka
        self.app = unique("rsum")
        self.input = unique("numbers")
        self.output = unique("sums")
        self.user = unique("user")
        self.password = uuid.uuid4().hex
        admin = kafka.admin_conf
        create_topic(kafka.bootstrap, self.input, partitions, client=admin)
        create_topic(kafka.bootstrap, self.output, partitions, client=admin)
        kafka.add_user(self.user, self.password)
        self.acls = app_acls(self.app, [self.input], [self.output])
        self.env = {
            **kafka.app_env(self.user, self.password),
            "LOCKGATE_APP_NAME": self.app,
            "LOCKGATE_INPUT_TOPIC": self.input,
            "LOCKGATE_OUTPUT_TOPIC": self.output,
            "LOCKGATE_STATE_DIR": str(tmp_path / "state"),
            "LOCKGATE_INSTANCE_ID": "i1",
            "LOCKGATE_CHECKPOINT_INTERVAL_MS": "300",
        }


def _wait_started(app: AppProcess) -> None:
    wait_until(lambda: "started" in app.log_text() or not app.alive, 60, what="start")
    assert app.alive, app.log_text()[-3000:]


def test_running_sum_exactly_once_with_exactly_the_documented_acls(
    secure_kafka: SecureKafka, tmp_path: Path
) -> None:
    """Two runs: the second from an empty state dir restores from the changelog and the
    checkpoints in the control topic (the READ on the app's prefix); it reads the password
    from LOCKGATE_SASL_PASSWORD_FILE."""
    s = _Setup(secure_kafka, tmp_path, partitions=3)
    secure_kafka.grant(s.user, s.acls)
    admin = secure_kafka.admin_conf
    inputs = _inputs(2000, 30, seed=7)
    restored = 0
    for run, batch in enumerate([inputs[:1000], inputs[1000:]]):
        produce_numbers(secure_kafka.bootstrap, s.input, batch, client=admin)
        env = {**s.env, "LOCKGATE_STATE_DIR": str(tmp_path / f"state-{run}")}
        if run == 1:  # the password from a file (a mounted Secret), not the environment
            secret = tmp_path / "sasl-password"
            secret.write_text(s.password + "\n")
            del env["LOCKGATE_SASL_PASSWORD"]
            env["LOCKGATE_SASL_PASSWORD_FILE"] = str(secret)
        app = AppProcess("examples.running_sum:app", env, tmp_path / f"app-{run}.log").start()
        try:
            _wait_started(app)
            expected = 1000 * (run + 1)
            out = read_all(
                secure_kafka.bootstrap, s.output, expected=expected, idle=2, client=admin
            )
        finally:
            code = app.terminate()
        log = app.log_text()
        assert code == 0, log[-3000:]
        assert s.password not in log
        restored += sum(
            int(line.split("records=")[1].split()[0])
            for line in log.splitlines()
            if "key group restored" in line
        )
    assert restored >= 30  # run 2 had no local state: the 30 keys came from the changelog
    # The checkpoint catalog reads <app>.control: the app's own ACLs suffice.
    r = lockgate_cli(s.env, "checkpoints", "list", "--app", s.app)
    assert r.returncode == 0, r.stdout + r.stderr
    assert s.app in r.stdout, r.stdout
    stored = read_inputs(secure_kafka.bootstrap, s.input, len(inputs), client=admin)
    assert sorted(stored) == sorted(inputs)
    assert check(model(stored), out) == []


def test_at_least_once_needs_no_transactional_id_nor_idempotent_write(
    secure_kafka: SecureKafka, tmp_path: Path
) -> None:
    """Its idempotent (not transactional) producer needs only Write on the topics."""
    s = _Setup(secure_kafka, tmp_path)
    acls = [a for a in s.acls if a.resource.name != "TRANSACTIONAL_ID"]
    assert len(acls) == len(s.acls) - 1
    secure_kafka.grant(s.user, acls)
    admin = secure_kafka.admin_conf
    inputs = _inputs(300, 10, seed=9)
    produce_numbers(secure_kafka.bootstrap, s.input, inputs, client=admin)
    env = {**s.env, "LOCKGATE_GUARANTEE": "at_least_once"}
    app = AppProcess("examples.running_sum:app", env, tmp_path / "app.log").start()
    try:
        _wait_started(app)
        out = read_all(secure_kafka.bootstrap, s.output, expected=300, idle=2, client=admin)
    finally:
        code = app.terminate()
    assert code == 0, app.log_text()[-3000:]
    stored = read_inputs(secure_kafka.bootstrap, s.input, 300, client=admin)
    assert check(model(stored), out) == []  # no failure here: exact even at least once


#: One documented ACL removed at a time: the operation the runtime must name when refusing.
_MISSING = [
    pytest.param("WRITE", "TOPIC", "output", id="write-on-output"),
    pytest.param("WRITE", "TRANSACTIONAL_ID", "txn", id="write-on-transactional-id"),
    pytest.param("READ", "GROUP", "group", id="read-on-group"),
    pytest.param("READ", "TOPIC", "input", id="read-on-input"),
    pytest.param("READ", "TOPIC", "registry", id="read-on-registry"),
    pytest.param("DESCRIBE_CONFIGS", "TOPIC", "output", id="describe-configs-on-output"),
    pytest.param("CREATE", "TOPIC", "prefix", id="create-on-internal-prefix"),
]


@pytest.mark.parametrize(("operation", "resource", "which"), _MISSING)
def test_a_missing_acl_is_refused_at_start_naming_it(
    secure_kafka: SecureKafka, tmp_path: Path, operation: str, resource: str, which: str
) -> None:
    s = _Setup(secure_kafka, tmp_path)
    name = {
        "output": s.output,
        "input": s.input,
        "txn": f"{s.app}-",
        "group": s.app,
        "registry": REGISTRY_TOPIC,
        "prefix": f"{s.app}.",
    }[which]

    def dropped(a: Acl) -> bool:
        return a.operation.name == operation and a.resource.name == resource and a.name == name

    assert sum(map(dropped, s.acls)) == 1
    secure_kafka.grant(s.user, [a for a in s.acls if not dropped(a)])
    produce_numbers(secure_kafka.bootstrap, s.input, _inputs(10, 3, 1), client=s.kafka.admin_conf)
    app = AppProcess("examples.running_sum:app", s.env, tmp_path / "app.log").start()
    try:
        code = app.wait(90)
    finally:
        if app.alive:
            app.kill9()
    log = app.log_text()
    assert code == 2, log[-3000:]
    assert "not authorized" in log, log[-3000:]
    assert operation in log and name.rstrip("-") in log, log[-3000:]
    assert "Traceback" not in log, log[-3000:]
    assert s.password not in log


def test_a_wrong_password_is_one_clear_error(secure_kafka: SecureKafka, tmp_path: Path) -> None:
    s = _Setup(secure_kafka, tmp_path)
    secure_kafka.grant(s.user, s.acls)
    wrong = uuid.uuid4().hex
    secret = tmp_path / "sasl-password"
    secret.write_text(wrong + "\n")
    env = {**s.env, "LOCKGATE_SASL_PASSWORD_FILE": str(secret)}
    del env["LOCKGATE_SASL_PASSWORD"]
    app = AppProcess("examples.running_sum:app", env, tmp_path / "app.log").start()
    try:
        code = app.wait(90)
    finally:
        if app.alive:
            app.kill9()
    log = app.log_text()
    assert code == 2, log[-3000:]
    assert "authentication failed" in log.lower(), log[-3000:]
    assert "Traceback" not in log, log[-3000:]
    assert wrong not in log and s.password not in log


def test_an_untrusted_certificate_is_one_clear_error(
    secure_kafka: SecureKafka, tmp_path: Path
) -> None:
    s = _Setup(secure_kafka, tmp_path)
    other_ca = tmp_path / "other-ca.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
         "-subj", "/CN=not-the-broker-ca", "-keyout", str(tmp_path / "other-ca.key"),
         "-out", str(other_ca)],
        check=True, capture_output=True,
    )  # fmt: skip
    env = {**s.env, **secure_kafka.app_env(s.user, s.password, ca=other_ca)}
    app = AppProcess("examples.running_sum:app", env, tmp_path / "app.log").start()
    try:
        code = app.wait(90)
    finally:
        if app.alive:
            app.kill9()
    log = app.log_text()
    assert code == 2, log[-3000:]
    assert "certificate" in log.lower(), log[-3000:]
    assert "Traceback" not in log, log[-3000:]
