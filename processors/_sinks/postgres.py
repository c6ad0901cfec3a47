"""The Postgres sink: each epoch's rows commit in the table iff the epoch commits in Kafka.

Two-phase commit (docs/architecture.md, "Sinks"): at the end of an epoch, before the
Kafka commit, the rows of each key group are written in one database transaction that
is prepared (``PREPARE TRANSACTION 'lockgate:<app>:<sink>:<g>:<token>'``; ``<token>`` is
the epoch's token, also written in its committed offsets' metadata). After the Kafka
commit it is committed (``COMMIT PREPARED``); after an abort, rolled back. A prepared
transaction survives a crash of the instance and of the database; whoever owns key group
``g`` next settles it by Kafka's outcome: the token in ``g``'s committed offsets names
the one epoch of ``g`` that committed last, so its transaction is committed and any
other one of ``g`` rolled back.

Every database call is bounded by the time the Kafka transaction has left (server side:
``statement_timeout`` and ``lock_timeout``; client side: the call runs on a worker thread
and its socket is shut down at the deadline). A database that is down, slow or refuses a
row makes the epoch abort (and replay later): never lost, never twice.
"""

from __future__ import annotations

import concurrent.futures
import logging
import socket
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, TypeVar

from processors._kafka.errors import AbortEpoch
from processors.exceptions import ConfigError

__all__ = ["PostgresOutput", "PostgresSink", "SinkRowError", "SinkUnavailable"]

log = logging.getLogger("lockgate.sinks")

T = TypeVar("T")

#: Prefix of every prepared transaction id lockgate writes.
GID_PREFIX = "lockgate"
#: A prepared transaction that no longer exists (someone settled it already).
_UNDEFINED_OBJECT = "42704"
#: libpq's smallest effective connect timeout.
_MIN_CONNECT_S = 2
#: Pause between connection attempts while a database is down.
_CONNECT_RETRY_S = 0.5


class SinkUnavailable(AbortEpoch):  # noqa: N818 - an AbortEpoch, control flow
    """A sink's database could not take the epoch in time: the epoch aborts and replays."""


class SinkRowError(ValueError):
    """An emitted row does not fit its sink's declaration (raised into user code)."""


@dataclass(frozen=True)
class PostgresOutput:
    """A Postgres table declared as an output (:meth:`processors.App.postgres_output`).

    Attributes:
        name: the name records are emitted to (``ctx.emit(name, key, row)``).
        dsn: a libpq connection string or URL, or a function returning one (called when
            the first connection is made, so secrets can come from the environment).
        table: the table (``"name"`` or ``"schema.name"``); it must exist. In
            ``upsert`` mode it needs a unique constraint on ``key_columns``.
        mode: ``"upsert"``: one row per key, the last value of each epoch wins
            (``INSERT ... ON CONFLICT (key_columns) DO UPDATE``); an emitted ``None``
            deletes the key's row. ``"append"``: every emitted row is inserted.
        key_columns: the columns of the key (upsert). A row without them takes the
            record's key: a mapping gives the columns, a scalar the one key column.
    """

    name: str
    dsn: str | Callable[[], str]
    table: str
    mode: Literal["upsert", "append"] = "upsert"
    key_columns: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        where = f"postgres_output({self.name!r})"
        if self.mode not in ("upsert", "append"):
            raise ConfigError(f"{where}: mode must be 'upsert' or 'append', got {self.mode!r}")
        if isinstance(self.key_columns, str):
            object.__setattr__(self, "key_columns", (self.key_columns,))
        object.__setattr__(self, "key_columns", tuple(self.key_columns))
        if self.mode == "upsert" and not self.key_columns:
            raise ConfigError(f"{where}: mode='upsert' needs key_columns=(...)")
        if self.mode == "append" and self.key_columns:
            raise ConfigError(f"{where}: key_columns are for mode='upsert' only")
        if not isinstance(self.table, str) or not self.table or self.table.count(".") > 1:
            raise ConfigError(f"{where}: table must be 'name' or 'schema.name'")
        if not (isinstance(self.dsn, str) or callable(self.dsn)):
            raise ConfigError(f"{where}: dsn must be a string or a function returning one")

    def connection_string(self) -> str:
        """The DSN (calling ``dsn`` when it is a function)."""
        return self.dsn() if callable(self.dsn) else self.dsn


#: One buffered operation: ("row", columns -> value) or ("delete", key columns -> value).
_Op = tuple[str, dict[str, Any]]


class PostgresSink:
    """The runtime side of one :class:`PostgresOutput` (one connection, one owner thread).

    The bookkeeping (all gids are of this app and sink):

    - ``_rows``: the open epoch's operations per key group (upsert: per key, last wins);
    - ``_prepared``: gids prepared for the epoch being committed;
    - ``_to_commit``: gids whose epoch committed in Kafka, ``COMMIT PREPARED`` pending;
    - ``_to_rollback``: gids of aborted epochs, ``ROLLBACK PREPARED`` pending;
    - ``_settle``: key groups taken over, with their committed token, not settled yet.

    Invariant: :meth:`prepare` returns only when ``_to_commit`` and ``_settle`` are empty
    (so a Kafka commit never moves a key group's token past an unresolved epoch).
    """

    def __init__(self, app: str, spec: PostgresOutput) -> None:
        self.spec = spec
        self._prefix = f"{GID_PREFIX}:{app}:{spec.name}:"
        self._rows: dict[int, dict[Any, _Op] | list[_Op]] = {}
        self._prepared: list[str] = []
        self._to_commit: list[str] = []
        self._to_rollback: list[str] = []
        self._settle: dict[int, str | None] = {}
        self._conn: Any = None
        self._broken = False
        #: Guards the gid lists: a worker call that outlived its deadline may still run.
        self._lock = threading.Lock()
        self._worker = concurrent.futures.ThreadPoolExecutor(
            max_workers=1, thread_name_prefix=f"lockgate-sink-{spec.name}"
        )
        schema, _, table = spec.table.rpartition(".")
        self._table_parts = (schema, table) if schema else (table,)

    # -- the epoch's rows -----------------------------------------------------------------

    def add(self, g: int, key: Any, value: Any) -> None:
        """Buffer one emitted record of key group ``g`` (see :class:`PostgresOutput`).

        Raises:
            SinkRowError: not a mapping, a ``None`` in append mode, or no key columns.
        """
        spec = self.spec
        op = self.operation(key, value)
        if spec.mode == "append":
            rows = self._rows.setdefault(g, [])
            assert isinstance(rows, list)
            rows.append(op)
            return
        by_key = self._rows.setdefault(g, {})
        assert isinstance(by_key, dict)
        ident = tuple(_hashable(op[1][c]) for c in spec.key_columns)
        by_key.pop(ident, None)  # the latest op of a key goes last
        by_key[ident] = op

    def operation(self, key: Any, value: Any) -> tuple[str, dict[str, Any]]:
        """What an emit of ``(key, value)`` writes: ``("row", columns)`` or ``("delete", key)``.

        Raises:
            SinkRowError: see :meth:`add`.
        """
        spec = self.spec
        if value is None:
            if spec.mode == "append":
                raise SinkRowError(f"emit to {spec.name!r}: append mode takes rows, not None")
            op: _Op = ("delete", self._key_of(key, {}))
        elif isinstance(value, Mapping):
            row = dict(value)
            if spec.mode == "upsert":
                for col, val in self._key_of(key, row).items():
                    row.setdefault(col, val)
            op = ("row", row)
        else:
            raise SinkRowError(
                f"emit to {spec.name!r}: a row is a mapping of column to value, got "
                f"{type(value).__name__}"
            )
        return op

    def _key_of(self, key: Any, row: Mapping[str, Any]) -> dict[str, Any]:
        cols = self.spec.key_columns
        if all(c in row for c in cols):
            return {c: row[c] for c in cols}
        if isinstance(key, Mapping) and all(c in key for c in cols):
            return {c: key[c] for c in cols}
        if len(cols) == 1 and key is not None and not isinstance(key, Mapping):
            return {cols[0]: key}
        raise SinkRowError(
            f"emit to {self.spec.name!r}: the row has no key columns {list(cols)} and the "
            "record's key does not give them"
        )

    # -- the protocol -----------------------------------------------------------------------

    def has_prepared(self) -> bool:
        """Whether the epoch being committed prepared rows here."""
        return bool(self._prepared)

    def has_pending(self) -> bool:
        """Whether settled work (commits, rollbacks, settles) waits for the database."""
        return bool(self._to_commit or self._to_rollback or self._settle)

    def prepare(self, token: str, owned: set[int], deadline: float) -> None:
        """Finish pending work, then write and prepare each owned key group's rows.

        Raises:
            SinkUnavailable: see :meth:`Sinks.prepare`.
        """
        for g in [g for g in self._rows if g not in owned]:
            del self._rows[g]  # revoked or lost: the new owner replays them
        for g in [g for g in self._settle if g not in owned]:
            del self._settle[g]  # its new owner settles it
        if not self._rows and not self.has_pending():
            return
        rows, self._rows = self._rows, {}
        self._call(
            lambda left: self._prepare(token, owned, rows, left),
            deadline,
            "prepare",
            "; the epoch is replayed",
        )

    def commit(self, deadline: float) -> None:
        """The epoch committed in Kafka: commit its prepared transactions (never raises)."""
        with self._lock:
            self._to_commit.extend(self._prepared)
            self._prepared.clear()
        if self._to_commit:
            self._try(lambda left: self._finish(set(), left), deadline, "commit")

    def abort(self, deadline: float) -> None:
        """The epoch aborted: drop its rows, roll back what it prepared (never raises)."""
        self._rows.clear()
        with self._lock:
            self._to_rollback.extend(self._prepared)
            self._prepared.clear()
        if self._to_rollback:
            self._try(lambda left: self._finish(set(), left), deadline, "rollback")

    def settle(self, tokens: Mapping[int, str | None]) -> None:
        """Key groups were assigned with these committed tokens (settled by :meth:`tidy`)."""
        for g, token in tokens.items():
            self._rows.pop(g, None)  # anything buffered for them predates the assignment
            self._settle[g] = token

    def tidy(self, owned: set[int], deadline: float) -> None:
        """Finish pending work, bounded (never raises)."""
        for g in [g for g in self._settle if g not in owned]:
            del self._settle[g]
        self._try(lambda left: self._finish(owned, left), deadline, "settle")

    # -- on the worker thread -----------------------------------------------------------

    def _prepare(
        self, token: str, owned: set[int], rows: dict[int, dict[Any, _Op] | list[_Op]], left: float
    ) -> None:
        conn = self._finish(owned, left)
        from psycopg import sql

        for g in sorted(rows):
            ops = rows[g]
            ops_list = list(ops.values()) if isinstance(ops, dict) else ops
            if not ops_list:
                continue
            gid = f"{self._prefix}{g}:{token}"
            conn.execute("BEGIN")
            self._write(conn, ops_list)
            with self._lock:  # before PREPARE: an unknown outcome is rolled back
                self._prepared.append(gid)
            conn.execute(sql.SQL("PREPARE TRANSACTION {}").format(sql.Literal(gid)))

    def _finish(self, owned: set[int], left: float) -> Any:
        """Connect; commit and roll back what is pending; settle key groups taken over.

        Returns the connection (outside a transaction, timeouts set for ``left``).
        """
        import psycopg
        from psycopg import sql

        until = time.monotonic() + left
        conn = self._connection(left)
        ms = max(1, int(left * 1000))
        timeout = sql.SQL("SET statement_timeout = {}").format(sql.Literal(ms))
        try:
            conn.execute(timeout)
        except psycopg.OperationalError:
            # A connection the server closed meanwhile (it restarted): nothing was done on
            # it yet, so a new one may do it all.
            self._close()
            conn = self._connection(max(0.1, until - time.monotonic()))
            conn.execute(timeout)
        conn.execute(sql.SQL("SET lock_timeout = {}").format(sql.Literal(ms)))
        for pending, how in ((self._to_commit, "COMMIT"), (self._to_rollback, "ROLLBACK")):
            while pending:
                self._end_prepared(conn, how, pending[0])
                with self._lock:
                    pending.pop(0)
        settle = dict(self._settle)
        if not (settle or owned):
            return conn
        with self._lock:
            mine = set(self._prepared)
        listed = conn.execute(
            "SELECT gid FROM pg_prepared_xacts WHERE database = current_database() "
            "AND starts_with(gid, %s) ORDER BY prepared",
            (self._prefix,),
        ).fetchall()
        for (gid,) in listed:
            g_text, _, token = gid[len(self._prefix) :].partition(":")
            try:
                g = int(g_text)
            except ValueError:
                continue
            if gid in mine:
                continue
            if g in settle:
                committed = token == settle[g]
                log.warning(
                    "settling a prepared transaction of a key group taken over: %s",
                    "committed in Kafka, committing it" if committed else "rolling it back",
                    extra={"sink": self.spec.name, "key_group": g, "gid": gid},
                )
                self._end_prepared(conn, "COMMIT" if committed else "ROLLBACK", gid)
            elif g in owned:
                # Prepared after this instance took g over: by an instance that lost g, whose
                # Kafka commit the group generation refuses (it prepares before it commits).
                log.warning(
                    "rolling back a prepared transaction of a former owner of the key group",
                    extra={"sink": self.spec.name, "key_group": g, "gid": gid},
                )
                self._end_prepared(conn, "ROLLBACK", gid)
        for g, token in settle.items():
            if self._settle.get(g, "") == token:
                del self._settle[g]
        return conn

    def _end_prepared(self, conn: Any, how: str, gid: str) -> None:
        import psycopg
        from psycopg import sql

        try:
            conn.execute(sql.SQL(how + " PREPARED {}").format(sql.Literal(gid)))
        except psycopg.Error as exc:
            if getattr(exc, "sqlstate", None) != _UNDEFINED_OBJECT:
                raise
            # Settled already (by the next owner of the key group, or our own call whose
            # answer was lost): the decision is the same everywhere, Kafka's outcome.

    def _write(self, conn: Any, ops: Sequence[_Op]) -> None:
        from psycopg import sql

        table = sql.Identifier(*self._table_parts)
        keys = self.spec.key_columns
        groups: dict[tuple[str, tuple[str, ...]], list[tuple[Any, ...]]] = {}
        for kind, cols in ops:
            names = tuple(cols)
            groups.setdefault((kind, names), []).append(tuple(_adapt(cols[c]) for c in names))
        with conn.cursor() as cur:
            for (kind, names), params in groups.items():
                if kind == "delete":
                    where = sql.SQL(" AND ").join(
                        sql.SQL("{} = {}").format(sql.Identifier(c), sql.Placeholder())
                        for c in names
                    )
                    stmt = sql.SQL("DELETE FROM {} WHERE {}").format(table, where)
                else:
                    stmt = sql.SQL("INSERT INTO {} ({}) VALUES ({})").format(
                        table,
                        sql.SQL(", ").join(map(sql.Identifier, names)),
                        sql.SQL(", ").join(sql.Placeholder() for _ in names),
                    )
                    if self.spec.mode == "upsert":
                        rest = [c for c in names if c not in keys]
                        target = sql.SQL(", ").join(map(sql.Identifier, keys))
                        if rest:
                            sets = sql.SQL(", ").join(
                                sql.SQL("{} = EXCLUDED.{}").format(
                                    sql.Identifier(c), sql.Identifier(c)
                                )
                                for c in rest
                            )
                            stmt += sql.SQL(" ON CONFLICT ({}) DO UPDATE SET {}").format(
                                target, sets
                            )
                        else:
                            stmt += sql.SQL(" ON CONFLICT ({}) DO NOTHING").format(target)
                cur.executemany(stmt, params)

    def _connection(self, left: float) -> Any:
        import psycopg

        if self._conn is not None and (self._broken or self._conn.closed):
            self._close()
        until = time.monotonic() + left
        while self._conn is None:
            # A database that is down (restarting) may be back within the time left: try
            # again until then rather than abort at once (each abort replays the epoch).
            try:
                self._conn = psycopg.connect(
                    self.spec.connection_string(),
                    autocommit=True,
                    connect_timeout=max(_MIN_CONNECT_S, int(left + 0.999)),
                    application_name=f"lockgate {self._prefix[len(GID_PREFIX) + 1 : -1]}",
                )
            except psycopg.OperationalError:
                if time.monotonic() + _CONNECT_RETRY_S >= until:
                    raise
                time.sleep(_CONNECT_RETRY_S)
        self._broken = False
        return self._conn

    def _close(self) -> None:
        conn, self._conn = self._conn, None
        self._broken = False
        if conn is not None:
            try:
                conn.close()
            except Exception:  # noqa: BLE001, S110 - a broken connection, dropped anyway
                pass

    # -- bounded calls ---------------------------------------------------------------------

    def _call(self, fn: Callable[[float], T], deadline: float, what: str, then: str = "") -> T:
        """Run ``fn(time_left)`` on the worker thread, by ``deadline``.

        ``then`` ends the error's message (what happens next).

        Raises:
            SinkUnavailable: no time left, the deadline passed (the connection's socket is
                shut down: the worker's call fails at once) or a database error.
        """
        left = deadline - time.monotonic()
        if left < 0.1:
            raise SinkUnavailable(
                f"postgres sink {self.spec.name!r}: no time left for the {what}{then}"
            )

        def run() -> T:
            try:
                return fn(left)
            except BaseException:
                self._close()  # a transaction it had open ends with the session
                raise

        future = self._worker.submit(run)
        try:
            return future.result(timeout=left + 0.25)  # the server-side timeouts come first
        except concurrent.futures.TimeoutError:
            self._interrupt()
            raise SinkUnavailable(
                f"postgres sink {self.spec.name!r}: the {what} took longer than the "
                f"{left:.1f}s it had{then}"
            ) from None
        except SinkUnavailable:
            raise
        except Exception as exc:
            raise SinkUnavailable(
                f"postgres sink {self.spec.name!r}: the {what} failed "
                f"({type(exc).__name__}: {str(exc).strip()}){then}"
            ) from exc

    def _try(self, fn: Callable[[float], Any], deadline: float, what: str) -> None:
        try:
            self._call(fn, deadline, what)
        except SinkUnavailable as exc:
            log.warning(
                "postgres sink: %s left pending (done before the next epoch commits)",
                what,
                extra={"sink": self.spec.name, "error": str(exc)},
            )

    def _interrupt(self) -> None:
        """Unblock the worker stuck on the connection's socket; reconnect next time."""
        conn = self._conn
        if conn is None:
            return
        self._broken = True
        try:
            fd = conn.pgconn.socket
            sock = socket.socket(fileno=socket.dup(fd))
            try:
                sock.shutdown(socket.SHUT_RDWR)
            finally:
                sock.close()
        except Exception as exc:  # noqa: BLE001 - closed meanwhile: nothing to unblock
            log.debug("postgres sink: socket shutdown failed: %s", exc)


def _hashable(value: Any) -> Any:
    if isinstance(value, dict):
        return tuple(sorted((k, _hashable(v)) for k, v in value.items()))
    if isinstance(value, list):
        return tuple(_hashable(v) for v in value)
    return value


def _adapt(value: Any) -> Any:
    """Mappings and lists go to JSON(B) columns."""
    if isinstance(value, dict | list):
        from psycopg.types.json import Jsonb

        return Jsonb(value)
    return value
