"""pytest fixtures for integration tests of lockgate apps against a real Kafka broker.

Installed as the pytest plugin ``lockgate`` (entry point ``pytest11``), so the fixtures are
available in every test once lockgate is installed; the broker needs the ``testing`` extra
(``pip install lockgate[testing]``, which brings testcontainers) and a Docker engine, unless
an existing broker is named (``LOCKGATE_TEST_BOOTSTRAP``). Without testcontainers the plugin
still loads: only the fixtures that start containers fail, naming the extra to install.

Fixtures:

* ``lockgate_kafka`` (session): a running single-node Kafka broker, a :class:`LockgateKafka`
  (``.bootstrap``, ``.produce(...)``, ``.read_committed(...)``, ``.create_topics(...)``).
* ``lockgate_topics`` (function): creates topics with partition counts under names unique to
  the test, a :class:`TopicFactory`.
* ``lockgate_app`` (function): runs an app against the broker as a ``lockgate run``
  subprocess (or, with ``image=``, as the processor container), waits until it is ready and
  stops it (SIGTERM) at the end of the test; an :class:`AppFactory`.

Example:
    .. code-block:: python

        def test_running_sum(lockgate_kafka, lockgate_topics, lockgate_app):
            t = lockgate_topics({"numbers": 4, "sums": 4})
            lockgate_kafka.produce(t["numbers"], [("a", {"v": 2, "seq": 0}),
                                                  ("a", {"v": 5, "seq": 1})])
            lockgate_app("examples.running_sum:app",
                         env={"LOCKGATE_INPUT_TOPIC": t["numbers"],
                              "LOCKGATE_OUTPUT_TOPIC": t["sums"]})
            out = lockgate_kafka.read_committed(t["sums"], 2)
            assert [r.value["sum"] for r in out] == [2, 7]

Which broker ``lockgate_kafka`` runs (``--lockgate-kafka`` or ``LOCKGATE_TEST_KAFKA``):

* ``external``: the broker at ``--lockgate-bootstrap`` / ``LOCKGATE_TEST_BOOTSTRAP``
  (``host:port``); no Docker. Setting the bootstrap alone selects this mode.
* ``official``: the official ``apache/kafka`` image (:data:`OFFICIAL_IMAGE`), pulled from
  Docker Hub by the engine, in KRaft mode with its port published on 127.0.0.1. A
  ``confluentinc/cp-kafka`` image runs through testcontainers' own ``KafkaContainer``.
* ``local``: lockgate's own broker image (:data:`LOCAL_IMAGE`, for machines without an image
  registry), on the host network, listening on 127.0.0.1 only; built with
  ``docker/build-images.sh kafka`` of a lockgate checkout when that script is found (the
  build is skipped while the image is up to date).
* ``auto`` (default): ``external`` if a bootstrap is set, else ``official`` if that image is
  already on the engine, else ``local`` if a lockgate checkout's build script is found, else
  ``official``.

``--lockgate-kafka-image`` / ``LOCKGATE_TEST_KAFKA_IMAGE`` names the image; with ``auto``
its name picks the mode (``lockgate/...``: local, anything else: official).
"""

from __future__ import annotations

import atexit
import contextlib
import os
import random
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

import pytest

from processors._checkpoint.protocol import is_control_record
from state.codecs import JSON, STR, Codec

if TYPE_CHECKING:
    from processors._dsl.app import App

__all__ = [
    "LOCAL_IMAGE",
    "OFFICIAL_IMAGE",
    "PROCESSOR_IMAGE",
    "AppFactory",
    "AppRun",
    "BrokerUnavailableError",
    "LockgateKafka",
    "OutputRecord",
    "TopicFactory",
    "kafka_for",
    "start_kafka",
    "wait_kafka_ready",
]

#: The official Apache Kafka image run in ``official`` mode (the Kafka version lockgate's
#: own broker image is built from).
OFFICIAL_IMAGE = "apache/kafka:4.1.2"
#: lockgate's broker image (``docker/build-images.sh kafka``) run in ``local`` mode.
LOCAL_IMAGE = "lockgate/kafka:dev"
#: lockgate's processor image (``docker/build-images.sh processor``); a default for
#: :meth:`AppFactory.__call__` ``image=`` is not assumed, this is what the project builds.
PROCESSOR_IMAGE = "lockgate/processor:dev"

ENV_MODE = "LOCKGATE_TEST_KAFKA"
ENV_IMAGE = "LOCKGATE_TEST_KAFKA_IMAGE"
ENV_BOOTSTRAP = "LOCKGATE_TEST_BOOTSTRAP"
#: Host ports for host-network containers (local broker, processor containers), ``lo-hi``.
ENV_PORTS = "LOCKGATE_TEST_PLUGIN_PORTS"
#: Below Linux's default ephemeral range (32768-60999): no outgoing connection takes a
#: picked port before the broker or app binds it, or while a restarted broker is down.
DEFAULT_PORTS = "21000-25999"

MODES = ("auto", "external", "official", "local")
INSTALL_HINT = "pip install 'lockgate[testing]'"
_LABEL = "io.lockgate.pytest-plugin"
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


class BrokerUnavailableError(RuntimeError):
    """No broker could be provided: no Docker engine, image missing or broken, or a timeout.

    The message says what was tried and how to choose another broker.
    """


# ----------------------------------------------------------------------------- options


def pytest_addoption(parser: pytest.Parser) -> None:
    """Register the ``--lockgate-*`` options (each has an environment variable twin)."""
    group = parser.getgroup("lockgate", "lockgate Kafka fixtures")
    group.addoption(
        "--lockgate-kafka",
        choices=MODES,
        default=None,
        help=f"broker for lockgate_kafka: {', '.join(MODES)} (env {ENV_MODE}; default auto)",
    )
    group.addoption(
        "--lockgate-kafka-image",
        default=None,
        help=f"broker image (env {ENV_IMAGE}; default {OFFICIAL_IMAGE} or {LOCAL_IMAGE})",
    )
    group.addoption(
        "--lockgate-bootstrap",
        default=None,
        help=f"use the existing broker at host:port, no Docker (env {ENV_BOOTSTRAP})",
    )


@dataclass(frozen=True)
class BrokerChoice:
    """What ``lockgate_kafka`` starts: ``mode`` is external, official, confluent or local."""

    mode: str
    image: str | None = None
    bootstrap: str | None = None
    build_script: Path | None = None


def _build_script(rootdir: Path | None) -> Path | None:
    """``docker/build-images.sh`` of a lockgate checkout (the test root or this package's)."""
    here = Path(__file__).resolve().parents[1]
    for base in (rootdir, here):
        if base is None:
            continue
        script = base / "docker" / "build-images.sh"
        if script.is_file() and (base / "docker" / "kafka" / "Dockerfile").is_file():
            return script
    return None


def _image_present(image: str) -> bool:
    if shutil.which("docker") is None:
        return False
    try:
        done = subprocess.run(
            ["docker", "image", "inspect", image], capture_output=True, timeout=30, check=False
        )
    except (OSError, subprocess.TimeoutExpired):
        return False
    return done.returncode == 0


def _image_mode(image: str) -> str:
    if image.startswith("lockgate/"):
        return "local"
    if image.startswith("confluentinc/"):
        return "confluent"
    return "official"


def choose_broker(
    mode: str | None,
    image: str | None,
    bootstrap: str | None,
    rootdir: Path | None = None,
    image_present: Callable[[str], bool] = _image_present,
) -> BrokerChoice:
    """Decide which broker to provide (no side effects besides asking the engine for images).

    Args:
        mode: ``auto`` (or None), ``external``, ``official`` or ``local``.
        image: broker image, or None for the mode's default.
        bootstrap: an existing broker's ``host:port``, or None.
        rootdir: the pytest root directory (where a lockgate checkout's build script is
            looked for).
        image_present: whether an image is already on the engine (for tests).

    Returns:
        The choice; ``build_script`` is set for local mode when a checkout was found.

    Raises:
        pytest.UsageError: an unknown mode, or ``external`` without a bootstrap.
    """
    mode = (mode or "auto").strip().lower()
    if mode not in MODES:
        raise pytest.UsageError(f"{ENV_MODE}/--lockgate-kafka: {mode!r} is not one of {MODES}")
    script = _build_script(rootdir)
    if mode == "external" or (mode == "auto" and bootstrap):
        if not bootstrap:
            raise pytest.UsageError(
                f"lockgate Kafka mode 'external' needs {ENV_BOOTSTRAP}=host:port "
                "(or --lockgate-bootstrap)"
            )
        return BrokerChoice("external", bootstrap=bootstrap)
    if mode == "official":
        chosen = image or OFFICIAL_IMAGE
        return BrokerChoice(_image_mode(chosen) if image else "official", image=chosen)
    if mode == "local":
        return BrokerChoice("local", image=image or LOCAL_IMAGE, build_script=script)
    if image:  # auto with an image: its name says how to run it
        kind = _image_mode(image)
        return BrokerChoice(kind, image=image, build_script=script if kind == "local" else None)
    if image_present(OFFICIAL_IMAGE):
        return BrokerChoice("official", image=OFFICIAL_IMAGE)
    if script is not None:
        return BrokerChoice("local", image=LOCAL_IMAGE, build_script=script)
    return BrokerChoice("official", image=OFFICIAL_IMAGE)


def _option(config: pytest.Config, name: str, env: str) -> str | None:
    value = config.getoption(name, default=None)
    return str(value) if value else (os.environ.get(env) or None)


# ----------------------------------------------------------------------------- testcontainers


def _testcontainers() -> Any:
    """Import testcontainers, or fail with the extra to install."""
    try:
        import testcontainers.core.container as tc_container
    except ImportError as exc:
        raise BrokerUnavailableError(
            f"the lockgate Kafka fixtures need testcontainers: {INSTALL_HINT} "
            f"(or set {ENV_BOOTSTRAP}=host:port to use a running broker) [{exc}]"
        ) from exc
    return tc_container


def _no_registry_reaper() -> None:
    """Turn off Ryuk (an image from a registry) unless the user configured it."""
    if "TESTCONTAINERS_RYUK_DISABLED" in os.environ:
        return
    from testcontainers.core.config import testcontainers_config

    testcontainers_config.ryuk_disabled = True


def _docker_up(script: Path | None) -> None:
    """Make sure a Docker engine answers (start it with a checkout's ensure-engine.sh)."""
    if shutil.which("docker") is None:
        raise BrokerUnavailableError(
            f"no `docker` command: install a Docker engine, or set {ENV_BOOTSTRAP}=host:port"
        )
    ok = subprocess.run(["docker", "info"], capture_output=True, timeout=30, check=False)
    if ok.returncode == 0:
        return
    engine = script.parent / "ensure-engine.sh" if script is not None else None
    if engine is not None and engine.is_file():
        done = subprocess.run([str(engine)], capture_output=True, text=True, check=False)
        if done.returncode == 0:
            return
        raise BrokerUnavailableError(f"{engine} failed:\n{done.stderr[-2000:]}")
    raise BrokerUnavailableError(
        "no Docker engine answers (`docker info` failed): start one, or set "
        f"{ENV_BOOTSTRAP}=host:port to use a running broker:\n{ok.stderr.decode()[-1000:]}"
    )


def build_local_image(image: str, script: Path | None, kind: str = "kafka") -> None:
    """Make sure lockgate's ``kind`` image (``kafka`` or ``processor``) named ``image`` exists.

    With a checkout's ``docker/build-images.sh`` the script runs (it skips the build while the
    image's inputs are unchanged, about a second); without it the image must exist.

    Raises:
        BrokerUnavailableError: the build failed, or there is no image and no script.
    """
    if script is None:
        if _image_present(image):
            return
        raise BrokerUnavailableError(
            f"image {image} is not on the Docker engine and no lockgate checkout "
            "(docker/build-images.sh) was found to build it; choose the official image "
            f"({ENV_MODE}=official) or an existing broker ({ENV_BOOTSTRAP}=host:port)"
        )
    var = "LOCKGATE_KAFKA_IMAGE" if kind == "kafka" else "LOCKGATE_PROCESSOR_IMAGE"
    done = subprocess.run(
        [str(script), kind],
        capture_output=True,
        text=True,
        env={**os.environ, var: image},
        timeout=1800,
        check=False,
    )
    if done.returncode != 0:
        tail = "\n".join(done.stderr.splitlines()[-30:])
        raise BrokerUnavailableError(f"{script} {kind} failed ({done.returncode}):\n{tail}")


# ----------------------------------------------------------------------------- ports


def _port_range(spec: str | None = None) -> tuple[int, int]:
    lo, _, hi = (spec or os.environ.get(ENV_PORTS, DEFAULT_PORTS)).partition("-")
    return int(lo), int(hi)


def _port_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


#: Ports this process handed out: two picks before either is bound never return the same
#: port (``lockgate_app(..., wait_ready=False)`` twice in a row), until the range is used up.
_handed_out: set[int] = set()


def free_port(count: int = 1, ports: str | None = None) -> int:
    """Return a port p such that p .. p+count-1 are free on 127.0.0.1 right now.

    Ports come from ``ports`` (``lo-hi``), else ``LOCKGATE_TEST_PLUGIN_PORTS`` (default
    21000-25999, below Linux's default ephemeral ports, so no outgoing connection takes
    it). A port is picked at random among the free ones (suites sharing the machine with
    the same range rarely pick the same), checked by binding it, and not handed out twice
    by this process while the range has others. A port another process binds between the
    pick and its use is a bind failure, which the broker start retries on another port.

    Raises:
        BrokerUnavailableError: no ``count`` consecutive free ports in the range.
    """
    lo, hi = _port_range(ports)
    candidates = list(range(lo, hi - count + 2))
    random.shuffle(candidates)
    for fresh_only in (True, False):
        tried = 0
        for port in candidates:
            span = range(port, port + count)
            if fresh_only and any(p in _handed_out for p in span):
                continue
            tried += 1
            if tried > 500:
                break
            if all(_port_free(p) for p in span):
                _handed_out.update(span)
                return port
    raise BrokerUnavailableError(f"no {count} consecutive free ports in {lo}-{hi} ({ENV_PORTS})")


# ----------------------------------------------------------------------------- broker


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


_live: list[Any] = []


@atexit.register
def _remove_leftovers() -> None:
    while _live:
        container = _live.pop()
        with contextlib.suppress(Exception):
            container.stop()


def _logs_of(container: Any) -> str:
    try:
        out, err = container.get_logs()
    except Exception as exc:  # noqa: BLE001 - logs are diagnostics only
        return f"<no logs: {exc}>"
    return bytes(out).decode(errors="replace") + bytes(err or b"").decode(errors="replace")


def _remove(container: Any) -> None:
    with contextlib.suppress(Exception):
        container.stop(force=True, delete_volume=True)
    with contextlib.suppress(ValueError):
        _live.remove(container)


def _graceful_stop(container: Any, timeout: float) -> int | None:
    """``docker stop`` (SIGTERM, SIGKILL after ``timeout``), remove; return the exit code."""
    code: int | None = None
    with contextlib.suppress(Exception):
        wrapped = container.get_wrapped_container()
        wrapped.stop(timeout=int(max(1, timeout)))
        wrapped.reload()
        code = int(wrapped.attrs["State"]["ExitCode"])
    _remove(container)
    return code


def _official_container(image: str, port: int) -> Any:
    """The official ``apache/kafka`` image, KRaft, its port published on 127.0.0.1:port."""
    tc = _testcontainers()
    env = {
        "KAFKA_NODE_ID": "1",
        "KAFKA_PROCESS_ROLES": "broker,controller",
        "KAFKA_LISTENERS": f"PLAINTEXT://0.0.0.0:{port},CONTROLLER://localhost:9093",
        "KAFKA_ADVERTISED_LISTENERS": f"PLAINTEXT://127.0.0.1:{port}",
        "KAFKA_CONTROLLER_LISTENER_NAMES": "CONTROLLER",
        "KAFKA_LISTENER_SECURITY_PROTOCOL_MAP": "CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT",
        "KAFKA_CONTROLLER_QUORUM_VOTERS": "1@localhost:9093",
        "KAFKA_OFFSETS_TOPIC_REPLICATION_FACTOR": "1",
        "KAFKA_TRANSACTION_STATE_LOG_REPLICATION_FACTOR": "1",
        "KAFKA_TRANSACTION_STATE_LOG_MIN_ISR": "1",
        "KAFKA_GROUP_INITIAL_REBALANCE_DELAY_MS": "0",
        "KAFKA_HEAP_OPTS": "-Xms256m -Xmx512m",
    }
    container = tc.DockerContainer(image, env=env).with_kwargs(labels={_LABEL: "kafka"})
    ports: dict[str, Any] = container.ports
    ports[f"{port}/tcp"] = ("127.0.0.1", port)
    return container


def _local_container(image: str, port: int) -> Any:
    """Lockgate's broker image on the host network (it listens on 127.0.0.1 only)."""
    tc = _testcontainers()
    env = {
        "KAFKA_PORT": str(port),
        "KAFKA_CONTROLLER_PORT": str(port + 1),
        "KAFKA_HEAP_OPTS": "-Xms256m -Xmx512m",
        # C1 only: the JVM starts markedly faster on a busy machine; test loads are small.
        "KAFKA_JAVA_OPTS": "-XX:TieredStopAtLevel=1",
    }
    return tc.DockerContainer(image, env=env).with_kwargs(
        network_mode="host", labels={_LABEL: "kafka"}
    )


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


# ----------------------------------------------------------------------------- topics


def _unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


class TopicFactory:
    """Creates topics for one test (the ``lockgate_topics`` fixture).

    Call it with ``{logical name: partitions}``; it returns ``{logical name: real name}``.
    Real names are the logical ones plus a random suffix (``unique=False`` keeps them), so
    tests sharing the session broker never see each other's records.
    """

    def __init__(self, kafka: LockgateKafka) -> None:
        self._kafka = kafka

    def __call__(
        self,
        topics: Mapping[str, int],
        *,
        config: Mapping[str, str] | None = None,
        unique: bool = True,
    ) -> dict[str, str]:
        """Create the topics; return ``{logical name: real name}``.

        Args:
            topics: partitions per topic.
            config: topic configs for all of them (e.g. ``{"cleanup.policy": "compact"}``).
            unique: add a random suffix to each name.

        Raises:
            RuntimeError: a topic exists already (with ``unique=False``).
        """
        names = {t: _unique(t) if unique else t for t in topics}
        self._kafka.create_topics({names[t]: n for t, n in topics.items()}, config=config)
        return names


# ----------------------------------------------------------------------------- apps


def _find_spec(app: App | str) -> str:
    """``module:attribute`` of an app object (searched in the loaded modules) or the spec."""
    if isinstance(app, str):
        if ":" not in app:
            raise ValueError(f"app spec {app!r} must look like 'package.module:app'")
        return app
    home = getattr(app, "defined_in", None)  # the module that created it, first
    modules = list(sys.modules.items())
    if home is not None and home in sys.modules:
        modules.insert(0, (home, sys.modules[home]))
    for name, module in modules:
        if name == "__main__" or module is None:
            continue
        for attr, value in list(vars(module).items()):
            if value is app and not attr.startswith("_"):
                return f"{name}:{attr}"
    raise ValueError(
        f"the App {getattr(app, 'name', app)!r} is not a module-level name of any imported "
        "module: pass 'package.module:app' (the app runs in its own process and imports it)"
    )


def _http_ready(port: int, path: str = "/readyz") -> bool:
    try:
        url = f"http://127.0.0.1:{port}{path}"
        with urllib.request.urlopen(url, timeout=2) as resp:  # noqa: S310 - loopback http
            return int(resp.status) == 200
    except (urllib.error.URLError, OSError):
        return False


class AppRun:
    """One running instance of an app (a ``lockgate run`` process or a processor container).

    Attributes:
        spec: ``module:app``.
        app_name: ``LOCKGATE_APP_NAME`` (consumer group, changelog and DLQ prefix).
        http_port: the port of /livez /readyz /metrics on 127.0.0.1.
        env: the ``LOCKGATE_*`` environment the plugin set (plus the caller's ``env``).
        returncode: the exit code once it exited (137 or -9 after :meth:`kill`), else None.
        settled: the test stopped or killed it (or was told it failed to start): the
            fixture's teardown leaves it alone.
    """

    def __init__(self, spec: str, app_name: str, http_port: int, env: dict[str, str]) -> None:
        self.spec = spec
        self.app_name = app_name
        self.http_port = http_port
        self.env = env
        self.returncode: int | None = None
        self.settled = False

    @property
    def alive(self) -> bool:
        """Whether it is still running."""
        raise NotImplementedError

    def logs(self) -> str:
        """Its output (stdout and stderr) so far."""
        raise NotImplementedError

    def stop(self, timeout: float = 60.0) -> int | None:
        """SIGTERM (the app commits its epoch and leaves), wait; return the exit code.

        0 is a clean stop. After ``timeout`` seconds it is killed.
        """
        raise NotImplementedError

    def kill(self) -> None:
        """SIGKILL at once, like ``kill -9`` (uncommitted work is lost, not duplicated)."""
        raise NotImplementedError

    def ready(self) -> bool:
        """Whether ``/readyz`` answers 200 (group joined, key groups restored)."""
        return _http_ready(self.http_port)

    def wait_ready(self, timeout: float = 60.0) -> None:
        """Wait until :meth:`ready`.

        Raises:
            RuntimeError: it exited first (the message has its exit code and log tail).
            TimeoutError: not ready within ``timeout`` seconds (with the log tail).
        """
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.ready():
                return
            if not self.alive:
                raise RuntimeError(
                    f"lockgate run {self.spec} exited with code {self.returncode} before it "
                    f"was ready:\n{self.logs()[-4000:]}"
                )
            time.sleep(0.2)
        raise TimeoutError(
            f"lockgate run {self.spec} not ready within {timeout:.0f}s:\n{self.logs()[-4000:]}"
        )


class _ProcessRun(AppRun):
    """``lockgate run`` as a subprocess of the test."""

    def __init__(
        self,
        spec: str,
        app_name: str,
        http_port: int,
        env: dict[str, str],
        log_path: Path,
        cwd: Path,
    ) -> None:
        super().__init__(spec, app_name, http_port, env)
        self.log_path = log_path
        self._log: IO[bytes] | None = open(log_path, "ab")  # noqa: SIM115 - closed on exit
        paths = [p for p in sys.path if p and Path(p).is_dir()]
        if os.environ.get("PYTHONPATH"):
            paths.insert(0, os.environ["PYTHONPATH"])
        full = {**os.environ, "PYTHONPATH": os.pathsep.join(paths), **env}
        lockgate = Path(sys.executable).parent / "lockgate"
        cmd = (
            [str(lockgate), "run", spec]
            if lockgate.exists()
            else [sys.executable, "-c", "from processors.cli import main; main()", "run", spec]
        )
        self.proc = subprocess.Popen(
            cmd, cwd=cwd, env=full, stdout=self._log, stderr=subprocess.STDOUT
        )

    @property
    def alive(self) -> bool:
        """Whether the process still runs."""
        code = self.proc.poll()
        if code is not None:
            self._closed(code)
        return code is None

    def _closed(self, code: int) -> None:
        self.returncode = code
        if self._log is not None:
            self._log.close()
            self._log = None

    def logs(self) -> str:
        """The process output so far."""
        try:
            return self.log_path.read_text(errors="replace")
        except OSError:
            return ""

    def stop(self, timeout: float = 60.0) -> int | None:
        """SIGTERM, wait up to ``timeout`` s (then SIGKILL); return the exit code."""
        self.settled = True
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        self._closed(int(self.proc.returncode))
        return self.returncode

    def kill(self) -> None:
        """SIGKILL and reap the process."""
        self.settled = True
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(10)
        self._closed(int(self.proc.returncode))


class _ContainerRun(AppRun):
    """The processor image (entrypoint ``lockgate``) on the host network."""

    def __init__(
        self, spec: str, app_name: str, http_port: int, env: dict[str, str], image: str
    ) -> None:
        super().__init__(spec, app_name, http_port, env)
        tc = _testcontainers()
        self.image = image
        self.container = (
            tc.DockerContainer(image, env=env)
            .with_kwargs(network_mode="host", labels={_LABEL: "processor"})
            .with_command(["run", spec])
        )
        self.container.start()
        _live.append(self.container)

    @property
    def alive(self) -> bool:
        """Whether the container still runs."""
        try:
            wrapped = self.container.get_wrapped_container()
            wrapped.reload()
        except Exception:  # noqa: BLE001 - removed
            return False
        if wrapped.status in ("exited", "dead"):
            self.returncode = int(wrapped.attrs["State"]["ExitCode"])
            return False
        return True

    def logs(self) -> str:
        """The container output so far."""
        return _logs_of(self.container)

    def stop(self, timeout: float = 60.0) -> int | None:
        """``docker stop`` (SIGTERM, SIGKILL after ``timeout``), remove; return the exit code."""
        self.settled = True
        if self.returncode is None or self.alive:
            self.returncode = _graceful_stop(self.container, timeout)
        return self.returncode

    def kill(self) -> None:
        """SIGKILL and remove the container."""
        self.settled = True
        with contextlib.suppress(Exception):
            self.container.get_wrapped_container().kill(signal="SIGKILL")
        self.returncode = 137
        _remove(self.container)


class AppFactory:
    """Runs apps against the ``lockgate_kafka`` broker (the ``lockgate_app`` fixture).

    Every app started through it is stopped with SIGTERM at the end of the test; with
    ``check_exit`` (default) a non-zero exit at that stop fails the test's teardown with the
    app's log.
    """

    def __init__(self, kafka: LockgateKafka, tmp_path: Path, cwd: Path) -> None:
        self._kafka = kafka
        self._tmp = tmp_path
        self._cwd = cwd
        self.runs: list[AppRun] = []

    def __call__(
        self,
        app: App | str,
        env: Mapping[str, str] | None = None,
        *,
        app_name: str | None = None,
        instance_id: str | None = None,
        image: str | None = None,
        checkpoint_interval_ms: int = 200,
        wait_ready: bool = True,
        ready_timeout: float = 60.0,
    ) -> AppRun:
        """Start one instance of ``app`` and (by default) wait until it is ready.

        The instance gets ``LOCKGATE_BOOTSTRAP_SERVERS`` (the broker), ``LOCKGATE_APP_NAME``
        (``app_name``, default the App's name plus a random suffix, so each test has its own
        consumer group and state topics), ``LOCKGATE_INSTANCE_ID``, ``LOCKGATE_STATE_DIR``
        (under the test's tmp_path; not set for containers), ``LOCKGATE_HTTP_PORT`` and
        ``LOCKGATE_HTTP_HOST`` (127.0.0.1), ``LOCKGATE_CHECKPOINT_INTERVAL_MS`` and
        ``LOCKGATE_LOG_FORMAT=console``; ``env`` is applied last and wins.

        Args:
            app: ``"package.module:app"``, or the App object itself (it must be a
                module-level name of an imported module: the app runs in its own process).
            env: more environment (e.g. the app's topic variables).
            app_name: fixes ``LOCKGATE_APP_NAME``; pass the same name to a second instance
                or a restart to share the group and its state.
            instance_id: ``LOCKGATE_INSTANCE_ID`` (default ``i1``, ``i2``, ... per name).
            image: run the processor image (entrypoint ``lockgate``, host network) instead of
                a local ``lockgate run`` process; the image must contain the app's module.
            checkpoint_interval_ms: epochs commit this often (outputs become visible to
                read_committed consumers at each commit).
            wait_ready: wait for ``/readyz`` before returning.
            ready_timeout: seconds for that wait.

        Returns:
            The running instance.

        Raises:
            RuntimeError: the app exited before it was ready (with its exit code and log).
            TimeoutError: not ready in time (with its log).
        """
        spec = _find_spec(app)
        module = spec.split(":")[0].rsplit(".", 1)[-1]
        base = getattr(app, "name", None) or re.sub(r"[^A-Za-z0-9-]", "-", module)
        name = app_name or _unique(str(base))
        same = [r for r in self.runs if r.app_name == name]
        instance = instance_id or f"i{len(same) + 1}"
        port = free_port()
        plugin_env = {
            "LOCKGATE_BOOTSTRAP_SERVERS": self._kafka.bootstrap,
            "LOCKGATE_APP_NAME": name,
            "LOCKGATE_INSTANCE_ID": instance,
            "LOCKGATE_HTTP_PORT": str(port),
            "LOCKGATE_HTTP_HOST": "127.0.0.1",
            "LOCKGATE_CHECKPOINT_INTERVAL_MS": str(checkpoint_interval_ms),
            "LOCKGATE_LOG_FORMAT": "console",
        }
        run: AppRun
        if image is None:
            state = self._tmp / f"{name}-{instance}"
            state.mkdir(parents=True, exist_ok=True)
            plugin_env["LOCKGATE_STATE_DIR"] = str(state / "state")
            full = {**plugin_env, **(env or {})}
            log = state / "app.log"
            run = _ProcessRun(spec, name, port, full, log, self._cwd)
        else:
            full = {**plugin_env, **(env or {})}
            run = _ContainerRun(spec, name, port, full, image)
        self.runs.append(run)
        if wait_ready:
            try:
                run.wait_ready(ready_timeout)
            except (RuntimeError, TimeoutError):
                run.stop(10)  # the error tells the test; teardown leaves it be
                raise
        return run

    def stop_all(self, timeout: float = 60.0) -> list[str]:
        """Stop every instance the test did not stop or kill; return what went wrong.

        A problem is an instance that exits non-zero on SIGTERM, or one that had exited by
        itself with a non-zero code during the test (e.g. a crash the test did not notice);
        each comes with the instance's log tail.
        """
        problems = []
        for run in reversed(self.runs):
            if run.settled:
                continue
            who = f"{run.spec} ({run.app_name}/{run.env.get('LOCKGATE_INSTANCE_ID')})"
            if not run.alive:
                code = run.returncode
                run.stop(timeout)  # release its log file or container
                if code not in (0, None):
                    problems.append(
                        f"{who} exited by itself with code {code} during the test:\n"
                        f"{run.logs()[-3000:]}"
                    )
                continue
            code = run.stop(timeout)
            if code not in (0, None):
                problems.append(f"{who} exited with {code} on SIGTERM:\n{run.logs()[-3000:]}")
        return problems


# ----------------------------------------------------------------------------- fixtures

_SUMMARY = pytest.StashKey[str]()


def pytest_terminal_summary(
    terminalreporter: pytest.TerminalReporter, config: pytest.Config
) -> None:
    """Say which broker ``lockgate_kafka`` used (when a test used it)."""
    line = config.stash.get(_SUMMARY, None)
    if line:
        terminalreporter.write_line(line)


def kafka_for(config: pytest.Config) -> Iterator[LockgateKafka]:
    """The body of ``lockgate_kafka``: choose and start the broker, yield it, remove it.

    Use it to give the broker another scope, e.g. in a ``conftest.py``::

        @pytest.fixture(scope="package")
        def lockgate_kafka(request):
            yield from kafka_for(request.config)

    Fails the requesting test (not a skip) with the reason when no broker can be provided.
    """
    choice = choose_broker(
        _option(config, "lockgate_kafka", ENV_MODE),
        _option(config, "lockgate_kafka_image", ENV_IMAGE),
        _option(config, "lockgate_bootstrap", ENV_BOOTSTRAP),
        rootdir=config.rootpath,
    )
    try:
        kafka = start_kafka(choice)
    except BrokerUnavailableError as exc:
        pytest.fail(f"lockgate_kafka ({choice.mode}): {exc}", pytrace=False)
    config.stash[_SUMMARY] = (
        f"lockgate_kafka: {kafka.mode} broker{' ' + kafka.image if kafka.image else ''}"
        f" at {kafka.bootstrap} (ready in {kafka.startup_seconds:.1f} s)"
    )
    try:
        yield kafka
    finally:
        kafka.stop()


@pytest.fixture(scope="session")
def lockgate_kafka(request: pytest.FixtureRequest) -> Iterator[LockgateKafka]:
    """A single-node Kafka broker for the test session (see the module docstring for modes).

    Fails (not skips) with the reason when no broker can be provided.
    """
    yield from kafka_for(request.config)


@pytest.fixture
def lockgate_topics(lockgate_kafka: LockgateKafka) -> TopicFactory:
    """Create topics on the session broker: ``lockgate_topics({"in": 4, "out": 4})``."""
    return TopicFactory(lockgate_kafka)


@pytest.fixture
def lockgate_app(
    lockgate_kafka: LockgateKafka, tmp_path: Path, request: pytest.FixtureRequest
) -> Iterator[AppFactory]:
    """Run apps against the session broker; all are stopped (SIGTERM) after the test."""
    factory = AppFactory(lockgate_kafka, tmp_path, request.config.rootpath)
    yield factory
    problems = factory.stop_all()
    if problems:
        pytest.fail("\n\n".join(problems), pytrace=False)
