"""Exactly-once sinks outside Kafka, and the one interface the epoch protocol calls.

A sink receives the records an app emits to it (``ctx.emit(name, key, value)``), buffers
them per key group for the open epoch, and writes them in a way that commits if and only
if the epoch's Kafka transaction commits (docs/sinks.md, docs/architecture.md "Sinks").

The runtime calls :class:`Sinks` at six marked places (``# sink hook``):

- ``OutputWriter.emit`` (``_runtime/output.py``): :meth:`Sinks.write`, for an emit to a
  sink's name;
- ``_commit_epoch`` (``_runtime/epoch.py``): :meth:`Sinks.prepare` before the Kafka commit
  (raises :class:`SinkUnavailable`, an ``AbortEpoch``), :meth:`Sinks.commit` after it;
- ``EpochCommitter.abort_epoch`` (``_runtime/epoch.py``): :meth:`Sinks.abort`;
- ``_assign`` (``_runtime/rebalance.py``): :meth:`Sinks.settle`, with each assigned key
  group's committed epoch token (from the committed offsets' metadata);
- the idle branch of ``_epoch_to_commit``: :meth:`Sinks.tidy` (finishes settled work);
- ``_finish`` (``_runtime/runner.py``, a clean stop): :meth:`Sinks.close`.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable, Mapping
from typing import Any

from processors._kafka.faults import crash_point
from processors._sinks.errors import SinkRowsLost, SinkUnavailable
from processors._sinks.iceberg import IcebergOutput, IcebergSink
from processors._sinks.postgres import PostgresOutput, PostgresSink
from processors.exceptions import ConfigError

__all__ = [
    "IcebergOutput",
    "PostgresOutput",
    "SinkRowsLost",
    "SinkSpec",
    "SinkUnavailable",
    "Sinks",
]

#: A declared output outside Kafka.
SinkSpec = PostgresOutput | IcebergOutput

log = logging.getLogger("lockgate.sinks")

#: Share of the transaction timeout, from the transaction's start, by which every sink
#: must have prepared (the rest is left to ``send_offsets`` and the commit).
PREPARE_SHARE = 0.75
#: Bound of the work done outside a transaction's clock (commit after it, abort, tidy).
_SIDE_BOUND_S = 2.0


class Sinks:
    """The sinks of one runtime instance (empty for apps without any: every call is a no-op).

    Args:
        app: the name the app runs under (prefixes each sink's transaction ids).
        specs: the declared sinks by name (``App.sinks``).
        txn_timeout_s: the Kafka transaction timeout (bounds :meth:`prepare`).
        exactly_once: whether the app runs exactly once (sinks need it).

    Raises:
        ConfigError: sinks under at-least-once, or app and output names too long for a
            prepared transaction id (postgres).
    """

    def __init__(
        self,
        app: str,
        specs: Mapping[str, SinkSpec],
        txn_timeout_s: float,
        exactly_once: bool = True,
    ) -> None:
        if specs and not exactly_once:
            raise ConfigError(
                f"postgres/iceberg outputs {sorted(specs)} need "
                "LOCKGATE_GUARANTEE=exactly_once: under at_least_once an offset commit whose "
                "outcome is unknown would roll back rows that may have committed (lost rows)"
            )
        self._sinks: dict[str, PostgresSink | IcebergSink] = {
            name: IcebergSink(app, spec)
            if isinstance(spec, IcebergOutput)
            else PostgresSink(app, spec)
            for name, spec in specs.items()
        }
        self._txn_timeout_s = txn_timeout_s
        for sink in self._sinks.values():
            if isinstance(sink, IcebergSink):
                sink.warm()

    def __contains__(self, name: object) -> bool:
        return name in self._sinks

    def __bool__(self) -> bool:
        return bool(self._sinks)

    def write(self, name: str, writer: list[tuple[str, Any]], key: Any, value: Any) -> None:
        """Buffer one emitted record for the open epoch of the key group being processed.

        Args:
            name: the sink's declared name.
            writer: the runtime's ``lockgate-writer`` header of the key group in progress
                (``[(name, b"<app>/<g>")]``), which names the key group.
            key: the record's key.
            value: the row (a mapping of column to value), or ``None`` (upsert: delete).

        Raises:
            KeyError: ``name`` is not a sink.
            SinkRowError: the row does not fit the declaration (user code gets it).
        """
        g = int(bytes(writer[0][1]).rsplit(b"/", 1)[1])
        self._sinks[name].add(g, key, value)

    def prepare(self, token: str, owned: Iterable[int], began_at: float | None) -> None:
        """Prepare this epoch's rows in every sink, within the transaction's time.

        Before the Kafka commit. Finishes earlier settled work first (commits of epochs
        that committed in Kafka, settles of key groups taken over), so that no Kafka
        commit ever moves past a key group's epoch whose rows are not yet resolved.

        Args:
            token: the epoch's token (in its committed offsets' metadata).
            owned: the key groups this instance owns (rows of others are dropped).
            began_at: ``time.monotonic()`` when the Kafka transaction began (``None``
                without one: at-least-once).

        Raises:
            SinkUnavailable: a database is down, slow or refused a row: the epoch aborts
                and is replayed (nothing of it is visible in any table).
            SinkRowsLost: see :meth:`commit` (an earlier epoch's pending commit).
        """
        if not self._sinks:
            return
        now = time.monotonic()
        start = now if began_at is None else began_at
        deadline = start + PREPARE_SHARE * self._txn_timeout_s
        groups = set(owned)
        for sink in self._sinks.values():
            sink.prepare(token, groups, deadline)

    def commit(self) -> None:
        """The Kafka transaction committed: commit the prepared rows.

        What cannot be committed now (database down) stays pending and is retried by
        :meth:`tidy` and before the next :meth:`prepare`, which aborts until it is done.

        Raises:
            SinkRowsLost: a prepared transaction of a committed epoch is gone and was not
                committed (rolled back by someone): the instance stops, naming it.
        """
        if any(sink.has_prepared() for sink in self._sinks.values()):
            # Test crash point: committed in Kafka, prepared rows not committed yet.
            crash_point("before_sink_commit")
        for sink in self._sinks.values():
            sink.commit(time.monotonic() + _SIDE_BOUND_S)

    def abort(self) -> None:
        """The epoch aborted: drop its rows, roll back what was prepared (never raises)."""
        for sink in self._sinks.values():
            sink.abort(time.monotonic() + _SIDE_BOUND_S)

    def settle(self, committed: Iterable[tuple[int, str | None]]) -> None:
        """Key groups were (re)assigned: resolve their prepared transactions by Kafka.

        ``committed`` pairs each assigned input partition (= key group ``g``) with the
        token in its committed offset's metadata (``None``: not committed by a lockgate
        epoch). A partition without a token says nothing (another input's may); the
        partitions of ``g`` that have one must agree. A prepared transaction of ``g``
        with that token committed in Kafka and is committed; any other is rolled back
        (``g`` without any token: every one). Tried at once (bounded); what fails is done
        by the next :meth:`prepare`. Other key groups' pending settles are kept.

        Raises:
            ConfigError: the partitions of a key group name different epochs (committed
                offsets changed by hand): settling either way could lose or add rows.
            SinkRowsLost: see :meth:`commit`.
        """
        if not self._sinks:
            return
        tokens: dict[int, str | None] = {}
        for g, token in committed:
            known = tokens.setdefault(g, None)
            if token is None:
                continue
            if known is not None and known != token:
                raise ConfigError(
                    f"key group {g}: the committed offsets of its input partitions name "
                    f"different epochs ({known!r}, {token!r}; changed by hand?): the "
                    "sinks cannot tell which epoch's rows committed. Stop the app "
                    "and commit the offsets of every input of the key group together"
                )
            tokens[g] = token
        deadline = time.monotonic() + _SIDE_BOUND_S
        for sink in self._sinks.values():
            sink.settle(tokens, deadline)

    def tidy(self, owned: Iterable[int]) -> None:
        """Finish pending commits, rollbacks and settles, bounded.

        Args:
            owned: every key group this instance owns (pending settles of the others are
                dropped: their new owners settle them).

        Raises:
            SinkRowsLost: see :meth:`commit`.
        """
        groups = set(owned)
        for sink in self._sinks.values():
            if sink.has_pending():
                sink.tidy(groups, time.monotonic() + _SIDE_BOUND_S)

    def close(self, stop_by: float | None) -> None:
        """A clean stop: commit what is pending by ``stop_by``, then close (never raises).

        Rows of committed epochs not committed by then stay prepared (logged as an error):
        the next owner of their key groups commits them.

        Args:
            stop_by: ``time.monotonic()`` by which the stop must be done (the stop
                budget's transactional deadline); ``None``: a short bound.
        """
        deadline = time.monotonic() + _SIDE_BOUND_S if stop_by is None else stop_by
        for sink in self._sinks.values():
            sink.close(deadline)
