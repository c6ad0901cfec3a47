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

from collections.abc import Iterator
from pathlib import Path

import pytest

from processors._testing import choice as _choice
from processors._testing.apps import AppFactory, AppRun
from processors._testing.apps import _find_spec as _find_spec
from processors._testing.broker import (
    LockgateKafka,
    OutputRecord,
    start_kafka,
    wait_kafka_ready,
)
from processors._testing.choice import (
    ENV_BOOTSTRAP,
    ENV_IMAGE,
    ENV_MODE,
    MODES,
    BrokerUnavailableError,
    _option,
    choose_broker,
)
from processors._testing.choice import (
    BrokerChoice as BrokerChoice,
)
from processors._testing.containers import _official_container as _official_container
from processors._testing.containers import build_local_image as build_local_image
from processors._testing.ports import DEFAULT_PORTS as DEFAULT_PORTS
from processors._testing.ports import ENV_PORTS as ENV_PORTS
from processors._testing.ports import _port_free as _port_free
from processors._testing.ports import _port_range as _port_range
from processors._testing.ports import free_port as free_port
from processors._testing.topics import TopicFactory

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

# Bound here again (the same objects): the API reference reads the descriptions of a
# module's data from its own source.
#: The official Apache Kafka image run in ``official`` mode (the Kafka version lockgate's
#: own broker image is built from).
OFFICIAL_IMAGE = _choice.OFFICIAL_IMAGE
#: lockgate's broker image (``docker/build-images.sh kafka``) run in ``local`` mode.
LOCAL_IMAGE = _choice.LOCAL_IMAGE
#: lockgate's processor image (``docker/build-images.sh processor``); a default for
#: :meth:`AppFactory.__call__` ``image=`` is not assumed, this is what the project builds.
PROCESSOR_IMAGE = _choice.PROCESSOR_IMAGE


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
