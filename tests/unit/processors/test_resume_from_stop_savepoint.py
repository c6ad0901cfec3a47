"""LOCKGATE_RESUME_FROM_STOP_SAVEPOINT: which savepoint a key group is seeded from at assignment.

The Helm chart's ``upgrade.mode=savepoint`` sets it on the pods: the pre-upgrade hook halts
the pipeline at a stop-with-savepoint, and each rolled pod restores the key groups it is
assigned from the savepoint they are halted at, without the id in the release.
"""

from __future__ import annotations

import pytest

from processors import ConfigError, load_settings
from processors._runtime.operator_plan import savepoint_to_seed


def _seed(
    *,
    seeding: str | None = None,
    from_savepoint: str | None = None,
    origin: str | None = None,
    halted: str | None = None,
    resume: bool = False,
) -> str | None:
    return savepoint_to_seed(
        seeding=seeding,
        from_savepoint=from_savepoint,
        origin=origin,
        halted=halted,
        resume_halted=resume,
    )


def test_the_setting_is_off_by_default_and_read_from_the_environment(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("LOCKGATE_BOOTSTRAP_SERVERS", "k:9092")
    monkeypatch.setenv("LOCKGATE_APP_NAME", "sums")
    assert load_settings().resume_from_stop_savepoint is False
    monkeypatch.setenv("LOCKGATE_RESUME_FROM_STOP_SAVEPOINT", "true")
    assert load_settings().resume_from_stop_savepoint is True


def test_a_halted_key_group_stays_halted_without_the_setting() -> None:
    assert _seed(halted="sp-1") is None


def test_a_halted_key_group_is_seeded_from_its_halt_with_the_setting() -> None:
    assert _seed(halted="sp-1", resume=True) == "sp-1"
    # Already restored from it (a restart after the resume): not again.
    assert _seed(halted="sp-1", origin="sp-1", resume=True) is None


def test_nothing_to_seed_for_a_running_key_group() -> None:
    assert _seed(resume=True) is None
    assert _seed(origin="sp-0", resume=True) is None


def test_an_explicit_savepoint_not_restored_yet_comes_first() -> None:
    assert _seed(from_savepoint="sp-0", halted="sp-1", resume=True) == "sp-0"
    assert _seed(from_savepoint="sp-0", origin="sp-1") == "sp-0"


def test_a_stale_explicit_savepoint_and_a_newer_halt_are_refused() -> None:
    # The release kept LOCKGATE_FROM_SAVEPOINT=sp-0 from an old restore; a later
    # stop-with-savepoint halted the key group at sp-1. Resuming from sp-1 would make the
    # next start restore sp-0 over it (origin sp-1 != sp-0): refused, naming the variable.
    with pytest.raises(ConfigError, match="LOCKGATE_FROM_SAVEPOINT=sp-0 is still set"):
        _seed(from_savepoint="sp-0", origin="sp-0", halted="sp-1", resume=True)
    # Without the setting the key group stays halted, as before.
    assert _seed(from_savepoint="sp-0", origin="sp-0", halted="sp-1") is None


def test_a_restore_under_way_is_finished_first() -> None:
    assert _seed(seeding="sp-2", from_savepoint="sp-0", halted="sp-1", resume=True) == "sp-2"
    assert _seed(seeding="sp-2") == "sp-2"
