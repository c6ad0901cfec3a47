"""A writer-count change read again while a partition replays (issue 25, item 8).

``BarrierAlignment.on_barrier`` applies the key-group count a barrier announces for its
upstream app (``_update_writers``: expect new writers, drop writers beyond the count)
only when the aligner is not replaying: :meth:`Aligner.drop_writers` and
:meth:`Aligner.expect` refuse membership changes of known writers while replaying. These
tests drive the runtime's own :class:`BarrierAlignment` with a real :class:`Aligner`,
:class:`InputPositions`, :class:`KeyGroupCheckpoints`, :class:`SavepointRequests` and
:class:`OpenEpoch` (the runner's barrier writing records completions, a stand-in for the
savepoint files records exports) and compare a first run with a run restored from its
snapshot.

* A change read again inside ``[low, high)`` is skipped, and that is exact: the snapshot
  is taken at ``high``, after the first run applied it, so it carries the drop
  (``dropped``) or the expected writers (``last``) from ``low`` on; every record of a
  dropped writer before the drop was processed before the commit (immediately, or
  released by the drop), so the replay skips it.
* A savepoint's (and a stop-with-savepoint's frozen commit's) snapshot is taken *before*
  its completing barrier: ``high`` is that barrier's offset. Offsets before it are often
  never fed to the aligner (transaction markers of the upstream writers), so when the
  replay reaches the barrier, the aligner's next offset is still below ``high`` and it
  counted as replaying: a drop carried by that barrier was skipped. The restored run
  did not complete the checkpoint the drop completes in the first run; it completed
  later, at the next barrier of that upstream app (no loss, no duplicate, but its
  released records and watermarks waited a checkpoint interval, or indefinitely while
  that app wrote no barrier). The barrier now moves the aligner past the unread offsets
  before ``replaying`` is asked (:meth:`Aligner.skip_to`), so the restored run goes on
  exactly as the first run did from ``high`` (the module's argument 4).
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

UP = "up"


class _KeyGroup:
    """Key group 0 with nothing written in the open epoch (its savepoint overlay is empty)."""

    caches: dict[str, Any] = {}


class _SavepointFiles:
    """Records each export's savepoint, checkpoint and the alignment of input ``T``."""

    def __init__(self) -> None:
        #: (savepoint, checkpoint, the alignment before the completing event)
        self.exports: list[tuple[str, int, Snapshot]] = []

    def export(
        self,
        g: int,
        kg: Any,
        request: dict[str, Any],
        ckpt: int,
        offsets: dict[str, int],
        align: dict[str, Any],
        overlay: dict[str, Any],
        error: str | None = None,
    ) -> dict[str, Any]:
        before = Snapshot.from_json(align["T"])
        assert offsets == {"T": before.low} and error is None
        self.exports.append((str(request["savepoint"]), ckpt, before))
        return {"error": None}


class _Runtime:
    """The real component over key group 0 of input ``T``; the runner's part is recorded.

    Completions are what the component forwards downstream (the runner's barrier
    writing); the records to process are the open epoch's ``released`` (the loop's).
    """

    def __init__(self, aligner: Aligner, origin: str | None = None) -> None:
        sp_requests = SavepointRequests()
        self._positions = InputPositions(
            ("T",), Mode.ALIGNED, 60, 1000, grouped=False, cancelled=sp_requests.cancelled
        )
        self._positions.aligners[("T", 0)] = aligner
        marks = KeyGroupCheckpoints()
        marks.load(0, done=0, aligned=True, origin=origin, seeding=None, halted=None)
        self.open = OpenEpoch()
        self.sp_files = _SavepointFiles()
        #: (checkpoint, the savepoint it took, if any)
        self.completions: list[tuple[int, str | None]] = []
        self.barriers = BarrierAlignment(
            name="down",
            inputs=("T",),
            mode=Mode.ALIGNED,
            positions=self._positions,
            marks=marks,
            sp_requests=sp_requests,
            sp_files=self.sp_files,  # type: ignore[arg-type]
            metrics=Metrics("down", "test"),
            time_service=None,
            kgs={0: _KeyGroup()},  # type: ignore[dict-item]
            halted=marks.halted,
            open_epoch=self.open,
            write_barriers=self._write_barriers,
            halt=self._halt,
        )

    def _write_barriers(self, g: int, ckpt: int, request: dict[str, Any] | None) -> None:
        self.completions.append((ckpt, None if request is None else request["savepoint"]))

    def _halt(self, g: int, sp_id: str) -> None:
        raise AssertionError("no stop-with-savepoint here")

    @property
    def released(self) -> list[Any]:
        """The records to process, in order (released by completions, or processed)."""
        return list(self.open.released)

    @property
    def aligner(self) -> Aligner:
        return self._positions.aligners[("T", 0)]

    def barrier(
        self, offset: int, writer: int, ckpt: int, writers: int, sp: str | None = None
    ) -> None:
        """A barrier of ``up/<writer>`` announcing ``writers`` key groups, as the loop feeds it."""
        _, headers = Barrier(ckpt, f"{UP}/{writer}", writers, savepoint=sp).encode()
        self.barriers.on_barrier("T", 0, offset, lockgate_headers(headers))

    def record(self, offset: int, writer: int, payload: str) -> None:
        """A data record of ``up/<writer>``; what the loop would process goes to ``released``."""
        decision = self.aligner.on_record(offset, f"{UP}/{writer}", payload)
        assert not isinstance(decision, tuple)
        if decision is Decision.PROCESS:
            self.open.released.append(payload)


def _aligner(snapshot: Snapshot) -> Aligner:
    return Aligner(Mode.ALIGNED, 60, 1000, snapshot=snapshot)


def test_a_drop_read_again_inside_the_replayed_span_is_carried_by_the_snapshot() -> None:
    """The change skipped while replaying was applied before the commit: exact."""
    first = _Runtime(_aligner(Snapshot(0, 0, 4, {}, False)))
    first.barrier(0, 0, 5, 3)  # three upstream key groups: up/1 and up/2 expected at 4
    first.barrier(1, 0, 6, 3)
    first.record(2, 0, "a")  # tag 6: held
    first.barrier(3, 1, 5, 2)  # up redeployed with two key groups: up/2 dropped, 5 done
    first.record(4, 1, "b")  # tag 5: processed
    assert [c[0] for c in first.completions] == [5]
    commit = first.aligner.snapshot(5)
    assert (commit.low, commit.high, commit.done) == (2, 5, 5)
    assert commit.dropped == {f"{UP}/2"} and f"{UP}/2" not in commit.last
    processed = list(first.released)
    assert processed == ["b"]

    # Crash; restored from the commit, the partition is read again from offset 2.
    restored = _Runtime(_aligner(commit))
    restored.record(2, 0, "a")  # tag 6 > 5: held again
    restored.barrier(3, 1, 5, 2)  # replaying: the drop is not applied again (in the snapshot)
    restored.record(4, 1, "b")  # processed before the commit: skipped
    assert restored.aligner.replaying is False
    restored.barrier(6, 1, 6, 2)
    restored.record(7, 2, "late record of the dropped writer")  # no writer any more: processed
    assert [c[0] for c in restored.completions] == [6]
    processed += restored.released
    assert sorted(processed) == ["a", "b", "late record of the dropped writer"]


def _first_run() -> tuple[_Runtime, Snapshot]:
    """Savepoint sp-1 at checkpoint 5, completed by the drop its completing barrier carries.

    Upstream ``up`` had three key groups; up/0 and up/1 passed barrier 5 (the savepoint's),
    up/2 did not before ``up`` was redeployed with two key groups. The first barrier of
    the new deployment (up/0's 6, at offset 6 after a transaction marker at 5) drops
    up/2, which completes checkpoint 5: the savepoint, with the alignment before it.
    """
    first = _Runtime(_aligner(Snapshot(0, 0, 4, {}, False)))
    first.barrier(0, 0, 5, 3, "sp-1")
    first.record(1, 0, "a")  # tag 5: held
    first.barrier(2, 1, 5, 3, "sp-1")
    first.record(3, 1, "b")  # tag 5: held
    first.record(4, 2, "c")  # tag 4: processed
    # offset 5: a transaction marker (never reaches the aligner)
    first.barrier(6, 0, 6, 2)
    assert [(c[0], c[1]) for c in first.completions] == [(5, "sp-1")]
    assert first.released == ["c", "a", "b"]  # a and b after the cut
    [(sp, ckpt, before)] = first.sp_files.exports  # exported with the alignment before it
    assert (sp, ckpt) == ("sp-1", 5)
    return first, before


def test_a_drop_carried_by_a_savepoint_completing_barrier_applies_on_restore() -> None:
    """Restored from the savepoint, its completing barrier completes it again at once."""
    _, before = _first_run()
    assert (before.low, before.high, before.done) == (1, 6, 4)
    assert f"{UP}/2" in before.last and not before.dropped  # taken before the drop

    restored = _Runtime(_aligner(before), origin="sp-1")
    restored.record(1, 0, "a")  # tag 5 > 4: held (after the cut)
    restored.barrier(2, 1, 5, 3, "sp-1")
    restored.record(3, 1, "b")
    restored.record(4, 2, "c")  # before the cut: skipped
    restored.barrier(6, 0, 6, 2)  # high: the first run dropped up/2 here and completed 5
    # Before the fix: [] (the drop was skipped as "replaying"; 5 completed only at the
    # next barrier of up, jumping to 6, with a and b held until then).
    assert [(c[0], c[1]) for c in restored.completions] == [(5, None)]
    assert restored.released == ["a", "b"]
    assert restored.aligner.writers.keys() == {f"{UP}/0", f"{UP}/1"}
    restored.barrier(7, 1, 6, 2)
    assert [c[0] for c in restored.completions] == [5, 6]
