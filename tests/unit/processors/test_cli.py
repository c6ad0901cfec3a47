"""The CLI's app loading and `lockgate config` (in-process, no Kafka)."""

import os
import sys
from pathlib import Path

import click
import pytest
from click.testing import CliRunner
from confluent_kafka import KafkaError, KafkaException

from processors.cli import _unreachable_hint, load_app, main

APPS = Path(__file__).resolve().parent / "cli_apps"


@pytest.fixture(autouse=True)
def _env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in list(os.environ):
        if name.upper().startswith("LOCKGATE_"):
            monkeypatch.delenv(name)
    monkeypatch.syspath_prepend(str(APPS))
    for mod in [m for m in sys.modules if m.startswith("cli_app_")]:
        monkeypatch.delitem(sys.modules, mod)


def test_missing_attribute_names_it_and_lists_the_apps() -> None:
    with pytest.raises(click.UsageError) as err:
        load_app("examples.running_sum:typo")
    msg = err.value.message
    assert "module 'examples.running_sum' has no attribute 'typo'" in msg
    assert "App objects it defines: app" in msg
    assert "NoneType" not in msg


def test_attribute_that_is_not_an_app_is_named_with_its_type() -> None:
    with pytest.raises(click.UsageError, match="is a ValueState, not a lockgate App") as err:
        load_app("examples.running_sum:totals")
    assert "App objects it defines: app" in err.value.message


def test_module_without_apps_says_so() -> None:
    with pytest.raises(click.UsageError, match="it defines no lockgate App"):
        load_app("cli_app_none:app")


def test_several_apps_are_all_listed() -> None:
    with pytest.raises(click.UsageError, match="App objects it defines: first, second"):
        load_app("cli_app_two:third")


def test_definition_errors_are_usage_errors() -> None:
    with pytest.raises(click.UsageError, match="topic 'a' is already an input of this app"):
        load_app("cli_app_bad:app")


def test_config_prints_masked_json() -> None:
    res = CliRunner().invoke(
        main,
        ["config"],
        env={"LOCKGATE_SASL_PASSWORD": "hunter2", "LOCKGATE_GUARANTEE": "at_least_once"},
    )
    assert res.exit_code == 0, res.output
    assert '"guarantee": "at_least_once"' in res.output
    assert "hunter2" not in res.output


def test_config_with_an_app_accepts_its_variables() -> None:
    env = {"LOCKGATE_WINDOW_MS": "5000"}
    assert CliRunner().invoke(main, ["config"], env=env).exit_code == 2
    res = CliRunner().invoke(main, ["config", "cli_app_two:first"], env=env)
    assert res.exit_code == 0, res.output


def test_config_with_an_app_validates_its_chain() -> None:
    res = CliRunner().invoke(main, ["config", "cli_app_two:second"])
    assert res.exit_code == 2
    assert "has no operators" in res.output


@pytest.mark.parametrize("code", [KafkaError._TRANSPORT, KafkaError._ALL_BROKERS_DOWN])
def test_unreachable_brokers_get_a_hint_naming_what_to_check(code: int) -> None:
    hint = _unreachable_hint(KafkaException(KafkaError(code, "Failed to get metadata")), "k:9092")
    assert "no broker answered at k:9092" in hint
    assert "LOCKGATE_BOOTSTRAP_SERVERS" in hint


def test_other_kafka_errors_get_no_unreachable_hint() -> None:
    denied = KafkaException(KafkaError(KafkaError.TOPIC_AUTHORIZATION_FAILED))
    assert _unreachable_hint(denied, "k:9092") == ""
    assert _unreachable_hint(KafkaException("no KafkaError"), "k:9092") == ""


@pytest.mark.parametrize("fmt", ["json", "console"])
def test_an_unreachable_broker_is_reported_once(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, fmt: str
) -> None:
    import processors.cli as cli

    def unreachable(*_args: object, **_kwargs: object) -> int:
        raise KafkaException(KafkaError(KafkaError._TRANSPORT, "Failed to get metadata"))

    monkeypatch.setattr(cli, "run_app", unreachable)
    env = {
        "LOCKGATE_BOOTSTRAP_SERVERS": "127.0.0.1:1",
        "LOCKGATE_STATE_DIR": str(tmp_path),
        "LOCKGATE_LOG_FORMAT": fmt,
    }
    res = CliRunner().invoke(main, ["run", "examples.running_sum:app"], env=env)
    assert res.exit_code == 1
    assert res.stderr.count("no broker answered at 127.0.0.1:1") == 1, res.stderr
    assert "Failed to get metadata" in res.stderr


@pytest.mark.parametrize(
    "args",
    [
        ["savepoint", "cancel", "--pipeline", "sums"],
        ["savepoint", "cancel", "sp-20261128T010203Z-0a1b2c", "--halted", "--pipeline", "sums"],
    ],
)
def test_savepoint_cancel_takes_an_id_or_halted(args: list[str]) -> None:
    """Neither or both: a usage error (exit 2) before any Kafka client is made."""
    res = CliRunner().invoke(main, args, env={"LOCKGATE_BOOTSTRAP_SERVERS": "127.0.0.1:1"})
    assert res.exit_code == 2, res.output
    assert "give either a savepoint ID or --halted" in res.output
