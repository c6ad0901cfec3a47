"""Container helpers for the tests in tests/containers (and anything else that needs images).

Everything runs on the host network: the engine here is started with ``--bridge=none`` (see
docker/ensure-engine.sh), the Kafka image listens on 127.0.0.1 only, and every port these
helpers pick comes from tests/support/ports.py (``LOCKGATE_TEST_PORT_RANGE``).

* :func:`ensure_images` builds ``lockgate/processor:dev`` and ``lockgate/kafka:dev`` once per
  test process (docker/build-images.sh: engine, local base image, skip when up to date).
* The Kafka broker is the shipped pytest plugin's (processors/pytest_plugin.py): tests use
  its session fixture ``lockgate_kafka``; :func:`kafka_container` / :func:`start_kafka` start
  one outside a fixture (the plugin's ``local`` mode: this image on the host network, ready
  once the group and transaction coordinators answer).
* :func:`processor_container` / :func:`start_processor` run the processor image with the given
  arguments and environment; :func:`run_processor` runs it to completion.

Testcontainers' reaper (Ryuk) is an image from a registry, which this machine cannot reach, so
it is turned off unless ``TESTCONTAINERS_RYUK_DISABLED`` says otherwise; containers started here
are removed by their handles and, as a fallback, when the Python process exits.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import shutil
import subprocess
import threading
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any

from testcontainers.core.config import testcontainers_config
from testcontainers.core.container import DockerContainer
from testcontainers.core.wait_strategies import LogMessageWaitStrategy

from processors.pytest_plugin import BrokerChoice, LockgateKafka
from processors.pytest_plugin import start_kafka as plugin_start_kafka
from processors.pytest_plugin import wait_kafka_ready as wait_kafka_ready  # re-exported
from tests.support import ports

ROOT = Path(__file__).resolve().parents[2]
BUILD_SCRIPT = ROOT / "docker" / "build-images.sh"

PROCESSOR_IMAGE = os.environ.get("LOCKGATE_PROCESSOR_IMAGE", "lockgate/processor:dev")
KAFKA_IMAGE = os.environ.get("LOCKGATE_KAFKA_IMAGE", "lockgate/kafka:dev")

TEST_LABEL = "io.lockgate.test"

if "TESTCONTAINERS_RYUK_DISABLED" not in os.environ:
    testcontainers_config.ryuk_disabled = True


class ImagesUnavailableError(RuntimeError):
    """The engine could not be started or an image could not be built."""


# ----------------------------------------------------------------------------- images

_images_lock = threading.Lock()
_images: tuple[str, str] | None = None


def docker_available() -> bool:
    """Return True if a Docker engine answers right now (does not start one)."""
    if shutil.which("docker") is None:
        return False
    try:
        done = subprocess.run(["docker", "info"], capture_output=True, timeout=20, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return done.returncode == 0


def ensure_images(*, force: bool = False, timeout: float = 1800.0) -> tuple[str, str]:
    """Build (or find up to date) the processor and Kafka images; return their names.

    Runs docker/build-images.sh at most once per process (again only with ``force``). The
    script starts the engine if needed, builds the local base image on first use, and skips
    images whose inputs did not change, so a warm call costs about a second.

    Returns:
        ``(processor_image, kafka_image)``.

    Raises:
        ImagesUnavailableError: the script failed or timed out; the message carries the tail
            of its output.
    """
    global _images
    with _images_lock:
        if _images is not None and not force:
            return _images
        cmd = [str(BUILD_SCRIPT)]
        if force:
            cmd.append("--force")
        env = {
            **os.environ,
            "LOCKGATE_PROCESSOR_IMAGE": PROCESSOR_IMAGE,
            "LOCKGATE_KAFKA_IMAGE": KAFKA_IMAGE,
        }
        try:
            done = subprocess.run(
                cmd, capture_output=True, text=True, timeout=timeout, env=env, check=False
            )
        except subprocess.TimeoutExpired as exc:
            raise ImagesUnavailableError(f"{BUILD_SCRIPT} timed out after {timeout:.0f}s") from exc
        if done.returncode != 0:
            tail = "\n".join((done.stderr or "").splitlines()[-40:])
            raise ImagesUnavailableError(
                f"{BUILD_SCRIPT} failed with exit code {done.returncode}:\n{tail}"
            )
        _images = (PROCESSOR_IMAGE, KAFKA_IMAGE)
        return _images


# ----------------------------------------------------------------------------- ports


def free_port(count: int = 1) -> int:
    """Return a port p in the test range such that p .. p+count-1 are free on 127.0.0.1.

    The test range (:mod:`tests.support.ports`) is apart from the plugin's. A port is only
    free when it is checked: start the user quickly, and retry on a bind failure (the Kafka
    helpers do).
    """
    return ports.free_port(count)


# ----------------------------------------------------------------------------- cleanup

_live: dict[str, DockerContainer] = {}
_live_lock = threading.Lock()


def _track(container: DockerContainer) -> None:
    with _live_lock:
        _live[container.get_wrapped_container().id] = container


def _untrack(container: DockerContainer) -> None:
    wrapped = container._container  # None if it never got created
    if wrapped is not None:
        with _live_lock:
            _live.pop(wrapped.id, None)


@atexit.register
def _remove_leftovers() -> None:
    with _live_lock:
        leftovers = list(_live.values())
        _live.clear()
    for container in leftovers:
        with contextlib.suppress(Exception):
            container.stop()


def _remove(container: DockerContainer) -> None:
    """Remove a container (SIGKILL if still running) and its anonymous volumes."""
    try:
        container.stop(force=True, delete_volume=True)
    except Exception:  # noqa: BLE001 - already gone is fine
        pass
    finally:
        _untrack(container)


def _logs(container: DockerContainer) -> str:
    try:
        out, err = container.get_logs()
    except Exception as exc:  # noqa: BLE001 - logs are diagnostics only
        return f"<no logs: {exc}>"
    text = out.decode(errors="replace")
    if err:
        text += err.decode(errors="replace")
    return text


def _graceful_stop(container: DockerContainer, timeout: float) -> int | None:
    """`docker stop` (SIGTERM, SIGKILL after ``timeout``); return the exit code."""
    wrapped = container.get_wrapped_container()
    with contextlib.suppress(Exception):
        wrapped.stop(timeout=int(max(1, timeout)))
    try:
        wrapped.reload()
        code = wrapped.attrs["State"]["ExitCode"]
    except Exception:  # noqa: BLE001 - removed already
        return None
    return int(code)


# ----------------------------------------------------------------------------- kafka
# The broker comes from the shipped pytest plugin (processors/pytest_plugin.py): tests take
# its session fixture ``lockgate_kafka``; these wrappers are for code outside a fixture.


def start_kafka(*, image: str | None = None, startup_timeout: float = 120.0) -> LockgateKafka:
    """Start the Kafka image (host network, 127.0.0.1) with the plugin's ``local`` mode.

    Ports come from the plugin's range (``LOCKGATE_TEST_PLUGIN_PORTS``). Remove it with
    :meth:`LockgateKafka.stop` (or use :func:`kafka_container`).
    """
    choice = BrokerChoice("local", image=image or KAFKA_IMAGE, build_script=BUILD_SCRIPT)
    return plugin_start_kafka(choice, startup_timeout=startup_timeout)


@contextlib.contextmanager
def kafka_container(**kwargs: Any) -> Iterator[LockgateKafka]:
    """Context manager around :func:`start_kafka`; removes the broker on exit."""
    broker = start_kafka(**kwargs)
    try:
        yield broker
    finally:
        broker.stop()


# ----------------------------------------------------------------------------- processor


@dataclass
class ProcessorRun:
    """A processor container that ran to completion."""

    exit_code: int
    output: str


@dataclass
class Processor:
    """A running processor container (host network).

    ``http_port`` is the port of /livez /readyz /startupz /metrics (``LOCKGATE_HTTP_PORT``).
    """

    container: DockerContainer
    http_port: int
    env: dict[str, str] = field(default_factory=dict)

    @property
    def id(self) -> str:
        """Container id."""
        return str(self.container.get_wrapped_container().id)

    def logs(self) -> str:
        """Processor stdout and stderr so far."""
        return _logs(self.container)

    def status(self) -> str:
        """Docker status: created, running, exited, ..."""
        wrapped = self.container.get_wrapped_container()
        wrapped.reload()
        return str(wrapped.status)

    def wait(self, timeout: float) -> int:
        """Wait for the container to exit by itself; return its exit code."""
        result = self.container.get_wrapped_container().wait(timeout=timeout)
        return int(result["StatusCode"])

    def signal(self, sig: str) -> None:
        """Send a signal (e.g. ``"SIGTERM"``, ``"SIGKILL"``, ``"SIGSTOP"``) to PID 1."""
        self.container.get_wrapped_container().kill(signal=sig)

    def stop(self, timeout: float = 30.0, *, remove: bool = True) -> int | None:
        """`docker stop`: SIGTERM, SIGKILL after ``timeout``; return the exit code.

        With ``remove`` (default) the container is removed afterwards; named volumes stay.
        """
        code = _graceful_stop(self.container, timeout)
        if remove:
            _remove(self.container)
        return code

    def remove(self) -> None:
        """Remove the container now (SIGKILL if it still runs)."""
        _remove(self.container)


def _processor_container(
    args: Sequence[str],
    env: Mapping[str, str] | None,
    image: str | None,
    state_volume: str | None,
    name: str | None,
    http_port: int | None,
) -> tuple[DockerContainer, int, dict[str, str]]:
    full_env = dict(env or {})
    if "LOCKGATE_HTTP_PORT" in full_env:
        port = int(full_env["LOCKGATE_HTTP_PORT"])
    else:
        port = http_port if http_port is not None else free_port()
        full_env["LOCKGATE_HTTP_PORT"] = str(port)
    container = DockerContainer(image or PROCESSOR_IMAGE, env=full_env).with_kwargs(
        network_mode="host", labels={TEST_LABEL: "processor"}
    )
    if args:
        container = container.with_command(list(args))
    if name:
        container = container.with_name(name)
    if state_volume:
        container = container.with_volume_mapping(state_volume, "/var/lib/lockgate", "rw")
    return container, port, full_env


def start_processor(
    args: Sequence[str] = (),
    env: Mapping[str, str] | None = None,
    *,
    image: str | None = None,
    state_volume: str | None = None,
    name: str | None = None,
    http_port: int | None = None,
    wait_for_log: str | None = None,
    startup_timeout: float = 60.0,
) -> Processor:
    """Start the processor image on the host network.

    Args:
        args: arguments after the ``lockgate`` entrypoint, e.g.
            ``["run", "examples.running_sum:app"]``.
        env: environment, e.g. ``{"LOCKGATE_BOOTSTRAP_SERVERS": broker.bootstrap}``.
        image: image to run; default :data:`PROCESSOR_IMAGE`.
        state_volume: a Docker *named* volume mounted on /var/lib/lockgate (the state dir's
            parent); it survives the container, so a restart with the same name keeps state.
            Remove it with :func:`remove_volume`. (A host directory would be owned by root,
            and the image runs as uid 10001.)
        name: container name (default: Docker picks one).
        http_port: ``LOCKGATE_HTTP_PORT``; default a free port in the test range unless
            ``env`` sets it.
        wait_for_log: a regex to wait for in the output before returning.
        startup_timeout: seconds to wait for ``wait_for_log``.

    Returns:
        The running container's handle; stop it with :meth:`Processor.stop` or use
        :func:`processor_container`.
    """
    container, port, full_env = _processor_container(
        args, env, image, state_volume, name, http_port
    )
    if wait_for_log:
        container = container.waiting_for(
            LogMessageWaitStrategy(wait_for_log).with_startup_timeout(
                timedelta(seconds=startup_timeout)
            )
        )
    try:
        container.start()
    except Exception:
        _remove(container)
        raise
    _track(container)
    return Processor(container=container, http_port=port, env=full_env)


@contextlib.contextmanager
def processor_container(
    args: Sequence[str] = (), env: Mapping[str, str] | None = None, **kwargs: Any
) -> Iterator[Processor]:
    """Context manager around :func:`start_processor`; stops (SIGTERM) and removes on exit."""
    proc = start_processor(args, env, **kwargs)
    try:
        yield proc
    finally:
        proc.stop()


def run_processor(
    args: Sequence[str] = (),
    env: Mapping[str, str] | None = None,
    *,
    image: str | None = None,
    timeout: float = 120.0,
    entrypoint: str | None = None,
) -> ProcessorRun:
    """Run the processor image to completion (e.g. ``["--help"]``); return code and output.

    ``entrypoint`` replaces ``lockgate`` (e.g. ``"python"`` with ``args=["-c", "..."]``).
    """
    kwargs: dict[str, Any] = {"network_mode": "host", "labels": {TEST_LABEL: "processor-run"}}
    if entrypoint:
        kwargs["entrypoint"] = [entrypoint]
    container = DockerContainer(image or PROCESSOR_IMAGE, env=dict(env or {})).with_kwargs(**kwargs)
    if args:
        container = container.with_command(list(args))
    try:
        container.start()
        _track(container)
        code = int(container.get_wrapped_container().wait(timeout=timeout)["StatusCode"])
        return ProcessorRun(exit_code=code, output=_logs(container))
    finally:
        _remove(container)


def remove_volume(name: str) -> None:
    """Remove a named volume (ignore a missing one)."""
    subprocess.run(["docker", "volume", "rm", "-f", name], capture_output=True, check=False)
