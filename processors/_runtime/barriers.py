"""Barriers read downstream: alignment, checkpoint completion, forwarding.

A key group whose input partition carries records of upstream lockgate writers
(``lockgate-writer`` header) is *downstream*: its checkpoints are not its own clock's
but those its writers' barriers complete (:mod:`processors._checkpoint.alignment`). On each
completion the key group forwards the barrier to its own internal outputs (so a third
stage aligns on the same ids), and when the checkpoint is a savepoint it exports its
state at exactly that point. A key group with several such inputs (a DAG: pipelines
joined in one app) completes a checkpoint once every writer of every input passed it
(grouped aligners, :meth:`BarrierAlignment._complete_group`), so its savepoint is one
consistent cut over all its inputs. Its instance commits on its own timer as before: a commit
in the middle of an alignment is exact too, because the alignment snapshot committed
with the offsets says which records after the committed offset are already included.

:class:`BarrierAlignment` (the runner's ``self._barriers``) owns:

* the key groups whose grouped completion waits for an input's replay to end (completed
  between batches, :meth:`BarrierAlignment.tick`, once no input of theirs replays);

and keeps these invariants:

* an aligned checkpoint is a consistent cut: a key group completes a checkpoint only
  when every writer of every aligned input passed it, and a savepoint it takes exports
  the state and positions of exactly that cut (the alignment before the completing
  event);
* nothing completes while an input of the key group replays (a completion made earlier
  than in the first run could commit a ``done`` that skips records never processed);
* every completion forwards the barrier downstream (with the savepoint only where it was
  taken without error) and raises the open epoch's highest checkpoint id;
* upstream barrier watermarks apply only after the records the completion released
  (:class:`WatermarkUpdate` queued behind them in the open epoch's ``released``).

Everything else it reads or changes belongs to its collaborators: input positions and
aligners (``InputPositions``), per key group checkpoints and halts
(``KeyGroupCheckpoints``), savepoint requests and files, the open epoch (``OpenEpoch``),
the time service. What it asks of the runner goes through two callbacks: write a key
group's barriers (``write_barriers``) and halt a key group at a stop-with-savepoint
(``halt``). One thread (the loop's) calls it.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from processors._checkpoint.alignment import Aligner, Completion, Mode, Snapshot
from processors._checkpoint.input_positions import InputPositions
from processors._checkpoint.keygroup_state import KeyGroupCheckpoints
from processors._checkpoint.protocol import read_barrier
from processors._checkpoint.savepoint_requests import SavepointRequests
from processors._kafka.errors import AbortEpoch
from processors._runtime.health import Metrics
from processors._runtime.open_epoch import OpenEpoch
from processors._runtime.savepoint_files import SavepointFiles, dirty_overlay
from processors._task.keygroups import KeyGroup
from processors._task.time import TimeService

__all__ = ["BarrierAlignment", "WatermarkUpdate"]

log = logging.getLogger("lockgate.runtime")


class WatermarkUpdate:
    """Apply upstream writers' pending barrier watermarks to key group ``g``.

    Queued in ``OpenEpoch.released``, after the records the completion released.
    """

    __slots__ = ("checkpoint", "g", "topic")

    def __init__(self, topic: str, g: int, checkpoint: int) -> None:
        self.topic = topic
        self.g = g
        #: apply the pending barrier watermarks of checkpoints up to this one
        self.checkpoint = checkpoint


class BarrierAlignment:
    """Feeds barriers to the aligners and acts on completed checkpoints.

    Args:
        name: the name the app runs under (a barrier's savepoint may be for other apps).
        inputs: the app's input topics, in declaration order.
        mode: the alignment mode (``LOCKGATE_ALIGNMENT``).
        positions: the owned input partitions' positions and aligners.
        marks: per key group checkpoint facts (reads the completed checkpoint and the
            origin, records completions).
        sp_requests: savepoint requests, cancels and what barriers announced.
        sp_files: exports a key group's state for a savepoint.
        metrics: the instance's metrics (alignment durations, forced alignments).
        time_service: the app's watermarks and timers (``None``: no event time).
        kgs: the owned key groups (read only; one dict for the runner's life).
        halted: the halted key groups (read only; ``KeyGroupCheckpoints.halted``).
        open_epoch: the open epoch (flags, highest checkpoint id, released records).
        write_barriers: ``write_barriers(g, ckpt, request)`` forwards checkpoint ``ckpt``
            of key group ``g`` to its internal outputs, carrying savepoint ``request``
            (``None``: a plain checkpoint).
        halt: ``halt(g, sp_id)`` stops processing key group ``g`` at savepoint ``sp_id``
            (a stop-with-savepoint).
    """

    def __init__(
        self,
        *,
        name: str,
        inputs: Sequence[str],
        mode: Mode,
        positions: InputPositions,
        marks: KeyGroupCheckpoints,
        sp_requests: SavepointRequests,
        sp_files: SavepointFiles,
        metrics: Metrics,
        time_service: TimeService | None,
        kgs: Mapping[int, KeyGroup],
        halted: Mapping[int, str],
        open_epoch: OpenEpoch,
        write_barriers: Callable[[int, int, dict[str, Any] | None], None],
        halt: Callable[[int, str], None],
    ) -> None:
        self._name = name
        self._inputs = tuple(inputs)
        self._mode = mode
        self._positions = positions
        self._marks = marks
        self._sp_requests = sp_requests
        self._sp_files = sp_files
        self._metrics = metrics
        self._svc = time_service
        self._kgs = kgs
        self._halted = halted
        self._open = open_epoch
        self._write_barriers = write_barriers
        self._halt = halt
        #: Key groups whose grouped aligners could complete but one of them was replaying
        #: (completed once no input replays, see :meth:`complete_deferred`).
        self._deferred_groups: set[int] = set()

    @property
    def deferred_groups(self) -> frozenset[int]:
        """The key groups whose completion waits for an input's replay to end."""
        return frozenset(self._deferred_groups)

    def start_alignment(self, topic: str, g: int) -> Aligner:
        """Key group ``g`` met its first upstream lockgate record: it is downstream now.

        The alignment starts at the partition's committed position with the key
        group's completed checkpoint (checkpoint ids stay increasing).
        """
        aligner, released = self._positions.start_alignment(topic, g, self._marks.done(g))
        self._open.released.extend(released)
        log.info(
            "input partition has upstream lockgate writers: checkpoints now come from "
            "their barriers",
            extra={"partition": f"{topic}[{g}]", "mode": self._mode.value},
        )
        return aligner

    def on_barrier(self, topic: str, g: int, offset: int, headers: dict[str, str]) -> None:
        """Feed a barrier record at ``offset`` of ``topic[g]`` to its aligner.

        Called by the loop for a barrier of an owned key group that is not halted. It may
        start the partition's alignment, complete checkpoints (forwarding them, taking a
        savepoint) and queue released records and watermark updates in the open epoch's
        ``released``; a stop-with-savepoint it completes halts ``g`` (the caller then
        stops reading the partition).

        Raises:
            AbortEpoch: a state value of ``g`` cannot be encoded for the savepoint it
                completes (the epoch is replayed checking every write).
        """
        barrier = read_barrier(headers)
        if barrier is None:
            log.warning("ignoring a malformed barrier", extra={"headers": headers})
            return
        ckpt, writer, writers = barrier.checkpoint, barrier.writer, barrier.writers
        aligner = self._positions.aligners.get((topic, g)) or self.start_alignment(topic, g)
        svc = self._svc
        wm = barrier.watermark
        if svc is not None and svc.strategies and not barrier.event_time:
            svc.on_barrier_without_event_time(topic)
        elif svc is not None and svc.strategies:
            if wm is None:
                log.warning("ignoring a malformed barrier watermark", extra={"headers": headers})
            else:
                # Pending (in the key group's time state, so it survives a commit) until
                # checkpoint ``ckpt`` completes here and the records it releases were
                # processed: only then has every record this writer wrote before the
                # barrier been processed (aligned mode holds some back). A barrier of a
                # checkpoint completed already (a stage re-announcing its watermark) has
                # nothing of its writer held back: it applies after what is released now.
                svc.stash_barrier(topic, ckpt, writer, writers, wm, barrier.idle)
                if ckpt <= aligner.done:
                    self._open.released.append(WatermarkUpdate(topic, g, aligner.done))
        now = time.monotonic()
        # The position and alignment before this barrier: a savepoint completed by it is
        # restored from here (the replay re-reads the barrier and completes it again).
        before = aligner.snapshot(offset)
        later: tuple[Any, ...] = ()
        # Replaying is about this barrier's offset: one at the restored ``high`` (a
        # savepoint's completing barrier, often after unread transaction markers) is past
        # the replay, and a writer-count change it carries applies as in the first run.
        aligner.skip_to(offset)
        if writers and not aligner.replaying:
            later = self._update_writers(aligner, topic, g, writer, writers, now, before)
            if not aligner.grouped:
                self._open.released.extend(later)
        savepoint = barrier.for_app(self._name)
        if savepoint is None and barrier.savepoint is not None:
            if self._sp_requests.not_ours(barrier.savepoint):
                log.info(
                    "a barrier carries a savepoint requested for other apps: not taken here",
                    extra={"savepoint": barrier.savepoint, "apps": list(barrier.apps)},
                )
        if savepoint is not None:
            if savepoint in self._sp_requests.cancelled or self._marks.origin(g) == savepoint:
                savepoint = None  # cancelled, or restored from it (taken already)
            else:
                self._sp_requests.announced(savepoint, barrier.stop, barrier.apps)
                if self._mode is Mode.UNALIGNED:
                    # Savepoints are always aligned: hold records of writers past this
                    # barrier until the savepoint's checkpoint completes (nothing is held
                    # in unaligned mode, so nothing is released here), on every input
                    # of the key group.
                    for t, a in self._group(g, topic, aligner):
                        if a.mode is Mode.UNALIGNED:
                            self._open.released.extend(a.set_mode(Mode.ALIGNED))
                        self._positions.align_for_savepoint((t, g), ckpt)
        since = aligner.aligning_since
        completion = aligner.on_barrier(offset, writer, ckpt, savepoint, now)
        if aligner.grouped:
            self._complete_group(g, topic, before, now, later)
        elif completion is not None:
            if since is not None:
                self._metrics.observe_alignment(now - since)
            self._complete(g, completion, {topic: before})

    def _group(self, g: int, topic: str, aligner: Aligner) -> list[tuple[str, Aligner]]:
        """The aligners of key group ``g``'s inputs (just ``topic``'s unless grouped)."""
        if not aligner.grouped:
            return [(topic, aligner)]
        aligners = self._positions.aligners
        return [(t, a) for t in self._inputs for a in [aligners.get((t, g))] if a is not None]

    def _complete_group(
        self, g: int, topic: str, before: Snapshot, now: float, later: tuple[Any, ...]
    ) -> None:
        """Complete key group ``g``'s grouped aligners at the minimum they are all ready for.

        ``topic``'s barrier (its alignment ``before`` it) was just fed; ``later`` are
        records to process after the completion's own (released by a writer drop).
        Inputs without upstream writers (no aligner) do not hold a completion back: their
        position at the completion is part of the cut.

        Nothing completes while an input replays (reads below its restored snapshot's
        ``high``): its records there are skipped by the snapshot's ``done``, and a
        completion the other inputs make earlier than in the first run would let a commit
        in the middle of the replay record a ``done`` that skips records of the rest of
        the replay never processed. The completion waits until no input replays
        (:meth:`complete_deferred`, between batches); the inputs' held records wait too.
        """
        positions = self._positions
        group = [(t, a) for t in self._inputs for a in [positions.aligners.get((t, g))] if a]
        readies = [r for _, a in group for r in [a.ready] if r is not None]
        target = min(readies, default=-1)
        if target <= min(a.done for _, a in group):
            self._open.released.extend(later)
            return
        if any(a.replaying for _, a in group):
            self._deferred_groups.add(g)
            self._open.released.extend(later)
            return
        befores = {
            t: before if t == topic else a.snapshot(positions.next.get((t, g), 0)) for t, a in group
        }
        sinces = [s for _, a in group for s in [a.aligning_since] if s is not None]
        completions = [c for _, a in group for c in [a.complete(target, now)] if c is not None]
        if sinces:
            self._metrics.observe_alignment(now - min(sinces))
        completion = Completion(
            target,
            all(c.aligned for c in completions),
            next((c.savepoint for c in completions if c.savepoint is not None), None),
            tuple(p for c in completions for p in c.released),
        )
        self._complete(g, completion, befores, later)

    def complete_deferred(self) -> None:
        """Complete the key groups whose completion waited for an input's replay to end.

        A key group no longer owned, halted, or without aligners is forgotten; one whose
        input still replays keeps waiting.

        Raises:
            AbortEpoch: as :meth:`on_barrier`.
        """
        positions = self._positions
        for g in sorted(self._deferred_groups):
            group = [(t, a) for t in self._inputs for a in [positions.aligners.get((t, g))] if a]
            if g not in self._kgs or g in self._halted or not group:
                self._deferred_groups.discard(g)
                continue
            if any(a.replaying for _, a in group):
                continue
            self._deferred_groups.discard(g)
            topic, aligner = group[0]
            before = aligner.snapshot(positions.next.get((topic, g), 0))
            self._complete_group(g, topic, before, time.monotonic(), ())

    def _update_writers(
        self,
        aligner: Aligner,
        topic: str,
        g: int,
        writer: str,
        count: int,
        now: float,
        before: Snapshot,
    ) -> tuple[Any, ...]:
        """A barrier names how many key groups its app has: expect exactly those.

        An upstream redeployed with another key-group count changes its writer set;
        writers beyond the new count are dropped (their held records are released).

        Returns:
            Released records to process after any completion still to come (a grouped
            aligner completes with its key group; others complete here).
        """
        app = writer.rpartition("/")[0]
        expected = {f"{app}/{k}" for k in range(count)}
        known = {w for w in aligner.writers if w.rpartition("/")[0] == app}
        if expected - known:
            aligner.expect(sorted(expected - known))
        gone = known - expected
        if gone:
            log.warning(
                "upstream app changed its key-group count: dropping writers",
                extra={"partition": f"{topic}[{g}]", "writers": sorted(gone)},
            )
            released, completion = aligner.drop_writers(sorted(gone), now)
            if completion is not None:
                # The dropped writers' records come after the completion's cut.
                self._complete(g, completion, {topic: before}, later=released)
                return ()
            return released
        return ()

    def _complete(
        self,
        g: int,
        completion: Completion,
        befores: dict[str, Snapshot],
        later: tuple[Any, ...] = (),
    ) -> None:
        """Checkpoint ``completion.checkpoint`` completed on key group ``g``.

        ``befores`` holds, per aligned input, its alignment before the event that
        completed it (the savepoint's restore point); ``later`` are records to process
        after the completion's own.
        """
        ckpt = completion.checkpoint
        self._marks.completed(g, ckpt, aligned=completion.aligned)
        self._open.reached(ckpt)
        self._open.active = True
        sp_id = completion.savepoint
        if sp_id is not None and (
            self._marks.origin(g) == sp_id or sp_id in self._sp_requests.cancelled
        ):
            sp_id = None  # restored from it (the replay completes it again), or cancelled
        if sp_id is not None and not self._sp_requests.take_once(g, sp_id, ckpt):
            # Announced again at a later id (upstream apps that took the savepoint at
            # different ids): taken at the first. A replay completes the same id again.
            sp_id = None
        released = completion.released + later
        for t in befores:
            # A savepoint's alignment that is over goes back to unaligned. The records
            # still held (tags past the savepoint) come after the completion's own.
            released += self._positions.end_savepoint_alignment((t, g), ckpt)
        if sp_id is None:
            self._write_barriers(g, ckpt, None)
            self._open.released.extend(released)
            for t in befores:
                self._release_watermarks(t, g, ckpt)
            return
        request = self._sp_requests.request_for(sp_id)
        error = None
        if not completion.aligned:
            error = (
                f"checkpoint {ckpt} of key group {g} completed unaligned (the alignment "
                "timed out after LOCKGATE_ALIGNMENT_TIMEOUT_MS or held "
                "LOCKGATE_ALIGNMENT_MAX_HELD records): a savepoint needs an aligned cut"
            )
        try:
            overlay = dirty_overlay(self._kgs[g])
        except Exception as exc:  # noqa: BLE001 - a store codec may raise anything
            # Find the record whose state cannot be encoded: replay checking every write.
            self._open.check_writes = True
            raise AbortEpoch(
                f"key group {g}: a state value cannot be encoded for the savepoint "
                f"({type(exc).__name__}: {exc}); replaying to find the record"
            ) from exc
        # Inputs without upstream writers (a source input of a mixed key group): their
        # position now is part of the cut.
        nxt = self._positions.next
        offsets = {t: nxt.get((t, g), 0) for t in self._inputs if t not in befores}
        offsets.update({t: b.low for t, b in befores.items()})
        manifest = self._sp_files.export(
            g,
            self._kgs[g],
            request,
            ckpt,
            offsets,
            {t: b.to_json() for t, b in befores.items()},
            overlay,
            error,
        )
        ok = manifest["error"] is None
        # Downstream takes the savepoint (and stops) only where this key group did.
        self._write_barriers(g, ckpt, request if ok else None)
        self._open.commit_now = True
        if request["stop"] and ok:
            # Nothing after the cut is processed: the commit names the position and
            # alignment from before the completing barrier, so the records the completion
            # released are read again from Kafka by a cancel's rewind or a restore.
            for t, b in befores.items():
                self._positions.freeze((t, g), b)
            self._halt(g, sp_id)
            return
        self._open.released.extend(released)
        for t in befores:
            self._release_watermarks(t, g, ckpt)

    def _release_watermarks(self, topic: str, g: int, ckpt: int) -> None:
        """Queue the writers' barrier watermarks of checkpoints up to ``ckpt``.

        After the records the completion released: they were written before those
        barriers, so the watermarks may not pass them before they are processed.
        """
        svc = self._svc
        if svc is not None and svc.strategies:
            self._open.released.append(WatermarkUpdate(topic, g, ckpt))

    def tick(self) -> None:
        """Force alignments that outlived ``LOCKGATE_ALIGNMENT_TIMEOUT_MS``.

        First completes the key groups whose completion waited for a replay to end.
        Called by the loop between batches; the records released are queued in the open
        epoch's ``released``.

        Raises:
            AbortEpoch: as :meth:`on_barrier`.
        """
        if self._deferred_groups:
            self.complete_deferred()
        now = time.monotonic()
        for (topic, g), aligner in self._positions.aligners.items():
            if aligner.mode is not Mode.ALIGNED or g in self._halted:
                continue
            was_forced = aligner.forced
            released = aligner.tick(now)
            if aligner.forced and not was_forced:
                self.note_forced(topic, g, "LOCKGATE_ALIGNMENT_TIMEOUT_MS")
            self._open.released.extend(released)

    def note_forced(self, topic: str, g: int, why: str) -> None:
        """Count and log an alignment of ``topic[g]`` forced to unaligned (``why``: the bound)."""
        self._metrics.alignments_forced += 1
        log.warning(
            "alignment switched to unaligned for this checkpoint",
            extra={"partition": f"{topic}[{g}]", "reason": why},
        )
