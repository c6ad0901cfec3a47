"""Checkpoint-barrier alignment of one input partition, and its exactly-restorable snapshot.

An input partition written by upstream lockgate apps interleaves the records of several
*writers* (upstream key groups, e.g. ``"click-counts/3"``). Every writer periodically writes
a *barrier* carrying a checkpoint id, strictly increasing per writer. The partition is read
in offset order; :class:`Aligner` is the pure state machine (no I/O, no Kafka) that decides,
per record, whether to process it now, hold it, or skip it, and reports checkpoint
completions. It follows Flink's barrier alignment:

* ``done`` is the last checkpoint completed on this partition; ``last[w]`` the last barrier
  id seen from writer ``w`` (a writer first seen starts at ``last[w] = done``).
* A record's **tag** is ``last[w]`` when it is read (``-1`` for records that no lockgate
  writer wrote, and for writers dropped by :meth:`Aligner.drop_writers`).
* **Completion**: whenever ``min(last)`` over the known writers exceeds ``done``, ``done``
  becomes that minimum (one completion, even if it jumps over several ids).
* ALIGNED mode holds a record whose tag exceeds ``done`` (its writer already passed a
  barrier that is not complete yet) until a completion makes ``done >= tag``; so at every
  completion ``c`` of an alignment that was not forced, the records processed so far are
  exactly the records read with ``tag <= c``: a consistent cut. UNALIGNED mode, and a
  *forced* alignment (timeout, or ``max_held`` records held), process everything at once
  until the next completion.

Invariant: while the machine is not replaying (see below), ``min(last) == done`` whenever
some writer is known: a new writer starts at ``done``, ``last`` only grows, and a
completion sets ``done`` to the minimum as soon as it exceeds ``done``.

Snapshot and recovery
---------------------
At a commit the caller passes ``high``, the next offset it would read, to
:meth:`Aligner.snapshot`. The snapshot holds ``low`` (offset of the first held record, or
``high``), which the caller commits as the Kafka offset; ``high``; ``done``; ``last``, the
per-writer barrier id as of offset ``low`` (barriers at offsets ``< low`` plus the writer's
initial value, for every writer known at the commit); ``forced``; and, beyond those, the
dropped writers (with the offset from which a writer expected again after a drop counts
again) and the savepoint ids of checkpoints not completed yet. A machine restored from it and fed
the partition again from ``low`` skips a record at an offset ``< high`` iff its tag is
``<= done`` (snapshot value) and handles every other record normally. Why that is exact:

1. **Same tags.** Every writer known at the commit starts the replay with the value it had
   at ``low`` (a writer first seen after ``low`` with the initial value it was given), and
   re-reading the same barriers from ``low`` gives it the same ``last`` at every offset;
   so every record in ``[low, high)`` gets the same tag as in the first run. Writers that
   were dropped before the commit are dropped again (tag ``-1``).
2. **Processed before the commit => tag <= done.** A record processed because its tag was
   ``<= done`` at that time has ``tag <= done at the commit`` (``done`` only grows). A
   record released by a forced alignment, or processed while forced, lies below ``low``:
   forcing releases everything held, so every record held later, hence the first held
   record at the commit, comes after it. (UNALIGNED never holds: ``low == high``.)
   Records of writers that were dropped before the commit were all processed (immediately,
   or released by the drop), and so were records without a writer; both are skipped. So
   are the records of a writer expected again after a drop that precede its re-admission
   (the snapshot keeps that offset while it is above ``low``); its earlier barriers are
   ignored, as they were after the drop.
3. **Held at the commit => tag > done.** A completion releases every held record with
   ``tag <= done``, so what is still held has ``tag > done``; the replay reads it again
   (it is at or after ``low``) and, with the same tag, holds it again.
4. **No early completion.** At any offset ``o < high`` the replay knows a superset of the
   writers the first run knew at ``o``, with the same ``last`` values, so its minimum is at
   most the first run's ``done`` at ``o``, which is at most the snapshot ``done``. At
   ``high`` the replayed state (``done``, ``last``, held records) equals the state at the
   commit (the held count is below ``max_held`` as it was), and the two runs go on alike.

Several inputs: grouped machines
--------------------------------
A key group that reads several co-partitioned inputs written by upstream writers (a DAG:
two pipelines joined in one app) takes one checkpoint over all of them, as Flink's
multi-input alignment does: checkpoint ``c`` completes for the key group when every writer
of *every* input partition has passed ``c``. Each partition keeps its own machine (its
offsets, its snapshot), created with ``grouped=True``: it never completes on its own, its
:attr:`Aligner.ready` (``min(last)``) says how far it could, and the key group completes
all its machines together with :meth:`Aligner.complete` at the minimum of their ``ready``.
Every machine of the group then has the same ``done``, so a record is held exactly when
its tag is past the key group's completed checkpoint, and the cut is consistent across
the inputs. The invariant above becomes ``min(last) >= done``. Arguments 1-3 hold per
partition unchanged; argument 4 does not: a partition's ``ready`` may exceed its ``done``
in the first run, so another input's replay can complete a checkpoint *earlier* relative
to this partition's offsets, and a snapshot taken then would skip records of the rest of
its replay that were never processed. So the caller completes a group only while none of
its machines is :attr:`Aligner.replaying` (and completes it as soon as the last replay
ends); then every completion happens at or after ``high`` on every input, as argument 4
needs.

Only timing differs: a restored machine restarts its alignment timer at the first
:meth:`Aligner.tick` or barrier. To keep the arguments true, membership changes of writers
the snapshot knows are refused while replaying (see :meth:`Aligner.expect` and
:meth:`Aligner.drop_writers`), and a snapshot taken while replaying keeps the older
``high``. Memory is bounded by the held records plus the barriers read since ``low``.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from enum import Enum
from types import MappingProxyType
from typing import Any, NamedTuple


class Mode(Enum):
    """How records of a writer that is ahead of the completed checkpoint are handled."""

    ALIGNED = "aligned"
    UNALIGNED = "unaligned"


class Decision(Enum):
    """What the caller does with the record it passed to :meth:`Aligner.on_record`.

    Attributes:
        PROCESS: Process the record now.
        HOLD: The aligner keeps the payload; it comes back in a later release.
        SKIP: Replay after a restore: the record was processed before the snapshot.
    """

    PROCESS = "process"
    HOLD = "hold"
    SKIP = "skip"


@dataclass(frozen=True, slots=True)
class Forced:
    """Outcome of a record that filled the hold buffer: the alignment is now forced.

    Attributes:
        released: Payloads of every held record, this one last, in offset order, to be
            processed now.
    """

    released: tuple[Any, ...]


@dataclass(frozen=True, slots=True)
class Completion:
    """A checkpoint completed on this partition.

    Attributes:
        checkpoint: The new ``done``, greater than every earlier completion.
        aligned: False if the mode is UNALIGNED or the alignment was forced, i.e. the
            processed records are not exactly those with ``tag <= checkpoint``.
        savepoint: The savepoint id a barrier of exactly this checkpoint carried, if any.
        released: Payloads of the held records with ``tag <= checkpoint``, in offset order,
            to be processed right after the completion.
    """

    checkpoint: int
    aligned: bool
    savepoint: str | None
    released: tuple[Any, ...]


def _int(value: object, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"alignment snapshot: {what} must be an integer, not {value!r}")
    return value


@dataclass(frozen=True, slots=True)
class Snapshot:
    """The alignment state of a partition at a commit (see the module docs).

    Attributes:
        low: Offset to commit and to resume reading from (first held record, or ``high``).
        high: The next offset the machine would have read; records in ``[low, high)`` with
            ``tag <= done`` are skipped on replay.
        done: The last completed checkpoint.
        last: Per known writer, its barrier id as of offset ``low``.
        forced: The alignment was forced (processing unaligned until the next completion).
        dropped: Writers dropped by :meth:`Aligner.drop_writers` and not expected again.
        savepoints: Savepoint ids of checkpoints ``> done`` already announced by a barrier.
        rejoined: Writers expected again after a drop, with the offset from which they
            count again (only offsets ``> low``): on replay, their records and barriers
            before it are those of a dropped writer.

    Raises:
        ValueError: If ``low > high``.
    """

    low: int
    high: int
    done: int
    last: Mapping[str, int]
    forced: bool
    dropped: frozenset[str] = frozenset()
    savepoints: Mapping[int, str] = field(default_factory=dict)
    rejoined: Mapping[str, int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.low > self.high:
            raise ValueError(f"alignment snapshot: low {self.low} > high {self.high}")
        object.__setattr__(self, "last", MappingProxyType(dict(self.last)))
        object.__setattr__(self, "savepoints", MappingProxyType(dict(self.savepoints)))
        object.__setattr__(self, "dropped", frozenset(self.dropped))
        object.__setattr__(self, "rejoined", MappingProxyType(dict(self.rejoined)))

    def to_json(self) -> dict[str, Any]:
        """Return a JSON-able dict; ``dropped``, ``savepoints``, ``rejoined`` only if not empty."""
        out: dict[str, Any] = {
            "low": self.low,
            "high": self.high,
            "done": self.done,
            "last": dict(self.last),
            "forced": self.forced,
        }
        if self.dropped:
            out["dropped"] = sorted(self.dropped)
        if self.savepoints:
            out["savepoints"] = {str(k): v for k, v in sorted(self.savepoints.items())}
        if self.rejoined:
            out["rejoined"] = dict(self.rejoined)
        return out

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Snapshot:
        """Rebuild a snapshot from :meth:`to_json` output (possibly through a JSON codec).

        Raises:
            ValueError: If a key is missing or has the wrong type.
        """
        try:
            last = data["last"]
            forced = data["forced"]
            if not isinstance(last, Mapping) or not isinstance(forced, bool):
                raise ValueError(f"alignment snapshot: malformed {dict(data)!r}")
            dropped = data.get("dropped", [])
            savepoints = data.get("savepoints", {})
            rejoined = data.get("rejoined", {})
            if not isinstance(dropped, list) or not isinstance(savepoints, Mapping):
                raise ValueError(f"alignment snapshot: malformed {dict(data)!r}")
            if not isinstance(rejoined, Mapping):
                raise ValueError(f"alignment snapshot: malformed {dict(data)!r}")
            if not all(isinstance(w, str) for w in [*last, *dropped, *savepoints.values()]):
                raise ValueError(f"alignment snapshot: malformed {dict(data)!r}")
            return cls(
                low=_int(data["low"], "low"),
                high=_int(data["high"], "high"),
                done=_int(data["done"], "done"),
                last={w: _int(c, f"last[{w}]") for w, c in last.items()},
                forced=forced,
                dropped=frozenset(dropped),
                savepoints={int(k): v for k, v in savepoints.items()},
                rejoined={w: _int(o, f"rejoined[{w}]") for w, o in rejoined.items()},
            )
        except KeyError as e:
            raise ValueError(f"alignment snapshot: missing key {e}") from None


class _Held(NamedTuple):
    offset: int
    tag: int
    writer: str
    payload: Any


class Aligner:
    """Barrier alignment of one input partition (see the module docs for the semantics).

    Feed it every record and barrier of the partition in strictly increasing offset order.
    Payloads are opaque: a held payload is returned as is in a later release.

    Args:
        mode: ALIGNED holds records of writers ahead of ``done``; UNALIGNED never holds.
        timeout_s: Alignment lasting this long (see :meth:`tick`) is forced.
        max_held: Holding this many records forces the alignment (at least 1).
        snapshot: Restore from it; reading resumes at ``snapshot.low``.
        start_offset: First offset to read when there is no snapshot.
        grouped: One of several machines of a key group (see the module docs): it never
            completes by itself; the caller completes the group with :meth:`complete`.

    Raises:
        ValueError: If ``max_held < 1`` or ``timeout_s < 0``.
    """

    def __init__(
        self,
        mode: Mode,
        timeout_s: float,
        max_held: int,
        snapshot: Snapshot | None = None,
        start_offset: int = 0,
        grouped: bool = False,
    ) -> None:
        if max_held < 1 or timeout_s < 0:
            raise ValueError(f"max_held must be >= 1 and timeout_s >= 0 ({max_held}, {timeout_s})")
        self._mode = mode
        self._timeout_s = timeout_s
        self._max_held = max_held
        snap = snapshot or Snapshot(start_offset, start_offset, 0, {}, False)
        self._done = snap.done
        self._last: dict[str, int] = dict(snap.last)
        self._forced = snap.forced
        self._dropped: set[str] = set(snap.dropped)
        self._savepoints: dict[int, str] = dict(snap.savepoints)
        self._rejoined: dict[str, int] = dict(snap.rejoined)
        # Replay: records at offsets < _high with tag <= _skip_done were processed already.
        self._high = snap.high
        self._skip_done = snap.done
        self._next = snap.low  # offsets read must be >= this
        self._held: list[_Held] = []
        # _base: last[w] as of the first held offset; _since: accepted barriers after it.
        self._base: dict[str, int] = dict(snap.last)
        self._since: deque[tuple[int, str, int]] = deque()
        self._max_last = max(self._last.values(), default=self._done)
        self._aligning_since: float | None = None
        self._grouped = grouped

    # -- read-only state ----------------------------------------------------------------

    @property
    def mode(self) -> Mode:
        """The configured mode."""
        return self._mode

    @property
    def done(self) -> int:
        """The last completed checkpoint of this partition."""
        return self._done

    @property
    def ready(self) -> int | None:
        """``min(last)``: the checkpoint this partition could complete; None without writers.

        Equals :attr:`done` unless the machine is grouped and waits for the others.
        """
        return min(self._last.values()) if self._last else None

    @property
    def grouped(self) -> bool:
        """Whether the key group completes this machine (:meth:`complete`)."""
        return self._grouped

    @property
    def held(self) -> int:
        """How many records are held."""
        return len(self._held)

    @property
    def forced(self) -> bool:
        """Whether the alignment is forced (processing everything until the next completion)."""
        return self._forced

    @property
    def writers(self) -> Mapping[str, int]:
        """A read-only view of ``last``: each known writer's last barrier id."""
        return MappingProxyType(self._last)

    @property
    def aligning(self) -> bool:
        """ALIGNED mode and some known writer is past ``done`` (a checkpoint is pending)."""
        return self._mode is Mode.ALIGNED and self._max_last > self._done

    @property
    def aligning_since(self) -> float | None:
        """When the current alignment began (the ``now_s`` of that event), else None.

        None also while the begin time is unknown (after a restore or a drop), until the
        next :meth:`tick` or barrier starts the timer.
        """
        return self._aligning_since if self.aligning else None

    @property
    def replaying(self) -> bool:
        """Whether offsets below the restored snapshot's ``high`` are still to be read."""
        return self._next < self._high

    @property
    def idle(self) -> bool:
        """Nothing held, no replay pending, and every record would be processed at once.

        While idle, :meth:`on_record` returns PROCESS and changes nothing but registering a
        writer seen for the first time (at ``last = done``).
        """
        return (
            not self._held
            and self._next >= self._high
            and (self._max_last <= self._done or self._forced or self._mode is Mode.UNALIGNED)
        )

    # -- events -------------------------------------------------------------------------

    def on_record(self, offset: int, writer: str | None, payload: Any) -> Decision | Forced:
        """Decide what to do with a data record.

        Args:
            offset: Its offset, greater than every offset passed before.
            writer: The upstream writer, or None for a record no lockgate writer wrote.
            payload: Opaque; kept if the record is held.

        Returns:
            A :class:`Decision`, or :class:`Forced` when holding this record filled the
            buffer: then every held record, this one included, is to be processed now and
            the alignment is forced until the next completion.

        Raises:
            ValueError: If the offset does not increase.
        """
        self._advance(offset)
        if writer is None or writer in self._dropped or self._before_rejoin(writer, offset):
            return Decision.SKIP if offset < self._high else Decision.PROCESS
        tag = self._last.get(writer)
        if tag is None:
            tag = self._first_seen(writer)
        if offset < self._high and tag <= self._skip_done:
            return Decision.SKIP
        if tag <= self._done or self._forced or self._mode is Mode.UNALIGNED:
            return Decision.PROCESS
        self._held.append(_Held(offset, tag, writer, payload))
        if len(self._held) >= self._max_held:
            return Forced(self._force())
        return Decision.HOLD

    def on_barrier(
        self, offset: int, writer: str, checkpoint: int, savepoint: str | None, now_s: float
    ) -> Completion | None:
        """Take a barrier of ``writer``; duplicates (``checkpoint <= last[w]``) change nothing.

        Barriers of dropped writers are ignored too.

        Args:
            offset: Its offset, greater than every offset passed before.
            writer: The upstream writer.
            checkpoint: The checkpoint id.
            savepoint: A savepoint id, reported by the completion of exactly ``checkpoint``
                (the first one announced for a checkpoint wins).
            now_s: The current time (starts the alignment timer).

        Returns:
            The completion this barrier caused, if any.

        Raises:
            ValueError: If the offset does not increase.
        """
        self._advance(offset)
        if writer in self._dropped or self._before_rejoin(writer, offset):
            return None
        last = self._last.get(writer)
        if last is None:
            last = self._first_seen(writer)
        if checkpoint <= last:
            return None
        self._last[writer] = checkpoint
        if checkpoint > self._max_last:
            self._max_last = checkpoint
        if savepoint is not None and checkpoint > self._done:
            # (A replay from a snapshot taken after this checkpoint completed re-reads the
            # announcement of a checkpoint already done: nothing will report it.)
            self._savepoints.setdefault(checkpoint, savepoint)
        if self._held:
            self._since.append((offset, writer, checkpoint))
        else:  # at or before every record held from now on: part of the state at low
            self._base[writer] = checkpoint
        completion = self._complete(now_s)
        if completion is None and self._aligning_since is None and self.aligning:
            self._aligning_since = now_s
        return completion

    def tick(self, now_s: float) -> tuple[Any, ...]:
        """Force the alignment if it has lasted ``timeout_s``.

        Forcing never completes a checkpoint; it releases every held record and makes the
        machine process everything until the next completion.

        Args:
            now_s: The current time, on the clock of the ``now_s`` of the barriers.

        Returns:
            The payloads released (offset order); empty if nothing was forced.
        """
        if self._forced or not self.aligning:
            return ()
        if self._aligning_since is None:
            self._aligning_since = now_s
        if now_s - self._aligning_since < self._timeout_s:
            return ()
        return self._force()

    def set_mode(self, mode: Mode) -> tuple[Any, ...]:
        """Switch the mode (e.g. ALIGNED for the duration of a savepoint's alignment).

        Leaving ALIGNED releases every held record: processing them later than records
        read after them would reorder a writer's records. A completion reports
        ``aligned`` for the mode it completes in. Snapshots stay exact across switches
        (records processed unaligned lie before every record held later, like forced ones).

        Returns:
            The payloads released (offset order), to be processed before the next record;
            empty unless switching ALIGNED -> UNALIGNED with records held.
        """
        if mode is self._mode:
            return ()
        self._mode = mode
        self._aligning_since = None  # (re)started by the next barrier or tick
        released = tuple(h.payload for h in self._held)
        self._held = []
        self._fold()
        return released

    def skip_to(self, offset: int) -> None:
        """Offsets below ``offset`` not read yet will never be read (transaction markers).

        Call it before asking :attr:`replaying` about the record at ``offset``: a replay
        ends at the restored ``high``, which a savepoint's snapshot puts at its completing
        barrier, right after offsets the caller never feeds. No effect below the next
        offset.
        """
        if offset > self._next:
            self._next = offset

    def expect(self, writers: Iterable[str]) -> None:
        """Make writers known (at ``last = done``), also writers dropped before.

        Adding writers at ``done`` never raises the minimum, so this never completes.

        Raises:
            RuntimeError: While replaying, for a dropped writer (its replayed records would
                no longer be recognised as processed).
        """
        for w in writers:
            if w in self._dropped:
                if self.replaying:
                    raise RuntimeError(f"cannot expect dropped writer {w!r} while replaying")
                self._dropped.discard(w)
                self._rejoined[w] = self._next  # its earlier log is a dropped writer's
            if w not in self._last:
                self._first_seen(w)

    def drop_writers(
        self, writers: Iterable[str], now_s: float
    ) -> tuple[tuple[Any, ...], Completion | None]:
        """Forget writers for good (until :meth:`expect` names them again).

        Their held records are released, their later records are processed at once (as if
        they had no writer) and their barriers are ignored, so a writer that is gone cannot
        block alignment even if its last records are still to be read. The drop is part of
        the snapshot. The remaining writers may complete a checkpoint.

        Args:
            writers: The writers to drop (unknown ones are recorded as dropped too).
            now_s: The current time (starts the alignment timer if still aligning).

        Returns:
            ``(released, completion)``: first process ``released``, the dropped writers'
            held records in offset order, then handle the completion, if any.

        Raises:
            RuntimeError: While replaying, for a writer that is known.
        """
        gone = set(writers)
        if self.replaying and not gone.isdisjoint(self._last):
            raise RuntimeError(f"cannot drop known writers while replaying: {sorted(gone)}")
        for w in gone:
            self._last.pop(w, None)
            self._base.pop(w, None)
            self._rejoined.pop(w, None)
        self._dropped |= gone
        self._since = deque(b for b in self._since if b[1] not in gone)
        released = tuple(h.payload for h in self._held if h.writer in gone)
        if released:
            self._held = [h for h in self._held if h.writer not in gone]
            self._fold()
        self._max_last = max(self._last.values(), default=self._done)
        completion = self._complete(now_s)
        if not self.aligning:
            self._aligning_since = None
        return released, completion

    def complete(self, checkpoint: int, now_s: float) -> Completion | None:
        """Complete exactly ``checkpoint`` on a grouped machine (its key group's minimum).

        Args:
            checkpoint: At most :attr:`ready` (when there are writers).
            now_s: The current time (restarts the alignment timer if still aligning).

        Returns:
            The completion, or None if ``checkpoint <= done``.

        Raises:
            ValueError: If the machine is not grouped, or a writer is not past ``checkpoint``.
        """
        if not self._grouped:
            raise ValueError("complete() is for grouped machines; others complete themselves")
        ready = self.ready
        if ready is not None and checkpoint > ready:
            raise ValueError(f"checkpoint {checkpoint} is past this partition's ready {ready}")
        if checkpoint <= self._done:
            return None
        return self._complete(now_s, checkpoint)

    def snapshot(self, high: int) -> Snapshot:
        """Return the state to persist with a commit of ``low`` (see the module docs).

        Args:
            high: The next offset the caller would read (at least every offset passed).

        Raises:
            ValueError: If ``high`` is below an offset already read.
        """
        if high < self._next:
            raise ValueError(f"snapshot high {high} is below the next offset {self._next}")
        low = self._held[0].offset if self._held else high
        if self._rejoined:  # a replay from low reads no offset before these any more
            self._rejoined = {w: o for w, o in self._rejoined.items() if o > low}
        return Snapshot(
            low=low,
            high=max(high, self._high),
            done=self._done,
            last=self._base,
            forced=self._forced,
            dropped=frozenset(self._dropped),
            savepoints=self._savepoints,
            rejoined=self._rejoined,
        )

    # -- transitions --------------------------------------------------------------------

    def _advance(self, offset: int) -> None:
        if offset < self._next:
            raise ValueError(f"offset {offset} read after offset {self._next - 1}")
        self._next = offset + 1

    def _before_rejoin(self, writer: str | None, offset: int) -> bool:
        """Replay: a record or barrier of ``writer`` from before it was dropped and expected."""
        return bool(self._rejoined) and offset < self._rejoined.get(writer or "", -1)

    def _first_seen(self, writer: str) -> int:
        self._last[writer] = self._base[writer] = self._done
        return self._done

    def _complete(self, now_s: float, upto: int | None = None) -> Completion | None:
        """Complete ``min(last)`` (grouped: only ``upto``) if it exceeds ``done``.

        Releases the held records the completion covers.
        """
        if upto is not None:
            low = upto
        elif self._grouped or not self._last:
            return None
        else:
            low = min(self._last.values())
        if low <= self._done:
            return None
        self._done = low
        aligned = self._mode is Mode.ALIGNED and not self._forced
        self._forced = False
        savepoint = self._savepoints.pop(low, None)
        for c in [c for c in self._savepoints if c < low]:
            del self._savepoints[c]
        released = tuple(h.payload for h in self._held if h.tag <= low)
        if released:
            self._held = [h for h in self._held if h.tag > low]
            self._fold()
        self._aligning_since = now_s if self.aligning else None
        return Completion(low, aligned, savepoint, released)

    def _force(self) -> tuple[Any, ...]:
        self._forced = True
        released = tuple(h.payload for h in self._held)
        self._held = []
        self._fold()
        return released

    def _fold(self) -> None:
        """Fold the barriers now before the first held record into ``_base``."""
        low = self._held[0].offset if self._held else math.inf
        since = self._since
        while since and since[0][0] < low:
            _, writer, checkpoint = since.popleft()
            self._base[writer] = checkpoint
