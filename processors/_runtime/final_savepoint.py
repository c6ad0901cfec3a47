"""What the runtime needs of a bounded run's final savepoint: :class:`FinalSavepoint`.

``lockgate run --until BOUND --savepoint`` (``LOCKGATE_UNTIL_SAVEPOINT``) ends with a
savepoint of the app. Requesting it and waiting for it takes the operator commands' Kafka
clients and savepoint store (processors/_ops/bounded_savepoint.py, which implements this
protocol); the runtime sits below them, so it is handed a factory
(:data:`FinalSavepointFactory`, from ``processors/cli.py``) and only talks to the
protocol: it starts it when its key groups reached the bound, tells it which key groups it
owns, re-arms its request for key groups assigned later that have no committed manifest
of it (:meth:`FinalSavepoint.has_manifest`), and stops when
:attr:`FinalSavepoint.result` is set.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from processors._checkpoint.savepoint_requests import SavepointRequests
from processors._config.settings import Settings

__all__ = ["FinalSavepoint", "FinalSavepointFactory", "Outcome"]


@dataclass(frozen=True)
class Outcome:
    """How a bounded run's savepoint ended.

    Attributes:
        savepoint: the complete savepoint's id (``None``: it failed).
        error: why it failed (``None``: complete).
        location: where it is (the savepoint store's URL).
        reused: no new savepoint was taken: the state is the one ``savepoint`` holds.
    """

    savepoint: str | None
    error: str | None
    location: str = ""
    reused: bool = False


class FinalSavepoint(Protocol):
    """A bounded run's final savepoint, requested and awaited off the loop's thread.

    Attributes:
        owned: the key groups the loop owns (replaced by the loop, read by the waiter).
        request: the savepoint request of this run, once known (the loop re-arms it).
        result: set once, when the savepoint completed or failed.
    """

    owned: frozenset[int]
    request: dict[str, Any] | None
    result: Outcome | None

    def start(self) -> None:
        """Start waiting (a second call does nothing)."""

    def has_manifest(self, savepoint: str, g: int) -> bool | None:
        """Whether key group ``g`` has a committed manifest of ``savepoint`` (thread-safe).

        One the waiter read (read_committed), or one this instance's epoch committed
        (:meth:`exported`); ``None`` while not known (the waiter has not read that
        savepoint's manifests to the end yet). The runtime's rule for a bounded request:
        a key group with one took it already; one known to have none takes it (re-armed),
        whatever its checkpoint; while not known, the checkpoint rule of every savepoint.
        """
        ...

    def exported(self, savepoint: str, groups: Iterable[int]) -> None:
        """The loop's epoch exporting ``savepoint`` for ``groups`` committed."""

    def close(self) -> None:
        """Stop waiting (the instance is going)."""


#: Builds the final savepoint: (app name, settings, inputs, key-group count, this
#: instance's end offset per input partition, the loop's savepoint requests).
FinalSavepointFactory = Callable[
    [str, Settings, Sequence[str], int, Mapping[tuple[str, int], int], SavepointRequests],
    FinalSavepoint,
]
