"""What the checkpoint protocol knows of each owned key group, and what the last commit made of it.

Per key group the runtime tracks five facts:

* ``done``: the last checkpoint completed (a source's own epoch, or a downstream key
  group's barrier completion);
* ``aligned``: whether that completion was aligned (savepoints need an aligned one);
* ``origin``: the savepoint its state descends from (a savepoint it was restored from is
  never taken again by it, and a barrier carrying that savepoint is ignored);
* ``halted``: the savepoint a stop-with-savepoint halted it at (its inputs are paused);
* ``seeding``: a restore from a savepoint under way (written into every checkpoint record
  until it is done, so a restart redoes it).

The first four are also kept as they were at the last commit: an aborted epoch goes back
to them (:meth:`KeyGroupCheckpoints.rewind`). They are written into each checkpoint record
and read back at assignment (:meth:`KeyGroupCheckpoints.load`).

Invariant: :attr:`KeyGroupCheckpoints.halted` is one dict object for the component's
life (the per-record loop keeps a reference to it); only this module changes it.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, replace
from typing import NamedTuple

__all__ = ["Committed", "KeyGroupCheckpoints", "Rewound"]


@dataclass(frozen=True, slots=True)
class Committed:
    """What the last commit made of one key group (restored when an epoch aborts)."""

    done: int = 0
    aligned: bool = True
    origin: str | None = None
    halted: str | None = None


_NEVER_COMMITTED = Committed()


class Rewound(NamedTuple):
    """What :meth:`KeyGroupCheckpoints.rewind` did to one key group."""

    committed_halt: str | None  #: the savepoint it was halted at when the epoch began
    halt_undone: bool  #: it was halted in the aborted epoch: that halt is gone


class KeyGroupCheckpoints:
    """Checkpoint facts per owned key group (see the module docs), owned in one place."""

    def __init__(self) -> None:
        self._done: dict[int, int] = {}
        self._aligned: dict[int, bool] = {}
        self._origin: dict[int, str | None] = {}
        self._seeding: dict[int, str] = {}
        self._committed: dict[int, Committed] = {}
        #: When (wall clock, ms) a restore of a key group from a savepoint began in this
        #: process (the first one).
        self._restore_began: dict[int, int] = {}
        #: Halted key group -> the savepoint it halted at. Read it freely; change it only
        #: through :meth:`halt`, :meth:`lift`, :meth:`rewind`, :meth:`seeded`, :meth:`forget`.
        self.halted: dict[int, str] = {}

    # -- reading --------------------------------------------------------------------------

    def done(self, g: int, default: int = 0) -> int:
        """The last checkpoint completed by key group ``g`` (``default`` if none is known)."""
        return self._done.get(g, default)

    def aligned(self, g: int) -> bool:
        """Whether key group ``g``'s last completion was aligned (``True`` if none)."""
        return self._aligned.get(g, True)

    def origin(self, g: int) -> str | None:
        """The savepoint key group ``g``'s state descends from, if any."""
        return self._origin.get(g)

    def seeding(self, g: int) -> str | None:
        """The savepoint key group ``g`` is being restored from, if a restore is under way."""
        return self._seeding.get(g)

    def restored_since(self, g: int, ms: int) -> bool:
        """Whether a restore of key group ``g`` from a savepoint began in this process after ``ms``.

        A savepoint request issued before that restore began was aimed at the state the
        restore replaced: it must not be taken from the restored state. (A request issued
        during the restore waits for its end and is taken.)
        """
        began = self._restore_began.get(g)
        return began is not None and ms > 0 and ms < began

    def is_halted(self, g: int) -> bool:
        """Whether key group ``g`` is halted at a savepoint."""
        return g in self.halted

    # -- changes between commits ----------------------------------------------------------

    def completed(self, g: int, checkpoint: int, *, aligned: bool = True) -> None:
        """Key group ``g`` completed ``checkpoint`` (its own epoch, or a barrier completion)."""
        self._done[g] = checkpoint
        self._aligned[g] = aligned

    def start_seeding(self, g: int, savepoint: str) -> None:
        """Key group ``g`` starts (or redoes) its restore from ``savepoint``."""
        self._seeding[g] = savepoint
        self._restore_began.setdefault(g, int(time.time() * 1000))

    def end_seeding(self, g: int) -> None:
        """Key group ``g`` has nothing (more) to restore."""
        self._seeding.pop(g, None)

    def seeded(self, g: int, savepoint: str, checkpoint: int) -> None:
        """Key group ``g`` was restored from ``savepoint`` taken at ``checkpoint``."""
        self._done[g] = checkpoint
        self._origin[g] = savepoint
        self.halted.pop(g, None)
        self._seeding.pop(g, None)

    def halt(self, g: int, savepoint: str) -> None:
        """Key group ``g`` halts at ``savepoint`` (the caller pauses its inputs)."""
        self.halted[g] = savepoint

    def lift(self, savepoint: str) -> list[int]:
        """Lift every halt at ``savepoint`` (cancelled); returns the key groups lifted.

        A lifted key group stays running if the open epoch aborts: its committed halt is
        cleared too.
        """
        lifted = [g for g, at in self.halted.items() if at == savepoint]
        for g in lifted:
            del self.halted[g]
            self._committed[g] = replace(self._committed.get(g, _NEVER_COMMITTED), halted=None)
        return lifted

    # -- commits, aborts, assignments -----------------------------------------------------

    def commit(self, groups: list[int]) -> None:
        """The open epoch committed: what it made of ``groups`` is now the committed state."""
        for g in groups:
            self._committed[g] = Committed(
                self._done.get(g, 0),
                self._aligned.get(g, True),
                self._origin.get(g),
                self.halted.get(g),
            )

    def rewind(self, g: int) -> Rewound:
        """The open epoch aborted: key group ``g`` goes back to its committed state.

        A halt made by the aborted epoch is undone (the replay halts again); the result
        says whether one was, so the caller resumes the key group's inputs.
        """
        c = self._committed.get(g, _NEVER_COMMITTED)
        self._done[g], self._aligned[g], self._origin[g] = c.done, c.aligned, c.origin
        undone = c.halted is None and g in self.halted
        if undone:
            del self.halted[g]
        return Rewound(c.halted, undone)

    def load(
        self,
        g: int,
        *,
        done: int,
        aligned: bool,
        origin: str | None,
        seeding: str | None,
        halted: str | None,
    ) -> None:
        """Key group ``g`` was assigned with these facts (its checkpoint record's); committed."""
        self._done[g] = done
        self._aligned[g] = aligned
        self._origin[g] = origin
        if seeding:
            self._seeding[g] = seeding
        if halted:
            self.halted[g] = halted
        self.commit([g])

    def forget(self, g: int) -> None:
        """Key group ``g`` is no longer owned."""
        for per_group in (self._done, self._aligned, self._origin, self.halted, self._seeding):
            per_group.pop(g, None)
        self._restore_began.pop(g, None)
        self._committed.pop(g, None)
