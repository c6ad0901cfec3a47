"""`lockgate` as a subprocess: configuration errors exit 2 and never print a secret.

No broker is needed: every case here must stop before any Kafka client exists (the
bootstrap address points at a closed port so a regression cannot silently connect).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
LOCKGATE = Path(sys.executable).parent / "lockgate"
SECRET = "hunter2-Zq9"
APP = "examples.running_sum:app"


def lockgate(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
    base = {k: v for k, v in os.environ.items() if not k.upper().startswith("LOCKGATE_")}
    base.update(
        {
            "LOCKGATE_BOOTSTRAP_SERVERS": "127.0.0.1:1",
            "LOCKGATE_HTTP_PORT": "0",
            "LOCKGATE_LOG_FORMAT": "console",
        }
    )
    base.update(env)
    return subprocess.run(
        [str(LOCKGATE), *args], cwd=ROOT, env=base, capture_output=True, text=True, timeout=60
    )


# Each case: environment next to a secret, and a fragment the error must contain.
SECRET_CASES = {
    "reserved key": (
        {"LOCKGATE_KAFKA__SASL_PASSWORD": SECRET, "LOCKGATE_KAFKA__GROUP_ID": "x"},
        "LOCKGATE_KAFKA__GROUP_ID",
    ),
    "bad secret value": ({"LOCKGATE_SASL_PASSWORD": SECRET + "\n"}, "LOCKGATE_SASL_PASSWORD"),
    "bad pass-through secret": (
        {"LOCKGATE_KAFKA__SSL_KEY_PASSWORD": SECRET + "\r\n"},
        "LOCKGATE_KAFKA__SSL_KEY_PASSWORD",
    ),
    "unknown variable": (
        {"LOCKGATE_SASL_PASSWORD": SECRET, "LOCKGATE_CHECKPOINT_INTERVAL": "500"},
        "did you mean LOCKGATE_CHECKPOINT_INTERVAL_MS",
    ),
    "invalid int": (
        {"LOCKGATE_KAFKA__SASL_PASSWORD": SECRET, "LOCKGATE_CHECKPOINT_INTERVAL_MS": "abc"},
        "LOCKGATE_CHECKPOINT_INTERVAL_MS",
    ),
    "cross-field rule": (
        {"LOCKGATE_SASL_PASSWORD": SECRET, "LOCKGATE_TRANSACTION_TIMEOUT_MS": "1000"},
        "at least twice",
    ),
    "kafka as JSON": ({"LOCKGATE_KAFKA": '{"sasl.password": "' + SECRET + '"}'}, "KAFKA__<KEY>"),
    "empty pass-through key": ({"LOCKGATE_KAFKA__": SECRET}, "property name"),
}


@pytest.mark.parametrize("command", [["config"], ["config", APP], ["run", APP]])
@pytest.mark.parametrize("case", sorted(SECRET_CASES))
def test_configuration_errors_exit_2_without_the_secret(command: list[str], case: str) -> None:
    env, expected = SECRET_CASES[case]
    res = lockgate(*command, **env)
    output = res.stdout + res.stderr
    assert res.returncode == 2, output
    assert SECRET not in output
    assert expected in res.stderr
    assert res.stdout == ""


def test_config_masks_secrets_on_success() -> None:
    res = lockgate(
        "config",
        LOCKGATE_SASL_PASSWORD=SECRET,
        LOCKGATE_KAFKA__SASL_OAUTHBEARER_CLIENT_SECRET=SECRET,
        LOCKGATE_KAFKA__SSL_KEY_PASSWORD=SECRET,
    )
    assert res.returncode == 0, res.stderr
    assert SECRET not in res.stdout + res.stderr
    assert '"sasl_password": "**********"' in res.stdout


def test_unknown_variable_stops_run_before_kafka() -> None:
    res = lockgate("run", APP, LOCKGATE_CHECKPOINT_INTERVAL="500")
    assert res.returncode == 2
    assert "LOCKGATE_CHECKPOINT_INTERVAL is not a lockgate setting" in res.stderr
    assert "did you mean LOCKGATE_CHECKPOINT_INTERVAL_MS?" in res.stderr


def test_allow_listed_tooling_variables_pass() -> None:
    res = lockgate(
        "config",
        LOCKGATE_INPUT_TOPIC="in",
        LOCKGATE_KAFKA_PORT="9092",
        LOCKGATE_TEST_BOOTSTRAP="127.0.0.1:9092",
        LOCKGATE_CHAOS_KILLS="3",
        LOCKGATE_TEST_CRASH_POINTS="after_commit:0",
    )
    assert res.returncode == 0, res.stderr


def test_config_is_a_dry_run_of_the_epoch_rule() -> None:
    env = {"LOCKGATE_CHECKPOINT_INTERVAL_MS": "6000"}  # default timeout 10000 < 12000
    config, run = lockgate("config", **env), lockgate("run", APP, **env)
    assert config.returncode == run.returncode == 2
    for res in (config, run):
        assert "LOCKGATE_TRANSACTION_TIMEOUT_MS (10000) must be at least twice" in res.stderr


def test_run_with_a_missing_attribute_lists_the_apps() -> None:
    res = lockgate("run", "examples.running_sum:typo")
    assert res.returncode == 2
    assert "module 'examples.running_sum' has no attribute 'typo'" in res.stderr
    assert "App objects it defines: app" in res.stderr
    assert "NoneType" not in res.stderr


def test_config_with_an_app_checks_the_app() -> None:
    assert lockgate("config", APP).returncode == 0
    res = lockgate("config", "examples.running_sum:typo")
    assert res.returncode == 2 and "has no attribute 'typo'" in res.stderr


def test_operator_commands_run_in_an_apps_environment(tmp_path: Path) -> None:
    """Inside an app's pod the environment holds the app's own LOCKGATE_* variables.

    An operator command without --app cannot know them: it warns (naming each, with a
    "did you mean") and runs, where ``lockgate run`` refuses them (test above).
    """
    res = lockgate(
        "savepoint",
        "list",
        LOCKGATE_SAVEPOINT_DIR=str(tmp_path),
        LOCKGATE_CLICKS_TOPIC="clicks",
        LOCKGATE_CHECKPOINT_INTERVAL="500",
    )
    assert res.returncode == 0, res.stderr
    assert "warning: ignoring variables no setting reads" in res.stderr
    assert "LOCKGATE_CLICKS_TOPIC is not a lockgate setting" in res.stderr
    assert "did you mean LOCKGATE_CHECKPOINT_INTERVAL_MS?" in res.stderr


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("dlq", "replay", "--app", "x", "--offsets", "0:x"), "lockgate: --offsets: '0:x'"),
        (("reset", "--app", APP, "--to", "bogus"), "lockgate: --to: 'bogus'"),
    ],
)
def test_bad_positions_are_usage_errors(args: tuple[str, ...], message: str) -> None:
    res = lockgate(*args)
    assert res.returncode == 2, res.stderr
    assert message in res.stderr and "Traceback" not in res.stderr, res.stderr
