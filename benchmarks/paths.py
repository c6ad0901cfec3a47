"""Where the harness's files are: the repository, the caches, the project's interpreter."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BENCH_DIR = ROOT / "benchmarks"
CACHE = ROOT / ".cache" / "bench"
VENVS = CACHE / "venvs"
MAIN_PY = ROOT / ".venv" / "bin" / "python"
LOCKGATE_BIN = ROOT / ".venv" / "bin" / "lockgate"
