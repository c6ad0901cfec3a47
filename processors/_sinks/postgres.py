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

import logging
import math
import socket
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from processors._sinks.bounded_calls import BoundedCalls, Job
from processors._sinks.errors import SinkRowError, SinkRowsLost
from processors._sinks.two_phase import TwoPhaseSink
from processors.exceptions import ConfigError

__all__ = ["PostgresOutput", "PostgresSink"]

log = logging.getLogger("lockgate.sinks")

#: Prefix of every prepared transaction id lockgate writes.
GID_PREFIX = "lockgate"
#: A prepared transaction that no longer exists (someone settled it already).
_UNDEFINED_OBJECT = "42704"
#: Refusals of a ROLLBACK PREPARED after which it is given up (logged).
_ROLLBACK_TRIES = 3
#: The longest prepared transaction id Postgres takes (bytes, GIDSIZE - 1).
GID_MAX = 199
#: Room left in a gid for the key group (up to 6 digits) and the epoch token (16 hex).
_GID_TAIL = len(":999999:") + 16
#: Pause between connection attempts while a database is down.
_CONNECT_RETRY_S = 0.5


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


#: One buffered operation: ("row", columns -> value), ("delete", key columns -> value) or
#: ("replace", columns -> value): an upsert's delete of the key, then its row.
_Op = tuple[str, dict[str, Any]]


class PostgresSink(TwoPhaseSink["dict[Any, _Op] | list[_Op]", str]):
    """The runtime side of one :class:`PostgresOutput` (one connection, one owner thread).

    The bookkeeping is :class:`TwoPhaseSink`'s: a key group's buffered rows are its
    operations (upsert: a dict per key, the last wins; append: a list), its prepared work
    is prepared transaction ids (gids, all of this app and sink). Invariant: :meth:`prepare` returns
    only when ``_to_commit`` and ``_settle`` are empty (so a Kafka commit never moves a
    key group's token past an unresolved epoch).
    """

    kind = "postgres"
    logged_at_abort = (SinkRowsLost,)

    def __init__(self, app: str, spec: PostgresOutput) -> None:
        super().__init__(spec.name)
        self.spec = spec
        self._prefix = f"{GID_PREFIX}:{app}:{spec.name}:"
        if len(self._prefix.encode()) - 1 + _GID_TAIL > GID_MAX:
            raise ConfigError(
                f"postgres_output({spec.name!r}) of app {app!r}: app and output names too "
                f"long: a prepared transaction id ('{self._prefix}<key group>:<token>') "
                f"takes at most {GID_MAX} bytes, so the app and output names together may "
                f"take {GID_MAX - _GID_TAIL - len(GID_PREFIX) - 2} bytes"
            )
        #: Transaction id of each gid this instance prepared (to verify a lost commit).
        self._xids: dict[str, int] = {}
        #: Refusals per gid of a pending rollback.
        self._failures: dict[str, int] = {}
        self._conn: Any = None
        self._broken = False
        #: The worker thread: a failed call closes the session (a transaction it had
        #: open ends with it); a timed-out one has its socket shut down; the caller waits
        #: 0.25 s past the deadline for the server-side timeouts to answer first.
        self._calls = BoundedCalls(
            "postgres",
            spec.name,
            self._lock,
            passthrough=(SinkRowsLost,),
            grace_s=0.25,
            on_worker_error=self._close,
            on_timeout=self._interrupt,
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
        prev = by_key.pop(ident, None)  # the latest op of a key goes last
        if op[0] == "row" and prev is not None:
            # Several rows of a key in one epoch write what they would across epochs (each
            # an upsert of its own columns): the merge of their columns; after a delete,
            # the delete and then that merge.
            if prev[0] == "delete":
                op = ("replace", op[1])
            else:
                op = (prev[0], {**prev[1], **op[1]})
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

    # -- the protocol's hooks -------------------------------------------------------------

    def _left_at_stop(self) -> tuple[str, dict[str, Any]] | None:
        if not self._to_commit:
            return None
        left = list(self._to_commit)
        return (
            f"postgres sink: the rows of {len(left)} committed epoch(s) could not be "
            "committed before the stop; they stay prepared in the database and are "
            "committed by the next owner of their key groups",
            {"gids": left},
        )

    def _closing(self) -> None:
        self._calls.submit(self._close)  # after anything still running

    # -- on the worker thread -----------------------------------------------------------

    def _prepare(self, token: str, rows: dict[int, dict[Any, _Op] | list[_Op]], job: Job) -> None:
        conn = self._finish(job)
        from psycopg import sql

        for g in sorted(rows):
            ops = rows[g]
            ops_list = list(ops.values()) if isinstance(ops, dict) else ops
            if not ops_list:
                continue
            gid = f"{self._prefix}{g}:{token}"
            self._calls.live(job)
            conn.execute("BEGIN")
            # Its transaction id: a commit that finds the gid gone asks what became of it.
            xid = int(conn.execute("SELECT txid_current()").fetchone()[0])
            self._write(conn, ops_list)
            # Checked and noted under the lock the caller cancels under: once cancelled (the
            # call timed out, the epoch aborted) nothing is prepared; noted before PREPARE, so
            # an unknown outcome is rolled back.
            with self._lock:
                job.check()
                self._prepared.append(gid)
                self._xids[gid] = xid
            conn.execute(sql.SQL("PREPARE TRANSACTION {}").format(sql.Literal(gid)))

    def _finish(self, job: Job) -> Any:
        """Connect; commit and roll back what is pending; settle key groups taken over.

        Returns the connection (outside a transaction, timeouts set for the time left).
        """
        import psycopg
        from psycopg import sql

        conn = self._connection(job)
        self._calls.live(job)
        ms = max(1, int(job.left() * 1000))
        timeout = sql.SQL("SET statement_timeout = {}").format(sql.Literal(ms))
        try:
            conn.execute(timeout)
        except psycopg.OperationalError:
            # Our own shutdown of the socket (the call was cancelled): stop here. Else a
            # connection the server closed meanwhile (it restarted): nothing was done on it
            # yet, so a new one may do it all.
            self._calls.live(job)
            self._close()
            conn = self._connection(job)
            self._calls.live(job)
            conn.execute(timeout)
        conn.execute(sql.SQL("SET lock_timeout = {}").format(sql.Literal(ms)))
        for pending, how in ((self._to_commit, "COMMIT"), (self._to_rollback, "ROLLBACK")):
            while True:
                with self._lock:
                    job.check()
                    if not pending:
                        break
                    gid = pending[0]
                try:
                    self._end_prepared(conn, how, gid)
                except psycopg.Error as exc:
                    if how == "COMMIT" or not self._rollback_failed(gid, exc):
                        raise
                with self._lock:
                    if pending and pending[0] == gid:
                        pending.pop(0)
                    self._xids.pop(gid, None)
                    self._failures.pop(gid, None)
        with self._lock:
            settle = dict(self._settle)
            mine = set(self._prepared)
        if not settle:
            return conn
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
            if gid in mine or g not in settle:
                # Only right after an assignment, by the committed token: an instance that
                # merely believes it owns g never touches another's transactions of g.
                continue
            self._calls.live(job)
            committed = token == settle[g]
            log.warning(
                "settling a prepared transaction of a key group taken over: %s",
                "committed in Kafka, committing it" if committed else "rolling it back",
                extra={"sink": self.spec.name, "key_group": g, "gid": gid},
            )
            self._end_prepared(conn, "COMMIT" if committed else "ROLLBACK", gid)
        with self._lock:
            for g, token in settle.items():
                if g in self._settle and self._settle[g] == token:
                    del self._settle[g]
        return conn

    def _end_prepared(self, conn: Any, how: str, gid: str) -> None:
        """``COMMIT PREPARED`` or ``ROLLBACK PREPARED`` one gid.

        Raises:
            SinkRowsLost: our own commit found its transaction gone and not committed.
        """
        import psycopg
        from psycopg import sql

        try:
            conn.execute(sql.SQL(how + " PREPARED {}").format(sql.Literal(gid)))
        except psycopg.Error as exc:
            if getattr(exc, "sqlstate", None) != _UNDEFINED_OBJECT:
                raise
            with self._lock:
                xid = self._xids.get(gid)
            if how != "COMMIT" or xid is None:
                # Settled already (by the next owner of the key group, by Kafka's outcome;
                # or a rollback of ours whose answer was lost).
                return
            # Ours, and its epoch committed in Kafka: committed already (our own call whose
            # answer was lost, or the next owner's settle) is fine; anything else lost rows.
            row = conn.execute("SELECT txid_status(%s)", (xid,)).fetchone()
            status = None if row is None else row[0]
            if status != "committed":
                raise SinkRowsLost(
                    f"postgres sink {self.spec.name!r}: the prepared transaction {gid!r} of "
                    f"an epoch that committed in Kafka is gone and was not committed "
                    f"(transaction {xid}: {status or 'unknown'}): its rows are lost; "
                    "stopping (another instance rolled it back?)"
                ) from exc

    def _rollback_failed(self, gid: str, exc: BaseException) -> bool:
        """Count a rollback the server refused; after a few, give it up (logged).

        Returns whether the gid was given up (dropped from the pending rollbacks). A
        connection failure is not counted (the database may be back later).
        """
        import psycopg

        if isinstance(exc, psycopg.OperationalError) or getattr(exc, "sqlstate", None) is None:
            return False
        with self._lock:
            n = self._failures[gid] = self._failures.get(gid, 0) + 1
        if n < _ROLLBACK_TRIES:
            return False
        log.error(
            "postgres sink: giving up the rollback of an aborted epoch's prepared "
            "transaction after %d refusals; it stays prepared until the key group is next "
            "assigned (settled then) or an operator runs ROLLBACK PREPARED",
            n,
            extra={"sink": self.spec.name, "gid": gid, "error": str(exc).strip()},
        )
        return True

    def _write(self, conn: Any, ops: Sequence[_Op]) -> None:
        from psycopg import sql

        table = sql.Identifier(*self._table_parts)
        keys = self.spec.key_columns
        groups: dict[tuple[str, tuple[str, ...]], list[tuple[Any, ...]]] = {}

        def put(kind: str, cols: Mapping[str, Any]) -> None:
            names = tuple(cols)
            groups.setdefault((kind, names), []).append(tuple(_adapt(cols[c]) for c in names))

        # Every delete first (a replace's too), then every row: a key has at most one
        # delete, and it comes before its row.
        for kind, cols in ops:
            if kind in ("delete", "replace"):
                put("delete", {c: cols[c] for c in keys})
        for kind, cols in ops:
            if kind in ("row", "replace"):
                put("row", cols)
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

    def _connection(self, job: Job) -> Any:
        import psycopg

        if self._conn is not None and (self._broken or self._conn.closed):
            self._close()
        while self._conn is None:
            # A database that is down (restarting) may be back within the time left: try
            # again until then rather than abort at once (each abort replays the epoch).
            self._calls.live(job)
            try:
                self._conn = psycopg.connect(
                    self.spec.connection_string(),
                    autocommit=True,
                    # The time left, no more (libpq's smallest is 2 s: checked after).
                    connect_timeout=max(1, math.ceil(job.left())),
                    application_name=f"lockgate {self._prefix[len(GID_PREFIX) + 1 : -1]}",
                )
            except psycopg.OperationalError:
                if job.left() <= _CONNECT_RETRY_S:
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

    def _interrupt(self) -> None:
        """Unblock the worker stuck on the connection's socket; reconnect next time."""
        conn = self._conn
        if conn is None:
            return  # connecting: bounded by its connect_timeout, checked after
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
