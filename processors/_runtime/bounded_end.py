"""A bounded run's end phase, and what the savepoint code asks of a run's end.

``lockgate run --until BOUND [--savepoint]`` (processors/_runtime/bounded.py has the
bound and its end offsets). Once every owned key group reached its ends, the run drains
event time (unless ``--no-drain``), commits and stops; with ``--savepoint``
(``LOCKGATE_UNTIL_SAVEPOINT``) it goes on instead, marks the key groups as ended
(``bounded`` in their checkpoint records) and stops once its final savepoint
(processors/_runtime/final_savepoint.py) is complete or failed. :class:`BoundedEnd`
owns that phase; the loop asks it once per loop iteration (:meth:`BoundedEnd.trim` per
fetched batch, :meth:`BoundedEnd.after_batch` after it), never per record.

The epoch and savepoint code ask a run's end three questions through
:class:`SavepointRules`: whether a savepoint request waits (:meth:`~SavepointRules.defers`),
whether a source key group took it already (:meth:`~SavepointRules.taken`), and what a key
group's checkpoint record says of the bound (:meth:`~SavepointRules.bounded`); and tell it
when an epoch carrying a savepoint committed (:meth:`~SavepointRules.committed`). A run
that is not bounded answers with :class:`EverySavepoint` (the rules of every savepoint);
a bounded run with its :class:`BoundedEnd`.

Invariants this component owns:

* **a key group is ended once per ownership**: drained and committed when it reached its
  ends, then listed in :attr:`BoundedEnd.ended` with its end offsets (written as
  ``bounded`` in each of its checkpoint records from the next commit on) until it is
  revoked; a new owner ends it again;
* **the final savepoint waits for every owned key group to be ended**, and all of them
  take it in the same epoch; a key group took it when a committed manifest of it exists
  (not by its checkpoint: one taken over and drained after the request is past the
  request's checkpoint yet has not taken it); while that is not known, the checkpoint
  rule of every savepoint applies;
* **the run stops only at its end**: without ``--savepoint`` once the final commit
  succeeded (a failed one aborts, replays and comes back here), with it once the
  savepoint is complete (exit code 0, :attr:`BoundedEnd.savepoint_result`) or failed
  (:attr:`BoundedEnd.exit_code` 1).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol

from processors._checkpoint.keygroup_state import KeyGroupCheckpoints
from processors._checkpoint.savepoint_requests import SavepointRequests
from processors._config.settings import Settings
from processors._kafka.clients import Admin
from processors._runtime.bounded import BoundedRun, parse_until
from processors._runtime.final_savepoint import FinalSavepoint, FinalSavepointFactory
from processors._runtime.open_epoch import OpenEpoch
from processors.exceptions import ConfigError

__all__ = ["BoundedEnd", "EverySavepoint", "SavepointRules", "plan_bounded_run"]

log = logging.getLogger("lockgate.runtime")


class SavepointRules(Protocol):
    """What the epoch and savepoint code ask of a run's end (see the module docs)."""

    def defers(self, request: dict[str, Any]) -> bool:
        """Whether the source key groups wait before taking ``request``."""
        ...

    def taken(self, g: int, request: dict[str, Any]) -> bool:
        """Whether source key group ``g`` took ``request`` already (it is skipped)."""
        ...

    def bounded(self, g: int) -> dict[str, int] | None:
        """Key group ``g``'s end offsets by input topic, once it was ended (else ``None``)."""
        ...

    def committed(self, request: dict[str, Any], manifests: dict[int, dict[str, Any]]) -> None:
        """The epoch carrying ``request`` committed with ``manifests`` (by key group)."""
        ...


def taken_by_checkpoint(marks: KeyGroupCheckpoints, g: int, request: dict[str, Any]) -> bool:
    """The rule of every savepoint: ``g``'s checkpoint is at or past the request's.

    A previous owner took it.
    """
    return marks.done(g) >= int(request["checkpoint"])


class EverySavepoint:
    """The rules of every savepoint: a run that is not bounded.

    Args:
        marks: the key groups' checkpoint state (read only: the completed checkpoint).
    """

    def __init__(self, marks: KeyGroupCheckpoints) -> None:
        self._marks = marks

    def defers(self, request: dict[str, Any]) -> bool:
        """Never: a request is taken at the next epoch."""
        return False

    def taken(self, g: int, request: dict[str, Any]) -> bool:
        """By the checkpoint (:func:`taken_by_checkpoint`)."""
        return taken_by_checkpoint(self._marks, g, request)

    def bounded(self, g: int) -> dict[str, int] | None:
        """Never ended: ``None``."""
        return None

    def committed(self, request: dict[str, Any], manifests: dict[int, dict[str, Any]]) -> None:
        """Nothing to note."""


def plan_bounded_run(
    admin: Admin,
    settings: Settings,
    name: str,
    inputs: Sequence[str],
    partitions: int,
    upstream: Mapping[str, Any],
    final_savepoint: FinalSavepointFactory | None,
) -> BoundedRun:
    """Read the end offsets of a bounded run (processors/_runtime/bounded.py).

    Args:
        admin: reads the end offsets.
        settings: ``LOCKGATE_UNTIL`` (set), ``LOCKGATE_UNTIL_SAVEPOINT``, the drain.
        name: the app's name.
        inputs: the input topics.
        partitions: the key-group count (partitions of every input).
        upstream: the upstream lockgate writers each internal input expects.
        final_savepoint: builds the final savepoint (required with
            ``LOCKGATE_UNTIL_SAVEPOINT``).

    Raises:
        ConfigError: a malformed bound, or the app reads internal topics (their end is
            the upstream's barriers, not an offset).
    """
    until = settings.until
    assert until is not None
    bound = parse_until(until)
    if settings.until_savepoint is not None and final_savepoint is None:
        raise ConfigError(
            "LOCKGATE_UNTIL_SAVEPOINT: this runner was started without the final "
            "savepoint's coordinator (use `lockgate run`, or pass final_savepoint= to "
            "run_app)"
        )
    if upstream:
        raise ConfigError(
            f"LOCKGATE_UNTIL={until!r}: app {name!r} reads internal topics of other "
            f"lockgate apps ({sorted(upstream)}); a bounded run is for apps "
            "that read external inputs only (run the upstream bounded and this app "
            "unbounded, or stop it with a savepoint)"
        )
    plan = BoundedRun.plan(bound, admin, inputs, partitions)
    log.info(
        "bounded run: processing up to the end offsets, then stopping",
        extra={
            "until": until,
            "drain": settings.until_drain,
            "ends": {f"{t}[{g}]": o for (t, g), o in sorted(plan.ends.items())},
        },
    )
    return plan


class BoundedEnd:
    """A bounded run's end phase (see the module docs); the run's :class:`SavepointRules`.

    Args:
        run: the end offsets and the evidence that partitions reached them.
        settings: the drain and the final savepoint's settings (handed to its factory).
        name: the app's name.
        inputs: the input topics.
        partitions: the key-group count.
        key_groups: the owned key groups (read only).
        halted: the halted key groups (read only).
        next_offsets: the next record to process of each owned input partition (read
            only).
        backlog: the records the interleaver buffers per input partition (``None``: one
            input, no interleaver).
        open_epoch: the open epoch (``active`` and ``commit_now`` are raised here).
        marks: the key groups' checkpoint state (read only: the checkpoint rule).
        requests: the savepoint requests (the final savepoint's request is re-armed).
        final_savepoint: builds the final savepoint (``LOCKGATE_UNTIL_SAVEPOINT``;
            checked by :func:`plan_bounded_run`).
        drain: advances event time to its end in every owned key group that is not
            halted (``None``: the app has no event time).
        end_epoch: commits the open epoch (raises ``AbortEpoch`` when it failed).
        live_source: whether a key group is a source that is not halted.
        stop: ends the loop (it finishes the open epoch and stops).
    """

    def __init__(
        self,
        run: BoundedRun,
        settings: Settings,
        name: str,
        inputs: Sequence[str],
        partitions: int,
        key_groups: Mapping[int, object],
        halted: Mapping[int, str],
        next_offsets: Mapping[tuple[str, int], int],
        backlog: Callable[[], Mapping[tuple[str, int], int]] | None,
        open_epoch: OpenEpoch,
        marks: KeyGroupCheckpoints,
        requests: SavepointRequests,
        final_savepoint: FinalSavepointFactory | None,
        drain: Callable[[], None] | None,
        end_epoch: Callable[[], None],
        live_source: Callable[[int], bool],
        stop: Callable[[], None],
    ) -> None:
        self.run = run
        self._settings = settings
        self._name = name
        self._inputs = inputs
        self._partitions = partitions
        self._kgs = key_groups
        self._halted = halted
        self._next = next_offsets
        self._backlog = backlog
        self._open = open_epoch
        self._marks = marks
        self._sp_requests = requests
        self._factory = final_savepoint
        self._drain = drain
        self._end_epoch = end_epoch
        self._live_source = live_source
        self._stop = stop
        #: The key groups that reached their end (and were drained): their end offsets
        #: by input topic, written as ``bounded`` in their checkpoint records
        #: (processors/_ops/bounded_savepoint.py reads them back). With a final savepoint
        #: only (without one, the run stops at once).
        self.ended: dict[int, dict[str, int]] = {}
        #: The final savepoint (``LOCKGATE_UNTIL_SAVEPOINT``), once the bound is reached.
        self.final_savepoint: FinalSavepoint | None = None
        #: The id of the complete savepoint the run ends with.
        self.savepoint_result: str | None = None
        #: 1 when the final savepoint failed, else 0.
        self.exit_code = 0

    def trim(self, msgs: list[Any]) -> list[Any]:
        """Drop the fetched records at or past their end (:meth:`BoundedRun.trim`)."""
        return self.run.trim(msgs)

    def after_batch(self) -> bool:
        """After each batch: the savepoint phase's step; end the key groups at their end.

        Returns:
            Whether key groups were ended now (the loop starts its next iteration).

        Raises:
            AbortEpoch: the final commit failed (the loop aborts, replays and comes back).
        """
        if self.final_savepoint is not None:
            self._final_savepoint_step()
        if self._done() and not self._all_ended():
            self._end()
            return True
        return False

    def close(self) -> None:
        """Stop waiting for the final savepoint (the instance is going)."""
        if self.final_savepoint is not None:
            self.final_savepoint.close()

    # -- what the epoch and savepoint code ask ---------------------------------------------

    def defers(self, request: dict[str, Any]) -> bool:
        """A bounded run takes its final savepoint only with every owned key group ended."""
        if not request.get("bounded"):
            return False
        return not self._all_ended()

    def taken(self, g: int, request: dict[str, Any]) -> bool:
        """A bounded run's final savepoint: taken where a committed manifest of it exists.

        Not by the checkpoint: a key group taken over in the savepoint phase (its previous
        owner died before exporting it) is drained and committed at an id past the
        request's checkpoint (this instance's ids are), as is one of an instance restarted
        or deferring longer than the request's margin; it still has to take it.
        """
        sp = self.final_savepoint
        if not request.get("bounded") or sp is None:
            return taken_by_checkpoint(self._marks, g, request)
        known = sp.has_manifest(str(request["savepoint"]), g)
        if known is None:  # not read yet (a restart; an earlier run's request): by checkpoint
            return taken_by_checkpoint(self._marks, g, request)
        return known

    def bounded(self, g: int) -> dict[str, int] | None:
        """Key group ``g``'s end offsets once it was ended (``bounded`` in its records)."""
        return self.ended.get(g)

    def committed(self, request: dict[str, Any], manifests: dict[int, dict[str, Any]]) -> None:
        """The epoch carrying a savepoint committed: a bounded run's notes its manifests."""
        sp = self.final_savepoint
        if sp is not None and request.get("bounded"):
            sp.exported(str(request["savepoint"]), manifests)

    # -- the end phase ----------------------------------------------------------------------

    def _done(self) -> bool:
        """Whether every owned, not halted key group reached the bounded run's ends."""
        if not self._kgs or self._open.released:
            return False
        owned = [(t, g) for g in self._kgs if g not in self._halted for t in self._inputs]
        backlog = self._backlog() if self._backlog is not None else {}
        return self.run.reached(owned, self._next, backlog)

    def _end(self) -> None:
        """Drain event time (unless ``--no-drain``), commit, and stop the loop.

        With a final savepoint (``LOCKGATE_UNTIL_SAVEPOINT``) the loop goes on instead:
        the key groups are marked as having reached the bound (``bounded`` in their
        checkpoint records from the next commit on) and the savepoint phase starts
        (:class:`~processors._ops.bounded_savepoint.BoundedSavepoint`). Key groups
        assigned later come here again once they reached their ends.

        Raises:
            AbortEpoch: the final commit failed (the loop aborts, replays and comes back).
        """
        settings = self._settings
        if settings.until_drain and self._drain is not None:
            self._drain()
            self._open.active = True  # the final watermark is state: it commits
        self._end_epoch()
        log.info(
            "bounded run complete: every owned key group reached its end offsets",
            extra={"key_groups": sorted(self._kgs), "drained": settings.until_drain},
        )
        if settings.until_savepoint is None:
            self._stop()
            return
        ends = self.run.ends
        for g in self._kgs:
            self.ended[g] = {t: ends.get((t, g), 0) for t in self._inputs}
        self._open.active = True  # the next commit says so in the checkpoint records
        if self.final_savepoint is None:
            factory = self._factory
            assert factory is not None  # checked at start (plan_bounded_run)
            self.final_savepoint = factory(
                self._name,
                settings,
                self._inputs,
                self._partitions,
                ends,
                self._sp_requests,
            )
            log.info(
                "bounded run: waiting for every key group to reach the bound, then taking "
                "the savepoint",
                extra={"location": settings.savepoint_dir},
            )
        self.final_savepoint.owned = frozenset(self._kgs)
        self.final_savepoint.start()

    def _all_ended(self) -> bool:
        """With a final savepoint: whether every owned key group was ended (drained) already."""
        return (
            self._settings.until_savepoint is not None
            and bool(self._kgs)
            and self._kgs.keys() <= self.ended.keys()
        )

    def _final_savepoint_step(self) -> None:
        """In the savepoint phase: re-arm the request for new key groups; stop when done."""
        sp = self.final_savepoint
        assert sp is not None
        for g in [g for g in self.ended if g not in self._kgs]:
            del self.ended[g]  # revoked: a new owner says it again
        sp.owned = frozenset(self._kgs)
        request = sp.request
        if (
            request is not None
            and sp.result is None
            and int(request.get("expires_ms", 0)) > time.time() * 1000  # else it would spin
            and self._all_ended()
            and any(
                self._live_source(g) and sp.has_manifest(str(request["savepoint"]), g) is False
                for g in self._kgs
            )
            and self._sp_requests.rearm(request)
        ):
            self._open.commit_now = True  # key groups assigned since take it now
        outcome = sp.result
        if outcome is None:
            return
        if outcome.savepoint is None:
            log.error("%s", outcome.error)
            self.exit_code = 1
        else:
            self.savepoint_result = outcome.savepoint
            log.info(
                "bounded run: savepoint complete"
                + (" (every key group is where it left them)" if outcome.reused else ""),
                extra={"savepoint": outcome.savepoint, "location": outcome.location},
            )
        self._stop()
