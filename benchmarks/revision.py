"""The git revision of the lockgate code measured (``processors/`` and ``state/``)."""

from __future__ import annotations

import subprocess

from benchmarks.paths import ROOT
from benchmarks.shell import sh


def dirty() -> str:
    """' + uncommitted changes in ...' when lockgate's sources differ from HEAD."""
    changed = sh("git", "-C", str(ROOT), "status", "--short", "--", "processors", "state")
    files = [line.split()[-1] for line in changed.splitlines() if line.strip()]
    return f" + uncommitted changes in {', '.join(files)}" if files else ""


def revision() -> str:
    """HEAD's short hash, followed by :func:`dirty`'s note (as the results record it)."""
    return sh("git", "-C", str(ROOT), "rev-parse", "--short", "HEAD") + dirty()


def same_runtime(before: str, after: str) -> bool:
    """Whether git revisions ``before`` and ``after`` (as recorded: a short hash, maybe
    followed by "+ uncommitted changes ...") have the same ``processors/`` and ``state/``.

    False when either carries uncommitted changes or git cannot tell.
    """

    if not before or not after or " " in before or " " in after:
        return False
    try:
        out = subprocess.run(
            ["git", "-C", str(ROOT), "diff", "--quiet", before, after, "--", "processors", "state"],
            capture_output=True,
            timeout=30,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired):
        return False
    return out.returncode == 0
