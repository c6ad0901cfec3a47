"""Kafka I/O helpers: client configuration, topic administration, error classes."""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable, Mapping
from typing import Any

from confluent_kafka import IsolationLevel, KafkaError, KafkaException, TopicPartition
from confluent_kafka.admin import (  # type: ignore[attr-defined]  # re-exported in cimpl
    AdminClient,
    ConfigResource,
    NewPartitions,
    NewTopic,
    OffsetSpec,
    ResourceType,
)

from processors._config.log_setup import librdkafka_logger
from processors._config.settings import GroupProtocol, Guarantee, Settings
from processors._kafka.authz import (
    AUTHORIZATION_CODES,
    authorization_error,
    check_group,
    check_topics,
)
from processors._kafka.errors import AbortEpoch, Kind, classify, kafka_call
from processors.exceptions import ConfigError, FatalKafkaError, TopicError

__all__ = ["CONTROL_TOPIC", "PARTITION_EOF", "AbortEpoch", "Admin", "kafka_call"]

log = logging.getLogger("lockgate.kafka")

CONTROL_TOPIC = "lockgate.control"
#: Seconds the start-up check of the consumer group keeps asking while its coordinator is not
#: ready (a broker that just started loads __consumer_offsets first).
GROUP_CHECK_TIMEOUT_S = 120.0
#: ``fetch.queue.backoff.ms`` of the input consumer and the changelog reader. librdkafka
#: stops fetching a partition for this long (default 1000 ms) whenever its queue is over
#: ``queued.min.messages`` or ``queued.max.messages.kbytes``. The memory plan bounds the
#: queue (``MemoryPlan.fetch_config``: 16 MiB at the default limit, shared by every
#: partition since their queues forward to the consumer's), one fetch response fills it,
#: and the loop drains it in a fraction of a second, then waited out the rest of the
#: second in ``consume()``: Nexmark q2 (a filter) ran at ~77k events/s with 0.16 cores busy;
#: with 20 ms, ~270k events/s (docs/benchmarks.md, "What bounds q2"). A queue over its
#: bound is re-checked that often, with no request to the broker.
FETCH_QUEUE_BACKOFF_MS = 20
#: A just-created topic, or any topic while the broker restarts, has no known leader:
#: list_offsets answers these for a while ("No leaders found" is _NOENT).
_METADATA_NOT_READY = {KafkaError.UNKNOWN_TOPIC_OR_PART, KafkaError._NOENT}  # noqa: SLF001
_STALE_LEADER = {KafkaError.FENCED_LEADER_EPOCH, KafkaError.UNKNOWN_LEADER_EPOCH}
#: Changelog topic settings: compacted, and tombstones kept for a day (the local-state
#: age guard in processors/_task/keygroups.py is derived from the value the topic really has).
CHANGELOG_CONFIG = {"cleanup.policy": "compact", "delete.retention.ms": "86400000"}


# Pass-through properties that only one kind of client accepts; librdkafka warns about the
# others (or, for the group properties KIP-848 moved to the broker, refuses to start).
_CONSUMER_ONLY = (
    "session.timeout.ms",
    "heartbeat.interval.ms",
    "max.poll.interval.ms",
    "fetch.",
    "auto.offset.reset",
    "group.",
    "queued.",
    "check.crcs",
    "allow.auto.create.topics",
)
_PRODUCER_ONLY = (
    "linger.ms",
    "queue.buffering.",
    "batch.",
    "compression.",
    "acks",
    "request.required.acks",
    "message.timeout.ms",
    "delivery.timeout.ms",
    "retries",
    "sticky.",
)
_KIP848_BROKER_SIDE = ("session.timeout.ms", "heartbeat.interval.ms")


def _common(settings: Settings, drop: tuple[str, ...] = ()) -> dict[str, Any]:
    conf: dict[str, Any] = {"bootstrap.servers": settings.bootstrap_servers}
    for key, value in settings.kafka_config().items():
        if not key.startswith(drop):
            conf[key] = value
    return conf


def producer_config(settings: Settings, app: str, transactional_id: str | None) -> dict[str, Any]:
    """Return the producer configuration (transactional when ``transactional_id`` is set)."""
    conf = {
        "partitioner": "murmur2_random",  # Java-compatible placement, never CRC32
        "linger.ms": 5,
        "compression.type": "lz4",
        "enable.idempotence": True,
        "client.id": f"{app}-producer",
    }
    if transactional_id is not None:
        conf["transactional.id"] = transactional_id
        conf["transaction.timeout.ms"] = settings.transaction_timeout_ms
        # Right after a commit the coordinator may still be completing it and answers
        # send_offsets with a retriable CONCURRENT_TRANSACTIONS; librdkafka's default 100 ms
        # first backoff then costs 100 ms per epoch (measured: 114 ms -> 15 ms median).
        # Backoff stays exponential up to retry.backoff.max.ms.
        conf["retry.backoff.ms"] = 10
    conf.update(_common(settings, drop=_CONSUMER_ONLY))
    conf["logger"] = librdkafka_logger("producer")
    return conf


def consumer_config(settings: Settings, app: str) -> dict[str, Any]:
    """Return the group consumer configuration (cooperative, manual offsets)."""
    conf: dict[str, Any] = {
        "group.id": app,
        "enable.auto.commit": False,
        "enable.auto.offset.store": False,
        "auto.offset.reset": "earliest",
        "isolation.level": "read_committed",
        "partition.assignment.strategy": "cooperative-sticky",
        "client.id": f"{app}-{settings.instance_id}",
        "fetch.wait.max.ms": 100,
        "fetch.queue.backoff.ms": FETCH_QUEUE_BACKOFF_MS,
    }
    if settings.group_protocol is GroupProtocol.CONSUMER:
        # KIP-848: the broker assigns (incrementally); client-side strategies do not apply.
        conf["group.protocol"] = "consumer"
        del conf["partition.assignment.strategy"]
    if settings.static_membership:
        conf["group.instance.id"] = settings.instance_id
    if settings.guarantee is Guarantee.AT_LEAST_ONCE:
        conf["isolation.level"] = "read_uncommitted"
    drop: tuple[str, ...] = _PRODUCER_ONLY
    if settings.group_protocol is GroupProtocol.CONSUMER:
        ignored = [k for k in settings.kafka_config() if k in _KIP848_BROKER_SIDE]
        if ignored:
            log.warning(
                "ignoring client-side group timeouts under group.protocol=consumer: the "
                "broker's group.consumer.* settings apply",
                extra={"ignored": ignored},
            )
        drop = drop + _KIP848_BROKER_SIDE
    conf.update(_common(settings, drop=drop))
    conf["logger"] = librdkafka_logger("consumer")
    return conf


def restore_consumer_config(settings: Settings, app: str) -> dict[str, Any]:
    """Return the configuration of the changelog reader (no group, read_committed)."""
    conf: dict[str, Any] = {
        "group.id": f"{app}.restore",  # required by librdkafka; never used to commit
        "enable.auto.commit": False,
        "enable.auto.offset.store": False,
        "isolation.level": "read_committed",
        "enable.partition.eof": True,
        "fetch.wait.max.ms": 20,  # reach the end (EOF) quickly
        "fetch.queue.backoff.ms": FETCH_QUEUE_BACKOFF_MS,
        "auto.offset.reset": "earliest",
        "client.id": f"{app}-{settings.instance_id}-restore",
    }
    conf.update(_common(settings, drop=_PRODUCER_ONLY + _CONSUMER_ONLY))
    conf["logger"] = librdkafka_logger("restore")
    return conf


def admin_config(settings: Settings) -> dict[str, Any]:
    """Return the admin client configuration."""
    conf = _common(settings, drop=_PRODUCER_ONLY + _CONSUMER_ONLY)
    # The admin client is a producer-type client, for which librdkafka asks the broker to
    # create topics named in metadata requests: never let a check re-create a deleted topic.
    conf["allow.auto.create.topics"] = False
    conf["logger"] = librdkafka_logger("admin")
    return conf


#: librdkafka's codes for a refused SASL authentication and a failed TLS handshake.
_REFUSALS = frozenset({KafkaError._AUTHENTICATION, KafkaError._SSL})  # noqa: SLF001


def _refusal_message(err: KafkaError, conf: dict[str, Any]) -> str:
    """What a refused connection means and which settings to check (never a secret)."""
    bootstrap = conf.get("bootstrap.servers")
    if err.code() == KafkaError._AUTHENTICATION:  # noqa: SLF001
        user = conf.get("sasl.username")
        who = f"User:{user}" if user else "the client"
        return (
            f"authentication failed: {bootstrap} refused the SASL credentials of {who} "
            f"({conf.get('sasl.mechanism', 'GSSAPI')}); check LOCKGATE_SASL_USERNAME and "
            f"LOCKGATE_SASL_PASSWORD or LOCKGATE_SASL_PASSWORD_FILE ({err.str()})"
        )
    return (
        f"TLS handshake with {bootstrap} failed: {err.str()}; check "
        "LOCKGATE_KAFKA__SSL_CA_LOCATION (the CA that signed the broker's certificate) and "
        "LOCKGATE_KAFKA__SECURITY_PROTOCOL"
    )


class Admin:
    """Topic checks and creation, last stable offsets."""

    def __init__(self, settings: Settings) -> None:
        self._conf = admin_config(settings)
        #: The first authentication (SASL) or TLS failure librdkafka reported, if any.
        self._refused: KafkaError | None = None
        self._conf["error_cb"] = self._on_error
        self._admin = AdminClient(self._conf)

    def _on_error(self, err: KafkaError) -> None:
        if self._refused is None and err.code() in _REFUSALS:
            self._refused = err

    def connect(self, timeout: float = 30.0) -> None:
        """Wait until the cluster answers a metadata request; fail at once if refused.

        A wrong SASL password or a broker certificate the CA does not sign makes every
        call time out as "broker transport failure"; this names the real cause after
        the first refused attempt instead.

        Raises:
            ConfigError: the broker refused the credentials, or the TLS handshake failed
                (the message says which settings to check, never a secret's value).
            KafkaException: no broker answered within ``timeout`` for another reason.
        """
        deadline = time.monotonic() + timeout
        while True:
            try:
                self._admin.list_topics(timeout=min(1.0, max(0.1, deadline - time.monotonic())))
                return
            except KafkaException:
                self._admin.poll(0)  # serves error_cb
                if self._refused is not None:
                    raise ConfigError(_refusal_message(self._refused, self._conf)) from None
                if time.monotonic() >= deadline:
                    raise

    @property
    def principal(self) -> str | None:
        """The SASL user name the clients authenticate as (``None``: none configured)."""
        user = self._conf.get("sasl.username")
        return str(user) if user is not None else None

    def check_access(
        self,
        topics: Mapping[str, Iterable[str]],
        group: str | None = None,
        timeout: float = 30.0,
        group_operation: str = "READ",
    ) -> None:
        """Check that the principal may perform the ACL operations the app needs.

        Args:
            topics: topic -> ACL operation names (``READ``, ``WRITE``, ``DESCRIBE_CONFIGS``).
            group: a consumer group the app joins (READ), if any.
            timeout: seconds for each describe call (the group's: at least
                :data:`GROUP_CHECK_TIMEOUT_S`, retrying while its coordinator is not ready).
            group_operation: what is needed on ``group`` (``DESCRIBE``: read its offsets).

        Raises:
            AuthorizationError: an ACL is missing (the message names it).
            KafkaException: the broker could not be asked.
        """
        check_topics(self._admin, self.principal, topics, timeout)
        if group is not None:
            # The group's coordinator may still be loading on a broker that just started.
            check_group(
                self._admin,
                self.principal,
                group,
                max(timeout, GROUP_CHECK_TIMEOUT_S),
                group_operation,
            )

    def partitions_of(self, topics: Iterable[str], timeout: float = 30.0) -> dict[str, int]:
        """Return the partition count of each existing topic among ``topics``."""
        md = self._admin.list_topics(timeout=timeout)
        out = {}
        for topic in topics:
            tmd = md.topics.get(topic)
            if tmd is not None and tmd.error is None:
                out[topic] = len(tmd.partitions)
        return out

    def partitions_of_each(self, topics: Iterable[str], timeout: float = 30.0) -> dict[str, int]:
        """:meth:`partitions_of`, asking for each topic's metadata only (cheap to repeat)."""
        out = {}
        for topic in topics:
            tmd = self._admin.list_topics(topic=topic, timeout=timeout).topics.get(topic)
            if tmd is not None and tmd.error is None and tmd.partitions:
                out[topic] = len(tmd.partitions)
        return out

    def input_partitions(self, topics: Iterable[str]) -> int:
        """Return P, the common partition count of the input topics.

        Raises:
            TopicError: an input topic does not exist, or the counts differ.
        """
        topics = list(topics)
        found = self.partitions_of(topics)
        missing = [t for t in topics if t not in found]
        if missing:
            raise TopicError(
                f"input topic(s) {', '.join(missing)} do not exist: create them first "
                "(lockgate never creates input topics)"
            )
        counts = {found[t] for t in topics}
        if len(counts) != 1:
            raise TopicError(
                f"input topics are not co-partitioned: {found}; all inputs need the same "
                "partition count"
            )
        return counts.pop()

    def layout_of(self, topics: Iterable[str], timeout: float = 30.0) -> dict[str, tuple[int, int]]:
        """Return (partition count, replication factor) of each existing topic among ``topics``.

        The replication factor is the smallest replica count of the topic's partitions.
        """
        md = self._admin.list_topics(timeout=timeout)
        out = {}
        for topic in topics:
            tmd = md.topics.get(topic)
            if tmd is not None and tmd.error is None and tmd.partitions:
                replicas = min(len(p.replicas) for p in tmd.partitions.values())
                out[topic] = (len(tmd.partitions), replicas)
        return out

    def ensure_topics(
        self,
        specs: dict[str, tuple[int, dict[str, str]]],
        timeout: float = 30.0,
        replication: dict[str, int] | None = None,
    ) -> None:
        """Create the topics in ``specs`` (name -> (partitions, config)) that are missing.

        Existing topics are kept; a partition count that differs is an error for
        changelogs (their partition g must be key group g). ``replication`` gives the
        replication factor of some topics (the others get the broker's default).
        """
        existing = self.partitions_of(specs)
        for name, (partitions, _) in specs.items():
            if name in existing and existing[name] != partitions and name.endswith(".changelog"):
                raise TopicError(
                    f"changelog {name} has {existing[name]} partitions, the input has "
                    f"{partitions}: a changelog must match the input partition count"
                )
        new = [
            NewTopic(
                name,
                num_partitions=parts,
                replication_factor=(replication or {}).get(name, -1),
                config=config,
            )
            for name, (parts, config) in specs.items()
            if name not in existing
        ]
        if not new:
            return
        for name, fut in self._admin.create_topics(new, operation_timeout=timeout).items():
            try:
                fut.result()
                log.info("created topic", extra={"topic": name})
            except KafkaException as exc:
                code = exc.args[0].code()
                if code in AUTHORIZATION_CODES:
                    raise authorization_error(
                        self.principal, "CREATE", "TOPIC", name, exc.args[0].name()
                    ) from None
                if code != KafkaError.TOPIC_ALREADY_EXISTS:
                    raise TopicError(f"cannot create topic {name}: {exc}") from exc
        deadline = time.monotonic() + timeout
        while not self._all_led(specs):
            if time.monotonic() > deadline:
                raise TopicError(f"topics {sorted(specs)} did not get leaders within {timeout}s")
            time.sleep(0.1)

    def grow_partitions(self, topic: str, partitions: int, timeout: float = 30.0) -> None:
        """Give ``topic`` at least ``partitions`` partitions (never fewer than it has).

        Raises:
            TopicError: the partitions cannot be added.
        """
        have = self.partitions_of([topic]).get(topic, 0)
        if have >= partitions:
            return
        futs = self._admin.create_partitions([NewPartitions(topic, partitions)])
        for fut in futs.values():
            try:
                fut.result(timeout)
            except KafkaException as exc:
                raise TopicError(f"cannot grow {topic} to {partitions} partitions: {exc}") from exc
        deadline = time.monotonic() + timeout
        while self.partitions_of([topic]).get(topic, 0) < partitions or not self._all_led([topic]):
            if time.monotonic() > deadline:
                raise TopicError(f"{topic} did not get {partitions} led partitions in {timeout}s")
            time.sleep(0.1)

    def _all_led(self, topics: Iterable[str]) -> bool:
        md = self._admin.list_topics(timeout=10)
        for topic in topics:
            tmd = md.topics.get(topic)
            if tmd is None or tmd.error is not None or not tmd.partitions:
                return False
            if any(p.leader < 0 for p in tmd.partitions.values()):
                return False
        return True

    def end_offsets(
        self, tps: list[TopicPartition], within_s: float = 60.0
    ) -> dict[tuple[str, int], int]:
        """Return the high watermark (the next offset to be written) of each partition.

        Retries transient errors (a just-created topic without a leader, leader-epoch
        changes after a broker restart) for up to ``within_s`` (one request's 10 s may
        come on top).

        Raises:
            FatalKafkaError: the offsets could not be read within ``within_s``.
        """
        return self._list_offsets(tps, OffsetSpec.latest(), within_s=within_s)  # type: ignore[no-untyped-call]

    def stable_offsets(self, tps: list[TopicPartition]) -> dict[tuple[str, int], int]:
        """Return the last stable offset of each partition (what read_committed reaches).

        Every transaction below it is decided: committed records below it never change.

        Raises:
            FatalKafkaError: the offsets could not be read within 60 s.
        """
        return self._list_offsets(
            tps,
            OffsetSpec.latest(),  # type: ignore[no-untyped-call]
            IsolationLevel.READ_COMMITTED,
        )

    def offsets_for_time(self, tps: list[TopicPartition], ts_ms: int) -> dict[tuple[str, int], int]:
        """Return the first offset with a timestamp >= ``ts_ms`` of each partition.

        ``-1`` for a partition without such a record.

        Raises:
            FatalKafkaError: the offsets could not be read within 60 s.
        """
        spec = OffsetSpec.for_timestamp(ts_ms)
        return self._list_offsets(tps, spec, IsolationLevel.READ_COMMITTED)

    def start_offsets(self, tps: list[TopicPartition]) -> dict[tuple[str, int], int]:
        """Return the log start offset (the first readable offset) of each partition.

        Raises:
            FatalKafkaError: the offsets could not be read within 60 s.
        """
        return self._list_offsets(tps, OffsetSpec.earliest())  # type: ignore[no-untyped-call]

    def _list_offsets(
        self,
        tps: list[TopicPartition],
        spec: Any,
        isolation: IsolationLevel = IsolationLevel.READ_UNCOMMITTED,
        within_s: float = 60.0,
    ) -> dict[tuple[str, int], int]:
        if not tps:
            return {}
        self._admin.poll(0)  # serve the admin client's log lines (librdkafka_logger)
        req = {TopicPartition(tp.topic, tp.partition): spec for tp in tps}
        deadline = time.monotonic() + within_s
        delay = 0.1
        while True:
            try:
                left = max(0.5, min(10.0, deadline - time.monotonic()))
                futs = self._admin.list_offsets(
                    req, isolation_level=isolation, request_timeout=left
                )
                return {(tp.topic, tp.partition): fut.result().offset for tp, fut in futs.items()}
            except KafkaException as exc:
                err = exc.args[0]
                transient = isinstance(err, KafkaError) and (
                    classify(err) is Kind.RETRY or err.code() in _METADATA_NOT_READY
                )
                if not transient or time.monotonic() > deadline:
                    raise FatalKafkaError(f"list_offsets: {exc}") from exc
                if isinstance(err, KafkaError) and err.code() in _STALE_LEADER:
                    # Seen after a broker restart: the admin client keeps sending the old
                    # leader epoch from its metadata cache. A new client has fresh metadata.
                    self._admin = AdminClient(self._conf)
                log.warning("retrying", extra={"call": "list_offsets", "error": str(err)})
                time.sleep(delay)
                delay = min(delay * 2, 2.0)

    def topic_config(self, topic: str, timeout: float = 30.0) -> dict[str, str]:
        """Return the effective configuration of ``topic`` (name -> value)."""
        res = ConfigResource(ResourceType.TOPIC, topic)
        fut = self._admin.describe_configs([res], request_timeout=timeout)[res]
        entries = fut.result(timeout)
        return {name: entry.value for name, entry in entries.items()}

    def check_changelogs(self, topics: Iterable[str]) -> dict[str, int]:
        """Check that each changelog is compacted; return its ``delete.retention.ms``.

        Raises:
            TopicError: a changelog exists with a cleanup policy without ``compact``
                (a ``delete`` topic silently loses state after its retention).
        """
        out = {}
        for topic in topics:
            conf = self.topic_config(topic)
            policy = conf.get("cleanup.policy", "")
            if "compact" not in policy.split(","):
                raise TopicError(
                    f"changelog {topic} has cleanup.policy={policy or '?'}: changelogs must be "
                    "compacted (cleanup.policy=compact), or state is lost after the topic's "
                    f"retention; fix it with: kafka-configs.sh --alter --entity-type topics "
                    f"--entity-name {topic} --add-config cleanup.policy=compact"
                )
            out[topic] = int(conf.get("delete.retention.ms") or 86_400_000)
        return out


#: librdkafka's "reached the end of the partition" event code.
PARTITION_EOF: int = KafkaError._PARTITION_EOF  # noqa: SLF001 - public constant, underscored name
