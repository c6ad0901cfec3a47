"""A bounded run's end phase (``BoundedEnd``) and the savepoint rules, without a broker.

Drives the component the runner owns with its real collaborators (``BoundedRun``,
``OpenEpoch``, ``KeyGroupCheckpoints``, ``SavepointRequests``) and records the callbacks
it is given (drain, end the epoch, end the loop); the final savepoint is a stand-in for
the ``FinalSavepoint`` protocol. The Kafka side is in tests/integration/test_bounded_run.py
and test_bounded_savepoint.py.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import pytest

from processors._checkpoint.keygroup_state import KeyGroupCheckpoints
from processors._checkpoint.savepoint_requests import SavepointRequests
from processors._config.settings import Settings
from processors._runtime.bounded import BoundedRun, parse_until
from processors._runtime.bounded_end import BoundedEnd, EverySavepoint
from processors._runtime.final_savepoint import Outcome
from processors._runtime.open_epoch import OpenEpoch

SP = "sp-20261128T010203Z-0a1b2c"


@pytest.fixture(autouse=True)
def _env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in list(os.environ):
        if name.upper().startswith("LOCKGATE_"):
            monkeypatch.delenv(name)


class _FinalSavepoint:
    """Records what the end phase tells a final savepoint; answers from ``manifests``."""

    def __init__(self, ends: Mapping[tuple[str, int], int]) -> None:
        self.ends = dict(ends)
        self.owned: frozenset[int] = frozenset()
        self.request: dict[str, Any] | None = None
        self.result: Outcome | None = None
        self.started = 0
        self.closed = False
        self.manifests: dict[int, bool | None] = {}
        self.exports: list[tuple[str, list[int]]] = []

    def start(self) -> None:
        self.started += 1

    def has_manifest(self, savepoint: str, g: int) -> bool | None:
        return self.manifests.get(g)

    def exported(self, savepoint: str, groups: Iterable[int]) -> None:
        self.exports.append((savepoint, sorted(groups)))

    def close(self) -> None:
        self.closed = True


class _Run:
    """A bounded run's end phase with two key groups of one input, and what it did."""

    def __init__(self, savepoint: bool, drain: bool = True) -> None:
        extra = {"until_savepoint": "default", "savepoint_dir": "/sp"} if savepoint else {}
        self.settings = Settings(until="now", **extra)
        self.kgs: dict[int, object] = {0: object(), 1: object()}
        self.halted: dict[int, str] = {}
        self.next: dict[tuple[str, int], int] = {("in", 0): 0, ("in", 1): 0}
        self.open = OpenEpoch()
        self.marks = KeyGroupCheckpoints()
        self.requests = SavepointRequests()
        self.calls: list[str] = []
        self.built: list[_FinalSavepoint] = []
        self.end = BoundedEnd(
            BoundedRun(parse_until("now"), {("in", 0): 5, ("in", 1): 3}),
            self.settings,
            "app",
            ("in",),
            2,
            self.kgs,
            self.halted,
            self.next,
            None,
            self.open,
            self.marks,
            self.requests,
            self._factory,
            (lambda: self.calls.append("drain")) if drain else None,
            lambda: self.calls.append("end_epoch"),
            lambda g: g not in self.halted,
            lambda: self.calls.append("stop"),
        )

    def _factory(
        self,
        name: str,
        settings: Settings,
        inputs: Sequence[str],
        partitions: int,
        ends: Mapping[tuple[str, int], int],
        requests: SavepointRequests,
    ) -> _FinalSavepoint:
        sp = _FinalSavepoint(ends)
        self.built.append(sp)
        return sp

    def reach_the_ends(self) -> None:
        self.next.update({("in", 0): 5, ("in", 1): 3})


def test_nothing_happens_before_every_owned_key_group_reached_its_end() -> None:
    run = _Run(savepoint=False)
    assert not run.end.after_batch()
    run.next[("in", 0)] = 5  # key group 1 is not there yet
    assert not run.end.after_batch()
    assert run.calls == []


def test_without_a_savepoint_the_run_drains_commits_and_stops() -> None:
    run = _Run(savepoint=False)
    run.reach_the_ends()
    assert run.end.after_batch()
    assert run.calls == ["drain", "end_epoch", "stop"]
    assert run.open.active  # the final watermark commits
    assert run.end.ended == {} and run.end.exit_code == 0 and run.built == []


def test_no_drain_without_event_time() -> None:
    run = _Run(savepoint=False, drain=False)
    run.reach_the_ends()
    assert run.end.after_batch()
    assert run.calls == ["end_epoch", "stop"]


def test_records_released_by_an_alignment_are_processed_first() -> None:
    run = _Run(savepoint=False)
    run.reach_the_ends()
    run.open.released.append(object())
    assert not run.end.after_batch()


def test_a_halted_key_group_does_not_hold_the_end_back() -> None:
    run = _Run(savepoint=False)
    run.next[("in", 0)] = 5
    run.halted[1] = SP
    assert run.end.after_batch()


def test_with_a_savepoint_the_key_groups_are_ended_and_the_savepoint_phase_starts() -> None:
    run = _Run(savepoint=True)
    request = {"savepoint": SP, "checkpoint": 100, "bounded": {"until": "now"}}
    assert run.end.defers(request)  # not every owned key group ended yet
    run.reach_the_ends()
    assert run.end.after_batch()
    assert run.calls == ["drain", "end_epoch"]  # no stop: the savepoint phase goes on
    assert run.end.ended == {0: {"in": 5}, 1: {"in": 3}}
    assert run.end.bounded(0) == {"in": 5}  # written in key group 0's checkpoint records
    (sp,) = run.built
    assert sp.started == 1 and sp.owned == {0, 1} and sp.ends == {("in", 0): 5, ("in", 1): 3}
    assert not run.end.defers(request)  # every owned key group ended: taken now
    assert not run.end.defers({"savepoint": SP, "checkpoint": 100})  # not the bounded one
    assert not run.end.after_batch()  # ended once per ownership


def test_a_revoked_key_group_is_ended_again_by_its_next_owner() -> None:
    run = _Run(savepoint=True)
    run.reach_the_ends()
    run.end.after_batch()
    del run.kgs[1]
    assert not run.end.after_batch()
    assert run.end.ended == {0: {"in": 5}}
    (sp,) = run.built
    assert sp.owned == {0}


def test_the_request_is_rearmed_for_a_key_group_without_a_committed_manifest() -> None:
    run = _Run(savepoint=True)
    run.reach_the_ends()
    run.end.after_batch()
    (sp,) = run.built
    request = {
        "savepoint": SP,
        "checkpoint": 100,
        "bounded": {"until": "now"},
        "expires_ms": int(time.time() * 1000) + 60_000,
    }
    sp.request = request
    sp.manifests = {0: True, 1: True}
    run.end.after_batch()
    assert run.requests.current is None and not run.open.commit_now
    sp.manifests = {0: True, 1: False}  # key group 1 was assigned after the export
    run.end.after_batch()
    assert run.requests.current is request and run.open.commit_now


def test_the_final_savepoint_is_taken_where_no_committed_manifest_of_it_exists() -> None:
    run = _Run(savepoint=True)
    bounded = {"savepoint": SP, "checkpoint": 100, "bounded": {"until": "now"}}
    plain = {"savepoint": SP, "checkpoint": 100}
    run.marks.completed(0, 150)  # past the request's checkpoint
    assert run.end.taken(0, bounded)  # no final savepoint yet: by the checkpoint
    run.reach_the_ends()
    run.end.after_batch()
    (sp,) = run.built
    assert run.end.taken(0, bounded)  # not known yet: by the checkpoint
    sp.manifests = {0: False, 1: True}
    assert not run.end.taken(0, bounded)  # drained past it, yet it has no manifest
    assert run.end.taken(1, bounded)
    assert run.end.taken(0, plain) and not run.end.taken(1, plain)  # by the checkpoint
    run.end.committed(bounded, {1: {"error": None}})
    run.end.committed(plain, {0: {"error": None}})  # not the final savepoint: not noted
    assert sp.exports == [(SP, [1])]


def test_the_outcome_stops_the_run_with_its_exit_code() -> None:
    run = _Run(savepoint=True)
    run.reach_the_ends()
    run.end.after_batch()
    (sp,) = run.built
    sp.result = Outcome(savepoint=SP, error=None, location="/sp")
    run.end.after_batch()
    assert run.calls[-1] == "stop"
    assert run.end.savepoint_result == SP and run.end.exit_code == 0
    run.end.close()
    assert sp.closed

    failed = _Run(savepoint=True)
    failed.reach_the_ends()
    failed.end.after_batch()
    failed.built[0].result = Outcome(savepoint=None, error="a manifest failed")
    failed.end.after_batch()
    assert failed.calls[-1] == "stop"
    assert failed.end.savepoint_result is None and failed.end.exit_code == 1


def test_every_savepoint_is_taken_at_once_and_by_checkpoint() -> None:
    marks = KeyGroupCheckpoints()
    rules = EverySavepoint(marks)
    request = {"savepoint": SP, "checkpoint": 100, "bounded": {"until": "now"}}
    assert not rules.defers(request)
    assert not rules.taken(0, request)
    marks.completed(0, 100)
    assert rules.taken(0, request)  # a previous owner took it
    assert rules.bounded(0) is None
    rules.committed(request, {0: {"error": None}})  # nothing to note
