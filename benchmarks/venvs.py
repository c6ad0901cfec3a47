"""One virtualenv per peer / tool under .cache/bench/venvs/<name>, with pinned versions.

The peers pin their own (older) confluent-kafka and pydantic, so they never share the
project's .venv. A venv is rebuilt when its pin list changes (stamp file).
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

from benchmarks.paths import VENVS
from benchmarks.progress import say

PINS: dict[str, list[str]] = {
    "quix": [
        "quixstreams==3.28.1",
        "confluent-kafka==2.12.2",
        "rocksdict==0.3.29",
        "orjson==3.13.0",
    ],
    "faust": [
        "faust-streaming==0.15.3",
        "aiokafka[lz4]==0.14.0",  # lz4 via cramjam: the inputs are lz4-compressed
        "mode-streaming==0.7.1",
        "cramjam==2.14.0",
        "rocksdict==0.3.29",  # Faust's rocksdb:// store uses rocksdict when installed
        "orjson==3.13.0",  # Faust's json codec uses orjson when installed
        "uvloop==0.23.0",  # the worker runs with --loop=uvloop
    ],
    "plot": ["matplotlib==3.11.2"],
    "pyspy": ["py-spy==0.4.3"],
    # Flink peer (benchmarks/flink.py): PyFlink bundles the Flink runtime jars; the Kafka
    # SQL connector jar comes from Maven (benchmarks/nexmark/pom.xml).
    "flink": ["apache-flink==2.3.0"],
}

#: The packages whose versions RESULTS.md lists per venv.
KEY_PACKAGES = {
    "quix": ["quixstreams", "confluent-kafka", "rocksdict", "orjson", "pydantic"],
    "faust": ["faust-streaming", "aiokafka", "mode-streaming", "rocksdict", "orjson", "uvloop"],
    "plot": ["matplotlib"],
    "pyspy": ["py-spy"],
    "flink": ["apache-flink", "apache-flink-libraries", "apache-beam"],
}


def python(name: str) -> Path:
    """The interpreter of venv ``name``."""
    return VENVS / name / "bin" / "python"


def _base_python() -> str:
    # The project's interpreter (3.11), so every system runs on the same Python.
    return getattr(sys, "_base_executable", None) or shutil.which("python3.11") or "python3"


def ensure(name: str) -> None:
    """Create or update venv ``name`` with its pins (no-op when the stamp matches)."""
    venv = VENVS / name
    stamp = venv / ".bench-pins"
    want = "\n".join(PINS[name]) + "\n"
    if stamp.exists() and stamp.read_text() == want and python(name).exists():
        return
    say(f"creating venv {venv} ({', '.join(PINS[name])})")
    shutil.rmtree(venv, ignore_errors=True)
    VENVS.mkdir(parents=True, exist_ok=True)
    subprocess.run([_base_python(), "-m", "venv", str(venv)], check=True)
    pip = [str(python(name)), "-m", "pip", "install", "-q", "--disable-pip-version-check"]
    subprocess.run([*pip, "--upgrade", "pip"], check=True)
    subprocess.run([*pip, *PINS[name]], check=True)
    stamp.write_text(want)


def freeze(name: str) -> dict[str, str]:
    """Installed package versions of venv ``name`` (``None``: the project venv)."""
    py = python(name) if name != "main" else Path(sys.executable)
    out = subprocess.run(
        [str(py), "-m", "pip", "list", "--format=freeze", "--disable-pip-version-check"],
        check=False,
        capture_output=True,
        text=True,
    ).stdout
    versions = {}
    for line in out.splitlines():
        pkg, _, ver = line.partition("==")
        versions[pkg.lower().replace("_", "-")] = ver
    return versions
