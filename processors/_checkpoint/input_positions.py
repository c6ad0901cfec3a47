"""Where each owned input partition stands: next offset, committed offset, alignment.

An input partition is ``(topic, key group)``. For every owned one the runtime tracks:

* ``next``: the next record to process. Set on assignment (the committed offset, or the
  log start when nothing is committed), advanced by the per-record loop, reset by a
  rewind. Never read back from ``consumer.position()``: that is INVALID right after a
  ``seek()`` until the next fetch.
* ``committed``: the offset in the last committed transaction.
* an *aligner* (:class:`~processors._checkpoint.alignment.Aligner`) when the partition
  carries records of upstream lockgate writers, and the alignment snapshot committed last
  with it;
* a *frozen* snapshot: what a halted (stop-with-savepoint) partition commits instead of
  its aligner's current one (the position from before the completing barrier);
* *aligned until*: an unaligned-mode partition aligned for a savepoint, until that
  checkpoint completes;
* *rewound* partitions, whose records in the batch ``consume()`` is returning predate a
  seek made by a callback meanwhile, and partitions *paused by backpressure* (the
  interleaver buffers too many of their records).

Invariants (``tests/unit/test_input_positions.py``):

1. ``next`` and ``committed`` have the same keys: the owned input partitions
   (:meth:`InputPositions.assign` adds both, :meth:`InputPositions.forget` removes both),
   and ``committed[p] <= next[p]``: a commit names ``next`` or an aligner's ``low``, which
   is below it, and only processing moves ``next`` (forward).
2. Every aligner, committed snapshot, frozen snapshot and aligned-until entry belongs to
   an owned partition; a frozen snapshot or an aligned-until entry only to one with an
   aligner.
3. After :meth:`InputPositions.rewind` of key group ``g`` (an aborted epoch), each of
   ``g``'s partitions has ``next == committed``, each aligner is rebuilt from its
   committed snapshot (dropped if none was committed), and nothing stays frozen unless
   the committed state was halted.
4. After :meth:`InputPositions.forget` of ``g`` (revoked or lost) none of ``g``'s
   partitions has an entry in any of them, except ``rewound``: it lives for one
   ``consume()`` (cleared before the next; the loop drops the batch's records of every
   partition in it and seeks only the owned ones).
5. :attr:`InputPositions.next`, :attr:`InputPositions.aligners`,
   :attr:`InputPositions.rewound` and :attr:`InputPositions.backpressured` are each one
   object for the component's life: the per-record loop keeps references to them. The
   loop writes ``next`` and reads ``aligners``; every other change goes through the
   methods (the loop and the interleaving clear ``rewound`` and update ``backpressured``).
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping, Sequence
from typing import Any, NamedTuple

from processors._checkpoint.alignment import Aligner, Mode, Snapshot

__all__ = ["InputPositions", "Rewind"]

#: An input partition: (topic, key group).
Key = tuple[str, int]


class Rewind(NamedTuple):
    """What :meth:`InputPositions.rewind` did to one key group's partitions."""

    #: records released by the alignments set up again, processed before any other
    released: tuple[Any, ...]
    #: ``(topic, offset)`` to seek each partition that has a committed offset to
    seeks: list[tuple[str, int]]


class InputPositions:
    """Positions and alignment of every owned input partition (see the module docs).

    Args:
        inputs: the app's input topics (key group ``g`` is partition ``g`` of each).
        mode: the app's alignment mode.
        timeout_s: ``LOCKGATE_ALIGNMENT_TIMEOUT_MS`` in seconds.
        max_held: ``LOCKGATE_ALIGNMENT_MAX_HELD``.
        grouped: a key group's aligners complete together (several inputs).
        cancelled: the cancelled savepoint ids (a live view: a snapshot's pending
            savepoint that was cancelled does not keep an unaligned partition aligned).
    """

    def __init__(
        self,
        inputs: Sequence[str],
        mode: Mode,
        timeout_s: float,
        max_held: int,
        *,
        grouped: bool,
        cancelled: Collection[str],
    ) -> None:
        self._inputs = tuple(inputs)
        self._mode = mode
        self._timeout_s = timeout_s
        self._max_held = max_held
        self._grouped = grouped
        self._cancelled = cancelled
        #: Per input topic, the upstream writers (``<app>/<key group>``) registered for it
        #: at start (:meth:`expect_writers`).
        self.writers: dict[str, list[str]] = {}
        #: The next record to process per owned input partition. One dict for the
        #: component's life; the per-record loop writes it directly.
        self.next: dict[Key, int] = {}
        #: The aligner per aligned input partition. One dict for the component's life;
        #: read it freely, change it only through the methods.
        self.aligners: dict[Key, Aligner] = {}
        #: Partitions sought by a callback while ``consume()`` collected a batch. One set
        #: for the component's life: the loop clears it before each ``consume()``.
        self.rewound: set[Key] = set()
        #: Partitions paused because the interleaver buffers too many of their records.
        #: One set for the component's life; the interleaving pauses and resumes them.
        self.backpressured: set[Key] = set()
        self._committed: dict[Key, int] = {}
        self._align_committed: dict[Key, Snapshot] = {}
        self._frozen: dict[Key, Snapshot] = {}
        self._aligned_until: dict[Key, int] = {}

    # -- reading --------------------------------------------------------------------------

    @property
    def committed(self) -> Mapping[Key, int]:
        """Offsets in the last committed transaction (a live, read-only view)."""
        return self._committed

    def is_downstream(self, g: int) -> bool:
        """Whether key group ``g`` reads upstream lockgate writers (has an aligner)."""
        aligners = self.aligners
        return any((t, g) in aligners for t in self._inputs)

    def commit_position(self, key: Key) -> tuple[int, Snapshot | None]:
        """What the open epoch commits for owned partition ``key``.

        A source partition commits its next offset. An aligned one commits the first
        record its aligner still holds (``low``) with the snapshot saying which records
        after it are already included; a halted one its frozen snapshot instead.

        Returns:
            The offset and, for an aligned partition, the alignment snapshot.
        """
        aligner = self.aligners.get(key)
        if aligner is None:
            return self.next[key], None
        snap = self._frozen.get(key) or aligner.snapshot(self.next[key])
        return snap.low, snap

    # -- assignment -----------------------------------------------------------------------

    def expect_writers(self, writers: Mapping[str, list[str]]) -> None:
        """The upstream writers registered for each input topic (read at start)."""
        self.writers = dict(writers)

    def assign(self, key: Key, offset: int) -> None:
        """Owned partition ``key`` starts at ``offset``, its committed one."""
        self._committed[key] = offset
        self.next[key] = offset

    def load(self, g: int, snapshots: Mapping[str, Snapshot]) -> tuple[Any, ...]:
        """Key group ``g`` resumes the committed alignment ``snapshots`` (per input topic).

        Returns:
            Records released by aligning its inputs for a savepoint (none in practice:
            nothing is held unaligned), to process before any other.
        """
        for topic, snap in snapshots.items():
            self._resume(g, topic, snap)
        return self.share_savepoint_alignment(g)

    def seed(
        self, g: int, offsets: Mapping[str, int], snapshots: Mapping[str, Snapshot | None]
    ) -> tuple[Any, ...]:
        """Move key group ``g``'s positions and alignment to a savepoint's (as committed).

        ``snapshots`` has an entry per topic of ``offsets``; ``None`` for a partition
        without alignment.

        Returns:
            As :meth:`load`.
        """
        for topic, offset in offsets.items():
            key = (topic, g)
            self.next[key] = self._committed[key] = offset
            snap = snapshots.get(topic)
            if snap is not None:
                self._resume(g, topic, snap)
            else:
                self._drop_aligner(key)
        return self.share_savepoint_alignment(g)

    def start_fetching(self, keys: Iterable[Key]) -> list[tuple[Key, int]]:
        """Partitions just assigned are fetched from their next offsets.

        Records of theirs in the batch ``consume()`` is collecting predate that position:
        the partitions count as rewound.

        Returns:
            Each partition with the offset to fetch it from.
        """
        start = [(key, self.next[key]) for key in keys]
        self.rewound.update(key for key, _ in start)
        return start

    def forget(self, g: int) -> None:
        """Key group ``g`` is no longer owned: nothing of its partitions is kept."""
        for topic in self._inputs:
            key = (topic, g)
            self._committed.pop(key, None)
            self.next.pop(key, None)
            self.aligners.pop(key, None)
            self._align_committed.pop(key, None)
            self._frozen.pop(key, None)
            self._aligned_until.pop(key, None)
        paused = [key for key in self.backpressured if key[1] == g]
        self.backpressured.difference_update(paused)

    # -- alignment ------------------------------------------------------------------------

    def start_alignment(self, topic: str, g: int, done: int) -> tuple[Aligner, tuple[Any, ...]]:
        """Owned partition ``topic[g]`` met its first upstream lockgate record.

        The alignment starts at its committed position with the key group's completed
        checkpoint ``done`` (checkpoint ids stay increasing).

        Returns:
            The new aligner, and records released as in :meth:`load`.
        """
        key = (topic, g)
        start = self._committed.get(key, self.next[key])
        aligner = self._new_aligner(Snapshot(start, start, done, {}, False), key)
        self.aligners[key] = aligner
        return aligner, self.share_savepoint_alignment(g)

    def align_for_savepoint(self, key: Key, checkpoint: int) -> None:
        """Unaligned partition ``key`` aligns until savepoint ``checkpoint`` completes.

        The caller switched its aligner to ALIGNED.
        """
        self._aligned_until[key] = max(self._aligned_until.get(key, 0), checkpoint)

    def end_savepoint_alignment(self, key: Key, checkpoint: int) -> tuple[Any, ...]:
        """Checkpoint ``checkpoint`` completed on ``key``: end a savepoint's alignment it ends.

        Returns:
            The records the aligner held (tags past the savepoint), released by its
            return to unaligned; empty when ``key`` was not aligned for a savepoint up
            to ``checkpoint``.
        """
        until = self._aligned_until.get(key)
        if until is None or checkpoint < until:
            return ()
        del self._aligned_until[key]
        return self.aligners[key].set_mode(Mode.UNALIGNED)

    def share_savepoint_alignment(self, g: int) -> tuple[Any, ...]:
        """Align every input of ``g`` while one of them aligns for a savepoint.

        With ``LOCKGATE_ALIGNMENT=none`` a savepoint barrier aligns its partition until
        the savepoint completes; a multi-input key group's aligners complete together, so
        all of them must hold (an aligner created later, or restored from a snapshot that
        saw no savepoint barrier yet, would otherwise make the completion unaligned).

        Returns:
            Records released by the switches (none in practice: nothing is held
            unaligned), to process before any other.
        """
        if self._mode is not Mode.UNALIGNED or not self._grouped:
            return ()
        keys = [(t, g) for t in self._inputs if (t, g) in self.aligners]
        until = max((self._aligned_until.get(k, 0) for k in keys), default=0)
        if not until:
            return ()
        released: tuple[Any, ...] = ()
        for key in keys:
            aligner = self.aligners[key]
            if aligner.mode is Mode.UNALIGNED:
                released += aligner.set_mode(Mode.ALIGNED)
            self._aligned_until[key] = max(self._aligned_until.get(key, 0), until)
        return released

    # -- halts ----------------------------------------------------------------------------

    def freeze(self, key: Key, snapshot: Snapshot) -> None:
        """Halted partition ``key`` commits ``snapshot`` from now on (its aligner's is later)."""
        self._frozen[key] = snapshot

    def thaw(self, g: int) -> None:
        """Key group ``g``'s halt was lifted: its partitions commit their aligners' again."""
        for topic in self._inputs:
            self._frozen.pop((topic, g), None)

    # -- commits and aborts ---------------------------------------------------------------

    def mark_committed(
        self, offsets: Iterable[tuple[Key, int]], snapshots: Mapping[Key, Snapshot]
    ) -> None:
        """The open epoch committed ``offsets`` and the alignment ``snapshots`` with them."""
        committed = self._committed
        for key, offset in offsets:
            committed[key] = offset
        self._align_committed.update(snapshots)

    def rewind(self, g: int, *, keep_frozen: bool) -> Rewind:
        """The open epoch aborted: key group ``g``'s partitions go back to the last commit.

        Each aligner is rebuilt from its committed snapshot (dropped when none was
        committed: the partition met its first upstream record in the aborted epoch),
        ``next`` goes back to the committed offset and the partition counts as rewound.

        Args:
            g: the key group.
            keep_frozen: the key group was halted when the epoch began (its frozen
                snapshots stay); otherwise a halt of the aborted epoch is undone.

        Returns:
            The records released by the alignments set up again, and where to seek.
        """
        for topic in self._inputs:
            key = (topic, g)
            if key in self.aligners or key in self._align_committed:
                snap = self._align_committed.get(key)
                if snap is None:
                    self._drop_aligner(key)
                else:
                    self.aligners[key] = self._new_aligner(snap, key)
            if not keep_frozen:
                self._frozen.pop(key, None)
        released = self.share_savepoint_alignment(g)
        seeks = []
        for topic in self._inputs:
            key = (topic, g)
            offset = self._committed.get(key)
            if offset is None:
                continue
            self.next[key] = offset
            self.rewound.add(key)
            seeks.append((topic, offset))
        return Rewind(released, seeks)

    # -- internals ------------------------------------------------------------------------

    def _resume(self, g: int, topic: str, snapshot: Snapshot) -> None:
        """``topic[g]`` aligns from ``snapshot``, which is also its committed alignment."""
        key = (topic, g)
        self.aligners[key] = self._new_aligner(snapshot, key)
        self._align_committed[key] = snapshot

    def _drop_aligner(self, key: Key) -> None:
        self.aligners.pop(key, None)
        self._align_committed.pop(key, None)
        self._aligned_until.pop(key, None)

    def _new_aligner(self, snapshot: Snapshot, key: Key) -> Aligner:
        """An aligner of input partition ``key`` resuming from ``snapshot``.

        It expects the writers registered for that input. In unaligned mode, a snapshot
        taken while a savepoint was aligning (a savepoint barrier seen, its checkpoint not
        complete) resumes aligned until it completes: the writers past the savepoint
        barrier must keep being held. A multi-input app's aligners are grouped: the key
        group completes them together.
        """
        pending = [
            c
            for c, sp in snapshot.savepoints.items()
            if c > snapshot.done and sp not in self._cancelled
        ]
        mode = self._mode
        self._aligned_until.pop(key, None)
        if pending and mode is Mode.UNALIGNED:
            mode = Mode.ALIGNED
            self._aligned_until[key] = max(pending)
        aligner = Aligner(
            mode, self._timeout_s, self._max_held, snapshot=snapshot, grouped=self._grouped
        )
        if not aligner.replaying:
            # While replaying, membership comes from the snapshot and the barriers replayed
            # (a writer dropped before the commit must stay dropped until then).
            aligner.expect(self.writers.get(key[0], ()))
        return aligner
