"""KeyGroupCheckpoints: what an aborted epoch goes back to, and what a halt survives."""

from __future__ import annotations

import time

from processors._checkpoint.keygroup_state import KeyGroupCheckpoints


def test_rewind_restores_what_the_last_commit_made() -> None:
    marks = KeyGroupCheckpoints()
    marks.load(3, done=7, aligned=True, origin="sp-a", seeding=None, halted=None)
    marks.completed(3, 9, aligned=False)
    assert (marks.done(3), marks.aligned(3)) == (9, False)
    rewound = marks.rewind(3)
    assert (marks.done(3), marks.aligned(3), marks.origin(3)) == (7, True, "sp-a")
    assert rewound.committed_halt is None and not rewound.halt_undone
    marks.completed(3, 11)
    marks.commit([3])
    marks.completed(3, 12)
    marks.rewind(3)
    assert marks.done(3) == 11


def test_a_halt_of_the_aborted_epoch_is_undone_and_a_committed_one_kept() -> None:
    marks = KeyGroupCheckpoints()
    halted = marks.halted  # the per-record loop keeps this very dict
    marks.commit([1, 2])
    marks.halt(1, "sp-x")
    assert marks.is_halted(1) and halted == {1: "sp-x"}
    rewound = marks.rewind(1)
    assert rewound.halt_undone and not marks.is_halted(1) and halted == {}
    marks.halt(2, "sp-y")
    marks.commit([2])
    rewound = marks.rewind(2)
    assert rewound == ("sp-y", False) and halted == {2: "sp-y"}
    assert marks.halted is halted


def test_a_lifted_halt_stays_lifted_through_an_abort() -> None:
    marks = KeyGroupCheckpoints()
    marks.load(0, done=4, aligned=True, origin=None, seeding=None, halted="sp-z")
    marks.load(1, done=4, aligned=True, origin=None, seeding=None, halted="sp-other")
    assert marks.lift("sp-z") == [0]
    assert not marks.is_halted(0) and marks.is_halted(1)
    rewound = marks.rewind(0)
    assert rewound.committed_halt is None and not marks.is_halted(0)
    assert marks.done(0) == 4


def test_seeding_and_forgetting() -> None:
    marks = KeyGroupCheckpoints()
    marks.load(5, done=2, aligned=True, origin=None, seeding="sp-s", halted="sp-h")
    assert marks.seeding(5) == "sp-s"
    marks.seeded(5, "sp-s", 40)
    assert (marks.done(5), marks.origin(5), marks.seeding(5)) == (40, "sp-s", None)
    assert not marks.is_halted(5)
    marks.forget(5)
    assert (marks.done(5), marks.origin(5), marks.aligned(5)) == (0, None, True)
    assert marks.rewind(5) == (None, False)
    assert marks.done(5, default=-1) == 0  # the rewind re-created it from "never committed"


def test_a_request_older_than_a_restore_is_recognised() -> None:
    marks = KeyGroupCheckpoints()
    assert not marks.restored_since(2, 1)  # never restored here
    before = int(time.time() * 1000) - 1
    marks.start_seeding(2, "sp-r")
    marks.start_seeding(2, "sp-r")  # a redo keeps the first start
    after = int(time.time() * 1000) + 1
    marks.seeded(2, "sp-r", 9)
    assert marks.restored_since(2, before)  # requested before the restore began
    assert not marks.restored_since(2, after)  # requested during or after it
    assert not marks.restored_since(2, 0)  # no request time: never refused
    marks.forget(2)
    assert not marks.restored_since(2, before)
