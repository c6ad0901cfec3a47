"""The pytest plugin against the SASL_SSL broker: a user's project, settings from the env."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tests.security.support import SecureKafka

ROOT = Path(__file__).resolve().parents[2]

USER_TEST = """
def test_running_sum(lockgate_kafka, lockgate_topics, lockgate_app):
    t = lockgate_topics({"numbers": 2, "sums": 2})
    lockgate_kafka.produce(t["numbers"], [("a", {"v": 2, "seq": 0}), ("a", {"v": 5, "seq": 1})])
    lockgate_app(
        "examples.running_sum:app",
        env={"LOCKGATE_INPUT_TOPIC": t["numbers"], "LOCKGATE_OUTPUT_TOPIC": t["sums"]},
    )
    out = lockgate_kafka.read_committed(t["sums"], 2)
    assert [r.value["sum"] for r in out] == [2, 7]
"""


def test_plugin_and_its_apps_connect_with_the_environments_settings(
    secure_kafka: SecureKafka, tmp_path: Path
) -> None:
    """The admin's settings in LOCKGATE_KAFKA__* and LOCKGATE_SASL_* (password from a file):
    the plugin's readiness check, topic creation, produce, read and the app all use them."""
    (tmp_path / "test_user_app.py").write_text(USER_TEST)
    conf = secure_kafka.admin_conf
    secret = tmp_path / "password"
    secret.write_text(conf["sasl.password"] + "\n")
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("LOCKGATE_TEST_KAFKA")},
        "LOCKGATE_TEST_BOOTSTRAP": secure_kafka.bootstrap,
        "PYTHONPATH": str(ROOT),  # the user's app package (here: examples/)
        "LOCKGATE_KAFKA__SECURITY_PROTOCOL": "SASL_SSL",
        "LOCKGATE_KAFKA__SASL_MECHANISM": "SCRAM-SHA-512",
        "LOCKGATE_KAFKA__SSL_CA_LOCATION": str(secure_kafka.ca),
        "LOCKGATE_SASL_USERNAME": conf["sasl.username"],
        "LOCKGATE_SASL_PASSWORD_FILE": str(secret),
    }
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(tmp_path)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )
    out = done.stdout + done.stderr
    assert done.returncode == 0, out[-4000:]
    assert "1 passed" in out, out[-4000:]
    assert conf["sasl.password"] not in out
