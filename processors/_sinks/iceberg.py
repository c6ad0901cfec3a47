"""The Iceberg sink: each epoch's rows land in the table iff the epoch commits in Kafka.

Two-phase commit, as Flink's Iceberg sink does it (docs/sinks.md, "Iceberg"):

1. **Prepare** (before the Kafka commit): the rows of each key group ``g`` are written to
   one Parquet data file whose path is a function of ``(app, sink, g, token)`` (``token``:
   the epoch's token, also written in its committed offsets' metadata). First a *marker*
   ``<table location>/lockgate/<app>/<sink>/<g>.<token>.json`` naming that file is
   written, then the file itself. Nothing is visible to readers yet.
2. **Commit** (after the Kafka commit): every prepared file of the epoch is appended to
   the table in one Iceberg snapshot (summary ``lockgate.app``, ``lockgate.sink``,
   ``lockgate.epochs`` = ``g=token,...``), which sets, in the same metadata commit, the
   table property ``lockgate:<app>:<sink>:<g>`` to ``token`` for each key group: the
   *register* of the last epoch of ``g`` in the table. Then the markers are deleted.
3. **Settle** (when ``g`` is assigned, with the token ``T`` of ``g``'s committed offsets):
   markers of ``g`` are listed *before* the table is loaded; a marker of ``T`` whose
   register is not ``T`` is rolled forward (appended, register set to ``T``); a marker of
   any other token is rolled back (its file and marker deleted) unless the register or a
   snapshot summary names it (then only the marker goes).

Why this is exact with several instances (a zombie and the new owner) on one table:

- Every append is a compare-and-set on the register. The commit is built on metadata
  loaded just before; each of our commits also adds a snapshot to ``main``, and pyiceberg
  puts the requirement "``main`` is still the snapshot I read" on it, which the catalog
  checks atomically with the swap of the metadata pointer (the SQL catalog: ``UPDATE ...
  WHERE metadata_location = <the one read>``). So no register changes between our read
  and our commit; if anything committed meanwhile the catalog refuses
  (``CommitFailedException``): we load again, decide again, and retry (pyiceberg's own
  retry, which re-applies the append on newer metadata without our check, is switched
  off for our commits).
- The owner's commit of epoch ``T`` of ``g`` expects the register to hold the token this
  instance last saw for ``g`` (set by the settle, advanced by each commit). If it holds
  ``T``, someone settled it already: done. If it holds anything else, another instance
  took ``g`` over and settled ``T`` (the latest Kafka epoch of ``g`` at its assignment
  was ``T`` or later, and every earlier one was in the table before a later one could
  commit in Kafka): the commit is dropped, never repeated.
- No Kafka commit moves past an unresolved epoch: :meth:`IcebergSink.prepare` first
  finishes pending commits (append *and* marker deletion) and settles, and aborts the
  epoch (:class:`SinkUnavailable`) when it cannot. So at a settle a marker whose token is
  not the committed one belongs to an epoch that did not commit in Kafka (rolled back),
  and the register of ``g`` is either ``T`` or the epoch before it.
- Tokens are random per epoch, so a register value never comes back (no ABA).

Every catalog and file call runs on one worker thread per sink and is bounded by the
time the Kafka transaction has left: a catalog or file store that is down or slow makes
the epoch abort (and replay); a commit after the Kafka commit that fails stays pending
and is retried before the next epoch may commit. Append mode only (an upsert would need
equality deletes or a copy-on-write rewrite per epoch: neither exact and cheap here).
"""

from __future__ import annotations

import json
import logging
import os
import random
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Literal, NamedTuple
from urllib.parse import quote, urlsplit

from processors._kafka.faults import crash_point
from processors._sinks.bounded_calls import BoundedCalls, Job
from processors._sinks.errors import SinkRowError
from processors._sinks.two_phase import TwoPhaseSink
from processors.exceptions import ConfigError

__all__ = ["IcebergOutput", "IcebergSink"]

log = logging.getLogger("lockgate.sinks")

#: Table property prefix of the per key group registers (``<prefix><app>:<sink>:<g>``).
REGISTER_PREFIX = "lockgate:"
#: Snapshot summary keys of lockgate's appends.
SUMMARY_APP, SUMMARY_SINK, SUMMARY_EPOCHS = "lockgate.app", "lockgate.sink", "lockgate.epochs"
#: Directory (under the table location) of the prepare markers.
MARKER_DIR = "lockgate"
#: pyiceberg's commit retry (re-applies an append on newer metadata): off for our commits.
_NO_RETRY = {"commit.retry.num-retries": "0"}
#: Pause bounds between attempts of a commit the catalog refused for a concurrent one.
_CONFLICT_PAUSE_S = (0.02, 0.15)
#: Substrings of catalog and FileIO property names (lower case) whose values are secrets:
#: masked in :class:`IcebergOutput`'s repr and in the errors of loading the catalog.
_SECRET_HINTS = ("secret", "token", "password", "credential", "account-key", "private-key")
_MASK = "***"


def _is_secret(prop: str) -> bool:
    """Whether the catalog or FileIO property (or env variable) ``prop`` holds a secret."""
    name = prop.lower().replace("_", "-")
    return any(hint in name for hint in _SECRET_HINTS)


def _uri_password(value: str) -> str | None:
    """The password in a URI's user info (``postgresql://user:pw@host/db``), if any."""
    try:
        return urlsplit(value).password if "://" in value else None
    except ValueError:
        return None


def masked_properties(props: Mapping[str, str]) -> dict[str, str]:
    """``props`` with the values of secret properties and the passwords of URIs masked."""
    out: dict[str, str] = {}
    for key, value in props.items():
        text = str(value)
        if _is_secret(key):
            text = _MASK
        elif password := _uri_password(text):
            text = text.replace(f":{password}@", f":{_MASK}@")
        out[key] = text
    return out


def _secret_values(props: Mapping[str, str]) -> list[str]:
    """The secret values a message could contain, longest first.

    Those of the secret properties of ``props``, the passwords of its URIs, and the values
    of pyiceberg's and AWS's secret environment variables (4 characters or more).
    """
    found = [str(v) for k, v in props.items() if _is_secret(k)]
    found += [pw for v in props.values() if (pw := _uri_password(str(v)))]
    found += [
        v
        for k, v in os.environ.items()
        if k.startswith(("PYICEBERG_", "AWS_")) and _is_secret(k.removeprefix("AWS_"))
    ]
    return sorted({v for v in found if len(v) >= 4}, key=len, reverse=True)


class _Part(NamedTuple):
    """One prepared data file: key group, epoch token, data file path, marker path."""

    g: int
    token: str
    path: str
    marker: str


@dataclass(frozen=True, repr=False)
class IcebergOutput:
    """An Apache Iceberg table declared as an output (:meth:`processors.App.iceberg_output`).

    Attributes:
        name: the name records are emitted to (``ctx.emit(name, key, row)``).
        catalog: the pyiceberg catalog: its name in pyiceberg's configuration
            (``.pyiceberg.yaml``, ``PYICEBERG_CATALOG__*``), a mapping of its properties
            (e.g. ``{"type": "sql", "uri": "sqlite:////data/catalog.db", "warehouse":
            "file:///data/warehouse"}``; the catalog's name is the key ``"name"``, default
            ``"default"``: a SQL catalog keeps tables per catalog name), or a function
            returning a loaded catalog (called on the sink's worker at the first use).
            The catalog's properties are also its tables' FileIO properties: an
            ``s3://`` warehouse takes ``s3.endpoint``, ``s3.region``,
            ``s3.force-virtual-addressing`` (``"false"``: path-style requests, what most
            S3-compatible servers want), ``s3.access-key-id``/``s3.secret-access-key``
            (better from the environment: pyiceberg merges
            ``PYICEBERG_CATALOG__<NAME>__S3__SECRET_ACCESS_KEY`` and the like into a
            mapping's properties too, and pyarrow falls back to ``AWS_ACCESS_KEY_ID``/
            ``AWS_SECRET_ACCESS_KEY``). Secret values (properties named like ``secret``,
            ``token``, ``password``..., URI passwords) never appear in this object's repr
            nor in the errors of loading the catalog.
        table: the table, ``"namespace.name"``; it must exist and be unpartitioned.
        mode: ``"append"`` (every emitted row is one table row); the only mode.
    """

    name: str
    catalog: str | Mapping[str, str] | Callable[[], Any]
    table: str
    mode: Literal["append"] = "append"

    def __post_init__(self) -> None:
        where = f"iceberg_output({self.name!r})"
        if self.mode != "append":
            raise ConfigError(
                f"{where}: mode must be 'append', got {self.mode!r} (an exact upsert would "
                "need equality deletes per epoch, which pyiceberg does not write)"
            )
        if not isinstance(self.table, str) or "." not in self.table.strip("."):
            raise ConfigError(f"{where}: table must be 'namespace.name'")
        if not (isinstance(self.catalog, str | Mapping) or callable(self.catalog)):
            raise ConfigError(
                f"{where}: catalog must be a catalog name, a mapping of catalog properties "
                "or a function returning a catalog"
            )

    def __repr__(self) -> str:
        catalog: Any = self.catalog
        if isinstance(catalog, Mapping):
            catalog = masked_properties(catalog)
        return (
            f"IcebergOutput(name={self.name!r}, catalog={catalog!r}, table={self.table!r}, "
            f"mode={self.mode!r})"
        )

    def load_catalog(self) -> Any:
        """The pyiceberg catalog (loads it from the name or properties given).

        Raises:
            Exception: what loading the catalog raises; when its message contains a secret
                value (pyiceberg names every property when it cannot tell the catalog's
                type), a ``RuntimeError`` with the secret masked instead.
        """
        if callable(self.catalog):
            return self.catalog()
        props = {} if isinstance(self.catalog, str) else dict(self.catalog)
        try:
            from pyiceberg.catalog import load_catalog

            if isinstance(self.catalog, str):
                return load_catalog(self.catalog)
            return load_catalog(props.pop("name", "default"), **props)
        except Exception as exc:
            text = str(exc)
            secrets = [v for v in _secret_values(props) if v in text]
            if not secrets:
                raise
            for value in secrets:
                text = text.replace(value, _MASK)
            raise RuntimeError(f"{type(exc).__name__}: {text}") from None


class IcebergSink(TwoPhaseSink["list[dict[str, Any]]", _Part]):
    """The runtime side of one :class:`IcebergOutput` (one worker thread, one owner thread).

    The bookkeeping is :class:`TwoPhaseSink`'s; its prepared work is data files
    (:class:`_Part`, all of this app and sink). Besides, ``_last`` holds, per owned key
    group, its register as this instance last saw or set it.

    Invariant: :meth:`prepare` returns only when ``_to_commit`` and ``_settle`` are empty.
    """

    kind = "iceberg"

    def __init__(self, app: str, spec: IcebergOutput) -> None:
        super().__init__(spec.name)
        self.spec = spec
        self.app = app
        self._register_prefix = f"{REGISTER_PREFIX}{app}:{spec.name}:"
        self._last: dict[int, str | None] = {}
        self._catalog: Any = None
        #: The table as last loaded (schema and location for a prepare; never for a commit).
        self._table: Any = None
        #: The worker thread: a failed call makes the next one load the table again.
        self._calls = BoundedCalls(
            "iceberg",
            spec.name,
            self._lock,
            passthrough=(ConfigError,),
            on_error=self._forget_table,
        )

    def warm(self) -> None:
        """Load pyiceberg, the catalog and the table on the worker, in the background.

        The first settle comes right after the first assignment, with a short bound: the
        imports and the first catalog connection should not eat it. Errors are left for
        the calls that need the catalog (logged here at debug level).
        """

        def run() -> None:
            try:
                import pyiceberg.io.pyarrow  # noqa: F401 - imported for its cost, now
                import pyiceberg.table  # noqa: F401

                self._load(Job(time.monotonic() + 60.0))
            except Exception as exc:  # noqa: BLE001 - the real calls report it
                log.debug("iceberg sink: warm-up failed: %s", exc, extra={"sink": self.spec.name})

        self._calls.submit(run)

    # -- the epoch's rows -----------------------------------------------------------------

    def add(self, g: int, key: Any, value: Any) -> None:
        """Buffer one emitted row of key group ``g``.

        Raises:
            SinkRowError: the value is not a mapping.
        """
        self._rows.setdefault(g, []).append(self.operation(key, value)[1])

    def operation(self, key: Any, value: Any) -> tuple[str, dict[str, Any]]:
        """What an emit of ``(key, value)`` writes: ``("row", columns)``.

        Raises:
            SinkRowError: the value is not a mapping (``None`` included: append only).
        """
        if not isinstance(value, Mapping):
            raise SinkRowError(
                f"emit to {self.spec.name!r}: a row is a mapping of column to value, got "
                f"{type(value).__name__} (iceberg outputs append; they take no deletes)"
            )
        return ("row", dict(value))

    # -- the protocol's hooks -------------------------------------------------------------

    def _forget_owned(self, owned: set[int]) -> None:
        for g in [g for g in self._last if g not in owned]:
            del self._last[g]

    def _settling(self, g: int) -> None:
        self._last.pop(g, None)  # known again once settled

    def _left_at_stop(self) -> tuple[str, dict[str, Any]] | None:
        if not self._to_commit:
            return None
        left = [f"{p.g}={p.token}" for p in self._to_commit]
        return (
            f"iceberg sink: the files of {len(left)} committed key group epoch(s) could not "
            "be appended before the stop; they stay prepared and are appended by the next "
            "owner of their key groups",
            {"epochs": left},
        )

    # -- on the worker thread -----------------------------------------------------------

    def _forget_table(self) -> None:
        """Load the table again at the next call (after a failed one)."""
        self._table = None

    def _load(self, job: Job) -> Any:
        """The table, loaded now from the catalog (its current metadata)."""
        self._calls.live(job)
        first = self._catalog is None
        if self._catalog is None:
            self._catalog = self.spec.load_catalog()
        table = self._catalog.load_table(self.spec.table)
        if not table.spec().is_unpartitioned():
            raise ConfigError(
                f"iceberg_output({self.spec.name!r}): table {self.spec.table!r} is "
                "partitioned; lockgate writes one data file per key group and epoch, so the "
                "table must be unpartitioned"
            )
        if first:
            io_props = getattr(table.io, "properties", {})
            log.info(
                "iceberg sink: table loaded",
                extra={
                    "sink": self.spec.name,
                    "table": self.spec.table,
                    "location": table.location(),
                    "file_io": type(table.io).__name__,
                    "s3_endpoint": io_props.get("s3.endpoint", ""),
                },
            )
        self._table = table
        return table

    def _register(self, g: int) -> str:
        return f"{self._register_prefix}{g}"

    def _marker_dir(self, table: Any) -> str:
        app, sink = quote(self.app, safe=""), quote(self.spec.name, safe="")
        return f"{table.location().rstrip('/')}/{MARKER_DIR}/{app}/{sink}"

    def _data_path(self, table: Any, g: int, token: str) -> str:
        from pyiceberg.table.locations import load_location_provider

        provider = load_location_provider(table.metadata.location, table.metadata.properties)
        return str(
            provider.new_data_location(
                self._task(g, token, None, []).generate_data_file_filename("parquet")
            )
        )

    def _task(self, g: int, token: str, schema: Any, batches: list[Any]) -> Any:
        """The write of ``g``'s file of ``token``: its name is a function of them alone."""
        from pyiceberg.table import WriteTask

        ident = uuid.uuid5(uuid.NAMESPACE_URL, f"lockgate:{self.app}:{self.spec.name}:{g}:{token}")
        return WriteTask(ident, 0, schema, batches)

    def _prepare(self, token: str, rows: dict[int, list[dict[str, Any]]], job: Job) -> None:
        import pyarrow as pa
        from pyiceberg.io.pyarrow import schema_to_pyarrow

        self._finish(job)
        table = self._table if self._table is not None else self._load(job)
        schema = table.schema()
        arrow_schema = schema_to_pyarrow(schema, include_field_ids=False)
        for g in sorted(rows):
            if not rows[g]:
                continue
            try:
                data = pa.Table.from_pylist(rows[g], schema=arrow_schema)
            except (pa.ArrowException, TypeError, ValueError) as exc:
                raise SinkRowError(
                    f"iceberg sink {self.spec.name!r}: rows of key group {g} do not fit "
                    f"table {self.spec.table!r} ({type(exc).__name__}: {exc})"
                ) from exc
            part = _Part(
                g,
                token,
                self._data_path(table, g, token),
                f"{self._marker_dir(table)}/{g}.{token}.json",
            )
            # Noted (under the lock the caller cancels under) before anything is written:
            # whatever this writes is deleted by the abort if the epoch does not commit.
            with self._lock:
                job.check()
                self._prepared.append(part)
            body = {"app": self.app, "sink": self.spec.name, "key_group": g, "token": token}
            body |= {"file": part.path, "records": data.num_rows}
            self._write_bytes(table.io, part.marker, json.dumps(body).encode())
            self._calls.live(job)
            self._write_data(table, part, data)

    def _write_data(self, table: Any, part: _Part, data: Any) -> None:
        from pyiceberg.io.pyarrow import write_file

        task = self._task(part.g, part.token, table.schema(), data.to_batches())
        # write_file names the file by the task (00000-0-<its uuid>): the path the marker names.
        written = list(write_file(table.io, table.metadata, iter([task])))
        if len(written) != 1 or written[0].file_path != part.path:
            raise RuntimeError(f"iceberg sink: data file written at an unexpected path {written}")

    @staticmethod
    def _write_bytes(io: Any, path: str, body: bytes) -> None:
        with io.new_output(path).create(overwrite=True) as out:
            out.write(body)

    @staticmethod
    def _delete(io: Any, path: str) -> None:
        try:
            io.delete(path)
        except FileNotFoundError:
            pass

    def _finish(self, job: Job) -> None:
        """Append what committed in Kafka, delete what aborted, settle key groups taken over."""
        with self._lock:
            busy = bool(self._to_commit or self._to_rollback or self._settle)
        if not busy:
            return
        while True:
            with self._lock:
                commits = list(self._to_commit)
            if not commits:
                break
            self._commit_own(commits, job)
        while True:
            with self._lock:
                if not self._to_rollback:
                    break
                part = self._to_rollback[0]
            table = self._table if self._table is not None else self._load(job)
            self._calls.live(job)
            self._roll_back(table, part)
            with self._lock:
                if self._to_rollback and self._to_rollback[0] == part:
                    self._to_rollback.pop(0)
        with self._lock:
            settle = dict(self._settle)
        if settle:
            self._settle_groups(settle, job)

    def _commit_own(self, parts: list[_Part], job: Job) -> None:
        """Append our parts of epochs that committed in Kafka (compare-and-set, retried)."""
        from pyiceberg.exceptions import CommitFailedException

        while True:
            table = self._load(job)
            props = table.properties
            with self._lock:
                last = dict(self._last)
            todo: list[_Part] = []
            done: list[_Part] = []
            for part in parts:
                current = props.get(self._register(part.g))
                if current == part.token:
                    done.append(part)  # appended already (our lost answer, or a settle)
                elif current == last.get(part.g):
                    todo.append(part)
                else:
                    # Another instance took the key group over and settled this epoch (it
                    # was the latest of g in Kafka then, or an earlier one already in).
                    seen = self._in_history(table, part.g, part.token)
                    log.warning(
                        "iceberg sink: key group taken over; its new owner settled the epoch "
                        "(%s); not appending it again",
                        "its files are in the table" if seen else "no snapshot names it",
                        extra={"sink": self.spec.name, "key_group": part.g, "token": part.token},
                    )
                    done.append(part)
            if todo:
                try:
                    self._append(table, todo, job, "commit")
                except CommitFailedException as exc:
                    log.info(
                        "iceberg sink: commit refused for a concurrent one, retrying",
                        extra={"sink": self.spec.name, "error": str(exc)},
                    )
                    time.sleep(random.uniform(*_CONFLICT_PAUSE_S))
                    continue
            # Test crash point: appended, markers not deleted yet.
            crash_point("after_sink_table_commit")
            for part in todo + done:
                self._delete(table.io, part.marker)
            with self._lock:
                for part in todo:
                    self._last[part.g] = part.token
                for part in todo + done:
                    if part in self._to_commit:
                        self._to_commit.remove(part)
            return

    def _append(self, table: Any, parts: list[_Part], job: Job, why: str) -> None:
        """One snapshot appending ``parts``' files and setting their registers.

        Built on ``table`` as loaded; the catalog refuses it (``CommitFailedException``)
        if ``main`` moved since. Raises what the catalog or file store raises.
        """
        from pyiceberg.io.pyarrow import parquet_file_to_data_file
        from pyiceberg.table import Table

        meta = table.metadata
        # pyiceberg's own retry would re-apply the append on newer metadata, past our
        # check of the registers: off, for this commit only (not written to the table).
        base = Table(
            table.name(),
            meta.model_copy(update={"properties": {**meta.properties, **_NO_RETRY}}),
            table.metadata_location,
            table.io,
            table.catalog,
        )
        files = [parquet_file_to_data_file(table.io, meta, p.path) for p in parts]
        summary = {
            SUMMARY_APP: self.app,
            SUMMARY_SINK: self.spec.name,
            SUMMARY_EPOCHS: ",".join(f"{p.g}={p.token}" for p in parts),
        }
        txn = base.transaction()
        with txn.update_snapshot(snapshot_properties=summary).fast_append() as append:
            for data_file in files:
                append.append_data_file(data_file)
        txn.set_properties({self._register(p.g): p.token for p in parts})
        self._calls.live(job)
        txn.commit_transaction()
        log.debug(
            "iceberg sink: appended",
            extra={"sink": self.spec.name, "why": why, "epochs": summary[SUMMARY_EPOCHS]},
        )

    def _in_history(self, table: Any, g: int, token: str) -> bool:
        """Whether a snapshot still in the table's metadata appended ``g``'s ``token``."""
        needle = f"{g}={token}"
        for snap in table.metadata.snapshots:
            summary = snap.summary
            if summary is None:
                continue
            props = summary.additional_properties
            if props.get(SUMMARY_APP) != self.app or props.get(SUMMARY_SINK) != self.spec.name:
                continue
            if needle in props.get(SUMMARY_EPOCHS, "").split(","):
                return True
        return False

    def _roll_back(self, table: Any, part: _Part) -> None:
        """Delete an uncommitted part's file and marker (only the marker if it is in).

        A part whose epoch did not commit in Kafka is never in the table; the check of the
        register and the snapshots' summaries guards the files of the table all the same.
        """
        if table.properties.get(self._register(part.g)) == part.token or self._in_history(
            table, part.g, part.token
        ):
            log.error(
                "iceberg sink: a marker to roll back names an epoch whose files are in the "
                "table; deleting the marker only",
                extra={"sink": self.spec.name, "key_group": part.g, "token": part.token},
            )
        else:
            self._delete(table.io, part.path)
        self._delete(table.io, part.marker)

    def _markers(self, table: Any) -> dict[int, dict[str, str]]:
        """The prepare markers of this app and sink: key group -> token -> marker path."""
        base = self._marker_dir(table)
        found: dict[int, dict[str, str]] = {}
        for name in _list_dir(table.io, base):
            stem, _, ext = name.rpartition(".")
            g_text, _, token = stem.partition(".")
            if ext != "json" or not g_text.isdigit() or not token:
                continue
            found.setdefault(int(g_text), {})[token] = f"{base}/{name}"
        return found

    def _settle_groups(self, settle: dict[int, str | None], job: Job) -> None:
        """Settle key groups taken over by their committed tokens (see the module doc)."""
        from pyiceberg.exceptions import CommitFailedException

        while True:
            self._calls.live(job)
            # Markers first, then the table: a marker appended and deleted by someone in
            # between is then seen in the register (else the register could look older
            # than an append we never saw the marker of).
            catalog_table = self._table if self._table is not None else self._load(job)
            markers = self._markers(catalog_table)
            table = self._load(job)
            props = table.properties
            forward: list[_Part] = []
            back: list[tuple[_Part, str | None]] = []
            for g, committed in settle.items():
                current = props.get(self._register(g))
                for token, marker in sorted(markers.get(g, {}).items()):
                    part = _Part(g, token, self._data_path(table, g, token), marker)
                    if token == committed and current != committed:
                        forward.append(part)
                    else:
                        back.append((part, current))
            if forward:
                log.warning(
                    "settling key groups taken over: appending epochs that committed in Kafka",
                    extra={"sink": self.spec.name, "epochs": [f"{p.g}={p.token}" for p in forward]},
                )
                try:
                    self._append(table, forward, job, "settle")
                except CommitFailedException:
                    time.sleep(random.uniform(*_CONFLICT_PAUSE_S))
                    continue
            for part, current in back:
                self._calls.live(job)
                if current == part.token:
                    # Appended by its committer, which died before deleting the marker.
                    log.info(
                        "settling a key group taken over: its last epoch is in the table "
                        "already; deleting the marker left behind",
                        extra={"sink": self.spec.name, "key_group": part.g, "token": part.token},
                    )
                    self._delete(table.io, part.marker)
                    continue
                log.warning(
                    "settling a key group taken over: deleting the files of an epoch "
                    "that did not commit in Kafka",
                    extra={"sink": self.spec.name, "key_group": part.g, "token": part.token},
                )
                self._roll_back(table, part)
            for part in forward:
                self._delete(table.io, part.marker)
            with self._lock:
                for g, committed in settle.items():
                    if self._settle.get(g, "-") != committed:
                        continue  # settled again meanwhile: that settle decides
                    rolled = any(p.g == g for p in forward)
                    self._last[g] = committed if rolled else props.get(self._register(g))
                    del self._settle[g]
            return


def _list_dir(io: Any, uri: str) -> list[str]:
    """The names of the files directly in ``uri`` (none when it does not exist)."""
    from pyiceberg.io.pyarrow import PyArrowFileIO

    if isinstance(io, PyArrowFileIO):
        from pyarrow.fs import FileSelector, FileType

        scheme, netloc, path = PyArrowFileIO.parse_location(uri)
        fs = io.fs_by_scheme(scheme, netloc)
        infos = fs.get_file_info(FileSelector(path, allow_not_found=True))
        return [i.base_name for i in infos if i.type == FileType.File]
    fs = io.get_fs(uri.partition("://")[0] or "file")
    try:
        return [str(p).rstrip("/").rpartition("/")[2] for p in fs.ls(uri, detail=False)]
    except FileNotFoundError:
        return []
