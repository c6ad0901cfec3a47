"""Every LOCKGATE_* name written anywhere in the repository is accepted by load_settings.

Unknown LOCKGATE_* variables stop `lockgate` (exit 2). The environment a processor runs in
is often inherited from the tooling (the Makefile, the broker script, the test harness), so
every variable the tooling reads must be a setting, a pass-through, or on the documented
allow-list (processors._config.settings.NON_SETTINGS_ENV / NON_SETTINGS_PREFIXES). A new tooling
variable fails this test until it is added there.
"""

import re
from pathlib import Path

from processors._config.settings import _unknown_variables

ROOT = Path(__file__).resolve().parents[3]
NAME = re.compile(r"\bLOCKGATE_[A-Za-z0-9_]*")
# Names an app declares for itself, App(..., env=[...]), in code or in docs.
DECLARED = re.compile(r"env=\[([^\]]*)\]")
SKIP_DIRS = {"lockgate.egg-info", "__pycache__"}  # and every directory starting with "."
# Files that spell wrong or example names on purpose: the rules themselves and their tests.
SKIP_FILES = {
    "processors/_config/settings.py",
    "processors/_dsl/app.py",
    "processors/_config/docgen.py",
    "docs/configuration.md",
    "tests/unit/processors/test_settings.py",
    "tests/unit/processors/test_settings_properties.py",
    "tests/unit/processors/test_cli.py",
    "tests/unit/processors/test_env_allowlist.py",
    "tests/integration/test_cli.py",
    "tests/unit/processors/cli_apps/cli_app_two.py",
}
# Python constants that happen to start with LOCKGATE_ (never environment variables).
NOT_ENV = {"LOCKGATE_BIN", "LOCKGATE_APPS"}
SUFFIXES = {".py", ".sh", ".md", ".yaml", ".yml", ".tpl", ".json", ".toml", ".txt", ""}


def _files() -> list[Path]:
    out = []
    for path in ROOT.rglob("*"):
        rel = path.relative_to(ROOT)
        hidden = any(part.startswith(".") for part in rel.parts[:-1])
        if hidden or SKIP_DIRS & set(rel.parts) or not path.is_file() or str(rel) in SKIP_FILES:
            continue
        if path.suffix in SUFFIXES or path.name.startswith("Dockerfile"):
            out.append(path)
    return out


def test_every_lockgate_name_in_the_repo_is_accepted() -> None:
    seen: dict[str, set[str]] = {}
    for path in _files():
        try:
            text = path.read_text()
        except (UnicodeDecodeError, OSError):
            continue
        declared = {n for block in DECLARED.findall(text) for n in NAME.findall(block)}
        for name in NAME.findall(text):
            if name in declared:
                continue
            if name.endswith("_") and not name.startswith("LOCKGATE_KAFKA__"):
                continue  # a prefix being described, e.g. "the LOCKGATE_ prefix"
            if name.startswith("LOCKGATE_KAFKA__") or name in NOT_ENV:
                continue
            seen.setdefault(name, set()).add(str(path.relative_to(ROOT)))
    assert "LOCKGATE_TEST_CRASH_POINTS" in seen and "LOCKGATE_KAFKA_PORT" in seen
    rejected = {
        name: sorted(where)
        for name, where in seen.items()
        if _unknown_variables({name: "x"}, app_env=())
    }
    assert not rejected, f"LOCKGATE_* names load_settings would reject: {rejected}"
