"""Savepoints in the runtime: requests, exports, stop-with-savepoint, restores.

* **Request** — ``lockgate savepoint trigger`` writes ``savepoint-request/<id>`` with
  a checkpoint id ``C`` ahead of every clock to partition 0 of each source app's
  ``<app>.control``; every instance of that app reads it (:meth:`_poll_requests`).
* **Source key groups** end their next epoch with id ``C`` (or their next id when
  already past it): barriers carry the savepoint id, and right before the commit each
  key group exports the committed state overlaid with the epoch's changes — the state
  at the cut — and its manifest goes into the same transaction.
* **Downstream key groups** take it when the barriers of ``C`` complete their
  alignment: the export is the state at that moment (database + dirty caches), the
  manifest's offsets and alignment snapshot are those *before* the completing barrier,
  so a restore replays the held records and re-completes ``C``. An alignment that was
  not aligned (timeout, held-record bound, or unaligned mode) fails the savepoint
  with a reason in the manifest.
* **Stop-with-savepoint** halts each key group at the savepoint (partition paused;
  nothing after the cut is processed or committed; ``halted`` in its checkpoint
  records, so a new owner keeps it halted) until it is started again with
  ``--from-savepoint``.
* **Restore** (``--from-savepoint ID``): a key group not yet restored from ``ID`` (its
  checkpoint record's ``origin``) is seeded in one transaction: every saved entry and
  a tombstone for every other key goes to the changelog, the offsets and alignment
  snapshot come from the manifest.
* **Operator ids** — window and interval-join stores and timers are numbered by
  declaration order (``window-<n>``, ``w<n>:...``); each of their store entries in a
  manifest names its operator's id (``operator``, and ``timers`` for the owner prefix),
  and a restore gives every operator the state saved under its id
  (:func:`plan_operator_restore`), so reordered declarations keep their state.
"""

from __future__ import annotations

import hashlib
import logging
import os
import re
import time
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import orjson
from confluent_kafka import Consumer, TopicPartition

from processors._checkpoint.alignment import Snapshot
from processors._checkpoint.control_topics import (
    CANCEL_PREFIX,
    REQUEST_PARTITION,
    REQUEST_PREFIX,
    manifest_key,
)
from processors._dsl.app import OperatorInfo
from processors._kafka.clients import restore_consumer_config
from processors._kafka.errors import AbortEpoch
from processors._kafka.faults import crash_point
from processors._runtime.core import RunnerCore
from processors._task.time import TIME_STORE
from processors.exceptions import ConfigError
from state.cache import DELETED, MISSING
from state.savepoint import (
    SavepointError,
    SavepointStore,
    StoreFile,
    check_compatible,
    merged_items,
)

log = logging.getLogger("lockgate.savepoint")

#: Entries (or tombstones) of a savepoint restore committed per transaction (the test
#: suite lowers it to drive many chunks).
_SEED_CHUNK = int(os.environ.get("LOCKGATE_TEST_SEED_CHUNK", "50000"))
#: How far back a starting instance looks for savepoint requests it may have missed.
_REQUEST_LOOKBACK_MS = 60_000
_POLL_INTERVAL_S = 0.25
#: The names operator stores get (declaration-numbered); a saved store with such a name
#: and no ``operator`` field was saved before operator ids were recorded.
_OPERATOR_STORE = re.compile(r"^(window-\d+|interval-join-\d+\.(left|right))$")


@dataclass
class OperatorPlan:
    """How a savepoint's stores and timers map onto the app's (see :func:`plan_operator_restore`).

    Attributes:
        sources: app store name -> the saved store restored into it; every saved store
            but those of dropped operators is here (stores of the app's own map to
            themselves, whether the app still declares them or not).
        timers: saved timer owner prefix -> the app's (``None``: dropped with its
            operator); empty when nothing is renamed.
        legacy: the savepoint records no operator ids (taken before they were
            recorded): stores restore by name, i.e. by declaration order.
        added: ids of the app's operators without state in the savepoint (they start
            empty).
        dropped: ids of saved operators the app does not have (their state is dropped;
            only with ``allow_non_restored``).
    """

    sources: dict[str, str]
    timers: dict[str, str | None] = field(default_factory=dict)
    legacy: bool = False
    added: list[str] = field(default_factory=list)
    dropped: list[str] = field(default_factory=list)


def _suffix(store: str) -> str:
    """The part of an operator store's name that says which of its stores it is."""
    return store.partition(".")[2]


def plan_operator_restore(
    saved: Mapping[str, Mapping[str, Any]],
    operators: Mapping[str, OperatorInfo],
    allow_non_restored: bool,
) -> OperatorPlan:
    """Map a savepoint's stores and timers onto the app's by operator id.

    Contract: a saved operator store (its entry has ``operator``) is restored into the
    store of the app's operator with the same id, wherever the declaration order put
    it; its timers' owner prefix (``timers``) is renamed to that operator's. An app
    operator whose id the savepoint lacks starts empty (as a new store does); a saved
    operator the app lacks is refused, or with ``allow_non_restored`` its state and
    timers are dropped (as a dropped store's). A savepoint without any ``operator``
    field is *legacy*: every store restores by name, as before operator ids existed.

    Args:
        saved: the manifest's stores (name -> entry with ``kind``, ``codec`` and, for
            operator stores, ``operator`` and ``timers``).
        operators: the app's operators by id (:attr:`processors.App.operators`).
        allow_non_restored: accept saved operators that the app no longer has.

    Raises:
        SavepointError: saved operator ids the app does not have (without
            ``allow_non_restored``), or an operator whose stores changed shape (a
            window id now on an interval join); the message names the ids.
    """
    ids: dict[str, list[str]] = {}
    prefixes: dict[str, str] = {}
    for name, entry in saved.items():
        uid = entry.get("operator")
        if uid is not None:
            ids.setdefault(str(uid), []).append(name)
            if entry.get("timers"):
                prefixes[str(uid)] = str(entry["timers"])
    if not ids:
        legacy = any(_OPERATOR_STORE.match(name) for name in saved)
        added = [] if legacy else list(operators)  # legacy: restored by name, not added
        return OperatorPlan({name: name for name in saved}, legacy=legacy, added=added)
    sources = {name: name for name, entry in saved.items() if entry.get("operator") is None}
    timers: dict[str, str | None] = {}
    problems: list[str] = []
    dropped = sorted(uid for uid in ids if uid not in operators)
    if dropped and not allow_non_restored:
        problems.append(
            f"operator id(s) {dropped} are in the savepoint but not in the app (its operator "
            f"ids: {sorted(operators)}); give those operators the uid= they were saved with "
            "(a derived id changes with the topics or operator it reads), or drop their state "
            "with --allow-non-restored-state"
        )
    for uid in dropped:
        if uid in prefixes:
            timers[prefixes[uid]] = None
    for uid, info in operators.items():
        if uid not in ids:
            continue
        old = {_suffix(n): n for n in ids[uid]}
        new = {_suffix(n): n for n in info.stores}
        if old.keys() != new.keys() or (uid in prefixes) != (info.timers is not None):
            problems.append(
                f"operator {uid!r} was saved with the stores {sorted(ids[uid])}, the app's "
                f"{info.kind} with that id has {list(info.stores)}; give it another uid="
            )
            continue
        for suffix, name in new.items():
            sources[name] = old[suffix]
        if info.timers is not None:
            timers[prefixes[uid]] = info.timers
    if problems:
        raise SavepointError("; ".join(problems))
    if all(old == new for old, new in timers.items()):
        timers = {}
    added = [uid for uid in operators if uid not in ids]
    return OperatorPlan(sources, timers, added=added, dropped=dropped)


def moved_operator_state(
    registered: object, operators: Mapping[str, OperatorInfo]
) -> tuple[list[str], list[str]]:
    """Return the app's stores whose changelog holds another operator's state.

    ``registered`` is the ``operators`` of the app's last registration (id -> its
    stores, as the process that wrote it declared them; anything else: unknown, nothing
    returned). Each store of the app's operators that belonged to another id then is
    described as ``"window-1 (state of 'a', now 'b')"``, in one of two lists:

    * *moved*: one of the two ids is on the other side too (declarations reordered, or
      an operator removed before this one): the store would restore state that belongs
      to another operator of the app;
    * *renamed*: neither is (the id changed in place, e.g. a derived id after its input
      topic was renamed): restored by store name, as before operator ids.
    """
    if not isinstance(registered, Mapping):
        return [], []
    owner: dict[str, str] = {}
    for uid, stores in registered.items():
        if isinstance(stores, list):
            owner.update({str(store): str(uid) for store in stores})
    moved: list[str] = []
    renamed: list[str] = []
    for uid, info in operators.items():
        for store in info.stores:
            before = owner.get(store)
            if before is not None and before != uid:
                known = before in operators or uid in registered
                (moved if known else renamed).append(f"{store} (state of {before!r}, now {uid!r})")
    return moved, renamed


def rename_timers(names: list[str], renames: Mapping[str, str | None]) -> list[str]:
    """Return the timer names of one timer entry with their owner prefixes renamed.

    ``renames`` maps a saved owner prefix (``w<n>``) to the app's, or to ``None`` to
    drop the operator's timers; other names (the app's own ``u...`` timers) stay.
    """
    out: list[str] = []
    for name in names:
        prefix, sep, rest = name.partition(":")
        if sep and prefix in renames:
            new = renames[prefix]
            if new is not None:
                out.append(f"{new}:{rest}")
        else:
            out.append(name)
    return out


def savepoint_to_seed(
    *,
    seeding: str | None,
    from_savepoint: str | None,
    origin: str | None,
    halted: str | None,
    resume_halted: bool,
) -> str | None:
    """Return the savepoint a key group must be seeded from at its assignment, or ``None``.

    In order: a restore under way (its checkpoint record names it) is finished; then an
    explicit ``--from-savepoint`` the key group does not descend from yet; then, with
    ``LOCKGATE_RESUME_FROM_STOP_SAVEPOINT``, the savepoint a stop-with-savepoint halted it
    at. A key group whose state already descends from the savepoint found is not seeded
    again (a restart).

    Args:
        seeding: the savepoint a cut-short restore was seeding, if any.
        from_savepoint: the ``--from-savepoint`` setting.
        origin: the savepoint the key group's state descends from, if any.
        halted: the savepoint a stop-with-savepoint halted the key group at, if any.
        resume_halted: the ``resume_from_stop_savepoint`` setting.

    Returns:
        The savepoint id to seed from, or ``None`` to keep the key group's state.

    Raises:
        ConfigError: the key group is to resume from its halt while ``--from-savepoint``
            (restored from already) is still set: once it descends from the halt's
            savepoint, the next start would restore the older one over it.
    """
    if seeding is not None:
        return seeding
    if from_savepoint is not None and origin != from_savepoint:
        return from_savepoint
    if resume_halted and halted is not None and origin != halted:
        if from_savepoint is not None:  # restored from it already (else returned above)
            raise ConfigError(
                f"key group halted at savepoint {halted} and LOCKGATE_RESUME_FROM_STOP_SAVEPOINT "
                f"is set, but LOCKGATE_FROM_SAVEPOINT={from_savepoint} is still set too: after "
                f"resuming from {halted}, the next start would restore the older "
                f"{from_savepoint} over it. Remove LOCKGATE_FROM_SAVEPOINT (--from-savepoint); "
                "the key group descends from it already"
            )
        return halted
    return None


class SavepointMixin(RunnerCore):
    """Savepoint requests, exports, halts and restores (see the module docs)."""

    _sp_consumer: Any = None
    _sp_next_poll = 0.0
    _sp_seen: set[str]
    _sp_location: SavepointStore | None = None
    _sp_plan_logged: str | None = None

    def _store_schemas(self) -> dict[str, dict[str, str]]:
        """Store name -> kind and codec, as registered and saved."""
        return {
            name: {"kind": h.spec.kind, "codec": h.spec.codec.name}
            for name, h in sorted(self._handles.items())
        }

    def _state_version(self) -> str:
        """A short hash of the store schemas (changes when a store's definition does)."""
        return hashlib.sha256(orjson.dumps(self._store_schemas())).hexdigest()[:16]

    # -- requests -------------------------------------------------------------------------

    def _open_request_reader(self) -> None:
        """Follow partition 0 of this app's control topic for savepoint requests."""
        self._sp_seen = set()
        self._sp_queue = deque()
        conf = restore_consumer_config(self.settings, self.name)
        conf["client.id"] = f"{self.name}-{self.settings.instance_id}-requests"
        conf["isolation.level"] = "read_uncommitted"  # requests are plain records
        consumer = Consumer(conf)
        since = int(time.time() * 1000) - _REQUEST_LOOKBACK_MS
        tp = TopicPartition(self._control_topic, REQUEST_PARTITION, since)
        # A control topic created a moment ago has no leader yet: retried, bounded.
        found = self._call(
            consumer.offsets_for_times, [tp], 10, what="savepoint request offsets", timeout_s=60
        )[0]
        start = found.offset if found.offset is not None and found.offset >= 0 else -1
        # -1 (OFFSET_END): nothing written since the lookback.
        consumer.assign([TopicPartition(self._control_topic, REQUEST_PARTITION, start)])
        self._sp_consumer = consumer

    def _poll_requests(self) -> None:
        """Take a pending savepoint request (cheap; runs at most every 250 ms)."""
        now = time.monotonic()
        if self._sp_consumer is None or now < self._sp_next_poll:
            return
        self._sp_next_poll = now + _POLL_INTERVAL_S
        resume: AbortEpoch | None = None
        for msg in self._sp_consumer.consume(100, 0):
            if msg.error() is not None or msg.key() is None:
                continue
            if msg.key().startswith(CANCEL_PREFIX):
                try:
                    self._cancel(msg.key()[len(CANCEL_PREFIX) :].decode(errors="replace"))
                except AbortEpoch as exc:  # after the rest of the batch: none of it is lost
                    resume = resume or exc
                continue
            if not msg.key().startswith(REQUEST_PREFIX):
                continue
            try:
                request = orjson.loads(msg.value())
                sp_id = str(request["savepoint"])
                int(request["checkpoint"])
            except (orjson.JSONDecodeError, KeyError, TypeError, ValueError):
                log.warning("ignoring a malformed savepoint request", extra={"key": msg.key()})
                continue
            if sp_id in self._sp_seen or sp_id in self._sp_cancelled:
                continue
            self._sp_seen.add(sp_id)
            if int(request.get("expires_ms", 0)) < time.time() * 1000:
                log.info("savepoint request expired", extra={"savepoint": sp_id})
                continue
            log.info(
                "savepoint requested",
                extra={"savepoint": sp_id, "checkpoint": request["checkpoint"]},
            )
            self._sp_queue.append(request)
        if self._sp_request is None and self._sp_queue:
            # One savepoint at a time, in the order they were requested: a second trigger
            # waits for the first to be taken (or to expire, or to be cancelled).
            self._sp_request = self._sp_queue.popleft()
            self._commit_now = True
        if resume is not None:
            raise resume

    def _cancel(self, sp_id: str) -> None:
        """Savepoint ``sp_id`` was cancelled: never take it, lift its halts.

        Key groups halted at it resume by a rewind of the open epoch (every key group
        back to its last commit, as after a restart): a halted key group replays from
        its committed position and alignment, completes the savepoint's checkpoint
        again — now without taking the savepoint — and goes on. Records a halt left
        unprocessed (skipped in the batch, released by the completion) come back that
        way, exactly once.

        Raises:
            AbortEpoch: some key group was halted at ``sp_id`` (the loop rewinds).
        """
        if sp_id in self._sp_cancelled:
            return
        self._sp_cancelled.add(sp_id)
        if self._sp_request is not None and self._sp_request.get("savepoint") == sp_id:
            self._sp_request = None
        queued = [r for r in self._sp_queue if r.get("savepoint") != sp_id]
        self._sp_queue.clear()
        self._sp_queue.extend(queued)
        lifted = self._marks.lift(sp_id)  # an abort of the open epoch keeps them running
        if not lifted:
            return
        for g in lifted:
            for t in self._inputs:
                self._frozen.pop((t, g), None)
            self._consumer.resume([TopicPartition(t, g) for t in self._inputs])
        self._epoch_active = True  # the next commit records that they are not halted
        log.warning(
            "savepoint cancelled: key groups resume",
            extra={"key_groups": lifted, "savepoint": sp_id},
        )
        raise AbortEpoch(f"savepoint {sp_id} cancelled: resuming halted key groups {lifted}")

    # -- export ---------------------------------------------------------------------------

    def _savepoints(self) -> SavepointStore:
        if self._sp_location is None:
            url = self.settings.savepoint_dir
            if not url:
                raise SavepointError(
                    "LOCKGATE_SAVEPOINT_DIR is not set for this app's instances: they cannot "
                    "write savepoint files"
                )
            self._sp_location = SavepointStore(url)
        return self._sp_location

    def _dirty_overlay(self, g: int) -> dict[str, dict[bytes, bytes | None]]:
        """The open epoch's changes of key group ``g``, encoded, without draining them."""
        overlay: dict[str, dict[bytes, bytes | None]] = {}
        for name, cache in self._kgs[g].caches.items():
            changes: dict[bytes, bytes | None] = {}
            for key in cache.dirty:
                value = cache.peek(key)
                if value is MISSING:
                    continue
                changes[key] = None if value is DELETED else cache.codec.encode(value)
            overlay[name] = changes
        return overlay

    def _export(
        self,
        g: int,
        request: dict[str, Any],
        ckpt: int,
        offsets: dict[str, int],
        align: dict[str, Any],
        overlay: dict[str, dict[bytes, bytes | None]],
        error: str | None = None,
    ) -> dict[str, Any]:
        """Export key group ``g`` and produce its manifest into the open transaction.

        A failure (no savepoint dir, I/O error, an earlier error) is recorded in the
        manifest instead of stopping the app: the savepoint fails, processing goes on.
        """
        sp_id = str(request["savepoint"])
        error = error or request.get("error")
        stores: dict[str, Any] = {}
        started = time.monotonic()
        if error is None:
            try:
                location = self._savepoints()
                db = self._kgs[g].db
                for name, handle in sorted(self._handles.items()):
                    items = merged_items(db.items(name), overlay.get(name, {}))
                    written = location.write_store(sp_id, self.name, g, name, items)
                    op = self.app.store_operator(name)
                    stores[name] = {
                        "kind": handle.spec.kind,
                        "codec": handle.spec.codec.name,
                        **(op.store_fields() if op is not None else {}),
                        **written.to_dict(),
                    }
            except (SavepointError, OSError) as exc:
                error = str(exc)
        manifest: dict[str, Any] = {
            "savepoint": sp_id,
            "app": self.name,
            "key_group": g,
            "checkpoint": ckpt,
            "offsets": offsets,
            "align": align,
            "stores": stores,
            "state_version": self._state_version(),
            "error": error,
            "stop": bool(request.get("stop")),
            "instance": self.settings.instance_id,
            "ts": int(time.time() * 1000),
        }
        if error is None:
            try:
                self._savepoints().write_manifest(sp_id, self.name, g, manifest)
            except SavepointError as exc:
                manifest["error"] = error = str(exc)
        if error is not None:
            log.error(
                "savepoint failed", extra={"savepoint": sp_id, "key_group": g, "error": error}
            )
        else:
            log.info(
                "savepoint exported",
                extra={
                    "savepoint": sp_id,
                    "key_group": g,
                    "checkpoint": ckpt,
                    "seconds": round(time.monotonic() - started, 3),
                },
            )
        self._produce(
            self._control_topic, orjson.dumps(manifest), manifest_key(sp_id, g), partition=g
        )
        self.metrics.beat()
        return manifest

    # -- halting --------------------------------------------------------------------------

    def _halt(self, g: int, sp_id: str) -> None:
        """Stop processing key group ``g`` at savepoint ``sp_id`` (stop-with-savepoint)."""
        self._marks.halt(g, sp_id)
        parts = [TopicPartition(t, g) for t in self._inputs]
        try:
            self._consumer.pause(parts)
        except Exception as exc:  # noqa: BLE001 - not assigned yet: the assign pauses it
            log.debug("pause failed: %s", exc)
        log.warning(
            "key group halted at a stop-with-savepoint; start the app with "
            f"--from-savepoint {sp_id} to continue from it",
            extra={"key_group": g, "savepoint": sp_id},
        )

    def _savepoint_committed(
        self, request: dict[str, Any], manifests: dict[int, dict[str, Any]]
    ) -> None:
        """The source epoch carrying a savepoint committed: halt on a stop request."""
        if self._sp_request is request:
            self._sp_request = None
        if not request.get("stop"):
            return
        for g, manifest in manifests.items():
            if manifest.get("error") is None:
                self._halt(g, str(request["savepoint"]))

    # -- restore --------------------------------------------------------------------------

    def _savepoint_manifest(self, sp_id: str, g: int) -> dict[str, Any]:
        """Return the committed manifest of key group ``g`` in savepoint ``sp_id``.

        Raises:
            ConfigError: the savepoint, this app in it, or the key group is missing, it
                was taken with another key-group count, or the key group failed.
        """
        location = self._savepoints()
        try:
            descriptor = location.read_descriptor(sp_id)
        except SavepointError as exc:
            raise ConfigError(f"--from-savepoint {sp_id}: {exc}") from exc
        apps = descriptor.get("apps", {})
        if self.name not in apps:
            raise ConfigError(
                f"--from-savepoint {sp_id}: the savepoint has no app {self.name!r} "
                f"(it has {sorted(apps)}); set LOCKGATE_APP_NAME to the saved app's name"
            )
        saved_groups = int(apps[self.name].get("key_groups", -1))
        if saved_groups != self._partitions:
            raise ConfigError(
                f"--from-savepoint {sp_id}: app {self.name!r} was saved with {saved_groups} "
                f"key groups, its inputs now have {self._partitions} partitions (changing the "
                "key-group count needs a savepoint rewrite)"
            )
        # The descriptor holds the manifests as committed in the epoch transactions (a
        # manifest file may have been rewritten by a fenced, aborted exporter since).
        committed = [m for m in apps[self.name].get("manifests") or () if m.get("key_group") == g]
        if committed:
            manifest = dict(committed[0])
        else:
            try:
                manifest = location.read_manifest(sp_id, self.name, g)
            except SavepointError as exc:
                raise ConfigError(f"--from-savepoint {sp_id}: {exc}") from exc
        if manifest.get("error"):
            raise ConfigError(
                f"--from-savepoint {sp_id}: key group {g} failed that savepoint: "
                f"{manifest['error']}"
            )
        # Whether it was a stop-with-savepoint is the savepoint's (the committed manifests
        # in the descriptor do not repeat it).
        manifest["stop"] = bool(manifest.get("stop") or descriptor.get("stop"))
        return manifest

    def _end_epoch(self) -> None:  # pragma: no cover - defined by EpochMixin
        raise NotImplementedError

    def _seed_from_savepoint(self, g: int) -> bool:
        """Put key group ``g``'s state, offsets and alignment at savepoint ``--from-savepoint``.

        The entries go into the key group's caches as epoch writes (a tombstone for
        every current key not saved) and are committed in chunks of
        :data:`_SEED_CHUNK` (one transaction per chunk, so a large state never outlives
        the transaction timeout); each chunk's checkpoint record says ``seeding``. The
        last commit also moves the offsets and alignment to the manifest's and records
        ``origin``. Seeding is idempotent: a restore cut short is redone from the start
        by the next owner — also without ``--from-savepoint``, because the checkpoint
        record names the savepoint being seeded. Returns False when the key group
        descends from that savepoint already (a restart), True when seeded.

        Raises:
            ConfigError: the savepoint is missing, incomplete or incompatible with the
                app's stores (the message names the store), or a file is corrupt.
            AbortEpoch: a chunk's commit failed (the caller stops; a restart redoes it).
        """
        sp_id = savepoint_to_seed(
            seeding=self._marks.seeding(g),
            from_savepoint=self.settings.from_savepoint,
            origin=self._marks.origin(g),
            halted=self._marks.halted.get(g),
            resume_halted=self.settings.resume_from_stop_savepoint,
        )
        if sp_id is None:
            self._marks.end_seeding(g)
            return False
        if self._marks.seeding(g) == sp_id and sp_id != self.settings.from_savepoint:
            log.warning(
                "finishing an interrupted restore of this key group from a savepoint",
                extra={"key_group": g, "savepoint": sp_id},
            )
        elif sp_id != self.settings.from_savepoint:
            log.info(
                "resuming a key group halted by a stop-with-savepoint from that savepoint "
                "(LOCKGATE_RESUME_FROM_STOP_SAVEPOINT)",
                extra={"key_group": g, "savepoint": sp_id},
            )
        manifest = self._savepoint_manifest(sp_id, g)
        downstream = any(manifest.get("align", {}).values())
        if downstream and not manifest.get("stop") and not self.settings.allow_non_stop_restore:
            raise ConfigError(
                f"--from-savepoint {sp_id}: key group {g} reads internal topics and the "
                "savepoint was taken without --stop. Restoring a pipeline from it counts "
                "the upstream's records written after the savepoint twice in this app (the "
                "old run's, still in the internal topic, and the restored upstream's). Take "
                "a stop-with-savepoint for a pipeline restore (lockgate savepoint trigger "
                "--pipeline ... --stop); to restore only this app while its upstream keeps "
                "running, set LOCKGATE_ALLOW_NON_STOP_RESTORE=true"
            )
        saved_stores: dict[str, Any] = manifest.get("stores", {})
        try:
            plan = plan_operator_restore(
                saved_stores, self.app.operators, self.settings.allow_non_restored_state
            )
            sources = plan.sources
            saved = {
                name: {
                    "kind": str(saved_stores[old].get("kind")),
                    "codec": str(saved_stores[old].get("codec")),
                }
                for name, old in sources.items()
            }
            restore = check_compatible(
                saved, self._store_schemas(), self.settings.allow_non_restored_state
            )
            location = self._savepoints()
            files: dict[str, StoreFile] = {}
            for name in restore:
                files[name] = StoreFile.from_dict(saved_stores[sources[name]])
                location.verify_store(sp_id, self.name, g, sources[name], files[name])
        except SavepointError as exc:
            raise ConfigError(f"--from-savepoint {sp_id}, key group {g}: {exc}") from exc
        self._log_operator_plan(sp_id, g, plan)
        offsets: dict[str, int] = {}
        for topic in self._inputs:
            offset = manifest.get("offsets", {}).get(topic)
            if offset is None:
                raise ConfigError(
                    f"--from-savepoint {sp_id}: key group {g} has no offset for input "
                    f"{topic!r} (the savepoint was taken with other inputs)"
                )
            offsets[topic] = int(offset)
        self._marks.start_seeding(g, sp_id)
        kg = self._kgs[g]
        entries = 0
        pending = 0
        for name, cache in kg.caches.items():
            saved_keys: set[bytes] = set()
            if name in files:
                decode = cache.codec.decode
                renames = plan.timers if name == TIME_STORE else None
                for key, raw in location.read_store(
                    sp_id, self.name, g, sources[name], files[name]
                ):
                    value = decode(raw)
                    if renames and key[:1] == b"t" and isinstance(value, list):
                        value = rename_timers(value, renames)
                        if not value:
                            continue  # only dropped operators' timers: a tombstone below
                    cache.put(key, value)
                    saved_keys.add(key)
                    entries += 1
                    pending += 1
                    if pending >= _SEED_CHUNK:
                        self._commit_seed_chunk()
                        pending = 0
            for key, _ in kg.db.items(name):  # an iterator over the DB as it was
                if key not in saved_keys:
                    cache.put(key, DELETED)
                    pending += 1
                    if pending >= _SEED_CHUNK:
                        self._commit_seed_chunk()
                        pending = 0
        for topic, offset in offsets.items():
            self._next[(topic, g)] = self._committed[(topic, g)] = offset
            align = manifest.get("align", {}).get(topic)
            if align:
                snap = Snapshot.from_json(align)
                self._aligners[(topic, g)] = self._new_aligner(snap, (topic, g))
                self._align_committed[(topic, g)] = snap
            else:
                self._aligners.pop((topic, g), None)
                self._align_committed.pop((topic, g), None)
        self._share_savepoint_alignment(g)
        self._marks.seeded(g, sp_id, int(manifest.get("checkpoint", 0)))
        self._checkpoint = max(self._checkpoint, self._marks.done(g))
        # The last part of the seeding commits with the caller's epoch (not an input
        # record: lockgate_records_in counts input records only).
        self._epoch_active = True
        log.info(
            "key group seeded from a savepoint",
            extra={"key_group": g, "savepoint": sp_id, "entries": entries},
        )
        return True

    def _operator_stores(self) -> dict[str, list[str]]:
        """Operator id -> its stores, as registered (see :func:`moved_operator_state`)."""
        return {uid: list(info.stores) for uid, info in self.app.operators.items()}

    def _check_operator_layout(self, registration: Mapping[str, Any] | None) -> None:
        """Refuse to restore operator state from changelogs numbered for other operators.

        Window and interval-join stores are numbered by declaration order, and a restart
        restores them from their changelogs by that number: after reordered (or removed)
        declarations an operator would get another's state. A savepoint restore maps
        state by operator id, so it is not checked.

        Raises:
            ConfigError: a store's changelog holds another operator's state (the message
                names the stores and ids, and how to deploy the change), unless
                ``allow_non_restored_state`` (then a warning).
        """
        if self.settings.from_savepoint is not None or registration is None:
            return
        moved, renamed = moved_operator_state(registration.get("operators"), self.app.operators)
        if renamed:
            log.warning(
                f"operator ids changed in place since the last run: {', '.join(renamed)}; "
                "their state is restored by store name"
            )
        if not moved:
            return
        what = (
            f"app {self.name!r}: the changelogs of {', '.join(moved)} hold the state of "
            "another operator (window and interval-join stores are numbered by declaration "
            "order, and declarations were reordered or removed since the last run)"
        )
        if self.settings.allow_non_restored_state:
            log.warning(what + "; starting anyway (LOCKGATE_ALLOW_NON_RESTORED_STATE)")
            return
        raise ConfigError(
            f"{what}. Deploy such a change through a savepoint, which maps state by operator "
            "id: lockgate savepoint trigger --app ... --stop with the previous code, then "
            "lockgate run ... --from-savepoint ID; after lockgate reset (no state left), set "
            "LOCKGATE_ALLOW_NON_RESTORED_STATE=true for one start"
        )

    def _log_operator_plan(self, sp_id: str, g: int, plan: OperatorPlan) -> None:
        """Say (once per process) how the savepoint's operators map onto the app's."""
        if self._sp_plan_logged == sp_id:
            return
        self._sp_plan_logged = sp_id
        extra = {"savepoint": sp_id, "key_group": g}
        if plan.legacy and self.app.operators:
            log.warning(
                "the savepoint records no operator ids (it was taken before lockgate "
                "recorded them): window and interval-join state is restored by declaration "
                "order (window-<n>, interval-join-<n>); if declarations were reordered since, "
                "restore with the previous code and take a new savepoint",
                extra=extra,
            )
            return
        if plan.added:
            log.warning(
                f"operators {plan.added} have no state in the savepoint: they start empty",
                extra=extra,
            )
        if plan.dropped:
            log.warning(
                f"the state of the savepoint's operators {plan.dropped} is dropped "
                "(--allow-non-restored-state)",
                extra=extra,
            )

    def _commit_seed_chunk(self) -> None:
        """Commit the seeding written so far (the offsets stay where they were)."""
        self._epoch_active = True
        self._end_epoch()
        self.metrics.beat()
        crash_point("mid_seed")
