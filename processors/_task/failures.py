"""The one policy for a record or timer that fails: stop, or dead-letter it.

Every executor of an app's chain applies it: the runtime (``processors._runtime``), the
:class:`~processors.testing.TestDriver` and a Spark backfill task
(``processors._spark.backfill_task``).

* ``LOCKGATE_ON_ERROR=fail``: the app stops with the :class:`UserCodeError` that
  :func:`stop_error` makes, naming the record (or timer), the stage and the error.
* ``dlq`` (the default): the record goes to the dead-letter topic with the reason in
  its headers. When user code ran for it (:func:`ran_user_code`), its partial effects
  (outputs, state writes) must not commit: the executor aborts the open epoch (the
  transaction, a backfill's chunk) and replays it with the record dead-lettered instead
  of processed. :class:`ReplayPoison` remembers those records, under the key the
  executor identifies a record by (input coordinates in the runtime, the record object
  in the TestDriver, the step index in a backfill). A decode failure is dead-lettered at
  once (user code did not run); a failing timer is dead-lettered without a replay (what
  it emitted before failing stays).
"""

from __future__ import annotations

from typing import Generic, TypeVar

from processors._config.settings import OnError
from processors.exceptions import UserCodeError

K = TypeVar("K")

#: Stages at which user code ran for the record: dead-lettering it needs a replay.
REPLAYED_STAGES = frozenset({"process", "emit", "state"})


def ran_user_code(stage: str) -> bool:
    """Whether a failure at ``stage`` follows user code running for the record."""
    return stage in REPLAYED_STAGES


def stop_error(
    on_error: OnError, what: str, exc: BaseException, stage: str | None = None
) -> UserCodeError | None:
    """The error that stops the app, or ``None`` when the failure is dead-lettered.

    Args:
        on_error: the app's ``LOCKGATE_ON_ERROR``.
        what: the failing thing (``record topic[p]@offset``, ``timer 'name' at t``).
        exc: what user code (or a codec) raised; the error's cause.
        stage: where (``deserialize``, ``process``, ``emit``, ``state``), if any.
    """
    if on_error is not OnError.FAIL:
        return None
    at = f" in {stage}" if stage else ""
    err = UserCodeError(
        f"{what} failed{at}: {type(exc).__name__}: {exc} "
        "(LOCKGATE_ON_ERROR=fail; set it to dlq to dead-letter instead)"
    )
    err.__cause__ = exc
    return err


class ReplayPoison(Generic[K]):
    """The records an epoch's replay dead-letters instead of processing.

    ``entries`` is a plain dict (key -> (error, stage)) so a per-record loop can test and
    look up without a method call; :meth:`mark` and :meth:`keep` change it.
    """

    def __init__(self) -> None:
        self.entries: dict[K, tuple[BaseException, str]] = {}

    def mark(self, key: K, exc: BaseException, stage: str) -> None:
        """Dead-letter the record ``key`` on the replay (``exc`` at ``stage`` is why)."""
        self.entries[key] = (exc, stage)

    def keep(self, wanted: dict[K, tuple[BaseException, str]]) -> None:
        """Keep only ``wanted`` (e.g. after a commit: records behind it are done).

        ``entries`` stays the same dict (a loop may hold it).
        """
        self.entries.clear()
        self.entries.update(wanted)
