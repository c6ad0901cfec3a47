"""The running broker of ``lockgate_kafka``: its start, readiness and client helpers.

Owns :class:`LockgateKafka` (produce, read_committed, create_topics), :class:`OutputRecord`,
the plugin's own client settings (the environment's ``LOCKGATE_KAFKA__*`` and SASL
settings), :func:`wait_kafka_ready` and :func:`start_kafka`.
"""

from __future__ import annotations

import os
import time
import uuid
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any

from processors._checkpoint.protocol import is_control_record
from processors._testing.choice import (
    ENV_BOOTSTRAP,
    INSTALL_HINT,
    BrokerChoice,
    BrokerUnavailableError,
)
from processors._testing.containers import (
    _docker_up,
    _live,
    _local_container,
    _logs_of,
    _no_registry_reaper,
    _official_container,
    _remove,
    _testcontainers,
    build_local_image,
)
from processors._testing.ports import free_port
from state.codecs import JSON, STR, Codec

_STARTED = "Kafka Server started"
_QUIET: dict[str, Any] = {"log_level": 0}
_KAFKA_ENV = "LOCKGATE_KAFKA__"


def _client(bootstrap: str) -> dict[str, Any]:
    """Settings of the plugin's own clients: quiet, and the environment's security.

    The apps the plugin starts inherit the environment, so they connect with its
    ``LOCKGATE_KAFKA__<KEY>`` properties (e.g. ``SECURITY_PROTOCOL=SASL_SSL``) and
    ``LOCKGATE_SASL_USERNAME`` / ``LOCKGATE_SASL_PASSWORD`` / ``LOCKGATE_SASL_PASSWORD_FILE``;
    the plugin's clients (readiness check, topic creation, produce, read) use the same ones,
    so an external broker that authenticates works (docs/security.md).
    """
    conf: dict[str, Any] = dict(_QUIET)
    for key, value in os.environ.items():
        if key.upper().startswith(_KAFKA_ENV) and len(key) > len(_KAFKA_ENV):
            conf[key[len(_KAFKA_ENV) :].lower().replace("_", ".")] = value
    if os.environ.get("LOCKGATE_SASL_USERNAME"):
        conf["sasl.username"] = os.environ["LOCKGATE_SASL_USERNAME"]
    if os.environ.get("LOCKGATE_SASL_PASSWORD"):
        conf["sasl.password"] = os.environ["LOCKGATE_SASL_PASSWORD"]
    elif os.environ.get("LOCKGATE_SASL_PASSWORD_FILE"):
        text = Path(os.environ["LOCKGATE_SASL_PASSWORD_FILE"]).read_text()
        conf["sasl.password"] = text.removesuffix("\n").removesuffix("\r")
    conf["bootstrap.servers"] = bootstrap
    return conf


def wait_kafka_ready(bootstrap: str, timeout: float = 60.0) -> None:
    """Wait until the broker serves metadata and its group and transaction coordinators.

    The first OffsetFetch creates ``__consumer_offsets`` and the first InitProducerId creates
    ``__transaction_state``; a consumer or transactional producer used before that can stall.

    Raises:
        TimeoutError: not ready within ``timeout`` seconds (the message says which part).
    """
    from confluent_kafka import Consumer, KafkaException, Producer, TopicPartition
    from confluent_kafka.admin import AdminClient

    deadline = time.monotonic() + timeout
    quiet = _client(bootstrap)

    def left() -> float:
        return max(1.0, deadline - time.monotonic())

    def retry(what: str, fn: Callable[[], object]) -> None:
        last: Exception | None = None
        while time.monotonic() < deadline:
            try:
                fn()
                return
            except KafkaException as exc:
                last = exc
                time.sleep(0.25)
        raise TimeoutError(f"Kafka on {bootstrap}: {what} not ready within {timeout:.0f}s: {last}")

    admin = AdminClient(quiet)

    def metadata() -> None:
        if not admin.list_topics(timeout=min(10.0, left())).brokers:
            raise KafkaException("metadata lists no brokers")

    retry("metadata", metadata)
    # A consumer's OffsetFetch, not AdminClient.list_consumer_group_offsets: with
    # confluent-kafka 2.16.1 that call crashed the process right after a broker start.
    consumer = Consumer({**quiet, "group.id": "lockgate-readiness"})
    try:
        probe = [TopicPartition("lockgate-readiness", 0)]
        retry("group coordinator", lambda: consumer.committed(probe, timeout=min(10.0, left())))
    finally:
        consumer.close()
    producer = Producer(
        {**quiet, "transactional.id": "lockgate-readiness", "transaction.timeout.ms": 10000}
    )
    retry("transaction coordinator", lambda: producer.init_transactions(min(30.0, left())))
    producer.flush(1)


@dataclass(frozen=True)
class OutputRecord:
    """A record read back from Kafka, decoded with the given codecs.

    Attributes:
        topic: the topic.
        partition: its partition.
        offset: its offset.
        key: the decoded key (None for a null key).
        value: the decoded value (None for a tombstone).
        headers: the headers as ``(name, bytes)`` pairs.
        timestamp: the record timestamp in ms.
    """

    topic: str
    partition: int
    offset: int
    key: Any
    value: Any
    headers: list[tuple[str, bytes]]
    timestamp: int


@dataclass
class LockgateKafka:
    """A running broker (the ``lockgate_kafka`` fixture) and client helpers for tests.

    Attributes:
        bootstrap: ``host:port`` for clients on this machine.
        mode: ``external``, ``official``, ``confluent`` or ``local``.
        image: the broker image (None for an external broker).
        startup_seconds: how long the start took (0 for an external broker).
    """

    bootstrap: str
    mode: str
    image: str | None = None
    startup_seconds: float = 0.0
    _container: Any = field(default=None, repr=False)

    def __str__(self) -> str:
        return self.bootstrap

    def logs(self) -> str:
        """The broker container's output so far (empty for an external broker)."""
        return "" if self._container is None else _logs_of(self._container)

    def stop(self) -> None:
        """Remove the broker container at once (SIGKILL: it is thrown away with its data).

        Nothing happens for an external broker.
        """
        if self._container is not None:
            _remove(self._container)
            self._container = None

    def create_topics(
        self,
        topics: Mapping[str, int],
        *,
        config: Mapping[str, str] | None = None,
        timeout: float = 30.0,
    ) -> None:
        """Create ``{name: partitions}`` (replication factor 1) and wait until they are listed.

        Raises:
            RuntimeError: a topic exists already, or the broker refused (the message has
                the broker's error).
            TimeoutError: not listed within ``timeout`` seconds.
        """
        from confluent_kafka import KafkaException
        from confluent_kafka.admin import (  # type: ignore[attr-defined]  # in cimpl
            AdminClient,
            NewTopic,
        )

        admin = AdminClient(_client(self.bootstrap))
        new = [NewTopic(n, int(p), 1, config=dict(config or {})) for n, p in topics.items()]
        for name, fut in admin.create_topics(new, request_timeout=timeout).items():
            try:
                fut.result(timeout)
            except KafkaException as exc:
                raise RuntimeError(f"create topic {name}: {exc}") from exc
        deadline = time.monotonic() + timeout
        while not set(topics) <= set(admin.list_topics(timeout=10).topics):
            if time.monotonic() > deadline:
                raise TimeoutError(f"topics {sorted(topics)} not listed after {timeout:.0f}s")
            time.sleep(0.1)

    def produce(
        self,
        topic: str,
        records: Iterable[tuple[Any, Any]],
        *,
        key_codec: Codec = STR,
        value_codec: Codec = JSON,
        timeout: float = 30.0,
    ) -> int:
        """Produce ``(key, value)`` pairs, in order, with the partitioner lockgate uses.

        Keys and values are encoded with the codecs (default: UTF-8 string keys, JSON values;
        None stays a null key or value). The producer is idempotent (no reordering on
        retries) and places keys with murmur2 like the Java client and lockgate.

        Returns:
            The number of records produced (all acknowledged).

        Raises:
            RuntimeError: some records were not delivered within ``timeout`` seconds.
        """
        from confluent_kafka import Producer

        producer = Producer(
            {
                **_client(self.bootstrap),
                "partitioner": "murmur2_random",
                "enable.idempotence": True,
                "linger.ms": 5,
            }
        )
        errors: list[str] = []

        def delivered(err: Any, _msg: Any) -> None:
            if err is not None:
                errors.append(str(err))

        count = 0
        for key, value in records:
            raw_key = None if key is None else key_codec.encode(key)
            raw_value = None if value is None else value_codec.encode(value)
            while True:
                try:
                    producer.produce(topic, raw_value, raw_key, on_delivery=delivered)
                    break
                except BufferError:
                    producer.poll(0.1)
            count += 1
        left = producer.flush(timeout)
        if left or errors:
            raise RuntimeError(
                f"produce to {topic}: {left} record(s) undelivered after {timeout:.0f}s, "
                f"errors: {errors[:5]}"
            )
        return count

    def read_committed(
        self,
        topic: str,
        count: int | None = None,
        *,
        timeout: float = 30.0,
        idle: float = 0.5,
        key_codec: Codec = STR,
        value_codec: Codec = JSON,
        control: bool = False,
    ) -> list[OutputRecord]:
        """Read ``topic`` from the start with ``isolation.level=read_committed``.

        Only records of committed transactions (and non-transactional records) are returned:
        what a downstream consumer sees of an exactly-once app's output.

        Args:
            topic: the topic; waited for if it does not exist yet.
            count: return once at least this many records were read and no more arrived
                for ``idle`` seconds (so duplicates show up as extra records). None: read
                until nothing new arrives for ``idle`` seconds, at most ``timeout``.
            timeout: overall limit in seconds.
            idle: quiet period in seconds that ends the read.
            key_codec: decodes keys (default UTF-8 strings).
            value_codec: decodes values (default JSON).
            control: also return lockgate's control records (checkpoint barriers in
                internal topics, header ``lockgate-type``); by default they are skipped
                and not counted.

        Returns:
            The records in (partition, offset) order.

        Raises:
            TimeoutError: fewer than ``count`` committed records within ``timeout`` (the
                message says how many arrived).
        """
        from confluent_kafka import Consumer, KafkaError, TopicPartition

        consumer = Consumer(
            {
                **_client(self.bootstrap),
                "group.id": f"lockgate-reader-{uuid.uuid4().hex[:10]}",
                "enable.auto.commit": False,
                "isolation.level": "read_committed",
            }
        )
        deadline = time.monotonic() + timeout
        raw: list[Any] = []
        try:
            while True:
                md = consumer.list_topics(topic, timeout=10).topics.get(topic)
                if md is not None and md.error is None and md.partitions:
                    break
                if time.monotonic() > deadline:
                    raise TimeoutError(f"topic {topic} does not exist after {timeout:.0f}s")
                time.sleep(0.2)
            consumer.assign([TopicPartition(topic, p, 0) for p in md.partitions])
            last = time.monotonic()
            while time.monotonic() < deadline:
                for msg in consumer.consume(1000, 0.2):
                    err = msg.error()
                    if err is None:
                        if control or not is_control_record(msg.headers()):
                            raw.append(msg)
                        last = time.monotonic()
                    elif err.code() != KafkaError._PARTITION_EOF:  # noqa: SLF001 - public code
                        raise RuntimeError(f"reading {topic}: {err}")
                if (count is None or len(raw) >= count) and time.monotonic() - last >= idle:
                    break
        finally:
            consumer.close()
        if count is not None and len(raw) < count:
            raise TimeoutError(
                f"{topic}: {len(raw)} of {count} committed records after {timeout:.0f}s"
            )
        raw.sort(key=lambda m: (m.partition(), m.offset()))
        return [
            OutputRecord(
                topic=m.topic(),
                partition=m.partition(),
                offset=m.offset(),
                key=None if m.key() is None else key_codec.decode(m.key()),
                value=None if m.value() is None else value_codec.decode(m.value()),
                headers=list(m.headers() or []),
                timestamp=m.timestamp()[1],
            )
            for m in raw
        ]


def start_kafka(choice: BrokerChoice, *, startup_timeout: float = 120.0) -> LockgateKafka:
    """Start (or connect to) the broker ``choice`` describes and wait until it is usable.

    Usable means metadata, the group coordinator and the transaction coordinator answer
    (:func:`wait_kafka_ready`). Host ports come from ``LOCKGATE_TEST_PLUGIN_PORTS``; a broker
    that dies at start (a port taken meanwhile) is retried twice on other ports.

    Raises:
        BrokerUnavailableError: no engine, no testcontainers, the image is missing or the
            broker did not start (the message carries the tail of its log).
    """
    started = time.monotonic()
    if choice.mode == "external":
        assert choice.bootstrap is not None
        try:
            wait_kafka_ready(choice.bootstrap, timeout=min(startup_timeout, 60.0))
        except TimeoutError as exc:
            raise BrokerUnavailableError(f"{ENV_BOOTSTRAP}={choice.bootstrap}: {exc}") from exc
        return LockgateKafka(choice.bootstrap, "external")
    _testcontainers()  # fail early, naming the extra
    assert choice.image is not None
    _docker_up(choice.build_script)
    if choice.mode == "local":
        _no_registry_reaper()
        build_local_image(choice.image, choice.build_script, "kafka")
    if choice.mode == "confluent":
        return _start_confluent(choice.image, startup_timeout, started)
    from testcontainers.core.wait_strategies import LogMessageWaitStrategy

    last = ""
    for _ in range(3):
        port = free_port(2)
        make = _local_container if choice.mode == "local" else _official_container
        container = make(choice.image, port).waiting_for(
            LogMessageWaitStrategy(_STARTED).with_startup_timeout(
                timedelta(seconds=startup_timeout)
            )
        )
        try:
            container.start()
        except Exception as exc:  # noqa: BLE001 - retried, then reported with the log
            last = f"{type(exc).__name__}: {exc}\n--- broker log ---\n{_logs_of(container)[-3000:]}"
            _remove(container)
            continue
        _live.append(container)
        bootstrap = f"127.0.0.1:{port}"
        try:
            wait_kafka_ready(bootstrap, timeout=startup_timeout)
        except TimeoutError as exc:
            log = _logs_of(container)[-3000:]
            _remove(container)
            raise BrokerUnavailableError(f"{exc}\n--- broker log ---\n{log}") from exc
        return LockgateKafka(
            bootstrap, choice.mode, choice.image, time.monotonic() - started, container
        )
    raise BrokerUnavailableError(f"Kafka container {choice.image} did not start:\n{last}")


def _start_confluent(image: str, startup_timeout: float, started: float) -> LockgateKafka:
    """A ``confluentinc/cp-kafka`` image through testcontainers' KafkaContainer (KRaft)."""
    try:
        from testcontainers.kafka import KafkaContainer
    except ImportError as exc:
        raise BrokerUnavailableError(f"testcontainers' Kafka module: {INSTALL_HINT}") from exc
    container = (
        KafkaContainer(image)
        .with_kraft()
        .with_env("KAFKA_TRANSACTION_STATE_LOG_REPLICATION_FACTOR", "1")
        .with_env("KAFKA_TRANSACTION_STATE_LOG_MIN_ISR", "1")
    )
    try:
        container.start(timeout=int(startup_timeout))
    except Exception as exc:
        log = _logs_of(container)[-3000:]
        _remove(container)
        raise BrokerUnavailableError(f"{image}: {exc}\n--- broker log ---\n{log}") from exc
    _live.append(container)
    bootstrap = container.get_bootstrap_server()
    wait_kafka_ready(bootstrap, timeout=startup_timeout)
    return LockgateKafka(bootstrap, "confluent", image, time.monotonic() - started, container)
