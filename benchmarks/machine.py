"""What this machine is and how loaded it is (the results' meta data)."""

from __future__ import annotations

import os
import platform
from pathlib import Path
from typing import Any

from benchmarks.shell import sh


def machine() -> dict[str, Any]:
    """What this machine is."""
    cpu = ""
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            cpu = line.split(":", 1)[1].strip()
            break
    mem_kb = int(Path("/proc/meminfo").read_text().split()[1])
    osname = ""
    for line in Path("/etc/os-release").read_text().splitlines():
        if line.startswith("PRETTY_NAME="):
            osname = line.split("=", 1)[1].strip('"')
    return {
        "cpu": cpu,
        "cores": os.cpu_count(),
        "memory_gib": round(mem_kb / 1024 / 1024, 1),
        "os": osname,
        "kernel": platform.release(),
        "python": platform.python_version(),
        "java": sh("java", "-version").splitlines()[0] if sh("java", "-version") else "",
    }


def uptime() -> str:
    """``uptime`` output (load averages)."""
    return sh("uptime")
