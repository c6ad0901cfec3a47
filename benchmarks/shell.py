"""Run a command for its output (facts about the machine and the checkout)."""

from __future__ import annotations

import subprocess


def sh(*argv: str) -> str:
    """stdout + stderr of ``argv``, stripped ("" when it cannot run or times out)."""
    try:
        out = subprocess.run(argv, capture_output=True, text=True, timeout=30, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return ""
    return (out.stdout + out.stderr).strip()
