"""The one configuration model: environment variables with the ``LOCKGATE_`` prefix.

Nested values use ``__`` (``LOCKGATE_KAFKA__SESSION_TIMEOUT_MS=10000`` passes
``session.timeout.ms`` to librdkafka). Secrets are :class:`pydantic.SecretStr` and
masked in every dump. The model is frozen: read once at start-up.

:func:`load_settings` is the only entry point of the CLI. Beyond the model's own
validation it rejects every ``LOCKGATE_*`` variable that nothing reads (with a
did-you-mean), except the names in :data:`NON_SETTINGS_ENV` /
:data:`NON_SETTINGS_PREFIXES` (tooling, tests, examples) and the names an app declares
with ``App(..., env=[...])``. Its error messages never contain the value of a secret.
"""

from __future__ import annotations

import difflib
import logging
import os
import re
import socket
from collections.abc import Callable, Iterable, Mapping
from enum import StrEnum
from pathlib import Path
from typing import Any

from pydantic import Field, SecretStr, ValidationError, field_validator, model_validator
from pydantic_core import ErrorDetails
from pydantic_settings import BaseSettings, SettingsConfigDict, SettingsError

from processors.exceptions import ConfigError

#: Where Kubernetes mounts a pod's service-account token (the default of
#: ``LOCKGATE_KUBERNETES_TOKEN_DIR``).
SERVICE_ACCOUNT_DIR = Path("/var/run/secrets/kubernetes.io/serviceaccount")

__all__ = [
    "NON_SETTINGS_ENV",
    "NON_SETTINGS_PREFIXES",
    "Alignment",
    "Guarantee",
    "LeaveGroup",
    "LogFormat",
    "OnError",
    "Settings",
    "load_settings",
]


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


class LeaveGroup(StrEnum):
    """When a static member leaves the consumer group on a clean stop."""

    NEVER = "never"
    ALWAYS = "always"
    SCALE_DOWN = "scale-down"


class Alignment(StrEnum):
    """How a downstream app takes checkpoints from barriers (docs/architecture.md).

    ``NONE`` was called ``unaligned``, which is still accepted (with a warning): it is not
    Flink's unaligned checkpoint (in-flight records are not part of the checkpoint), so
    its checkpoints are not consistent cuts across apps.
    """

    ALIGNED = "aligned"
    NONE = "none"


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

#: Substrings of librdkafka property names whose values are secrets (masked in dumps).
_SECRET_HINTS = (
    "password",
    "passphrase",
    "secret",
    "token",
    "credential",
    "private",
    "sasl.oauthbearer.config",
    "key.pem",
)

#: ``LOCKGATE_*`` variables that are not settings but are legitimately present in the
#: environment of ``lockgate`` (read by the tooling, the tests or the examples), and who
#: reads them. :func:`load_settings` accepts them; any other unknown ``LOCKGATE_*``
#: variable is an error. An app that reads its own variables declares them with
#: ``App(name, env=[...])`` instead of growing this list.
NON_SETTINGS_ENV: dict[str, str] = {
    "LOCKGATE_INPUT_TOPIC": "examples/running_sum.py, tests and benchmarks (input topic)",
    "LOCKGATE_OUTPUT_TOPIC": "examples/running_sum.py, tests and benchmarks (output topic)",
    "LOCKGATE_KAFKA_PORT": "docker/kafka/broker.sh and the Makefile (dev broker port)",
    "LOCKGATE_KAFKA_CONTROLLER_PORT": "docker/kafka/broker.sh",
    "LOCKGATE_KAFKA_DATA_DIR": "docker/kafka/broker.sh",
    "LOCKGATE_KAFKA_PYTHON": "docker/kafka/broker.sh and the Makefile",
    "LOCKGATE_KAFKA_HEAP": "docker/kafka/broker.sh and benchmarks/broker.py",
    "LOCKGATE_KAFKA_JAVA_OPTS": "docker/kafka/broker.sh",
    "LOCKGATE_KAFKA_FRESH": "docker/kafka/broker.sh",
    "LOCKGATE_KAFKA_GROUP_INITIAL_REBALANCE_DELAY_MS": (
        "docker/kafka/broker.sh and benchmarks/broker.py (the broker's join delay)"
    ),
    "LOCKGATE_KAFKA_READY_TIMEOUT": "docker/kafka/broker.sh",
    "LOCKGATE_KAFKA_STOP_TIMEOUT": "docker/kafka/broker.sh",
    "LOCKGATE_KAFKA_PROXY_PORT": "docker/kafka/broker.sh (listener advertised at a TCP proxy)",
    "LOCKGATE_KAFKA_PROXIED_PORT": "docker/kafka/broker.sh (that listener's own port)",
    "LOCKGATE_KAFKA_SECURITY": "docker/kafka/broker.sh (plaintext or sasl_ssl with ACLs)",
    "LOCKGATE_KAFKA_ADMIN_USER": "docker/kafka/broker.sh (sasl_ssl: the super user)",
    "LOCKGATE_KAFKA_ADMIN_PASSWORD": "docker/kafka/broker.sh (sasl_ssl: its password, secret)",
    "LOCKGATE_MVN": "docker/kafka/broker.sh",
    "LOCKGATE_KAFKA_IMAGE": "docker/build-images.sh and tests/support/docker.py",
    "LOCKGATE_PROCESSOR_IMAGE": "docker/build-images.sh and tests/support/docker.py",
    "LOCKGATE_BASE_IMAGE": "docker/build-images.sh and docker/base-image.sh",
    "LOCKGATE_DEBIAN_MIRROR": "docker/base-image.sh",
    "LOCKGATE_DEBIAN_SECURITY_MIRROR": "docker/base-image.sh",
    "LOCKGATE_PIP_CA": "docker/build-images.sh",
    "LOCKGATE_DOCKER_BUILDKIT": "docker/build-images.sh",
    "LOCKGATE_UID": "docker/Dockerfile (build argument)",
    "LOCKGATE_GID": "docker/Dockerfile (build argument)",
    "LOCKGATE_EXTRAS": "docker/Dockerfile (build argument) and docker/build-images.sh",
    "LOCKGATE_DOCKERD_ARGS": "docker/ensure-engine.sh",
    "LOCKGATE_DOCKERD_LOG": "docker/ensure-engine.sh",
    "LOCKGATE_DOCKERD_TIMEOUT": "docker/ensure-engine.sh",
    "LOCKGATE_TOOLS_DIR": "deploy/helm/ensure-helm.sh",
    "LOCKGATE_CONSOLE_HOST": "`lockgate console --host` (processors/_ops/console/command.py)",
    "LOCKGATE_CONSOLE_PORT": "`lockgate console --port` (processors/_ops/console/command.py)",
}

#: Prefixes of ``LOCKGATE_*`` variables owned by the test suite (accepted like
#: :data:`NON_SETTINGS_ENV`); e.g. ``LOCKGATE_TEST_CRASH_POINTS`` is read by
#: ``processors/_kafka/faults.py``.
NON_SETTINGS_PREFIXES: dict[str, str] = {
    "LOCKGATE_TEST_": "the test suite (tests/, processors/_kafka/faults.py)",
    "LOCKGATE_CHAOS_": "the chaos tests and `make chaos` (tests/chaos/)",
}

log = logging.getLogger("lockgate.settings")

_PREFIX = "LOCKGATE_"
#: The last password read from each LOCKGATE_SASL_PASSWORD_FILE (rotation may empty it).
_LAST_GOOD_PASSWORD: dict[Path, str] = {}
_KAFKA_PREFIX = "LOCKGATE_KAFKA__"
_APP_ENV_NAME = re.compile(r"^LOCKGATE_[A-Z0-9_]*[A-Z0-9]$")
_MASK = "**********"


def _is_secret_property(prop: str) -> bool:
    """Whether the librdkafka property ``prop`` (dotted, lower case) holds a secret."""
    return any(hint in prop for hint in _SECRET_HINTS)


def _kafka_property(key: str) -> str:
    """The librdkafka property of a ``LOCKGATE_KAFKA__<KEY>`` key (``a_b`` as ``a.b``)."""
    return key.lower().replace("_", ".")


def _control_chars(value: str) -> bool:
    return any(ord(c) < 32 or ord(c) == 127 for c in value)


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
        200_000,
        ge=0,
        description=(
            "Read-cache entries kept per store and key group across epochs (a ceiling; the "
            "process-wide state_cache_memory_bytes is split over the owned key groups)."
        ),
    )
    memory_limit_bytes: int | None = Field(
        None,
        ge=64 * 1024 * 1024,
        description=(
            "Memory this instance may use (the container's limit; the chart fills it from "
            "limits.memory via the downward API). A quarter goes to RocksDB (one block cache "
            "and write-buffer manager shared by every key group), a quarter to the read "
            "cache, a 16th to each consumer's prefetch; an epoch ends early after fetching "
            "a 128th. Default: the cgroup's memory limit, else 2 GiB."
        ),
    )
    state_rocksdb_memory_bytes: int | None = Field(
        None,
        ge=4 * 1024 * 1024,
        description=(
            "Block cache + memtables of all key-group databases of the process together "
            "(overrides the share of memory_limit_bytes)."
        ),
    )
    state_cache_memory_bytes: int | None = Field(
        None,
        ge=0,
        description=(
            "Read-cache memory of the whole process, split evenly over the stores of the key "
            "groups it owns (entries counted at 2x their encoded size + 120 bytes; overrides "
            "the share of memory_limit_bytes)."
        ),
    )
    state_cleanup_delay_ms: int = Field(
        600_000,
        ge=0,
        description=(
            "A key group released by this instance and not assigned back within this delay "
            "has its local state directory deleted (0: at the next epoch end)."
        ),
    )
    restore_batch_records: int = Field(
        20_000,
        ge=1,
        description="Changelog records applied per atomic restore batch (progress kept per batch).",
    )
    state_snapshot_dir: str | None = Field(
        None,
        description=(
            "Incremental RocksDB snapshots of each key group's state go here (a local or shared "
            "path, or an fsspec URL such as s3://bucket/snapshots, which needs fsspec and the "
            "filesystem's package); a key group assigned without local state starts from the "
            "newest usable snapshot and replays only the changelog after it. Unset: off "
            "(rocksdb backend only)."
        ),
    )
    state_snapshot_interval_ms: int = Field(
        60_000,
        ge=100,
        description=(
            "A key group's snapshot is taken at most this often (at an epoch commit that "
            "changed its state); used with state_snapshot_dir."
        ),
    )
    state_snapshot_retained: int = Field(
        2,
        ge=1,
        le=100,
        description=(
            "Snapshots kept per key group (older ones and the files only they use are deleted)."
        ),
    )
    guarantee: Guarantee = Field(
        Guarantee.EXACTLY_ONCE, description="exactly_once (transactions) or at_least_once."
    )
    checkpoint_interval_ms: int = Field(
        1000, ge=10, le=600_000, description="Epoch length: a checkpoint commits this often."
    )
    checkpoint_max_bytes: int | None = Field(
        None,
        ge=1024,
        description=(
            "An epoch ends before checkpoint_interval_ms once its input records' values hold "
            "this many bytes (bounds an epoch's memory under a backlog). Default: the memory "
            "limit / 128 (16 MiB at 2 GiB)."
        ),
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
    alignment: Alignment = Field(
        Alignment.ALIGNED,
        description=(
            "aligned: records of an upstream writer that passed a barrier wait until the "
            "checkpoint completes (consistent cuts across apps); none: processed on arrival, "
            "exactly-once per app but checkpoints are not consistent cuts across apps "
            "(savepoints still align). 'unaligned' is the old name of none."
        ),
    )
    input_wait_ms: int = Field(
        60_000,
        ge=0,
        le=3_600_000,
        description=(
            "How long an instance waits at start for input topics that do not exist yet "
            "(an upstream app creates its internal outputs when it starts: a pipeline deployed "
            "at once) before it fails; 0: fail at once."
        ),
    )
    alignment_timeout_ms: int = Field(
        10_000,
        ge=0,
        le=3_600_000,
        description=(
            "An alignment that takes longer switches that checkpoint to unaligned (0: at once); "
            "a savepoint then fails. Bounds how long a fast upstream's records wait for a slow one."
        ),
    )
    alignment_max_held: int = Field(
        100_000,
        ge=1,
        description=(
            "Records held in memory per input partition during an alignment; at the bound the "
            "checkpoint continues unaligned (a savepoint then fails)."
        ),
    )
    max_idle_ms: int = Field(
        100,
        ge=0,
        le=600_000,
        description=(
            "Multi-input apps: how long a key group waits for an input that has nothing "
            "buffered and is caught up before processing the other inputs' records without it "
            "(covers a record produced just before, still being fetched; 0: no wait)."
        ),
    )
    max_fetch_wait_ms: int = Field(
        5_000,
        ge=0,
        le=600_000,
        description=(
            "Multi-input apps: how long a key group waits for an input that has nothing "
            "buffered but unread records in Kafka (replays and catch-ups interleave the inputs "
            "by timestamp as the live run did)."
        ),
    )
    savepoint_dir: str | None = Field(
        None,
        description=(
            "Where savepoints are written: a local path or an fsspec URL (e.g. s3://bucket/sp, "
            "needs fsspec and the filesystem's package). Required to take or restore savepoints."
        ),
    )
    from_savepoint: str | None = Field(
        None,
        description=(
            "Start every key group from this savepoint id (state, offsets, alignment), once: "
            "key groups already restored from it continue normally. `lockgate run "
            "--from-savepoint ID` sets it."
        ),
    )
    until: str | None = Field(
        None,
        description=(
            "A bounded run: process the inputs up to this bound, then advance event time to "
            "the end (windows fire, event-time timers run; see until_drain), commit and exit "
            "0. `now` (each partition's last stable offset at start), a time (ms since the "
            "epoch or ISO 8601: the records before the first one at or after it) or "
            "`offsets:TOPIC:P=O,P=O[;TOPIC:...]` (other partitions: their last stable offset "
            "at start). `lockgate run --until` sets it. docs/operations.md, 'Bounded runs'."
        ),
    )
    until_drain: bool = Field(
        True,
        description=(
            "With until: advance event time to the end when the bound is reached (the final "
            "watermark). It stays there: a later run's records older than it are late. "
            "`lockgate run --no-drain` turns it off (a later run continues the event time)."
        ),
    )
    until_savepoint: str | None = Field(
        None,
        description=(
            "With until: once the bound is reached, event time drained and committed, take a "
            "savepoint of the app (every key group, all instances of the run) and exit 0 only "
            "when it is complete (its id is logged and printed). `default` writes it to "
            "savepoint_dir; any other value is the location (a path or fsspec URL) and "
            "replaces savepoint_dir for this run. `lockgate run --savepoint [LOCATION]` sets "
            "it. docs/operations.md, 'Bounded runs with a savepoint'."
        ),
    )
    until_savepoint_timeout_ms: int = Field(
        600_000,
        ge=1_000,
        description=(
            "With until_savepoint: how long an instance that reached its bound waits for the "
            "other key groups to reach theirs and for the savepoint to complete; then it "
            "exits 1 naming what is missing."
        ),
    )
    resume_from_stop_savepoint: bool = Field(
        False,
        description=(
            "A key group halted by a stop-with-savepoint is restored from that savepoint when "
            "an instance with this setting is assigned it (as with --from-savepoint ID, per key "
            "group, without naming the id), instead of staying halted. The Helm chart's "
            "upgrade.mode=savepoint sets it: the pre-upgrade hook halts the pipeline at a "
            "savepoint, the rolled pods resume from it. An explicit from_savepoint the key "
            "group was not restored from yet comes first."
        ),
    )
    allow_non_restored_state: bool = Field(
        False,
        description=(
            "With from_savepoint: accept saved stores and operators the app no longer declares "
            "(their state is dropped). Without it: start even though window or interval-join "
            "changelogs hold another operator's state (declarations reordered since the last "
            "run; for one start after `lockgate reset`). `lockgate run "
            "--allow-non-restored-state` sets it."
        ),
    )
    allow_non_stop_restore: bool = Field(
        False,
        description=(
            "With from_savepoint: restore key groups that read internal topics from a savepoint "
            "taken without --stop. Refused by default: when the upstream is restored from it too, "
            "the records it wrote after the savepoint reach this app twice (the old run's and "
            "the restored run's). Set it only when the upstream keeps running."
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
    leave_group_on_stop: LeaveGroup = Field(
        LeaveGroup.SCALE_DOWN,
        description=(
            "Whether a static member leaves the group on SIGTERM (its key groups move at "
            "once instead of after session.timeout.ms): never; always; scale-down (ask the "
            "Kubernetes API whether this StatefulSet pod's ordinal is at or above the desired "
            "replica count; outside Kubernetes or without access: stay). Classic protocol "
            "only: under KIP-848 librdkafka always leaves a static member temporarily."
        ),
    )
    kubernetes_token_dir: Path = Field(
        SERVICE_ACCOUNT_DIR,
        description=(
            "Directory with the service-account token, ca.crt and namespace used by "
            "LOCKGATE_LEAVE_GROUP_ON_STOP=scale-down (the chart mounts a projected token)."
        ),
    )
    http_port: int = Field(
        8080, ge=0, le=65535, description="Port of /livez /readyz /startupz /metrics (0: off)."
    )
    http_host: str = Field("0.0.0.0", description="Address the HTTP server binds.")  # noqa: S104
    liveness_timeout_ms: int = Field(
        60_000, ge=1000, description="/livez fails when the loop made no progress for this long."
    )
    query_enabled: bool = Field(
        False,
        description=(
            "Serve read-only GET /state/<store>/<key> on the HTTP port (committed state of "
            "the key group this instance owns; see docs/operations.md)."
        ),
    )
    query_token: SecretStr | None = Field(
        None,
        description=(
            "Bearer token /state requests must carry (Authorization: Bearer <token>); "
            "unset: no authentication (secret)."
        ),
    )
    query_peer_url: str | None = Field(
        None,
        description=(
            "How instances reach each other's HTTP port to forward a /state request to the "
            "owner of the key, with {instance} for its instance id, e.g. "
            "http://{instance}.<app>-headless:8080. Unset: answer 421 naming the owner."
        ),
    )
    query_timeout_ms: int = Field(
        5000, ge=100, description="How long a /state request waits for the processing loop."
    )
    log_level: str = Field("INFO", description="DEBUG, INFO, WARNING or ERROR.")
    log_format: LogFormat = Field(
        LogFormat.JSON, description="json (one object per line) or console."
    )
    sasl_username: str | None = Field(None, description="SASL username (sets sasl.username).")
    sasl_password: SecretStr | None = Field(None, description="SASL password (secret).")
    sasl_password_file: Path | None = Field(
        None,
        description=(
            "File holding the SASL password (a mounted Secret; one trailing newline is "
            "ignored). Read whenever a client is created, so a rotated Secret is used by the "
            "next client. Excludes LOCKGATE_SASL_PASSWORD."
        ),
    )
    kafka: dict[str, SecretStr] = Field(
        default_factory=dict,
        description=(
            "librdkafka properties for every client: LOCKGATE_KAFKA__<KEY>, the key with "
            "dots written as _, e.g. LOCKGATE_KAFKA__SECURITY_PROTOCOL=SASL_SSL."
        ),
    )

    @field_validator("alignment", mode="before")
    @classmethod
    def _old_alignment_name(cls, value: object) -> object:
        if isinstance(value, str) and value.strip().lower() == "unaligned":
            log.warning(
                "LOCKGATE_ALIGNMENT=unaligned is now called none (it is not Flink's unaligned "
                "checkpoint: in-flight records are not part of a checkpoint, so checkpoints "
                "are not consistent cuts across apps); set LOCKGATE_ALIGNMENT=none"
            )
            return Alignment.NONE
        return value

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

    @field_validator("query_peer_url")
    @classmethod
    def _peer_url(cls, value: str | None) -> str | None:
        if value is not None and (
            "{instance}" not in value or not value.startswith(("http://", "https://"))
        ):
            raise ValueError("must be an http(s) URL containing {instance}")
        return value

    @field_validator("query_token")
    @classmethod
    def _token(cls, value: SecretStr | None) -> SecretStr | None:
        if value is not None and len(value.get_secret_value().strip()) < 8:
            raise ValueError(
                "must be at least 8 characters (an empty token would accept every request); "
                "the value is not shown"
            )
        return value

    @field_validator("sasl_password", "query_token")
    @classmethod
    def _password(cls, value: SecretStr | None) -> SecretStr | None:
        if value is not None and _control_chars(value.get_secret_value()):
            raise ValueError(
                "contains a control character (often a trailing newline from a file-based "
                "Secret); the value is not shown"
            )
        return value

    @field_validator("kafka")
    @classmethod
    def _kafka_keys(cls, value: dict[str, SecretStr]) -> dict[str, SecretStr]:
        # Each message names the variable and never its value (values may be secrets).
        problems = []
        for key, secret in value.items():
            prop = _kafka_property(key)
            var = _KAFKA_PREFIX + key.upper()
            if not prop.strip("."):
                problems.append(f"{var} needs a property name after {_KAFKA_PREFIX}")
            elif prop in RESERVED_KAFKA_KEYS:
                problems.append(
                    f"{prop} is set by lockgate itself ({RESERVED_KAFKA_KEYS[prop]}); remove {var}"
                )
            elif prop.endswith(("password", "passphrase")) and _control_chars(
                secret.get_secret_value()
            ):
                problems.append(
                    f"{var} contains a control character (often a trailing newline from a "
                    "file-based Secret); the value is not shown"
                )
        if problems:
            raise ValueError("; ".join(problems))
        return value

    @model_validator(mode="after")
    def _password_source(self) -> Settings:
        if self.sasl_password_file is None:
            return self
        if self.sasl_password is not None:
            raise ValueError(
                "LOCKGATE_SASL_PASSWORD and LOCKGATE_SASL_PASSWORD_FILE are both set; keep one"
            )
        self.file_password()  # readable and well-formed now, not at the first client
        return self

    def file_password(self) -> str | None:
        """Return the password in ``sasl_password_file`` (``None`` when not set).

        Raises:
            ValueError: the file cannot be read, is empty, or holds a control character
                other than one trailing newline (the message never shows the content).
        """
        path = self.sasl_password_file
        if path is None:
            return None
        try:
            text = path.read_text()
        except (OSError, UnicodeDecodeError) as exc:
            raise ValueError(
                f"LOCKGATE_SASL_PASSWORD_FILE={path}: cannot read it "
                f"({getattr(exc, 'strerror', None) or type(exc).__name__})"
            ) from None
        text = text.removesuffix("\n").removesuffix("\r")
        if not text:
            raise ValueError(f"LOCKGATE_SASL_PASSWORD_FILE={path}: the file is empty")
        if _control_chars(text):
            raise ValueError(
                f"LOCKGATE_SASL_PASSWORD_FILE={path}: the password contains a control "
                "character; the value is not shown"
            )
        return text

    @model_validator(mode="after")
    def _until_savepoint_needs(self) -> Settings:
        # A savepoint at the end of a bounded run needs the bound and a location.
        if self.until_savepoint is None:
            return self
        if self.until is None:
            raise ValueError(
                "LOCKGATE_UNTIL_SAVEPOINT is set without LOCKGATE_UNTIL: a savepoint at the "
                "end of a run needs a bounded run (lockgate run --until BOUND --savepoint)"
            )
        if not self.until_savepoint.strip():
            raise ValueError(
                "LOCKGATE_UNTIL_SAVEPOINT is empty: give `default` (LOCKGATE_SAVEPOINT_DIR) "
                "or a location"
            )
        if self.until_savepoint == "default" and not self.savepoint_dir:
            raise ValueError(
                "LOCKGATE_UNTIL_SAVEPOINT=default needs LOCKGATE_SAVEPOINT_DIR (where the "
                "savepoint goes), or give the location instead of `default`"
            )
        return self

    def until_savepoint_dir(self) -> str | None:
        """Where a bounded run's final savepoint goes (``None``: no final savepoint).

        ``default`` is ``savepoint_dir``; any other value of ``until_savepoint`` is the
        location itself.
        """
        if self.until_savepoint is None:
            return None
        if self.until_savepoint == "default":
            return self.savepoint_dir
        return self.until_savepoint.strip()

    @model_validator(mode="after")
    def _epoch_fits_the_transaction(self) -> Settings:
        # Shared by `lockgate config` and `lockgate run`: an epoch must fit well inside a
        # transaction, or the broker aborts it (the runtime also cuts an epoch short at
        # half the timeout).
        if (
            self.guarantee is Guarantee.EXACTLY_ONCE
            and self.transaction_timeout_ms < 2 * self.checkpoint_interval_ms
        ):
            raise ValueError(
                f"LOCKGATE_TRANSACTION_TIMEOUT_MS ({self.transaction_timeout_ms}) must be at "
                f"least twice LOCKGATE_CHECKPOINT_INTERVAL_MS ({self.checkpoint_interval_ms}) "
                "under exactly_once (an epoch must fit well inside a transaction)"
            )
        return self

    def kafka_config(self) -> dict[str, str]:
        """Return the librdkafka pass-through properties (``a_b`` keys as ``a.b``)."""
        conf = {_kafka_property(k): v.get_secret_value() for k, v in self.kafka.items()}
        if self.sasl_username is not None:
            conf["sasl.username"] = self.sasl_username
        if self.sasl_password is not None:
            conf["sasl.password"] = self.sasl_password.get_secret_value()
        path = self.sasl_password_file
        if path is not None:
            try:
                conf["sasl.password"] = _LAST_GOOD_PASSWORD[path] = str(self.file_password())
            except ValueError as exc:
                # A Secret being rotated can be briefly unreadable or empty: keep using the
                # last good password (checked at start); without one it is a config error.
                last = _LAST_GOOD_PASSWORD.get(path)
                if last is None:
                    raise ConfigError(str(exc)) from None
                log.warning("keeping the last SASL password read: %s", exc)
                conf["sasl.password"] = last
        return conf

    def masked(self) -> dict[str, Any]:
        """Return the settings as plain data with every secret masked (safe to log)."""
        data = self.model_dump(mode="json")
        data["kafka"] = {
            _kafka_property(k): _MASK
            if _is_secret_property(_kafka_property(k))
            else v.get_secret_value()
            for k, v in self.kafka.items()
        }
        return data


def settings_env_names() -> set[str]:
    """Return the variable names the model reads (``LOCKGATE_KAFKA__<KEY>`` aside)."""
    return {_PREFIX + name.upper() for name in Settings.model_fields if name != "kafka"}


def _unknown_variables(environ: Mapping[str, str], app_env: Iterable[str]) -> list[str]:
    """Describe each ``LOCKGATE_*`` variable in ``environ`` that nothing reads.

    Only names are used, never values.
    """
    known = settings_env_names()
    allowed = known | set(NON_SETTINGS_ENV) | {n.upper() for n in app_env}
    problems = []
    for raw in sorted(environ):
        name = raw.upper()
        if not name.startswith(_PREFIX) or name in allowed:
            continue
        if name.startswith(_KAFKA_PREFIX) or name.startswith(tuple(NON_SETTINGS_PREFIXES)):
            continue
        if name == _KAFKA_PREFIX.rstrip("_"):
            problems.append(
                f"{raw}: librdkafka properties are set one per variable, as "
                f"{_KAFKA_PREFIX}<KEY> (e.g. {_KAFKA_PREFIX}SESSION_TIMEOUT_MS)"
            )
            continue
        if name.startswith("LOCKGATE_KAFKA_"):
            guess = _KAFKA_PREFIX + name.removeprefix("LOCKGATE_KAFKA_")
        else:
            close = difflib.get_close_matches(
                name.removeprefix(_PREFIX),
                [n.removeprefix(_PREFIX) for n in sorted(known | set(app_env))],
                n=1,
                cutoff=0.6,
            )
            guess = _PREFIX + close[0] if close else ""
        hint = (
            f"did you mean {guess}?"
            if guess
            else "see docs/configuration.md; an app that reads its own LOCKGATE_* variables "
            "declares them with App(..., env=[...])"
        )
        problems.append(f"{raw} is not a lockgate setting; {hint}")
    return problems


def _secret_values(environ: Mapping[str, str], overrides: Mapping[str, Any]) -> list[str]:
    """The secret values a message must never contain (a net under the structured rules)."""
    values = []
    for raw, value in environ.items():
        name = raw.upper()
        if (name.startswith(_PREFIX) and name[len(_PREFIX) :].lower() in _SECRET_FIELDS) or (
            name.startswith(_KAFKA_PREFIX)
            and (not name.removeprefix(_KAFKA_PREFIX) or _is_secret_property(_kafka_property(name)))
        ):
            values.append(value)
    for key, value in overrides.items():
        if key in _SECRET_FIELDS:
            values.extend(value.values() if isinstance(value, dict) else [value])
    texts = {v if isinstance(v, str) else str(v) for v in values}
    # Strip whitespace too: a secret with a trailing newline still leaks without it.
    texts |= {t.strip() for t in texts}
    return sorted((t for t in texts if len(t) >= 3), key=len, reverse=True)


_SECRET_FIELDS = {
    name for name, field in Settings.model_fields.items() if "SecretStr" in str(field.annotation)
}


def _describe(err: ErrorDetails) -> str:
    """One line per pydantic error; shows the input only for non-secret scalar fields."""
    loc = [str(part) for part in err["loc"]]
    msg = err["msg"].removeprefix("Value error, ")
    if not loc:  # a model validator: the message names its variables
        return msg
    if loc == ["kafka"]:  # the kafka validator: the message names each variable
        return msg
    var = _PREFIX + "__".join(loc).upper()
    value = err.get("input")
    if loc[0] in _SECRET_FIELDS or not isinstance(value, str | int | float | bool):
        return f"{var}: {msg}"
    text = repr(value) if len(repr(value)) <= 80 else repr(value)[:77] + "..."
    return f"{var}: {msg} (got {text})"


def load_settings(
    *,
    app_env: Iterable[str] = (),
    on_unknown: Callable[[list[str]], None] | None = None,
    **overrides: Any,
) -> Settings:
    """Read settings from the environment (plus ``overrides``).

    Args:
        app_env: ``LOCKGATE_*`` variables the app reads itself (``App.env``); they are
            accepted in the environment instead of being reported as unknown.
        on_unknown: when given, ``LOCKGATE_*`` variables that nothing reads are handed
            to it (one line each, with a "did you mean") instead of being an error:
            operator commands run in an app's environment see the app's own variables.
        **overrides: field values that take precedence over the environment.

    Returns:
        The frozen settings.

    Raises:
        ConfigError: a variable is invalid, or a ``LOCKGATE_*`` variable is read by
            nothing (see :data:`NON_SETTINGS_ENV`). The message names every problem,
            one per line, and never contains the value of a secret.
    """
    environ = dict(os.environ)
    app_env = list(app_env)
    lines = _unknown_variables(environ, app_env)
    if lines and on_unknown is not None:
        on_unknown(lines)
        lines = []
    settings: Settings | None = None
    try:
        settings = Settings(**overrides)
    except ValidationError as exc:
        lines.extend(_describe(err) for err in exc.errors())
    except SettingsError as exc:
        # pydantic-settings could not parse a complex value (e.g. LOCKGATE_KAFKA as
        # JSON); its message names the field, not the value.
        if not any(line.startswith(("LOCKGATE_KAFKA:", "lockgate_kafka:")) for line in lines):
            lines.append(f"cannot parse the environment: {exc}")
    if lines or settings is None:
        text = "invalid configuration:\n  " + "\n  ".join(dict.fromkeys(lines))
        for secret in _secret_values(environ, overrides):
            text = text.replace(secret, _MASK)
        raise ConfigError(text) from None
    return settings
