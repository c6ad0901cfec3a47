from pathlib import Path

import pytest
from pydantic import ValidationError

from processors import ConfigError, Guarantee, load_settings


def test_defaults(monkeypatch: pytest.MonkeyPatch) -> None:
    for var in ("LOCKGATE_GUARANTEE", "LOCKGATE_CHECKPOINT_INTERVAL_MS", "LOCKGATE_ON_ERROR"):
        monkeypatch.delenv(var, raising=False)
    s = load_settings()
    assert s.guarantee is Guarantee.EXACTLY_ONCE
    assert s.checkpoint_interval_ms == 1000
    assert s.on_error.value == "dlq"


def test_env_and_kafka_passthrough(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LOCKGATE_GUARANTEE", "at_least_once")
    monkeypatch.setenv("LOCKGATE_KAFKA__SESSION_TIMEOUT_MS", "6000")
    monkeypatch.setenv("LOCKGATE_KAFKA__SASL_PASSWORD", "hunter2")
    monkeypatch.setenv("LOCKGATE_SASL_USERNAME", "svc")
    s = load_settings()
    assert s.guarantee is Guarantee.AT_LEAST_ONCE
    conf = s.kafka_config()
    assert conf["session.timeout.ms"] == "6000"
    assert conf["sasl.password"] == "hunter2"
    assert conf["sasl.username"] == "svc"
    dumped = repr(s) + str(s.masked())
    assert "hunter2" not in dumped
    assert s.masked()["kafka"]["session.timeout.ms"] == "6000"


def test_invalid_values_name_the_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LOCKGATE_GUARANTEE", "twice")
    monkeypatch.setenv("LOCKGATE_CHECKPOINT_INTERVAL_MS", "-5")
    with pytest.raises(ConfigError) as err:
        load_settings()
    text = str(err.value)
    assert "LOCKGATE_GUARANTEE" in text
    assert "LOCKGATE_CHECKPOINT_INTERVAL_MS" in text


def test_settings_are_frozen() -> None:
    s = load_settings()
    with pytest.raises(ValidationError, match="frozen_instance"):
        s.checkpoint_interval_ms = 5  # type: ignore[misc]
    assert s.checkpoint_interval_ms != 5


def test_reserved_kafka_keys_are_rejected(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LOCKGATE_KAFKA__ISOLATION_LEVEL", "read_uncommitted")
    with pytest.raises(ConfigError, match="isolation.level is set by lockgate"):
        load_settings()


def test_passthrough_goes_to_the_clients_that_accept_it(monkeypatch: pytest.MonkeyPatch) -> None:
    from processors._kafka.clients import admin_config, consumer_config, producer_config

    monkeypatch.setenv("LOCKGATE_KAFKA__SESSION_TIMEOUT_MS", "6000")
    monkeypatch.setenv("LOCKGATE_KAFKA__LINGER_MS", "20")
    monkeypatch.setenv("LOCKGATE_KAFKA__SOCKET_TIMEOUT_MS", "30000")
    s = load_settings()
    consumer, producer = consumer_config(s, "a"), producer_config(s, "a", "a-1")
    assert consumer["session.timeout.ms"] == "6000" and "linger.ms" not in consumer
    assert producer["linger.ms"] == "20" and "session.timeout.ms" not in producer
    assert producer["partitioner"] == "murmur2_random"
    assert all(c["socket.timeout.ms"] == "30000" for c in (consumer, producer, admin_config(s)))
    monkeypatch.setenv("LOCKGATE_GROUP_PROTOCOL", "consumer")
    kip848 = consumer_config(load_settings(), "a")
    assert kip848["group.protocol"] == "consumer"
    assert "session.timeout.ms" not in kip848 and "partition.assignment.strategy" not in kip848


def test_fetch_queue_backoff_is_short_and_can_be_set(monkeypatch: pytest.MonkeyPatch) -> None:
    # librdkafka's 1 s default idled the loop once the bounded fetch queue was drained
    from processors._kafka.clients import (
        FETCH_QUEUE_BACKOFF_MS,
        consumer_config,
        producer_config,
        restore_consumer_config,
    )

    s = load_settings()
    assert FETCH_QUEUE_BACKOFF_MS < 100
    assert consumer_config(s, "a")["fetch.queue.backoff.ms"] == FETCH_QUEUE_BACKOFF_MS
    assert restore_consumer_config(s, "a")["fetch.queue.backoff.ms"] == FETCH_QUEUE_BACKOFF_MS
    assert "fetch.queue.backoff.ms" not in producer_config(s, "a", "a-1")
    monkeypatch.setenv("LOCKGATE_KAFKA__FETCH_QUEUE_BACKOFF_MS", "250")
    assert consumer_config(load_settings(), "a")["fetch.queue.backoff.ms"] == "250"


# -- unknown variables, the allow-list and app-declared variables ---------------------------


@pytest.fixture
def clean_env(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    """No LOCKGATE_* variable from the developer's shell or CI."""
    import os

    for name in list(os.environ):
        if name.upper().startswith("LOCKGATE_"):
            monkeypatch.delenv(name)
    return monkeypatch


def test_unknown_variable_is_rejected_with_a_suggestion(clean_env: pytest.MonkeyPatch) -> None:
    clean_env.setenv("LOCKGATE_CHECKPOINT_INTERVAL", "500")
    with pytest.raises(ConfigError, match="LOCKGATE_CHECKPOINT_INTERVAL") as err:
        load_settings()
    assert "did you mean LOCKGATE_CHECKPOINT_INTERVAL_MS?" in str(err.value)


def test_lowercase_unknown_variable_is_rejected(clean_env: pytest.MonkeyPatch) -> None:
    clean_env.setenv("lockgate_guarante", "exactly_once")
    with pytest.raises(ConfigError, match="did you mean LOCKGATE_GUARANTEE"):
        load_settings()


def test_single_underscore_kafka_typo_points_to_the_pass_through(
    clean_env: pytest.MonkeyPatch,
) -> None:
    clean_env.setenv("LOCKGATE_KAFKA_SESSION_TIMEOUT_MS", "6000")
    with pytest.raises(ConfigError, match="did you mean LOCKGATE_KAFKA__SESSION_TIMEOUT_MS"):
        load_settings()


def test_unknown_variable_without_a_close_match(clean_env: pytest.MonkeyPatch) -> None:
    clean_env.setenv("LOCKGATE_ZZZZZZZZ", "1")
    with pytest.raises(ConfigError, match="LOCKGATE_ZZZZZZZZ is not a lockgate setting") as err:
        load_settings()
    assert "did you mean" not in str(err.value)
    assert "App(..., env=" in str(err.value)


def test_kafka_without_key_is_rejected(clean_env: pytest.MonkeyPatch) -> None:
    clean_env.setenv("LOCKGATE_KAFKA", '{"linger.ms": "5"}')
    with pytest.raises(ConfigError, match="LOCKGATE_KAFKA__<KEY>"):
        load_settings()


def test_pass_through_and_allow_listed_tooling_names_are_accepted(
    clean_env: pytest.MonkeyPatch,
) -> None:
    from processors._config.settings import NON_SETTINGS_ENV

    for name in NON_SETTINGS_ENV:
        clean_env.setenv(name, "1")
    clean_env.setenv("LOCKGATE_TEST_SOMETHING_NEW", "1")
    clean_env.setenv("LOCKGATE_CHAOS_SOMETHING_NEW", "1")
    clean_env.setenv("LOCKGATE_KAFKA__CLIENT_RACK", "rack-1")
    assert load_settings().kafka_config()["client.rack"] == "rack-1"


def test_app_declared_variables_are_accepted(clean_env: pytest.MonkeyPatch) -> None:
    from processors import App

    clean_env.setenv("LOCKGATE_WINDOW_MS", "5000")
    with pytest.raises(ConfigError, match="LOCKGATE_WINDOW_MS"):
        load_settings()
    app = App("windows", env=["LOCKGATE_WINDOW_MS"])
    assert app.env == frozenset({"LOCKGATE_WINDOW_MS"})
    load_settings(app_env=app.env)


@pytest.mark.parametrize("bad", ["WINDOW_MS", "LOCKGATE_", "lockgate_window_ms", "LOCKGATE_A B"])
def test_app_env_names_must_be_lockgate_variables(bad: str) -> None:
    from processors import App

    with pytest.raises(ConfigError, match="env="):
        App("a", env=[bad])


def test_app_env_must_be_a_list_of_names() -> None:
    from processors import App

    with pytest.raises(TypeError, match="list of variable names"):
        App("a", env="LOCKGATE_WINDOW_MS")  # type: ignore[arg-type]


def test_every_error_is_reported_at_once(clean_env: pytest.MonkeyPatch) -> None:
    clean_env.setenv("LOCKGATE_CHECKPOINT_INTERVAL", "500")
    clean_env.setenv("LOCKGATE_GUARANTEE", "twice")
    with pytest.raises(ConfigError) as err:
        load_settings()
    assert "LOCKGATE_CHECKPOINT_INTERVAL " in str(err.value)
    assert "LOCKGATE_GUARANTEE" in str(err.value)


# -- cross-field rules live in the model (lockgate config and run share them) ---------------


def test_transaction_timeout_must_be_twice_the_checkpoint_interval(
    clean_env: pytest.MonkeyPatch,
) -> None:
    clean_env.setenv("LOCKGATE_CHECKPOINT_INTERVAL_MS", "1000")
    clean_env.setenv("LOCKGATE_TRANSACTION_TIMEOUT_MS", "1500")
    with pytest.raises(ConfigError, match="LOCKGATE_TRANSACTION_TIMEOUT_MS \\(1500\\) must be"):
        load_settings()
    clean_env.setenv("LOCKGATE_GUARANTEE", "at_least_once")  # no transactions: no rule
    assert load_settings().transaction_timeout_ms == 1500


def test_cross_field_rule_applies_to_the_model_itself() -> None:
    from pydantic import ValidationError

    from processors import Settings

    with pytest.raises(ValidationError, match="at least twice"):
        Settings(checkpoint_interval_ms=6000, transaction_timeout_ms=10_000)


# -- secrets never appear in messages --------------------------------------------------------


def test_reserved_key_error_names_only_the_variable(clean_env: pytest.MonkeyPatch) -> None:
    clean_env.setenv("LOCKGATE_KAFKA__SASL_PASSWORD", "hunter2")
    clean_env.setenv("LOCKGATE_KAFKA__GROUP_ID", "x")
    clean_env.setenv("LOCKGATE_KAFKA__TRANSACTIONAL_ID", "y")
    with pytest.raises(ConfigError) as err:
        load_settings()
    text = str(err.value)
    assert "hunter2" not in text and "sasl_password" not in text
    assert "LOCKGATE_KAFKA__GROUP_ID" in text and "LOCKGATE_KAFKA__TRANSACTIONAL_ID" in text


def test_secret_with_a_control_character_is_rejected_without_echo(
    clean_env: pytest.MonkeyPatch,
) -> None:
    clean_env.setenv("LOCKGATE_SASL_PASSWORD", "hunter2\n")
    clean_env.setenv("LOCKGATE_KAFKA__SSL_KEY_PASSWORD", "s3cr3t-key\r\n")
    with pytest.raises(ConfigError) as err:
        load_settings()
    text = str(err.value)
    assert "LOCKGATE_SASL_PASSWORD" in text and "LOCKGATE_KAFKA__SSL_KEY_PASSWORD" in text
    assert "hunter2" not in text and "s3cr3t-key" not in text


def test_secret_of_the_wrong_type_is_not_echoed(clean_env: pytest.MonkeyPatch) -> None:
    with pytest.raises(ConfigError, match="LOCKGATE_SASL_PASSWORD") as err:
        load_settings(sasl_password=987654321)
    assert "987654321" not in str(err.value)


def test_model_level_errors_do_not_dump_the_input(clean_env: pytest.MonkeyPatch) -> None:
    clean_env.setenv("LOCKGATE_SASL_PASSWORD", "hunter2")
    clean_env.setenv("LOCKGATE_KAFKA__SASL_OAUTHBEARER_CLIENT_SECRET", "oauth-s3cret")
    clean_env.setenv("LOCKGATE_TRANSACTION_TIMEOUT_MS", "1000")
    with pytest.raises(ConfigError) as err:
        load_settings()
    assert "hunter2" not in str(err.value) and "oauth-s3cret" not in str(err.value)


def test_empty_kafka_key_is_rejected_and_not_printed(clean_env: pytest.MonkeyPatch) -> None:
    clean_env.setenv("LOCKGATE_KAFKA__", "hunter2")
    with pytest.raises(ConfigError, match="property name") as err:
        load_settings()
    assert "hunter2" not in str(err.value)


@pytest.mark.parametrize(
    "key",
    [
        "SASL_PASSWORD",
        "SSL_KEY_PASSWORD",
        "SSL_KEYSTORE_PASSWORD",
        "SASL_OAUTHBEARER_CLIENT_SECRET",
        "SASL_OAUTHBEARER_CONFIG",
        "SSL_KEY_PEM",
        "SASL_OAUTHBEARER_ASSERTION_PRIVATE_KEY_PASSPHRASE",
        "SASL_OAUTHBEARER_ASSERTION_PRIVATE_KEY_PEM",
    ],
)
def test_secret_pass_through_properties_are_masked(clean_env: pytest.MonkeyPatch, key: str) -> None:
    clean_env.setenv(f"LOCKGATE_KAFKA__{key}", "very-secret-value")
    s = load_settings()
    assert "very-secret-value" not in str(s.masked()) + repr(s)
    assert s.kafka_config()[key.lower().replace("_", ".")] == "very-secret-value"


def test_sasl_password_from_a_file_is_read_at_each_client(
    clean_env: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    secret = tmp_path / "password"
    secret.write_text("first-pass\n")  # a mounted Secret often ends with a newline
    clean_env.setenv("LOCKGATE_SASL_USERNAME", "svc")
    clean_env.setenv("LOCKGATE_SASL_PASSWORD_FILE", str(secret))
    s = load_settings()
    assert s.kafka_config()["sasl.password"] == "first-pass"
    secret.write_text("rotated-pass")  # the kubelet updates the file on rotation
    assert s.kafka_config()["sasl.password"] == "rotated-pass"
    assert "rotated-pass" not in str(s.masked())


@pytest.mark.parametrize(
    ("content", "problem"),
    [(None, "cannot read it"), ("", "is empty"), ("pa\nss\n", "control character")],
)
def test_a_bad_password_file_is_refused_without_showing_it(
    clean_env: pytest.MonkeyPatch, tmp_path: Path, content: str | None, problem: str
) -> None:
    secret = tmp_path / "password"
    if content is not None:
        secret.write_text(content)
    clean_env.setenv("LOCKGATE_SASL_PASSWORD_FILE", str(secret))
    with pytest.raises(ConfigError) as exc:
        load_settings()
    assert problem in str(exc.value) and "LOCKGATE_SASL_PASSWORD_FILE" in str(exc.value)
    assert "pa\nss" not in str(exc.value)


def test_password_and_password_file_exclude_each_other(
    clean_env: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    (tmp_path / "p").write_text("x-secret")
    clean_env.setenv("LOCKGATE_SASL_PASSWORD_FILE", str(tmp_path / "p"))
    clean_env.setenv("LOCKGATE_SASL_PASSWORD", "y-secret")
    with pytest.raises(ConfigError) as exc:
        load_settings()
    assert "both set" in str(exc.value)
    assert "x-secret" not in str(exc.value) and "y-secret" not in str(exc.value)


def test_alignment_none_and_its_old_name_unaligned(
    clean_env: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    from processors._config.settings import Alignment

    clean_env.setenv("LOCKGATE_ALIGNMENT", "none")
    assert load_settings().alignment is Alignment.NONE
    assert "unaligned" not in caplog.text
    clean_env.setenv("LOCKGATE_ALIGNMENT", "unaligned")
    with caplog.at_level("WARNING", logger="lockgate.settings"):
        assert load_settings().alignment is Alignment.NONE
    assert "LOCKGATE_ALIGNMENT=unaligned is now called none" in caplog.text
    clean_env.setenv("LOCKGATE_ALIGNMENT", "sideways")
    with pytest.raises(ConfigError, match="LOCKGATE_ALIGNMENT"):
        load_settings()
