"""The harness's own Kafka broker (docker/kafka/broker.sh on its own port)."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

from benchmarks.paths import CACHE, MAIN_PY, ROOT
from benchmarks.progress import say

BROKER_SH = ROOT / "docker" / "kafka" / "broker.sh"


def data_dir(port: int, under: Path | None = None) -> Path:
    """The data dir of the broker on ``port``: ``under/kafka-<port>``, by default in
    .cache/bench (it holds server.properties, server.log, broker.pid and the topics)."""
    return (under or CACHE) / f"kafka-{port}"


def _env(port: int, group_join_delay_ms: int = 0, under: Path | None = None) -> dict[str, str]:
    env = dict(os.environ)
    env.update(
        {
            "LOCKGATE_KAFKA_GROUP_INITIAL_REBALANCE_DELAY_MS": str(group_join_delay_ms),
            "LOCKGATE_KAFKA_PORT": str(port),
            "LOCKGATE_KAFKA_CONTROLLER_PORT": str(port + 1),
            "LOCKGATE_KAFKA_DATA_DIR": str(data_dir(port, under)),
            "LOCKGATE_KAFKA_HEAP": "-Xms512m -Xmx1g",
            "LOCKGATE_KAFKA_PYTHON": str(MAIN_PY),
        }
    )
    return env


def up(port: int, group_join_delay_ms: int = 0, under: Path | None = None) -> str:
    """Start a fresh broker on ``port`` (wipes its data dir); return the bootstrap address.

    ``group_join_delay_ms``: the broker's ``group.initial.rebalance.delay.ms`` (how long
    a new group waits for more members before its first assignment; Kafka's default is
    3000, the test broker's 0). ``under``: the folder of its data dir (:func:`data_dir`);
    :func:`down` and :func:`broker_pid` must be given the same. Raises
    ``subprocess.CalledProcessError`` / ``TimeoutExpired`` when it does not come up.
    """
    say(f"starting a fresh Kafka broker on 127.0.0.1:{port} (controller {port + 1})")
    out = subprocess.run(
        [str(BROKER_SH), "up", "--fresh"],
        env=_env(port, group_join_delay_ms, under),
        check=True,
        stdout=subprocess.PIPE,
        text=True,
        timeout=300,
    )
    return out.stdout.strip().splitlines()[-1]


def down(port: int, under: Path | None = None) -> None:
    """Stop the broker on ``port`` (only the one this harness started: same data dir)."""
    say(f"stopping the Kafka broker on 127.0.0.1:{port}")
    subprocess.run([str(BROKER_SH), "down"], env=_env(port, under=under), check=False, timeout=120)


def broker_pid(port: int, under: Path | None = None) -> int | None:
    """Return the broker's pid (for CPU accounting), if known."""
    try:
        return int((data_dir(port, under) / "broker.pid").read_text().strip())
    except (OSError, ValueError):
        return None


def kafka_version() -> str:
    """The Kafka version broker.sh runs (from its pom)."""
    pom = (ROOT / "docker" / "kafka" / "pom.xml").read_text()
    found = re.search(r"<kafka\.version>([^<]+)</kafka\.version>", pom)
    return found.group(1) if found else "?"
