"""A multi-input key group completes its grouped aligners only when no input replays.

Drives the runtime's own ``BarrierMixin._complete_group`` / ``_complete_deferred`` with
real :class:`Aligner` machines (the rest of the runner is a stand-in that records
completions). The scenario is the adversarial review's: input A holds records of a writer
that passed barrier 1 when commit 1 is taken; after a restore, B's barrier 1 arrives
while A still replays. Completing then and committing in the middle of A's replay made
a second restore skip A's records 3..5, which were never processed.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from processors._checkpoint.alignment import Aligner, Completion, Decision, Mode, Snapshot
from processors._checkpoint.input_positions import InputPositions
from processors._runtime.barriers import BarrierMixin


class _Runtime:
    """Just what the group completion reads and calls."""

    _complete_group = BarrierMixin._complete_group
    _complete_deferred = BarrierMixin._complete_deferred

    def __init__(self, a: Aligner, b: Aligner, next_a: int, next_b: int) -> None:
        self._inputs = ("A", "B")
        self._positions = InputPositions(
            self._inputs, Mode.ALIGNED, 60, 1000, grouped=True, cancelled=set()
        )
        self._positions.aligners.update({("A", 0): a, ("B", 0): b})
        self._positions.next.update({("A", 0): next_a, ("B", 0): next_b})
        self._released: list[Any] = []
        self._open = SimpleNamespace(released=self._released)  # the same list
        self._deferred_groups: set[int] = set()
        self._kgs = {0: object()}
        self._halted: dict[int, str] = {}
        self.metrics = SimpleNamespace(observe_alignment=lambda s: None)
        self.completions: list[int] = []

    def _complete(
        self, g: int, completion: Completion, befores: dict[str, Snapshot], later: Any = ()
    ) -> None:
        self.completions.append(completion.checkpoint)
        self._released += [*completion.released, *later]


def _aligner(snapshot: Snapshot | None = None) -> Aligner:
    return Aligner(Mode.ALIGNED, 60, 1000, snapshot=snapshot, grouped=True)


def test_no_completion_while_an_input_replays() -> None:
    processed: list[int] = []
    a, b = _aligner(), _aligner()
    a.expect(["X/0"])
    b.expect(["Y/0"])
    rt = _Runtime(a, b, 0, 0)
    before = a.snapshot(0)
    a.on_barrier(0, "X/0", 1, None, 0.0)
    rt._complete_group(0, "A", before, 0.0, ())
    assert rt.completions == []  # B's writer has not passed 1
    for offset in range(1, 6):
        assert a.on_record(offset, "X/0", offset) is Decision.HOLD
    commit1 = (a.snapshot(6), b.snapshot(0))
    assert (commit1[0].low, commit1[0].high, commit1[0].done) == (1, 6, 0)

    # Restored from commit 1; B's barrier 1 comes first (a control record at the head of
    # its queue is released before A's older records).
    a, b = _aligner(commit1[0]), _aligner(commit1[1])
    rt = _Runtime(a, b, 1, 0)
    before = b.snapshot(0)
    b.on_barrier(0, "Y/0", 1, None, 0.0)
    rt._positions.next[("B", 0)] = 1
    rt._complete_group(0, "B", before, 0.0, ())
    assert rt.completions == [] and rt._deferred_groups == {0}  # A replays: wait
    for offset in (1, 2):
        if a.on_record(offset, "X/0", offset) is Decision.PROCESS:
            processed.append(offset)
    rt._positions.next[("A", 0)] = 3
    rt._complete_deferred()
    assert rt.completions == []  # still replaying
    commit2 = (a.snapshot(3), b.snapshot(1))
    assert commit2[0].done == 0  # before the fix: 1, which skips 3..5 on the next restore

    a, b = _aligner(commit2[0]), _aligner(commit2[1])
    rt = _Runtime(a, b, 1, 1)
    for offset in range(1, 6):
        if a.on_record(offset, "X/0", offset) is Decision.PROCESS:
            processed.append(offset)
    rt._positions.next[("A", 0)] = 6
    # B's barrier was before commit 2's low: it is in B's snapshot (ready 1) already.
    assert b.ready == 1 and not a.replaying
    rt._complete_deferred()  # nothing deferred in this process: completes on A's next event
    before = a.snapshot(6)
    rt._complete_group(0, "A", before, 0.0, ())
    assert rt.completions == [1]
    processed += [p for p in rt._released if isinstance(p, int)]
    assert sorted(processed) == [1, 2, 3, 4, 5]


def test_a_deferred_completion_happens_when_the_replay_ends() -> None:
    a, b = _aligner(), _aligner()
    a.expect(["X/0"])
    b.expect(["Y/0"])
    a.on_barrier(0, "X/0", 1, None, 0.0)
    assert a.on_record(1, "X/0", "a1") is Decision.HOLD
    snap_a = a.snapshot(2)
    a, b = _aligner(snap_a), _aligner(b.snapshot(0))
    rt = _Runtime(a, b, 0, 0)
    before = b.snapshot(0)
    b.on_barrier(0, "Y/0", 1, None, 0.0)
    rt._positions.next[("B", 0)] = 1
    rt._complete_group(0, "B", before, 0.0, ())
    assert rt.completions == [] and a.replaying
    assert a.on_record(1, "X/0", "a1") is Decision.HOLD  # tag 1 > done 0
    rt._positions.next[("A", 0)] = 2
    assert not a.replaying
    rt._complete_deferred()
    assert rt.completions == [1] and rt._released == ["a1"] and not rt._deferred_groups
