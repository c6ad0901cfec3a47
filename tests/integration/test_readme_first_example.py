"""The README's first example works as written (issue 27: a first day without scripts).

The shell block under the README's first code sample is run line by line against the
test broker (only the bootstrap address is replaced): it creates the input with
``lockgate topics --create-inputs``, sends one record with ``lockgate send`` and runs the
app, whose committed output must then hold the record's sum. The example uses the fixed
topic names ``numbers`` and ``sums``; no other test uses them on this broker.
"""

from __future__ import annotations

import os
import shlex
import subprocess
from pathlib import Path

import orjson

from tests.support.kafka import read_all
from tests.support.procs import ROOT

README = ROOT / "README.md"


def _first_shell_block() -> list[str]:
    """The lines of the first fenced block that starts with the bootstrap export."""
    blocks: list[list[str]] = []
    current: list[str] | None = None
    for line in README.read_text().splitlines():
        if line.startswith("```"):
            if current is None:
                current = []
            else:
                blocks.append(current)
                current = None
        elif current is not None:
            current.append(line)
    block = next(b for b in blocks if b and b[0].startswith("export LOCKGATE_BOOTSTRAP_SERVERS="))
    return [line for line in block if line.strip()]


def test_the_readme_first_example_runs_as_written(kafka_bootstrap: str, tmp_path: Path) -> None:
    lines = _first_shell_block()
    assert lines[0] == "export LOCKGATE_BOOTSTRAP_SERVERS=127.0.0.1:9092", lines
    assert lines[-1] == ".venv/bin/lockgate run examples.running_sum:app", lines
    env = {k: v for k, v in os.environ.items() if not k.startswith("LOCKGATE_")}
    env |= {
        "LOCKGATE_BOOTSTRAP_SERVERS": kafka_bootstrap,
        "LOCKGATE_STATE_DIR": str(tmp_path / "state"),
        "LOCKGATE_HTTP_PORT": "0",
    }
    venv_bin = Path(os.environ.get("VIRTUAL_ENV", ROOT / ".venv")) / "bin"
    for line in lines[1:-1]:
        # The same command with this interpreter's environment (its .venv/bin).
        command = line.replace(".venv/bin/", f"{venv_bin}/")
        done = subprocess.run(
            ["bash", "-o", "pipefail", "-c", command],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        assert done.returncode == 0, f"{line}\n{done.stdout}\n{done.stderr}"
    run = shlex.split(lines[-1].replace(".venv/bin/", f"{venv_bin}/"))
    log = (tmp_path / "run.log").open("w")
    proc = subprocess.Popen(run, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
    try:
        out = read_all(kafka_bootstrap, "sums", expected=1, timeout=60)
    finally:
        proc.terminate()
        code = proc.wait(60)
        log.close()
    text = (tmp_path / "run.log").read_text()
    assert code == 0, text[-3000:]
    assert [(m.key(), orjson.loads(m.value())["sum"]) for m in out] == [(b"a", 5)], text[-3000:]
