"""The one configuration model: environment variables with the ``LOCKGATE_`` prefix.

Nested values use ``__`` (``LOCKGATE_KAFKA__SESSION_TIMEOUT_MS=10000`` passes
``session.timeout.ms`` to librdkafka). Secrets are :class:`pydantic.SecretStr` and
masked in every dump. The model is frozen: read once at start-up.
"""

from __future__ import annotations

import os
import socket
from enum import StrEnum
from pathlib import Path
from typing import Any

from pydantic import Field, SecretStr, ValidationError, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from processors.exceptions import ConfigError

__all__ = ["Guarantee", "LogFormat", "OnError", "Settings", "load_settings"]


class Guarantee(StrEnum):
    """Processing guarantee."""

    EXACTLY_ONCE = "exactly_once"
    AT_LEAST_ONCE = "at_least_once"


class OnError(StrEnum):
    """What happens to a record that cannot be decoded or makes user code raise."""

    DLQ = "dlq"
    FAIL = "fail"


class LogFormat(StrEnum):
    """Log output format."""

    JSON = "json"
    CONSOLE = "console"


class GroupProtocol(StrEnum):
    """Consumer group protocol."""

    CLASSIC = "classic"
    CONSUMER = "consumer"


class StateBackendKind(StrEnum):
    """Where key group state lives."""

    ROCKSDB = "rocksdb"
    MEMORY = "memory"


def _default_state_dir() -> Path:
    base = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(base) / "lockgate"


#: librdkafka properties lockgate owns (exactly-once depends on them), and why.
RESERVED_KAFKA_KEYS = {
    "bootstrap.servers": "use LOCKGATE_BOOTSTRAP_SERVERS",
    "group.id": "the app name; use LOCKGATE_APP_NAME",
    "group.instance.id": "the instance id; use LOCKGATE_INSTANCE_ID",
    "transactional.id": "<app>-<instance id>",
    "transaction.timeout.ms": "use LOCKGATE_TRANSACTION_TIMEOUT_MS",
    "enable.auto.commit": "offsets commit with each epoch",
    "enable.auto.offset.store": "offsets commit with each epoch",
    "isolation.level": "follows LOCKGATE_GUARANTEE",
    "partitioner": "always murmur2_random (Java-compatible key placement)",
    "enable.idempotence": "always on",
    "partition.assignment.strategy": "cooperative-sticky (classic protocol)",
    "group.protocol": "use LOCKGATE_GROUP_PROTOCOL",
}

_SECRET_HINTS = ("password", "secret", "sasl.oauthbearer.config", "key.pem", "token")


class Settings(BaseSettings):
    """Every setting of a lockgate instance. See docs/configuration.md (generated)."""

    model_config = SettingsConfigDict(
        env_prefix="LOCKGATE_",
        env_nested_delimiter="__",
        frozen=True,
        extra="ignore",
        case_sensitive=False,
    )

    bootstrap_servers: str = Field(
        "127.0.0.1:9092", description="Kafka bootstrap servers, comma separated."
    )
    app_name: str | None = Field(
        None, description="Overrides the app name given in code (consumer group, topics prefix)."
    )
    instance_id: str = Field(
        default_factory=socket.gethostname,
        description=(
            "Stable id of this instance (the pod name). Used for group.instance.id and "
            "transactional.id = <app>-<instance id>. Default: the hostname."
        ),
    )
    state_dir: Path = Field(
        default_factory=_default_state_dir,
        description="Directory of the local state (one RocksDB per key group under <app>/<kg>/).",
    )
    state_backend: StateBackendKind = Field(
        StateBackendKind.ROCKSDB,
        description="rocksdb (default) or memory (restore from changelog).",
    )
    state_cache_entries: int = Field(
        200_000, ge=0, description="Read-cache entries kept per store and key group across epochs."
    )
    restore_batch_records: int = Field(
        20_000,
        ge=1,
        description="Changelog records applied per atomic restore batch (progress kept per batch).",
    )
    guarantee: Guarantee = Field(
        Guarantee.EXACTLY_ONCE, description="exactly_once (transactions) or at_least_once."
    )
    checkpoint_interval_ms: int = Field(
        1000, ge=10, le=600_000, description="Epoch length: a checkpoint commits this often."
    )
    transaction_timeout_ms: int = Field(
        10_000,
        ge=1000,
        le=900_000,
        description=(
            "Kafka transaction.timeout.ms (>= 2x the checkpoint interval). Also bounds how "
            "long a new owner waits for a dead instance's open transaction."
        ),
    )
    on_error: OnError = Field(
        OnError.DLQ,
        description="dlq: bad records go to <app>.dlq with error headers; fail: stop the app.",
    )
    consume_batch_size: int = Field(
        1000, ge=1, le=100_000, description="Records fetched per consume() call."
    )
    group_protocol: GroupProtocol = Field(
        GroupProtocol.CLASSIC,
        description=(
            "classic (cooperative-sticky assignment) or consumer (KIP-848, brokers >= 4.0; "
            "the broker assigns, incrementally)."
        ),
    )
    static_membership: bool = Field(
        True, description="Set group.instance.id to the instance id (no rebalance on restart)."
    )
    http_port: int = Field(
        8080, ge=0, le=65535, description="Port of /livez /readyz /startupz /metrics (0: off)."
    )
    http_host: str = Field("0.0.0.0", description="Address the HTTP server binds.")  # noqa: S104
    liveness_timeout_ms: int = Field(
        60_000, ge=1000, description="/livez fails when the loop made no progress for this long."
    )
    log_level: str = Field("INFO", description="DEBUG, INFO, WARNING or ERROR.")
    log_format: LogFormat = Field(
        LogFormat.JSON, description="json (one object per line) or console."
    )
    sasl_username: str | None = Field(None, description="SASL username (sets sasl.username).")
    sasl_password: SecretStr | None = Field(None, description="SASL password (secret).")
    kafka: dict[str, SecretStr] = Field(
        default_factory=dict,
        description=(
            "librdkafka properties for every client: LOCKGATE_KAFKA__<KEY>, the key with "
            "dots written as _, e.g. LOCKGATE_KAFKA__SECURITY_PROTOCOL=SASL_SSL."
        ),
    )

    @field_validator("log_level")
    @classmethod
    def _level(cls, value: str) -> str:
        level = value.upper()
        if level not in {"DEBUG", "INFO", "WARNING", "ERROR"}:
            raise ValueError("must be DEBUG, INFO, WARNING or ERROR")
        return level

    @field_validator("instance_id")
    @classmethod
    def _instance(cls, value: str) -> str:
        if not value or any(c.isspace() for c in value):
            raise ValueError("must be a non-empty id without spaces")
        return value

    @field_validator("kafka")
    @classmethod
    def _not_reserved(cls, value: dict[str, SecretStr]) -> dict[str, SecretStr]:
        for key in value:
            prop = key.lower().replace("_", ".")
            if prop in RESERVED_KAFKA_KEYS:
                raise ValueError(
                    f"{prop} is set by lockgate itself ({RESERVED_KAFKA_KEYS[prop]}); "
                    f"remove LOCKGATE_KAFKA__{key.upper()}"
                )
        return value

    def kafka_config(self) -> dict[str, str]:
        """Return the librdkafka pass-through properties (``a_b`` keys as ``a.b``)."""
        conf = {k.lower().replace("_", "."): v.get_secret_value() for k, v in self.kafka.items()}
        if self.sasl_username is not None:
            conf["sasl.username"] = self.sasl_username
        if self.sasl_password is not None:
            conf["sasl.password"] = self.sasl_password.get_secret_value()
        return conf

    def masked(self) -> dict[str, Any]:
        """Return the settings as plain data with every secret masked (safe to log)."""
        data = self.model_dump(mode="json")
        data["kafka"] = {
            k.lower().replace("_", "."): (
                "**********"
                if any(h in k.lower().replace("_", ".") for h in _SECRET_HINTS)
                else v.get_secret_value()
            )
            for k, v in self.kafka.items()
        }
        return data


def load_settings(**overrides: Any) -> Settings:
    """Read settings from the environment (plus ``overrides``).

    Raises:
        ConfigError: a variable is invalid; the message names each one.
    """
    try:
        return Settings(**overrides)
    except ValidationError as exc:
        lines = []
        for err in exc.errors():
            loc = [str(part) for part in err["loc"]]
            var = "LOCKGATE_" + "__".join(loc).upper()
            lines.append(f"{var}: {err['msg']} (got {err.get('input')!r})")
        raise ConfigError("invalid configuration:\n  " + "\n  ".join(lines)) from None
