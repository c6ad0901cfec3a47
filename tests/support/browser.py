"""A real headless Chromium for the tests (Debian's package, driven by Playwright).

Playwright's own browser download is never used: :func:`chromium_path` finds the system
binary the way ``tests/support/ensure-chromium.sh`` does (``make test`` runs that script,
which installs Debian's ``chromium`` when it is missing and it runs as root).
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

ENSURE = Path(__file__).resolve().parent / "ensure-chromium.sh"
#: ``make test`` sets this: a missing browser is then a failure, not a skip.
REQUIRE_ENV = "LOCKGATE_TEST_REQUIRE_BROWSER"


def chromium_path() -> str | None:
    """Return the path of a Chromium binary, or ``None`` (``$LOCKGATE_TEST_CHROMIUM`` first)."""
    given = os.environ.get("LOCKGATE_TEST_CHROMIUM")
    if given and os.access(given, os.X_OK):
        return given
    for name in ("chromium", "chromium-browser", "google-chrome"):
        found = shutil.which(name)
        if found:
            return found
    return None


def ensure_chromium() -> str | None:
    """Return a Chromium path, running ``ensure-chromium.sh`` when none is on PATH.

    The script installs Debian's package only as root; elsewhere this returns ``None``.
    """
    found = chromium_path()
    if found is not None:
        return found
    proc = subprocess.run([str(ENSURE)], capture_output=True, text=True, check=False)
    lines = proc.stdout.strip().splitlines()
    return lines[-1] if proc.returncode == 0 and lines else None
