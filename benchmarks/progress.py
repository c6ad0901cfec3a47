"""Progress output on stderr, timed from the harness's start."""

from __future__ import annotations

import sys
import time

_T0 = time.monotonic()


def say(msg: str) -> None:
    """Print one progress line on stderr, prefixed with the elapsed time."""
    el = time.monotonic() - _T0
    print(f"[bench {int(el // 60):02d}:{el % 60:04.1f}] {msg}", file=sys.stderr, flush=True)


def elapsed() -> float:
    """Seconds since the harness started."""
    return time.monotonic() - _T0
