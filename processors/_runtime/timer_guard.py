"""The runtime's bookkeeping around each timer callback (the time service's ``hooks``).

A timer callback is user code run outside any input record, so the failure policy
(processors/_task/failures.py) applies to the timer itself: a timer that raises, or
whose output the producer rejects, is dead-lettered (its key, no value, headers naming
the timer) and processing goes on. A timer that wrote state its codec cannot encode is
found while the epoch is replayed to look for such writes (the epoch's ``check_writes``
mode): the epoch is rewound (:class:`TimerRewind`) and, on the replay, the timer is
dead-lettered instead of run.

Invariants this component owns:

* an output rejection is blamed on the timer that produced it: the rejection pending
  from the record path is set aside while a timer runs and put back after it;
* a timer poisoned in an epoch is dead-lettered, not run, on that epoch's replays, until
  the epoch commits (:meth:`TimerGuard.committed`);
* a key whose pending state is unencodable already when its timer starts (the record
  that moved the watermark wrote it) does not blame the timer.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from processors._checkpoint.protocol import timer_error_headers
from processors._config.settings import OnError
from processors._kafka.errors import AbortEpoch
from processors._runtime.output import OutputWriter
from processors._task.failures import stop_error

__all__ = ["TimerGuard", "TimerRewind"]

log = logging.getLogger("lockgate.runtime")

_TimerId = tuple[bytes | None, int, str]


class TimerRewind(BaseException):  # noqa: N818 - internal control flow (past user code)
    """A timer wrote state its codec cannot encode: replay with the timer dead-lettered."""


class TimerGuard:
    """Implements :class:`processors._task.time.TimerHooks` for one runtime instance.

    Args:
        out: the instance's output writer (its pending record error, the DLQ).
        on_error: the failure policy (``LOCKGATE_ON_ERROR``).
        checking_writes: whether the open epoch is a replay looking for unencodable
            state (owned by the epoch commit).
        key_state_error: the encode error of the bound key group's pending writes of a
            key (``None``: they encode).
        commit_soon: asks the loop to end the epoch at the next chance.
    """

    def __init__(
        self,
        out: OutputWriter,
        on_error: OnError,
        checking_writes: Callable[[], bool],
        key_state_error: Callable[[bytes | None], BaseException | None],
        commit_soon: Callable[[], None],
    ) -> None:
        self._out = out
        self._on_error = on_error
        self._checking_writes = checking_writes
        self._key_state_error = key_state_error
        self._commit_soon = commit_soon
        #: Timers that wrote unencodable state in the open epoch: dead-lettered on replay.
        self._poisoned: dict[_TimerId, BaseException] = {}
        self._error_outside: BaseException | None = None
        self._blamable = False

    def committed(self) -> None:
        """The epoch committed: its dead-lettered timers are deleted, forget them."""
        self._poisoned.clear()

    def timer_started(self, raw_key: bytes | None, t: int, name: str) -> bool:
        """A timer callback starts: an output rejection from now on is the timer's.

        Returns:
            ``False`` for a timer poisoned by an earlier attempt of this epoch (its state
            could not be encoded): it is dead-lettered instead of run.
        """
        poisoned = self._poisoned.get((raw_key, t, name))
        if poisoned is not None:
            self._dead_letter(raw_key, t, name, poisoned)
            self._commit_soon()  # keep the replay span short
            return False
        self._error_outside = self._out.record_error
        self._out.record_error = None
        # While replaying to find unencodable state: a key whose state is bad already
        # (written by the record that moved the watermark) is not this timer's doing.
        self._blamable = self._checking_writes() and self._key_state_error(raw_key) is None
        return True

    def timer_done(self, raw_key: bytes | None, t: int, name: str) -> None:
        """A timer callback returned; if one of its outputs was rejected, dead-letter it.

        Raises:
            TimerRewind: while replaying to find unencodable state, this timer wrote
                some (the epoch is replayed without it).
            AbortEpoch: the producer refused a record (not the timer's fault).
            UserCodeError: under ``LOCKGATE_ON_ERROR=fail``.
        """
        rejected, self._out.record_error = self._out.record_error, self._error_outside
        self._check_writes(raw_key, t, name)
        if rejected is not None and self._out.producer_error is None:
            self._dead_letter(raw_key, t, name, rejected)

    def timer_failed(self, raw_key: bytes | None, t: int, name: str, exc: BaseException) -> None:
        """A timer callback raised ``exc`` (its unencodable writes are found the same way).

        Raises:
            TimerRewind: as :meth:`timer_done`.
            AbortEpoch: the producer refused a record (not the timer's fault).
            UserCodeError: under ``LOCKGATE_ON_ERROR=fail``.
        """
        self._out.record_error = self._error_outside
        self._check_writes(raw_key, t, name)
        self._dead_letter(raw_key, t, name, exc)

    def _check_writes(self, raw_key: bytes | None, t: int, name: str) -> None:
        if self._checking_writes() and self._blamable:
            bad = self._key_state_error(raw_key)
            if bad is not None:
                self._poisoned[(raw_key, t, name)] = bad
                raise TimerRewind

    def _dead_letter(self, raw_key: bytes | None, t: int, name: str, exc: BaseException) -> None:
        """Dead-letter the timer (its key, no value) and go on.

        What the callback emitted before failing stays in the epoch (a timer is not
        replayed alone).
        """
        if self._out.producer_error is not None:
            raise AbortEpoch(f"produce failed in a timer: {self._out.producer_error.str()}")
        stop = stop_error(self._on_error, f"timer {name!r} at {t}", exc)
        if stop is not None:
            raise stop
        log.warning(
            "timer failed: dead-lettering",
            extra={"timer": name, "time": t, "error": f"{type(exc).__name__}: {exc}"},
        )
        self._out.produce(self._out.dlq, None, raw_key, headers=timer_error_headers(exc, t, name))
        self._out.dead_letters += 1
