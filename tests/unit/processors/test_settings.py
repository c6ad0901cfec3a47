import pytest

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
    with pytest.raises(Exception):  # noqa: B017 - pydantic's ValidationError
        s.checkpoint_interval_ms = 5  # type: ignore[misc]


def test_reserved_kafka_keys_are_rejected(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LOCKGATE_KAFKA__ISOLATION_LEVEL", "read_uncommitted")
    with pytest.raises(ConfigError, match="isolation.level is set by lockgate"):
        load_settings()
