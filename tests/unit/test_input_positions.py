"""InputPositions: what a commit names, what an abort goes back to, what a revoke leaves.

The invariants are the module docstring's (processors/_checkpoint/input_positions.py):
``committed <= next`` with the same keys, every entry belongs to an owned partition,
a rewind puts ``next`` at ``committed`` and every aligner at its committed snapshot, a
forgotten key group leaves nothing, and the loop's containers are one object for life.
"""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from processors._checkpoint.alignment import Decision, Mode, Snapshot
from processors._checkpoint.input_positions import InputPositions

W = "up/0"


def _positions(
    inputs: tuple[str, ...] = ("T",), mode: Mode = Mode.ALIGNED, cancelled: Any = None
) -> InputPositions:
    return InputPositions(
        inputs,
        mode,
        60,
        1000,
        grouped=len(inputs) > 1,
        cancelled=set() if cancelled is None else cancelled,
    )


def _check(p: InputPositions) -> None:
    """The invariants that hold between any two protocol steps."""
    owned = set(p.next)
    assert set(p.committed) == owned
    assert all(p.committed[k] <= p.next[k] for k in owned)
    assert set(p.aligners) <= owned
    assert set(p._align_committed) <= owned
    assert set(p._frozen) <= set(p.aligners)
    assert set(p._aligned_until) <= set(p.aligners)


def test_a_source_partition_commits_its_next_offset_and_an_abort_goes_back() -> None:
    p = _positions()
    p.assign(("T", 0), 5)
    assert p.commit_position(("T", 0)) == (5, None)
    p.next[("T", 0)] = 9  # the per-record loop advances it
    assert p.commit_position(("T", 0)) == (9, None)
    p.mark_committed([(("T", 0), 9)], {})
    p.next[("T", 0)] = 12
    _check(p)
    back = p.rewind(0, keep_frozen=False)
    assert back.seeks == [("T", 9)] and back.released == ()
    assert p.next[("T", 0)] == 9 and ("T", 0) in p.rewound
    _check(p)


def test_an_aligned_partition_commits_low_and_is_restored_from_its_committed_snapshot() -> None:
    p = _positions()
    p.expect_writers({"T": [W, "up/1"]})
    p.assign(("T", 0), 0)
    aligner, released = p.start_alignment("T", 0, done=0)
    assert released == () and p.aligners[("T", 0)] is aligner and p.is_downstream(0)
    assert aligner.on_record(0, W, "r0") is Decision.PROCESS
    aligner.on_barrier(1, W, 1, None, 0.0)  # up/0 passed 1, up/1 not yet: hold up/0
    assert aligner.on_record(2, W, "r2") is Decision.HOLD
    p.next[("T", 0)] = 3
    offset, snap = p.commit_position(("T", 0))
    assert snap is not None and (offset, snap.low, snap.high) == (2, 2, 3)
    p.mark_committed([(("T", 0), offset)], {("T", 0): snap})
    assert aligner.on_record(3, W, "r3") is Decision.HOLD
    p.next[("T", 0)] = 4
    _check(p)
    back = p.rewind(0, keep_frozen=False)
    assert back.seeks == [("T", 2)] and p.next[("T", 0)] == 2 == p.committed[("T", 0)]
    restored = p.aligners[("T", 0)]
    assert restored is not aligner  # rebuilt from the committed snapshot: it replays
    assert restored.replaying and restored.done == snap.done == 0
    assert restored.on_record(2, W, "r2") is Decision.HOLD  # held again, as before
    _check(p)


def test_an_aligner_started_in_the_aborted_epoch_is_dropped() -> None:
    p = _positions()
    p.assign(("T", 0), 4)
    p.next[("T", 0)] = 6
    p.start_alignment("T", 0, done=0)
    p.rewind(0, keep_frozen=False)
    assert p.aligners == {} and not p.is_downstream(0)
    assert p.next[("T", 0)] == 4
    _check(p)


def test_a_frozen_snapshot_is_committed_and_kept_only_by_a_committed_halt() -> None:
    p = _positions()
    p.assign(("T", 0), 0)
    aligner, _ = p.start_alignment("T", 0, done=0)
    frozen = aligner.snapshot(0)
    p.next[("T", 0)] = 5
    p.freeze(("T", 0), frozen)
    assert p.commit_position(("T", 0)) == (0, frozen)
    p.mark_committed([(("T", 0), 0)], {("T", 0): frozen})
    p.rewind(0, keep_frozen=True)  # halted when the epoch began: still halted
    assert p.commit_position(("T", 0)) == (0, frozen)
    p.rewind(0, keep_frozen=False)  # the halt was the aborted epoch's
    assert p._frozen == {}
    p.freeze(("T", 0), frozen)
    p.thaw(0)  # the halt's savepoint was cancelled
    assert p._frozen == {}
    _check(p)


def test_a_forgotten_key_group_leaves_nothing() -> None:
    p = _positions(("A", "B"), Mode.UNALIGNED)
    for g in (0, 1):
        for t in ("A", "B"):
            p.assign((t, g), 3)
            a, _ = p.start_alignment(t, g, done=0)
            a.set_mode(Mode.ALIGNED)
            p.align_for_savepoint((t, g), 7)
            p.freeze((t, g), a.snapshot(3))
    p.mark_committed([(("A", 0), 3)], {("A", 0): p.aligners[("A", 0)].snapshot(3)})
    p.backpressured.update({("A", 0), ("B", 1)})
    p.start_fetching([("A", 0), ("B", 0)])
    p.forget(0)
    for d in (p.next, p.committed, p.aligners, p._align_committed, p._frozen, p._aligned_until):
        assert all(g == 1 for _, g in d), d
    assert p.backpressured == {("B", 1)}
    _check(p)


def test_savepoint_alignment_in_unaligned_mode() -> None:
    cancelled: set[str] = set()
    p = _positions(("A", "B"), Mode.UNALIGNED, cancelled)
    p.assign(("A", 0), 0)
    p.assign(("B", 0), 0)
    a, _ = p.start_alignment("A", 0, done=0)
    assert a.mode is Mode.UNALIGNED
    a.set_mode(Mode.ALIGNED)  # a savepoint barrier of checkpoint 5 arrived on A
    p.align_for_savepoint(("A", 0), 5)
    b, _ = p.start_alignment("B", 0, done=0)  # B joins A's savepoint alignment
    assert b.mode is Mode.ALIGNED
    assert p.end_savepoint_alignment(("B", 0), 4) == ()
    assert b.mode is Mode.ALIGNED
    p.end_savepoint_alignment(("B", 0), 5)
    assert b.mode is Mode.UNALIGNED
    # A snapshot announcing a savepoint not completed yet resumes aligned, unless cancelled.
    pending = Snapshot(0, 0, 0, {}, False, savepoints={5: "sp-1"})
    p.mark_committed([], {("A", 0): pending})
    p.rewind(0, keep_frozen=False)
    assert p.aligners[("A", 0)].mode is Mode.ALIGNED
    cancelled.add("sp-1")
    p.rewind(0, keep_frozen=False)
    assert p.aligners[("A", 0)].mode is Mode.UNALIGNED
    _check(p)


def test_seeding_moves_positions_and_alignment_as_committed() -> None:
    p = _positions(("A", "B"))
    p.assign(("A", 2), 0)
    p.assign(("B", 2), 0)
    p.start_alignment("B", 2, done=0)
    snap = Snapshot(10, 12, 3, {W: 3}, False)
    p.seed(2, {"A": 10, "B": 20}, {"A": snap, "B": None})
    assert p.next == {("A", 2): 10, ("B", 2): 20} and dict(p.committed) == p.next
    assert set(p.aligners) == {("A", 2)} and p._align_committed == {("A", 2): snap}
    _check(p)
    p.next[("A", 2)] = 15
    p.rewind(2, keep_frozen=False)
    assert p.next[("A", 2)] == 10 and p.aligners[("A", 2)].replaying
    assert p.aligners[("A", 2)].done == 3


def test_load_resumes_each_committed_snapshot() -> None:
    p = _positions()
    p.expect_writers({"T": [W]})
    p.assign(("T", 1), 8)
    snap = Snapshot(8, 8, 4, {W: 4}, False)
    assert p.load(1, {"T": snap}) == ()
    assert p.aligners[("T", 1)].done == 4 and p._align_committed == {("T", 1): snap}
    assert set(p.aligners[("T", 1)].writers) == {W}
    _check(p)


_OPS = st.lists(
    st.tuples(
        st.sampled_from(["advance", "commit", "rewind", "align", "freeze", "forget", "assign"]),
        st.integers(0, 1),
        st.sampled_from(["A", "B"]),
        st.integers(0, 5),
    ),
    max_size=40,
)


@settings(max_examples=200, deadline=None)
@given(_OPS)
def test_invariants_hold_after_any_sequence_of_steps(ops: list[tuple[str, int, str, int]]) -> None:
    p = _positions(("A", "B"))
    containers = (p.next, p.aligners, p.rewound, p.backpressured)
    for g in (0, 1):
        for t in ("A", "B"):
            p.assign((t, g), 0)
    # Key groups halted at the last commit: only they keep their frozen snapshots through a
    # rewind (the runtime passes ``keep_frozen`` from the committed halt; a halt is frozen
    # with its aligner, so the commit that records it commits the aligner's snapshot too).
    halted_at_commit: set[int] = set()
    for op, g, t, n in ops:
        key = (t, g)
        owned = key in p.next
        if op == "assign" and not owned:
            for topic in ("A", "B"):
                p.assign((topic, g), n)
        elif op == "advance" and owned:
            p.next[key] += n  # the loop: only forward
        elif op == "commit":
            offsets, snaps = [], {}
            for k in list(p.next):
                offset, snap = p.commit_position(k)
                offsets.append((k, offset))
                if snap is not None:
                    snaps[k] = snap
            p.mark_committed(offsets, snaps)
            halted_at_commit = {k[1] for k in p._frozen}
        elif op == "rewind" and owned:
            p.rewind(g, keep_frozen=g in halted_at_commit)
            for topic in ("A", "B"):
                if (topic, g) in p.next:
                    assert p.next[(topic, g)] == p.committed[(topic, g)]
        elif op == "align" and owned and key not in p.aligners and g not in halted_at_commit:
            # (a halted key group's partitions are paused: no record starts an alignment)
            p.start_alignment(t, g, done=0)
        elif op == "freeze" and key in p.aligners and g not in halted_at_commit:
            p.freeze(key, p.aligners[key].snapshot(p.next[key]))
        elif op == "forget":
            p.forget(g)
            halted_at_commit.discard(g)
            assert not any(k[1] == g for k in p.next)
        _check(p)
    now = (p.next, p.aligners, p.rewound, p.backpressured)
    assert all(a is b for a, b in zip(now, containers, strict=True))  # one object for life
