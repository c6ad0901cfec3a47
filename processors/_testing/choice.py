"""Which broker the ``lockgate_kafka`` fixture provides: modes, images, and the choice.

Owns the broker images and modes, the environment twins of the ``--lockgate-*`` options
(``LOCKGATE_TEST_KAFKA``, ``LOCKGATE_TEST_KAFKA_IMAGE``, ``LOCKGATE_TEST_BOOTSTRAP``),
:class:`BrokerChoice` and :func:`choose_broker`, and :class:`BrokerUnavailableError`, the
error of every part of the plugin that cannot provide a broker.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

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

MODES = ("auto", "external", "official", "local")
INSTALL_HINT = "pip install 'lockgate[testing]'"


class BrokerUnavailableError(RuntimeError):
    """No broker could be provided: no Docker engine, image missing or broken, or a timeout.

    The message says what was tried and how to choose another broker.
    """


@dataclass(frozen=True)
class BrokerChoice:
    """What ``lockgate_kafka`` starts: ``mode`` is external, official, confluent or local."""

    mode: str
    image: str | None = None
    bootstrap: str | None = None
    build_script: Path | None = None


def _build_script(rootdir: Path | None) -> Path | None:
    """``docker/build-images.sh`` of a lockgate checkout (the test root or this package's)."""
    here = Path(__file__).resolve().parents[2]
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
