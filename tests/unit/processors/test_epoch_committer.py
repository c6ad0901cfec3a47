"""EpochCommitter as a component: what it is handed, what it owns (processors/_runtime/epoch.py).

No broker: an at-least-once committer (no transactional producer) over fakes of its
collaborators, with no key group owned. The commit protocol itself is proven by the
chaos and integration tiers; these pin the component's contract: the runner's flags come
through getters, the aborts in a row are its own, and what the loop writes too (records
consumed, bytes fetched, the deadline, the slow record) lives in the ``OpenEpoch``.
"""

from __future__ import annotations

import time
from types import SimpleNamespace
from typing import Any

import pytest

from processors._checkpoint.alignment import Mode
from processors._checkpoint.input_positions import InputPositions
from processors._checkpoint.keygroup_state import KeyGroupCheckpoints
from processors._runtime.epoch import EpochCommitter
from processors._runtime.open_epoch import OpenEpoch
from processors.exceptions import FatalKafkaError


class _Calls:
    """Records the calls made on it by name (any method)."""

    def __init__(self) -> None:
        self.calls: list[str] = []

    def __getattr__(self, name: str) -> Any:
        def call(*args: Any, **kwargs: Any) -> None:
            self.calls.append(name)

        return call


class _Out(_Calls):
    def __init__(self) -> None:
        super().__init__()
        self.record_error: Any = "rejected"
        self.producer_error: Any = "refused"
        self.codec_error: Any = None
        self.records = 0
        self.dead_letters = 0


def _committer(
    flags: dict[str, bool], open_epoch: OpenEpoch
) -> tuple[EpochCommitter, SimpleNamespace]:
    fakes = SimpleNamespace(
        out=_Out(),
        sinks=_Calls(),
        checkpoints=_Calls(),
        cleaner=_Calls(),
        metrics=SimpleNamespace(epochs_aborted=0, beat=lambda: None),
    )
    settings: Any = SimpleNamespace(transaction_timeout_ms=10_000)
    marks = KeyGroupCheckpoints()
    committer = EpochCommitter(
        settings,
        "app",
        False,  # at-least-once: no transaction to abort or begin
        fakes.metrics,
        ("in",),
        {},
        {},
        marks.halted,
        InputPositions(("in",), Mode.ALIGNED, 60, 1000, grouped=False, cancelled=set()),
        marks,
        open_epoch,
        fakes.out,
        fakes.sinks,
        fakes.checkpoints,
        _Calls(),
        SimpleNamespace(current=None),
        _Calls(),
        _Calls(),
        _Calls(),
        None,
        fakes.cleaner,
        SimpleNamespace(entries={}),
        None,
        call=lambda *a, **k: None,
        seek=lambda *a: None,
        consumer=lambda: None,
        admin=lambda: None,
        restorer=lambda: None,
        sp_rules=lambda: _Calls(),
        stop_requested=lambda: flags["stop"],
        finishing=lambda: False,
        callback_failed=lambda: flags["failed"],
    )
    return committer, fakes


def test_an_abort_resets_the_open_epoch_and_counts_replays() -> None:
    open_epoch = OpenEpoch()
    committer, fakes = _committer({"stop": False, "failed": False}, open_epoch)
    assert open_epoch.deadline > time.monotonic()  # the first epoch's budget runs
    open_epoch.uncommitted = 5
    open_epoch.fetched_bytes = 100
    open_epoch.active = True
    open_epoch.released.append("held")
    open_epoch.deadline = 0.0
    committer.abort_epoch("a broker went away")
    assert (open_epoch.uncommitted, open_epoch.fetched_bytes) == (0, 0)
    assert not open_epoch.active and not open_epoch.released
    assert open_epoch.deadline > time.monotonic()  # the replay's budget restarts
    assert fakes.out.record_error is None and fakes.out.producer_error is None
    assert fakes.checkpoints.calls == ["forget"]
    assert fakes.sinks.calls == ["abort"]  # sink hook
    assert fakes.metrics.epochs_aborted == 1
    for _ in range(9):
        committer.abort_epoch("again")
    with pytest.raises(FatalKafkaError, match="11 epochs aborted in a row"):
        committer.abort_epoch("again")


def test_sink_outages_are_not_a_replay_loop() -> None:
    committer, fakes = _committer({"stop": False, "failed": False}, OpenEpoch())
    for _ in range(20):  # back_off=False: the rebalance callback's abort, no wait
        committer.abort_epoch("sink down", sink_outage=True, back_off=False)
    assert fakes.metrics.epochs_aborted == 20


def test_nothing_commits_after_a_callback_failed_or_never_commit_again() -> None:
    flags = {"stop": False, "failed": True}
    open_epoch = OpenEpoch()
    committer, fakes = _committer(flags, open_epoch)
    open_epoch.uncommitted = 3
    open_epoch.commit_now = True
    committer.end_epoch()  # read through the getter: nothing to commit
    assert not open_epoch.commit_now
    assert open_epoch.uncommitted == 3  # nothing committed, nothing dropped
    assert fakes.cleaner.calls == ["sweep"]  # released directories are still swept
    flags["failed"] = False
    committer.never_commit_again()
    committed: list[bool] = []
    committer._commit_epoch = lambda: committed.append(True)  # type: ignore[method-assign]
    committer.end_epoch()
    assert committed == []  # closing after a failure: the open epoch is never committed
    assert open_epoch.uncommitted == 3
    assert committer.txn is None and committer.producer is None  # at-least-once, unopened
