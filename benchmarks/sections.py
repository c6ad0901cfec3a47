"""The sections of a results file (RESULTS.md): replace one, end one."""

from __future__ import annotations

from pathlib import Path
from typing import Any


def splice_section(
    path: Path, section: list[str], begin: str, end: str, after: str | None = None
) -> str:
    """The text of results file ``path`` (a new one's if missing) with ``section`` in
    place of the one between ``begin`` and ``end``; without one, inserted after marker
    ``after`` (when given and present), else before the profiles (or the method), else
    appended."""
    text = path.read_text() if path.exists() else "# lockgate benchmarks: results\n"
    block = "\n".join(section)
    if begin in text and end in text:
        head, rest = text.split(begin, 1)
        return head + block + rest.split(end, 1)[1]
    if after is not None and after in text:
        i = text.index(after) + len(after)
        return text[:i] + "\n\n" + block + text[i:]
    for anchor in ("\n## Profile", "\n## Method"):
        if anchor in text:
            i = text.index(anchor)
            return text[: i + 1] + block + "\n\n" + text[i + 1 :]
    return text.rstrip("\n") + "\n\n" + block + "\n"


def section_footer(
    res: dict[str, Any], results_file: str, command: str, step: str, end: str
) -> list[str]:
    """The last lines of a RESULTS.md section: notes added by hand to the results file
    (then ``--render``), the error count, how to reproduce it, the ``end`` marker."""
    lines = [f"- {note}" for note in res.get("notes", [])]
    if res.get("notes"):
        lines.append("")
    if res.get("errors"):
        lines += [f"Errors in this section: {len(res['errors'])} (see {results_file}).", ""]
    lines += [
        f"Reproduce: `{res.get('env_line', '')} {command}` (or the `{step}` step of `make bench`).",
        "",
        end,
    ]
    return lines
