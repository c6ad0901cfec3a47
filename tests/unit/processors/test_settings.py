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


def test_passthrough_goes_to_the_clients_that_accept_it(monkeypatch: pytest.MonkeyPatch) -> None:
    from processors._kafka import admin_config, consumer_config, producer_config

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
