"""Docker for the plugin: the engine, lockgate's images, and the containers it starts.

Owns the testcontainers import (failing with the extra to install), the Docker engine
check, building lockgate's images from a checkout, the broker containers' definitions
(official and local image), and the containers' removal (at the latest at exit).
"""

from __future__ import annotations

import atexit
import contextlib
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

from processors._testing.choice import (
    ENV_BOOTSTRAP,
    ENV_MODE,
    INSTALL_HINT,
    BrokerUnavailableError,
    _image_present,
)

_LABEL = "io.lockgate.pytest-plugin"


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
