"""`make run`'s demo prints the committed output of running_sum."""

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_demo_prints_the_running_sums(kafka_bootstrap: str) -> None:
    env = {**os.environ, "LOCKGATE_BOOTSTRAP_SERVERS": kafka_bootstrap, "COLUMNS": "120"}
    res = subprocess.run(
        [sys.executable, "-m", "examples.demo"], cwd=ROOT, env=env, capture_output=True,
        text=True, timeout=180,
    )  # fmt: skip
    assert res.returncode == 0, res.stderr[-3000:]
    rows = [line.split("│")[3:7] for line in res.stdout.splitlines() if line.count("│") == 7]
    got = [tuple(c.strip() for c in row) for row in rows]
    # (key, sum, count, seq) in seq order: alice 5,7,-2,1 ; bob 3,4,8 ; carol 1,10,2
    assert got == [
        ("alice", "5", "1", "0"), ("bob", "3", "1", "1"), ("alice", "12", "2", "2"),
        ("carol", "1", "1", "3"), ("bob", "7", "2", "4"), ("alice", "10", "3", "5"),
        ("carol", "11", "2", "6"), ("bob", "15", "3", "7"), ("alice", "11", "4", "8"),
        ("carol", "13", "3", "9"),
    ]  # fmt: skip
