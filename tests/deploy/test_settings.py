"""The chart speaks the settings model's language: env names, enums, bounds and defaults.

The settings model ignores unknown LOCKGATE_* variables (extra="ignore"), so a misspelled name
in the chart would be silently dropped at run time; these tests catch it at render time.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.support.helm import (
    CHART_DIR,
    container_env,
    render,
    secret_files,
    statefulset_container_spec,
)

try:
    from processors._config.settings import Settings
except ImportError as exc:  # pragma: no cover - only while the model does not exist
    pytest.skip(
        f"processors._config.settings.Settings cannot be imported ({exc}); env names unchecked",
        allow_module_level=True,
    )

REPO = CHART_DIR.parents[2]
VALUES_DIR = Path(__file__).resolve().parent / "values"
VALUES_FILES = sorted(VALUES_DIR.glob("*.yaml"))
PRODUCTION = VALUES_DIR / "production.yaml"
SINGLE = VALUES_DIR / "single-replica.yaml"
STRIMZI = VALUES_DIR / "strimzi.yaml"
QUERY = VALUES_DIR / "queryable-state.yaml"
NAME = re.compile(r"\bLOCKGATE_[A-Z0-9_]*[A-Z0-9]")
KAFKA_PREFIX = "LOCKGATE_KAFKA__"
#: Variables of the development tooling, not of the app (deploy/helm/ensure-helm.sh).
TOOLING_NAMES = {"LOCKGATE_TOOLS_DIR", "LOCKGATE_EXTRAS"}  # helm.md: the build argument
SECRETS = {
    # A password written with a trailing newline (kubectl create secret --from-file, echo).
    "sums-kafka-user": {"username": "user", "password": "secret\n"},
    "sums-key-password": {"password": "key-secret"},
    "sums-lockgate": {"password": "strimzi-secret"},  # a Strimzi KafkaUser Secret: no username
    "sums-query-token": {"token": "query-secret"},
    "kafka-cluster-ca": {"ca.crt": "CA", "user.crt": "CRT", "user.key": "KEY"},
    "my-cluster-cluster-ca-cert": {"ca.crt": "CA"},
}
CONFIG_MAPS = {"sums-extra-settings": {}}


def _settings_env_names() -> set[str]:
    names = set()
    for name, field in Settings.model_fields.items():
        alias = field.validation_alias if isinstance(field.validation_alias, str) else None
        names.add((alias or f"LOCKGATE_{name}").upper())
    return names


def _schema() -> dict[str, Any]:
    schema: dict[str, Any] = json.loads((CHART_DIR / "values.schema.json").read_text())
    return schema


def _chart_defaults() -> dict[str, Any]:
    values: dict[str, Any] = yaml.safe_load((CHART_DIR / "values.yaml").read_text())
    return values


def _settings_from(
    values_file: Path,
    monkeypatch: pytest.MonkeyPatch,
    root: Path,
    secrets: dict[str, dict[str, str]] | None = None,
) -> Any:
    """Build the settings model from the env the chart renders for ``values_file``.

    The files the pod mounts from Secrets are written under ``root`` (as the kubelet would
    project them), and the settings that the model opens itself (LOCKGATE_SASL_PASSWORD_FILE)
    point there instead; librdkafka's file locations stay as rendered (nothing opens them here).
    """
    docs = render(values_files=[values_file])
    spec = statefulset_container_spec(docs)
    secrets = SECRETS if secrets is None else secrets
    env = container_env(spec, pod_name="sums-lockgate-1", secrets=secrets, config_maps=CONFIG_MAPS)
    files = secret_files(docs, secrets=secrets)
    for path, content in files.items():
        local = root / path.lstrip("/")
        local.parent.mkdir(parents=True, exist_ok=True)
        local.write_text(content)
    for name in list(os.environ):
        if name.upper().startswith("LOCKGATE_"):
            monkeypatch.delenv(name)
    for name, value in env.items():
        if value in files and not name.startswith(KAFKA_PREFIX):
            value = str(root / value.lstrip("/"))
        monkeypatch.setenv(name, value)
    return Settings()


def _bounds(field: str) -> tuple[int | None, int | None]:
    low = high = None
    for item in Settings.model_fields[field].metadata:
        low = getattr(item, "ge", low)
        high = getattr(item, "le", high)
    return low, high


def test_every_rendered_env_name_is_a_setting() -> None:
    known = _settings_env_names()
    rendered: set[str] = set()
    for values_file in VALUES_FILES:
        spec = statefulset_container_spec(render(values_files=[values_file]))
        rendered |= {e["name"] for e in spec["env"] if e["name"].startswith("LOCKGATE_")}
    unknown = {n for n in rendered if not n.startswith(KAFKA_PREFIX)} - known
    assert not unknown, f"rendered env names the settings model does not read: {unknown}"


def test_every_env_name_in_the_chart_and_docs_is_a_setting() -> None:
    """Names written in templates, values and docs (even in branches no test renders)."""
    sources = [
        *sorted((CHART_DIR / "templates").iterdir()),
        CHART_DIR / "values.yaml",
        CHART_DIR / "values.schema.json",
        REPO / "docs" / "helm.md",
    ]
    known = _settings_env_names() | TOOLING_NAMES
    unknown: dict[str, set[str]] = {}
    for path in sources:
        if not path.exists():
            continue
        for name in NAME.findall(path.read_text()):
            if not name.startswith(KAFKA_PREFIX.rstrip("_")) and name not in known:
                unknown.setdefault(name, set()).add(path.name)
    assert not unknown, f"env names the settings model does not read: {unknown}"


@pytest.mark.parametrize("values_file", [PRODUCTION, SINGLE], ids=lambda p: p.stem)
def test_settings_accept_the_rendered_env(
    values_file: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    values = yaml.safe_load(values_file.read_text())
    settings = _settings_from(values_file, monkeypatch, tmp_path)
    assert settings.instance_id == "sums-lockgate-1"
    assert settings.bootstrap_servers == values["kafka"]["bootstrapServers"]
    assert settings.app_name == values["appName"]
    assert str(settings.state_dir) == "/var/lib/lockgate/state"
    assert settings.guarantee.value == values["processing"]["guarantee"]
    assert settings.on_error.value == values["processing"]["onError"]
    conf = settings.kafka_config()
    for key, value in values["kafka"]["config"].items():
        assert conf[key] == str(value), key
    assert conf["session.timeout.ms"] == str(values["kafka"]["sessionTimeoutMs"])


def test_settings_see_the_strimzi_credentials(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """A literal username with the password of a Strimzi KafkaUser Secret, server-only TLS."""
    conf = _settings_from(STRIMZI, monkeypatch, tmp_path).kafka_config()
    assert conf["sasl.username"] == "sums-lockgate"
    assert conf["sasl.password"] == "strimzi-secret"
    assert conf["security.protocol"] == "SASL_SSL"
    assert conf["ssl.ca.location"] == "/etc/lockgate/kafka-tls/ca.crt"
    assert "ssl.certificate.location" not in conf


def test_schema_rejects_every_key_the_runtime_refuses() -> None:
    """kafka.config keys the settings model refuses fail at render, not in CrashLoopBackOff."""
    from processors._config.settings import RESERVED_KAFKA_KEYS

    config = _schema()["properties"]["kafka"]["properties"]["config"]["properties"]
    rejected = {key for key, rule in config.items() if rule is False}
    assert set(RESERVED_KAFKA_KEYS) <= rejected, set(RESERVED_KAFKA_KEYS) - rejected


def test_session_timeout_reaches_the_consumer(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    from processors._kafka.clients import consumer_config

    settings = _settings_from(PRODUCTION, monkeypatch, tmp_path)
    assert consumer_config(settings, "sums")["session.timeout.ms"] == "60000"


def test_settings_see_sasl_and_tls(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    settings = _settings_from(PRODUCTION, monkeypatch, tmp_path)
    assert settings.sasl_password is None
    assert settings.sasl_password_file == tmp_path / "etc/lockgate/kafka-sasl/password"
    conf = settings.kafka_config()
    assert conf["sasl.username"] == "user"
    assert conf["sasl.password"] == "secret"  # the file's trailing newline is not part of it
    assert conf["sasl.mechanism"] == "SCRAM-SHA-512"
    assert conf["security.protocol"] == "SASL_SSL"
    assert conf["ssl.ca.location"] == "/etc/lockgate/kafka-tls/ca.crt"
    assert conf["ssl.certificate.location"] == "/etc/lockgate/kafka-tls/tls.crt"
    assert conf["ssl.key.location"] == "/etc/lockgate/kafka-tls/tls.key"
    assert conf["ssl.key.password"] == "key-secret"
    masked = json.dumps(settings.masked())
    assert '"secret"' not in masked and "key-secret" not in masked


def test_a_rotated_password_file_reaches_the_next_client(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """The kubelet rewrites the mounted file when the Secret changes; no restart needed."""
    settings = _settings_from(PRODUCTION, monkeypatch, tmp_path)
    assert settings.kafka_config()["sasl.password"] == "secret"
    settings.sasl_password_file.write_text("rotated\n")
    assert settings.kafka_config()["sasl.password"] == "rotated"


def test_settings_see_the_queryable_state(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    values = yaml.safe_load(QUERY.read_text())
    settings = _settings_from(QUERY, monkeypatch, tmp_path)
    assert settings.query_enabled is True
    assert settings.query_token is not None
    assert settings.query_token.get_secret_value() == "query-secret"
    assert settings.query_timeout_ms == values["query"]["timeoutMs"]
    assert settings.query_peer_url is not None
    owner = settings.query_peer_url.replace("{instance}", "sums-lockgate-2")
    assert owner == "http://sums-lockgate-2.sums-lockgate-headless.default.svc:8080"
    assert settings.kafka_config()["sasl.password"] == "secret"
    assert "query-secret" not in json.dumps(settings.masked())


def test_settings_see_query_off(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    settings = _settings_from(PRODUCTION, monkeypatch, tmp_path)
    assert settings.query_enabled is False
    assert settings.query_peer_url is None


def test_enums_match_the_model() -> None:
    props = _schema()["properties"]
    fields = Settings.model_fields
    pairs = {
        "guarantee": props["processing"]["properties"]["guarantee"],
        "on_error": props["processing"]["properties"]["onError"],
        "log_format": props["logging"]["properties"]["format"],
    }
    for field, schema in pairs.items():
        enum_type = fields[field].annotation
        assert set(schema["enum"]) == {m.value for m in enum_type}, field


def test_log_levels_match_the_model() -> None:
    chart = set(_schema()["properties"]["logging"]["properties"]["level"]["enum"])
    accepted = set()
    for level in ("TRACE", "DEBUG", "INFO", "WARN", "WARNING", "ERROR", "CRITICAL", "FATAL"):
        try:
            Settings(log_level=level)
        except ValueError:
            continue
        accepted.add(level)
    assert chart == accepted


@pytest.mark.parametrize(
    ("field", "schema_path"),
    [
        ("checkpoint_interval_ms", ("processing", "checkpointIntervalMs")),
        ("transaction_timeout_ms", ("processing", "transactionTimeoutMs")),
        ("liveness_timeout_ms", ("probes", "liveness", "progressTimeoutMs")),
        ("http_port", ("httpPort",)),
        ("query_timeout_ms", ("query", "timeoutMs")),
    ],
)
def test_bounds_are_within_the_model(field: str, schema_path: tuple[str, ...]) -> None:
    node = _schema()
    for key in schema_path:
        node = node["properties"][key]
    low, high = _bounds(field)
    if low is not None:
        assert node["minimum"] >= low
    if high is not None:
        assert node["maximum"] <= high
    if field in ("checkpoint_interval_ms", "transaction_timeout_ms"):  # no stricter limits here
        assert (node["minimum"], node["maximum"]) == (low, high)


def test_defaults_match_the_model() -> None:
    values = _chart_defaults()
    fields = Settings.model_fields
    pairs = {
        "guarantee": values["processing"]["guarantee"],
        "checkpoint_interval_ms": values["processing"]["checkpointIntervalMs"],
        "transaction_timeout_ms": values["processing"]["transactionTimeoutMs"],
        "on_error": values["processing"]["onError"],
        "http_port": values["httpPort"],
        "liveness_timeout_ms": values["probes"]["liveness"]["progressTimeoutMs"],
        "log_level": values["logging"]["level"],
        "log_format": values["logging"]["format"],
        "query_enabled": values["query"]["enabled"],
        "query_timeout_ms": values["query"]["timeoutMs"],
    }
    for field, chart_default in pairs.items():
        default = fields[field].default
        assert getattr(default, "value", default) == chart_default, field
