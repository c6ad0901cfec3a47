"""Released key groups' directories: removed after the cleanup delay, reused before it.

Two instances of ``examples.running_sum`` (dynamic membership, so the second one leaves
the group at once when it stops) with their own state directories. The first owns all
four key groups, the second joins and takes some, then stops and hands them back:

* with a short ``LOCKGATE_STATE_CLEANUP_DELAY_MS`` the first instance removes the
  directories of the key groups it released (and only those), and restores them from the
  changelog's start when they come back; the output stays exact;
* with a long delay the directories stay, and the key groups that come back are restored
  from their local databases: nothing is read from the changelog (no input arrived
  meanwhile, so the other owner wrote nothing there).
"""

from __future__ import annotations

import random
import re
from pathlib import Path

from tests.support.checker import check, model
from tests.support.kafka import create_topic, produce_numbers, read_all, read_inputs
from tests.support.procs import AppProcess, wait_until

P = 4
APP = "examples.running_sum:app"
_GROUPS = re.compile(r"key_groups=\[([0-9, ]*)\]")
_RESTORED = re.compile(r"key group restored.*?key_group=(\d+).*?records=(\d+)")


def _env(bootstrap: str, names, tmp_path: Path, instance: str, delay_ms: int) -> dict[str, str]:  # type: ignore[no-untyped-def]
    return {
        "LOCKGATE_BOOTSTRAP_SERVERS": bootstrap,
        "LOCKGATE_APP_NAME": names("cleanup"),
        "LOCKGATE_INPUT_TOPIC": names("cleanup-in"),
        "LOCKGATE_OUTPUT_TOPIC": names("cleanup-out"),
        "LOCKGATE_STATE_DIR": str(tmp_path / f"state-{instance}"),
        "LOCKGATE_INSTANCE_ID": instance,
        "LOCKGATE_STATIC_MEMBERSHIP": "false",
        "LOCKGATE_CHECKPOINT_INTERVAL_MS": "300",
        "LOCKGATE_STATE_CLEANUP_DELAY_MS": str(delay_ms),
    }


def _batch(n: int, seed: int, start: int) -> list[tuple[str, int, int]]:
    rng = random.Random(seed)
    return [(f"key-{rng.randrange(40)}", rng.randrange(-5, 60), start + i) for i in range(n)]


def _revoked(log: str) -> set[int]:
    groups: set[int] = set()
    for line in log.splitlines():
        if " revoked" in line or line.startswith("revoked"):
            found = _GROUPS.search(line)
            if found and found.group(1).strip():
                groups.update(int(g) for g in found.group(1).split(","))
    return groups


def _restores(log: str) -> list[tuple[int, int]]:
    """(key group, records read from the changelog) of every completed restore."""
    return [(int(g), int(n)) for g, n in _RESTORED.findall(log)]


def _hand_over_and_back(  # type: ignore[no-untyped-def]
    kafka_bootstrap: str, names, tmp_path: Path, delay_ms: int, wait_removed: bool
) -> tuple[AppProcess, set[int], Path]:
    """i1 alone, i2 joins and takes key groups, (cleanup waited for), i2 leaves.

    Returns i1 (running, all key groups back), the key groups it released, its app dir.
    """
    env1 = _env(kafka_bootstrap, names, tmp_path, "i1", delay_ms)
    env2 = _env(kafka_bootstrap, names, tmp_path, "i2", delay_ms)
    env2["LOCKGATE_APP_NAME"] = env1["LOCKGATE_APP_NAME"]
    for k in ("LOCKGATE_INPUT_TOPIC", "LOCKGATE_OUTPUT_TOPIC"):
        env2[k] = env1[k]
    inp, out = env1["LOCKGATE_INPUT_TOPIC"], env1["LOCKGATE_OUTPUT_TOPIC"]
    app_dir = tmp_path / "state-i1" / env1["LOCKGATE_APP_NAME"]
    create_topic(kafka_bootstrap, inp, P)
    produce_numbers(kafka_bootstrap, inp, _batch(400, 1, 0))
    i1 = AppProcess(APP, env1, tmp_path / "i1.log").start()
    i2 = AppProcess(APP, env2, tmp_path / "i2.log")
    try:
        read_all(kafka_bootstrap, out, expected=400, idle=1)
        assert sorted(int(p.name) for p in app_dir.iterdir()) == list(range(P))
        i2.start()
        wait_until(lambda: _revoked(i1.log_text()), 60, what="i1 revokes key groups")
        wait_until(lambda: i2.log_text().count("key group restored") >= 1, 60, what="i2 restores")
        released = _revoked(i1.log_text())
        assert 0 < len(released) < P, i1.log_text()[-3000:]
        if wait_removed:
            wait_until(
                lambda: all(not (app_dir / str(g)).exists() for g in released),
                30,
                what="released directories removed",
            )
            kept = {int(p.name) for p in app_dir.iterdir()}
            assert kept == set(range(P)) - released, kept  # owned ones never removed
            assert not [p for p in app_dir.iterdir() if p.name.startswith(".trash-")]
        else:
            assert all((app_dir / str(g)).is_dir() for g in released)
        back = len(_restores(i1.log_text())) + len(released)
        code = i2.terminate()
        assert code == 0, i2.log_text()[-3000:]
        wait_until(lambda: len(_restores(i1.log_text())) >= back, 60, what="i1 takes them back")
    except BaseException:
        i1.terminate()
        raise
    finally:
        if i2.alive:
            i2.terminate()
    return i1, released, app_dir


def test_released_key_groups_state_is_removed_after_the_delay(  # type: ignore[no-untyped-def]
    kafka_bootstrap: str, names, tmp_path: Path
) -> None:
    i1, released, app_dir = _hand_over_and_back(
        kafka_bootstrap, names, tmp_path, delay_ms=1500, wait_removed=True
    )
    inp, env_out = i1.env["LOCKGATE_INPUT_TOPIC"], i1.env["LOCKGATE_OUTPUT_TOPIC"]
    try:
        produce_numbers(kafka_bootstrap, inp, _batch(200, 2, 400))
        out = read_all(kafka_bootstrap, env_out, expected=600, idle=1.5)
    finally:
        code = i1.terminate()
    log = i1.log_text()
    assert code == 0, log[-3000:]
    assert log.count("released key group's state removed") == len(released), log[-3000:]
    # The removed key groups came back from the changelog's start: state was read there.
    restores = _restores(log)
    again = [(g, n) for g, n in restores[P:] if g in released]
    assert sorted(g for g, _ in again) == sorted(released), restores
    assert all(n > 0 for _, n in again), restores
    assert sorted(int(p.name) for p in app_dir.iterdir()) == list(range(P))
    assert check(model(read_inputs(kafka_bootstrap, inp, 600)), out) == [], log[-3000:]


def test_key_groups_back_before_the_delay_reuse_their_state(  # type: ignore[no-untyped-def]
    kafka_bootstrap: str, names, tmp_path: Path
) -> None:
    i1, released, app_dir = _hand_over_and_back(
        kafka_bootstrap, names, tmp_path, delay_ms=120_000, wait_removed=False
    )
    inp, env_out = i1.env["LOCKGATE_INPUT_TOPIC"], i1.env["LOCKGATE_OUTPUT_TOPIC"]
    try:
        produce_numbers(kafka_bootstrap, inp, _batch(200, 3, 400))
        out = read_all(kafka_bootstrap, env_out, expected=600, idle=1.5)
    finally:
        code = i1.terminate()
    log = i1.log_text()
    assert code == 0, log[-3000:]
    assert "released key group's state removed" not in log
    restores = _restores(log)
    again = [(g, n) for g, n in restores[P:] if g in released]
    assert sorted(g for g, _ in again) == sorted(released), restores
    assert all(n == 0 for _, n in again), restores  # local state reused: no changelog read
    assert sorted(int(p.name) for p in app_dir.iterdir()) == list(range(P))
    assert check(model(read_inputs(kafka_bootstrap, inp, 600)), out) == [], log[-3000:]
