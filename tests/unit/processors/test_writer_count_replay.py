"""A writer-count change read again while a partition replays (issue 25, item 8).

``BarrierMixin._on_barrier`` applies the key-group count a barrier announces for its
upstream app (``_update_writers``: expect new writers, drop writers beyond the count)
only when the aligner is not replaying: :meth:`Aligner.drop_writers` and
:meth:`Aligner.expect` refuse membership changes of known writers while replaying. These
tests drive the runtime's own ``_on_barrier`` / ``_update_writers`` with a real
:class:`Aligner` (the rest of the runner is a stand-in recording completions and the
records to process) and compare a first run with a run restored from its snapshot.

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

from types import SimpleNamespace
from typing import Any

from processors._checkpoint.alignment import Aligner, Completion, Decision, Mode, Snapshot
from processors._checkpoint.input_positions import InputPositions
from processors._checkpoint.protocol import Barrier, lockgate_headers
from processors._checkpoint.savepoint_requests import SavepointRequests
from processors._runtime.barriers import BarrierMixin

UP = "up"


class _Runtime:
    """Just what ``_on_barrier`` reads and calls; ``_complete`` records completions."""

    _on_barrier = BarrierMixin._on_barrier
    _update_writers = BarrierMixin._update_writers
    _group = BarrierMixin._group

    def __init__(self, aligner: Aligner, origin: str | None = None) -> None:
        self.name = "down"
        self.app = SimpleNamespace(time_service=None)
        self._mode = Mode.ALIGNED
        self._inputs = ("T",)
        self._released: list[Any] = []
        self._open = SimpleNamespace(released=self._released)  # the same list
        self._sp_requests = SavepointRequests()
        self._positions = InputPositions(
            self._inputs, Mode.ALIGNED, 60, 1000, grouped=False, cancelled=set()
        )
        self._positions.aligners[("T", 0)] = aligner
        self._marks = SimpleNamespace(origin=lambda g: origin)
        self.metrics = SimpleNamespace(observe_alignment=lambda s: None)
        #: (checkpoint, savepoint, the alignment before the completing event)
        self.completions: list[tuple[int, str | None, Snapshot]] = []

    def _complete(
        self,
        g: int,
        completion: Completion,
        befores: dict[str, Snapshot],
        later: tuple[Any, ...] = (),
    ) -> None:
        sp = completion.savepoint
        if sp is not None and self._marks.origin(g) == sp:
            sp = None  # restored from it: the replay completes it again without taking it
        self.completions.append((completion.checkpoint, sp, befores["T"]))
        self._released += [*completion.released, *later]

    @property
    def aligner(self) -> Aligner:
        return self._positions.aligners[("T", 0)]

    def barrier(
        self, offset: int, writer: int, ckpt: int, writers: int, sp: str | None = None
    ) -> None:
        """A barrier of ``up/<writer>`` announcing ``writers`` key groups, as the loop feeds it."""
        _, headers = Barrier(ckpt, f"{UP}/{writer}", writers, savepoint=sp).encode()
        self._on_barrier("T", 0, offset, lockgate_headers(headers))

    def record(self, offset: int, writer: int, payload: str) -> None:
        """A data record of ``up/<writer>``; what the loop would process goes to ``_released``."""
        decision = self.aligner.on_record(offset, f"{UP}/{writer}", payload)
        assert not isinstance(decision, tuple)
        if decision is Decision.PROCESS:
            self._released.append(payload)


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
    processed = list(first._released)
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
    processed += restored._released
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
    assert first._released == ["c", "a", "b"]  # a and b after the cut
    return first, first.completions[0][2]


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
    assert restored._released == ["a", "b"]
    assert restored.aligner.writers.keys() == {f"{UP}/0", f"{UP}/1"}
    restored.barrier(7, 1, 6, 2)
    assert [c[0] for c in restored.completions] == [5, 6]
