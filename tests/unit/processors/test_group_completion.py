"""A multi-input key group completes its grouped aligners only when no input replays.

Drives the runtime's own :class:`BarrierAlignment` (barriers through ``on_barrier``, the
deferred completions through ``complete_deferred``) with real :class:`Aligner` machines,
:class:`InputPositions`, :class:`KeyGroupCheckpoints`, :class:`SavepointRequests` and
:class:`OpenEpoch`; the runner's barrier writing is a callback recording completions.
The scenario is the adversarial review's: input A holds records of a writer that passed
barrier 1 when commit 1 is taken; after a restore, B's barrier 1 arrives while A still
replays. Completing then and committing in the middle of A's replay made a second
restore skip A's records 3..5, which were never processed.
"""

from __future__ import annotations

from typing import Any

from processors._checkpoint.alignment import Aligner, Decision, Mode, Snapshot
from processors._checkpoint.input_positions import InputPositions
from processors._checkpoint.keygroup_state import KeyGroupCheckpoints
from processors._checkpoint.protocol import Barrier, lockgate_headers
from processors._checkpoint.savepoint_requests import SavepointRequests
from processors._runtime.barriers import BarrierAlignment
from processors._runtime.health import Metrics
from processors._runtime.open_epoch import OpenEpoch


class _NoSavepointFiles:
    """No savepoint is taken in these scenarios."""

    def export(self, *args: Any) -> dict[str, Any]:
        raise AssertionError("no savepoint expected")


class _Runtime:
    """The real component over the real collaborators of key group 0 with inputs A, B."""

    def __init__(self, a: Aligner, b: Aligner, next_a: int, next_b: int) -> None:
        inputs = ("A", "B")
        sp_requests = SavepointRequests()
        self.positions = InputPositions(
            inputs, Mode.ALIGNED, 60, 1000, grouped=True, cancelled=sp_requests.cancelled
        )
        self.positions.aligners.update({("A", 0): a, ("B", 0): b})
        self.positions.next.update({("A", 0): next_a, ("B", 0): next_b})
        self.open = OpenEpoch()
        marks = KeyGroupCheckpoints()
        #: The checkpoints the key group completed (forwarded downstream).
        self.completions: list[int] = []
        self.barriers = BarrierAlignment(
            name="down",
            inputs=inputs,
            mode=Mode.ALIGNED,
            positions=self.positions,
            marks=marks,
            sp_requests=sp_requests,
            sp_files=_NoSavepointFiles(),  # type: ignore[arg-type]
            metrics=Metrics("down", "test"),
            time_service=None,
            kgs={0: object()},  # type: ignore[dict-item]
            halted=marks.halted,
            open_epoch=self.open,
            write_barriers=self._write_barriers,
            halt=self._halt,
        )

    def _write_barriers(self, g: int, ckpt: int, request: dict[str, Any] | None) -> None:
        assert request is None
        self.completions.append(ckpt)

    def _halt(self, g: int, sp_id: str) -> None:
        raise AssertionError("no halt expected")

    @property
    def released(self) -> list[Any]:
        """The records the completions released, in the order the loop processes them."""
        return list(self.open.released)

    def barrier(self, topic: str, offset: int, writer: str, ckpt: int) -> None:
        """A barrier of ``writer`` (no key-group count announced) at ``topic[0]@offset``."""
        _, headers = Barrier(ckpt, writer, 0).encode()
        self.barriers.on_barrier(topic, 0, offset, lockgate_headers(headers))


def _aligner(snapshot: Snapshot | None = None) -> Aligner:
    return Aligner(Mode.ALIGNED, 60, 1000, snapshot=snapshot, grouped=True)


def test_no_completion_while_an_input_replays() -> None:
    processed: list[int] = []
    a, b = _aligner(), _aligner()
    a.expect(["X/0"])
    b.expect(["Y/0"])
    rt = _Runtime(a, b, 0, 0)
    rt.barrier("A", 0, "X/0", 1)
    assert rt.completions == []  # B's writer has not passed 1
    for offset in range(1, 6):
        assert a.on_record(offset, "X/0", offset) is Decision.HOLD
    commit1 = (a.snapshot(6), b.snapshot(0))
    assert (commit1[0].low, commit1[0].high, commit1[0].done) == (1, 6, 0)

    # Restored from commit 1; B's barrier 1 comes first (a control record at the head of
    # its queue is released before A's older records).
    a, b = _aligner(commit1[0]), _aligner(commit1[1])
    rt = _Runtime(a, b, 1, 0)
    rt.barrier("B", 0, "Y/0", 1)
    rt.positions.next[("B", 0)] = 1
    assert rt.completions == [] and rt.barriers.deferred_groups == {0}  # A replays: wait
    for offset in (1, 2):
        if a.on_record(offset, "X/0", offset) is Decision.PROCESS:
            processed.append(offset)
    rt.positions.next[("A", 0)] = 3
    rt.barriers.complete_deferred()
    assert rt.completions == []  # still replaying
    commit2 = (a.snapshot(3), b.snapshot(1))
    assert commit2[0].done == 0  # before the fix: 1, which skips 3..5 on the next restore

    a, b = _aligner(commit2[0]), _aligner(commit2[1])
    rt = _Runtime(a, b, 1, 1)
    for offset in range(1, 6):
        if a.on_record(offset, "X/0", offset) is Decision.PROCESS:
            processed.append(offset)
    rt.positions.next[("A", 0)] = 6
    # B's barrier was before commit 2's low: it is in B's snapshot (ready 1) already.
    assert b.ready == 1 and not a.replaying
    rt.barriers.complete_deferred()  # nothing deferred in this process
    assert rt.completions == []
    rt.barrier("A", 6, "X/0", 2)  # A's next event completes 1
    assert rt.completions == [1]
    processed += [p for p in rt.released if isinstance(p, int)]
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
    rt.barrier("B", 0, "Y/0", 1)
    rt.positions.next[("B", 0)] = 1
    assert rt.completions == [] and a.replaying
    assert a.on_record(1, "X/0", "a1") is Decision.HOLD  # tag 1 > done 0
    rt.positions.next[("A", 0)] = 2
    assert not a.replaying
    rt.barriers.complete_deferred()
    assert rt.completions == [1] and rt.released == ["a1"] and not rt.barriers.deferred_groups
