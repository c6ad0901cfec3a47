"""The open epoch: what the runtime's parts tell each other between two commits.

Every part of the runtime changes the open epoch: the per-record loop, barrier
completions, savepoints (halts lifted, seeding), rebalances (restored positions), the
bounded run (a drained end). Before this object they did it through attributes of one
shared ``self``; now each part is handed the one :class:`OpenEpoch` and the flags say
what they mean:

* ``active`` — something besides fetched records happened (a checkpoint completed,
  released records were processed, a halt lifted, a key group seeded): the epoch must
  commit even when no input record arrived.
* ``commit_now`` — commit at the next chance instead of at the interval (a savepoint
  started or was taken, a poisoned record is to be dead-lettered, a replay is kept short).
* ``check_writes`` — encode each record's state writes right after it: set while an
  epoch whose state could not be encoded at commit is replayed, to find the record.
* ``checkpoint`` — the highest checkpoint id this instance completed, committed or
  restored: the next source checkpoint id is above it (ids only increase).
* ``released`` — records an alignment released and upstream watermark updates, to
  process before the next fetched record (in this order).
* ``uncommitted`` — records consumed since the last commit, and ``fetched_bytes``, the
  value bytes fetched in the open epoch.
* ``deadline`` — when processing stops within the epoch (monotonic; the epoch budget,
  half the transaction timeout, from the epoch's start), and ``slow``, the record of the
  open epoch that alone took longer than the budget (with its seconds), if any.

Contract: one thread (the loop's) reads and writes it. The epoch sequence
(``_runtime/epoch.py``, :class:`~processors._runtime.epoch.EpochCommitter`) clears
``commit_now`` when it ends an epoch, ``active`` and ``check_writes`` when the epoch
commits, ``active`` and ``released`` when it rewinds. ``checkpoint`` never goes back:
parts raise it with :meth:`reached`; a commit sets it to its own id, which is always
above (the next id is chosen above it).

Written by both the per-record loop and the epoch sequence, hence here: ``uncommitted``
and ``fetched_bytes`` (the loop adds once per batch, the epoch sequence zeroes them at a
commit, an abort or an idle epoch), ``deadline`` (the loop reads it once per batch; the
epoch sequence restarts it: ``EpochCommitter.reset_deadline``, also the assignment's
callback after a restore) and ``slow`` (the loop notes a slow record; an abort caused by
the transaction's timeout dead-letters it, a rewind after user code raised forgets it).
"""

from __future__ import annotations

from collections import deque
from typing import Any


class OpenEpoch:
    """The open epoch's flags and released records (see the module docstring)."""

    __slots__ = (
        "active",
        "check_writes",
        "checkpoint",
        "commit_now",
        "deadline",
        "fetched_bytes",
        "released",
        "slow",
        "uncommitted",
    )

    def __init__(self) -> None:
        self.active = False
        self.commit_now = False
        self.check_writes = False
        self.checkpoint = 0
        self.released: deque[Any] = deque()
        self.uncommitted = 0
        self.fetched_bytes = 0
        self.deadline = 0.0
        self.slow: tuple[Any, float] | None = None

    def reached(self, checkpoint: int) -> None:
        """Note that checkpoint ``checkpoint`` completed, committed or was restored here."""
        if checkpoint > self.checkpoint:
            self.checkpoint = checkpoint
