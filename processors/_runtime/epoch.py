"""The epoch sequence: commit (exactly-once or at-least-once), abort, rewind.

Every ``LOCKGATE_CHECKPOINT_INTERVAL_MS`` (or sooner, when the batch budget runs out)
the open epoch ends with the commit sequence:

1. produce the final value of every dirty state key to its changelog partition,
   barrier records to internal outputs, and a checkpoint record per key group to
   ``lockgate.control``;
2. ``send_offsets_to_transaction`` with the next offset of **every** owned input
   partition (tracked by the runtime, never read from ``position()``), changed or
   not — the call is also the group-generation check that fences a zombie — with
   metadata carrying the checkpoint id;
3. ``commit_transaction``; then write the epoch's changes to the local databases
   (with the changelog offsets in ``__meta``); then ``begin_transaction``.

Nothing reaches the local databases before step 3 succeeded, so an abort is "drop the
caches and seek back to the committed offsets". Every blocking call is bounded by the
transaction timeout; transient errors past it abort the epoch.

:class:`EpochCommitter` (the runner's ``self._epochs``) is that sequence. It owns the
producer (``TransactionalProducer`` under exactly-once; replaced when it cannot go on)
and what only the sequence writes: whether the app registered, the open epoch's token,
whether it carries only barriers, whether the coordinator aborted it on its timeout, the
aborts in a row (a replay loop stops the instance; a sink outage backs off), and whether
no more epoch may commit. What the per-record loop writes too lives in the
:class:`~processors._runtime.open_epoch.OpenEpoch` (records consumed, bytes fetched, the
deadline, the slow record). Values the runner replaces during the run (the consumer on a
rejoin, the admin client and restorer made at start-up, a bounded run's savepoint rules)
are read through getters, never kept.

Invariants:

* nothing reaches RocksDB before its epoch committed (:meth:`EpochCommitter._apply_locally`
  runs only after the commit, or after an unknown commit settled as committed);
* a commit without an answer is never taken as aborted: it is settled from the group's
  stable committed offsets, which carry each epoch's token
  (:meth:`EpochCommitter._settle_unknown_commit`);
* an abort leaves every owned key group as the last commit made it (caches dropped,
  inputs, alignment, checkpoints and halts rewound) and begins the next transaction;
  more than ten aborts in a row without a commit stop the instance (a replay loop), but
  not those after user code raised (each dead-letters its record) nor a barrier-only
  epoch's, and sink outages are waited out instead;
* no commit moves past a callback's failure or a stop after a failure
  (``callback_failed``, :meth:`EpochCommitter.never_commit_again`).

One thread at a time calls it: the loop's, or the consumer close's final revoke.
"""

from __future__ import annotations

import logging
import secrets
import time
from collections.abc import Callable, Mapping
from typing import Any

import orjson
from confluent_kafka import KafkaError, KafkaException, Producer, TopicPartition

from processors._checkpoint.alignment import Snapshot
from processors._checkpoint.input_positions import InputPositions
from processors._checkpoint.keygroup_state import KeyGroupCheckpoints
from processors._checkpoint.savepoint_requests import SavepointRequests
from processors._checkpoint.txn import CommitOutcomeUnknown, TransactionalProducer
from processors._config.settings import Settings
from processors._kafka.authz import authorization_error
from processors._kafka.clients import Admin, producer_config
from processors._kafka.errors import AbortEpoch, CallHung, cause_code
from processors._kafka.faults import crash_point
from processors._runtime.bounded_end import SavepointRules
from processors._runtime.checkpoint_writer import CheckpointWriter
from processors._runtime.gauges import ProgressGauges
from processors._runtime.health import Metrics
from processors._runtime.open_epoch import OpenEpoch
from processors._runtime.output import OutputWriter
from processors._runtime.savepoint_files import SavepointFiles
from processors._runtime.savepoints import SavepointParticipant
from processors._runtime.timer_guard import TimerGuard
from processors._sinks import Sinks
from processors._task.failures import ReplayPoison, stop_error
from processors._task.global_tables import GlobalTables
from processors._task.interleave import Interleaver
from processors._task.keygroups import KeyGroup, Restorer, StateCleaner
from processors.exceptions import FatalKafkaError
from state.base.store import META_CHANGELOG_PREFIX, META_CHECKPOINT, META_UPDATED_MS
from state.cache import changelog_topic
from state.primitives import DEFAULT_SWEEP_BUDGET, StateHandle, sweep_key_group

__all__ = [
    "SINK_OUTAGE_BACKOFF_S",
    "EpochCommitter",
    "SlowRecordError",
    "offset_metadata",
    "sink_outage_wait_s",
    "where",
]

log = logging.getLogger("lockgate.runtime")


class SlowRecordError(Exception):
    """One record kept user code busy longer than the transaction can stay open."""


def where(msg: Any) -> str:
    """Return ``topic[partition]@offset`` of a record."""
    return f"{msg.topic()}[{msg.partition()}]@{msg.offset()}"


_MAX_CONSECUTIVE_ABORTS = 10
#: Back-off after an epoch a sink could not take (an outage of its database or store):
#: the first wait, doubled after each such abort in a row, up to the cap (seconds).
SINK_OUTAGE_BACKOFF_S = (0.5, 10.0)


def sink_outage_wait_s(aborts_in_a_row: int) -> float:
    """The wait before replaying the ``aborts_in_a_row``-th epoch in a row a sink refused.

    0.5 s, doubled each time, at most 10 s (``SINK_OUTAGE_BACKOFF_S``); defined for any
    count (the exponent is capped: ``2.0 ** 1024`` is no float).
    """
    first, cap = SINK_OUTAGE_BACKOFF_S
    return float(min(cap, first * 2 ** min(max(aborts_in_a_row, 1) - 1, 16)))


#: Offset commit refusals that mean "this member's generation is over" (at-least-once).
_STALE_MEMBER = frozenset({KafkaError.ILLEGAL_GENERATION, KafkaError.UNKNOWN_MEMBER_ID})


def offset_metadata(metadata: str | None) -> dict[str, Any]:
    """The object an epoch writes as its committed offsets' metadata.

    ``{"ckpt": <checkpoint>, "origin": <savepoint origin>, "txn": <epoch token>}``
    (:meth:`EpochCommitter._commit_positions`); ``{}`` when there is none or it is not
    ours (offsets of older versions, or reset by hand).
    """
    if not metadata:
        return {}
    try:
        data = orjson.loads(metadata)
    except orjson.JSONDecodeError:
        return {}
    return data if isinstance(data, dict) else {}


class EpochCommitter:
    """Commits and aborts epochs: the epoch sequence (see the module docstring).

    Made when the runner is; :meth:`open_producer` makes the producer at start-up.
    Called by one thread at a time: the loop's, or the consumer's ``close()`` (its final
    revoke, through the assignment's callbacks).

    Args:
        settings: the instance's settings (interval, timeouts, failure policy, cache).
        name: the name the app runs under (transactional id, changelog topics).
        eos: exactly-once (a transactional producer) or at-least-once.
        metrics: the instance's metrics (commits, aborts, records, blocked calls).
        inputs: the co-partitioned input topics.
        handles: the app's state handles (swept for expired TTL entries).
        kgs: the owned key groups (read only; one dict for the runner's life).
        halted: the halted key groups (read only; ``KeyGroupCheckpoints.halted``).
        positions: the owned input partitions' offsets and alignment (committed, rewound).
        marks: per key group: checkpoint, origin, halt, seeding (committed, rewound).
        open_epoch: the open epoch (flags, checkpoint id, released records, what was
            consumed and fetched, the deadline and the slow record).
        out: the output writer (the current producer, the epoch's tallies and errors).
        sinks: the sinks (the ``# sink hook`` calls).
        checkpoints: the checkpoint writer (registration, barriers, checkpoint records).
        sp_files: the savepoint files (a source key group's export).
        sp_requests: the savepoint requests (the one in progress).
        savepoints: the savepoint participant (told when an epoch with a savepoint
            committed).
        gauges: the progress gauges (at a commit, at an idle epoch).
        global_tables: the global tables (their snapshot goes into checkpoint records).
        interleaver: the interleaver of several inputs (``None``: one input).
        state_cleaner: removes released key groups' directories (``None``: in memory).
        poison: the records the replay dead-letters (a slow record is added, committed
            ones dropped).
        timer_guard: the timer guard (``None``: no timers), told of each commit.
        call: the runner's bounded blocking call (shown on /livez, given up on a stop).
        seek: makes an offset the next record fetched from an owned input partition.
        consumer: the runner's current consumer (replaced when it rejoins).
        admin: the admin client (``None`` before start-up made it).
        restorer: the restorer (``None`` before start-up made it; its state snapshots).
        sp_rules: what the run's end asks of savepoints (``EverySavepoint``, replaced by
            a bounded run's ``BoundedEnd`` at start-up).
        stop_requested: whether a stop was requested (no barrier-only epochs, no wait).
        finishing: whether the final commit after a stop request runs.
        callback_failed: whether a rebalance callback failed (nothing commits until the
            loop raised it).

    Owns (written only here): the producer and the transactional producer (``txn``,
    ``producer``: replaced on a timeout, a hung call or an unknown commit, so read them
    each time), whether the app registered, the open epoch's token, whether it is
    barrier-only, whether the coordinator aborted it on its timeout, the aborts in a row
    (replays and sink outages), the records of the last committed epoch, and whether no
    more commit may be made (set when a committed epoch's changelog offsets cannot be
    read while stopping, or by the runner's close after a failure:
    :meth:`never_commit_again`).
    """

    def __init__(
        self,
        settings: Settings,
        name: str,
        eos: bool,
        metrics: Metrics,
        inputs: tuple[str, ...],
        handles: dict[str, StateHandle],
        kgs: dict[int, KeyGroup],
        halted: Mapping[int, str],
        positions: InputPositions,
        marks: KeyGroupCheckpoints,
        open_epoch: OpenEpoch,
        out: OutputWriter,
        sinks: Sinks,
        checkpoints: CheckpointWriter,
        sp_files: SavepointFiles,
        sp_requests: SavepointRequests,
        savepoints: SavepointParticipant,
        gauges: ProgressGauges,
        global_tables: GlobalTables,
        interleaver: Interleaver | None,
        state_cleaner: StateCleaner | None,
        poison: ReplayPoison[tuple[str, int, int]],
        timer_guard: TimerGuard | None,
        *,
        call: Callable[..., Any],
        seek: Callable[[str, int, int], None],
        consumer: Callable[[], Any],
        admin: Callable[[], Admin | None],
        restorer: Callable[[], Restorer | None],
        sp_rules: Callable[[], SavepointRules],
        stop_requested: Callable[[], bool],
        finishing: Callable[[], bool],
        callback_failed: Callable[[], bool],
    ) -> None:
        self._settings = settings
        self._name = name
        self._eos = eos
        self._metrics = metrics
        self._inputs = inputs
        self._handles = handles
        self._ttl_stores = any(h.spec.ttl_ms for h in handles.values())
        self._kgs = kgs
        self._halted = halted
        self._positions = positions
        self._marks = marks
        self._open = open_epoch
        self._out = out
        self._sinks = sinks
        self._checkpoints = checkpoints
        self._sp_files = sp_files
        self._sp_requests = sp_requests
        self._savepoints = savepoints
        self._gauges = gauges
        self._globals = global_tables
        self._interleaver = interleaver
        self._state_cleaner = state_cleaner
        self._poison = poison
        self._timer_guard = timer_guard
        self._call = call
        self._seek = seek
        self._consumer = consumer
        self._admin = admin
        self._restorer = restorer
        self._sp_rules = sp_rules
        self._stop_requested = stop_requested
        self._finishing = finishing
        self._callback_failed = callback_failed
        self._txn_timeout_s = settings.transaction_timeout_ms / 1000
        #: Processing stops at this time within an epoch (half the transaction timeout).
        self.budget_s = settings.transaction_timeout_ms / 2000
        self._open.deadline = time.monotonic() + self.budget_s
        self._producer: Any = None
        #: The transactional producer (exactly-once only; ``_producer`` is its current one).
        self._txn: TransactionalProducer | None = None
        self._registered = False
        #: The epoch being committed has nothing but barriers (an idle writer's epoch).
        self._barrier_only = False
        self._consecutive_aborts = 0
        #: Epochs aborted in a row because a sink could not take them (backed off).
        self._sink_outage_aborts = 0
        #: Names the open epoch's offset commit (in the offsets' metadata).
        self._epoch_token = ""
        self._timed_out = False  # the coordinator aborted the open transaction
        self._stop_committing = False
        self._last_epoch_records = 0

    @property
    def txn(self) -> TransactionalProducer | None:
        """The transactional producer (``None``: at-least-once, or before start-up)."""
        return self._txn

    @property
    def producer(self) -> Any:
        """The current producer (replaced with the transactional one's; read each time)."""
        return self._producer

    def never_commit_again(self) -> None:
        """No later epoch commits (closing after a failure: nothing begins either)."""
        self._stop_committing = True

    def reset_deadline(self) -> None:
        """Restart the open epoch's budget (and forget its slow record)."""
        self._open.deadline = time.monotonic() + self.budget_s
        self._open.slow = None

    # -- the producer ---------------------------------------------------------------------

    def open_producer(self) -> None:
        """Create the producer; under exactly-once, fence older incarnations and begin.

        Called once, at start-up (before the consumer subscribes).

        Raises:
            AuthorizationError: the principal may not use the transactional id.
            FatalKafkaError: the transactional producer could not start.
            Stopping: a stop was requested while it initialised.
        """
        s = self._settings
        tid = f"{self._name}-{s.instance_id}" if self._eos else None
        pconf = producer_config(s, self._name, tid)
        # Python callbacks for failures only (a callback per record costs ~10%).
        pconf["delivery.report.only.error"] = True
        pconf["on_delivery"] = self._out.on_delivery
        if not self._eos:
            self._producer = Producer(pconf)
            self._out.use(self._producer)
            return
        self._txn = TransactionalProducer(
            pconf,
            timeout_s=self._txn_timeout_s,
            should_stop=lambda: self._stop_requested() and not self._finishing(),
            beat=self._metrics.beat,
            blocked=self._metrics.blocked,
        )
        # Fences an older incarnation with the same id and ends its open transaction;
        # resumed until it completes (SIGTERM ends the wait: Stopping).
        try:
            self._txn.start()
        except FatalKafkaError as exc:
            if cause_code(exc) != KafkaError.TRANSACTIONAL_ID_AUTHORIZATION_FAILED:
                raise
            user = pconf.get("sasl.username")
            raise authorization_error(
                str(user) if user is not None else None,
                "WRITE",
                "TRANSACTIONAL_ID",
                str(tid),
                "TRANSACTIONAL_ID_AUTHORIZATION_FAILED",
            ) from None
        self._use_txn_producer()
        self._begin()

    def _use_txn_producer(self) -> None:
        """Produce through the transactional component's current producer."""
        assert self._txn is not None
        self._producer = self._txn.producer
        self._out.use(self._producer)

    def _begin(self) -> None:
        assert self._txn is not None
        self._txn.begin()

    def _timed_out_fence(self, exc: BaseException) -> bool:
        """Whether ``exc`` is the coordinator aborting our own transaction on its timeout.

        True when librdkafka reports a fence (``_FENCED``) and the open transaction is
        older than the transaction timeout (its age is measured from the last commit,
        abort, idle epoch or restore: never shorter than the coordinator's). Any other
        fence is another live instance with our transactional id: never re-initialise
        then, or the two would fence each other back and forth.
        """
        return self._txn is not None and self._txn.timed_out_fence(exc)

    # -- commit ---------------------------------------------------------------------------

    def _owned_partitions(self) -> list[tuple[str, int]]:
        return [(t, g) for g in self._kgs for t in self._inputs]

    def end_epoch(self) -> None:
        """Commit the open epoch if anything happened since the last one; sweep state.

        Then released key groups' directories that are due are removed.

        Raises:
            AbortEpoch: the transaction must be aborted (the caller aborts and replays).
            FatalKafkaError: fenced, or a record can never be delivered.
            Stopping: a stop was requested while a commit call was retrying.
        """
        self._open.commit_now = False
        if self._epoch_to_commit():
            self._commit_epoch()
        if self._state_cleaner is not None:
            self._state_cleaner.sweep(self._kgs)

    def _commit_epoch(self) -> None:
        """Commit the open epoch: the steps of the epoch protocol (docs/architecture.md).

        1. changelogs, 2. barriers and checkpoint records, 3. offsets
        (``send_offsets_to_transaction``), 4. the commit; then the epoch's state to
        RocksDB and the next transaction. A commit without an answer is settled from the
        group's committed offsets, never taken as aborted.

        Raises:
            AbortEpoch: the transaction must be aborted (the caller aborts and replays).
            FatalKafkaError: fenced, or a record can never be delivered.
            Stopping: a stop was requested while a commit call was retrying.
        """
        started = time.monotonic()
        ckpt, savepoint = self._source_checkpoint_id()
        offsets, snaps = self._commit_positions(ckpt)  # step 3's offsets, with this epoch's token
        try:
            writes = self._produce_changelogs()  # 1.
            if not self._registered:
                self._checkpoints.register()
            manifests = self._write_barriers_and_checkpoints(  # 2.
                ckpt, savepoint, offsets, snaps, writes
            )
            # sink hook: each sink prepares the epoch's rows (two-phase commit), bounded by
            # the transaction's time; SinkUnavailable is an AbortEpoch.
            self._sinks.prepare(
                self._epoch_token,
                list(self._kgs),
                None if self._txn is None else self._txn.began_at,
            )
            self._commit(offsets, exported=bool(manifests))  # 3. and 4.
        except CommitOutcomeUnknown as exc:
            self._settle_or_abort(offsets, exc)  # returns only when the epoch committed
        except CallHung as exc:
            # Nothing of this epoch committed (send_offsets hung, commit never sent): the
            # new producer's init_transactions aborted the old transaction.
            self._use_txn_producer()
            self._out.delivery_error = None
            raise AbortEpoch(str(exc)) from None
        except FatalKafkaError as exc:
            if not self._timed_out_fence(exc):
                raise
            # The coordinator aborted the transaction on its timeout (a slow record, or a
            # broker that was away longer than the timeout) and bumped the producer epoch:
            # a new producer with the same transactional id takes over.
            self._replace_producer(f"the transaction outlived its timeout ({exc})", True)
            raise AbortEpoch(f"the transaction outlived its timeout ({exc})") from None
        except AbortEpoch:
            self._producer.poll(0)  # serve delivery reports that explain the abort
            self._out.raise_if_undeliverable()
            raise
        self._sinks.commit()  # sink hook: committed in Kafka, so the prepared rows commit
        self._epoch_committed(ckpt, savepoint, offsets, snaps, writes, manifests)
        self._observe_commit(ckpt, time.monotonic() - started)

    def _epoch_to_commit(self) -> bool:
        """Whether the open epoch has anything to commit (and may commit at all).

        Sweeps expired TTL entries first (their tombstones are something to commit).
        An idle epoch restarts the epoch budget and the transaction's clock.

        Raises:
            CodecUnavailable: an emit of this epoch failed for want of a service.
        """
        if self._stop_committing or self._callback_failed():
            return False
        if self._out.codec_error is not None:
            # An emit failed for want of a service (user code swallowed it): this epoch
            # misses that output, so it must not commit. Stop; the record is read again.
            raise self._out.codec_error
        if self._ttl_stores:
            # Expired entries nobody reads again: bounded tombstones per epoch (before the
            # idle check, so an idle app is cleaned up too).
            now_ms = int(time.time() * 1000)
            for kg in self._kgs.values():
                sweep_key_group(kg.caches, self._handles, now_ms, DEFAULT_SWEEP_BUDGET)
        if (
            self._open.uncommitted == 0
            and not self._open.active
            and self._out.records == 0
            and self._out.dead_letters == 0
            and (self._sp_requests.current is None or not self._kgs)
            and not any(c.dirty for kg in self._kgs.values() for c in kg.caches.values())
        ):
            if self._writes_barriers():
                self._barrier_only = True
                return True
            self.reset_deadline()  # nothing open: the next epoch starts now
            self._metrics.last_checkpoint_time = time.time()  # everything processed committed
            self._gauges.watermark()
            if self._txn is not None:
                self._txn.idle()
            self._open.fetched_bytes = 0  # fetched but never processed (stale, revoked, EOF texts)
            self._sinks.tidy(list(self._kgs))  # sink hook: pending commits and settles
            return False
        self._barrier_only = False
        return True

    def _writes_barriers(self) -> bool:
        """Whether this instance ends epochs even when idle: it writes barriers downstream.

        A source key group with internal outputs ends a (barrier-only) epoch every
        interval, input or not. Downstream checkpoints complete at the minimum over every
        writer's last barrier: a writer that stopped writing them would hold back every
        completion, and with them the watermarks of the active writers and every aligned
        savepoint. Not once a stop was requested (the stop budget is for real work).
        """
        return (
            not self._stop_requested()
            and bool(self._out.internal_outputs)
            and any(self.live_source(g) for g in self._kgs)
        )

    def _settle_or_abort(self, offsets: list[TopicPartition], exc: CommitOutcomeUnknown) -> None:
        """A commit got no definite answer: return if it committed, else abort the epoch.

        Never processes the epoch again on the missing answer alone
        (:meth:`_settle_unknown_commit` learns the outcome from the broker).

        Raises:
            AbortEpoch: it did not commit (the caller aborts and replays).
        """
        timed_out = exc.__cause__ is not None and self._timed_out_fence(exc.__cause__)
        undelivered = self._out.delivery_error  # the settle's new producer forgets it
        if not self._settle_unknown_commit(offsets, str(exc)):
            # A record that failed for a permanent reason (e.g. no write permission) made
            # the commit fail: replaying would fail the same way.
            self._out.delivery_error = undelivered
            self._out.raise_if_undeliverable()
            # The coordinator had aborted it on its timeout: a slow record, if any, caused
            # it (dead-lettered on the replay).
            self._timed_out = timed_out
            raise AbortEpoch(f"{exc}: the transaction did not commit") from None

    def _epoch_committed(
        self,
        ckpt: int,
        savepoint: dict[str, Any] | None,
        offsets: list[TopicPartition],
        snaps: dict[tuple[str, int], Snapshot],
        writes: dict[int, dict[str, dict[bytes, bytes | None]]],
        manifests: dict[int, dict[str, Any]],
    ) -> None:
        """After the commit: the state to RocksDB, the bookkeeping, the next transaction."""
        self._consecutive_aborts = 0
        self._sink_outage_aborts = 0
        self._open.check_writes = False
        self._apply_locally(ckpt, writes)
        self._positions.mark_committed(
            (((tp.topic, tp.partition), tp.offset) for tp in offsets), snaps
        )
        self._registered = True
        self._open.active = False
        self._barrier_only = False
        for g in self._kgs:
            if self.live_source(g):
                self._marks.completed(g, ckpt)
        if savepoint is not None:
            self._savepoints.committed(savepoint, manifests)
            self._sp_rules().committed(savepoint, manifests)
        self._marks.commit(list(self._kgs))
        if self._timer_guard is not None:
            self._timer_guard.committed()  # dead-lettered timers are deleted in this commit
        if self._poison.entries:  # dead-lettered records behind the committed positions are done
            committed = self._positions.committed
            self._poison.keep(
                {k: v for k, v in self._poison.entries.items() if k[2] >= committed.get(k[:2], 0)}
            )
        self._open.checkpoint = ckpt
        self._last_epoch_records = self._open.uncommitted
        m = self._metrics
        m.records_in += self._open.uncommitted
        m.records_out += self._out.records
        m.dlq_records += self._out.dead_letters
        self._open.uncommitted = 0
        self._out.epoch_done()
        self._open.fetched_bytes = 0
        if self._eos:
            self._begin()
        self.reset_deadline()

    def _observe_commit(self, ckpt: int, took: float) -> None:
        """Metrics and the debug log of a committed epoch."""
        if log.isEnabledFor(logging.DEBUG):
            log.debug(
                "epoch committed",
                extra={"checkpoint": ckpt, "records": self._last_epoch_records, "seconds": took},
            )
        m = self._metrics
        m.epochs_committed += 1
        m.last_checkpoint_id = ckpt
        m.last_checkpoint_time = time.time()
        m.observe_commit(took)
        nxt = self._positions.next
        self._gauges.at_commit(
            [TopicPartition(t, g, nxt[(t, g)]) for t, g in self._owned_partitions()]
        )

    def _produce_changelogs(self) -> dict[int, dict[str, dict[bytes, bytes | None]]]:
        """Produce every dirty key's final value; return the writes per key group."""
        writes: dict[int, dict[str, dict[bytes, bytes | None]]] = {}
        for g, kg in self._kgs.items():
            per_store: dict[str, dict[bytes, bytes | None]] = {}
            for name, cache in kg.caches.items():
                try:
                    changes = cache.drain()
                except Exception as exc:  # noqa: BLE001 - the store's codec may raise anything
                    if self._open.check_writes:
                        # Already checked record by record: not attributable to one record.
                        raise FatalKafkaError(
                            f"state store {name!r}, key group {g}: a value cannot be encoded "
                            f"with its codec ({type(exc).__name__}: {exc})"
                        ) from exc
                    # Find the record that wrote it: replay the epoch checking each
                    # record's state writes (the culprit is dead-lettered).
                    self._open.check_writes = True
                    raise AbortEpoch(
                        f"state store {name!r}, key group {g}: a value cannot be encoded "
                        f"({type(exc).__name__}: {exc}); replaying to find the record"
                    ) from exc
                if not changes:
                    continue
                per_store[name] = changes
                topic = changelog_topic(self._name, name)
                produce = self._producer.produce
                for key, value in changes.items():
                    try:  # the common case without a Python frame per key
                        produce(topic, value, key, partition=g)
                    except (BufferError, KafkaException):
                        self._out.produce(topic, value, key, partition=g)  # waits or raises
            if per_store:
                writes[g] = per_store
        return writes

    def _commit(self, offsets: list[TopicPartition], exported: bool = False) -> None:
        """Commit the epoch: its transaction, or (at-least-once) a flush and the offsets.

        Args:
            offsets: The input positions to commit.
            exported: The epoch carries savepoint manifests (test crash point
                ``after_export``, processors/_kafka/faults.py).

        Raises:
            AbortEpoch: At-least-once: a record was not delivered, or the group moved on.
        """
        producer = self._producer
        if self._txn is not None:
            crash_point("before_send_offsets")
            self._txn.send_offsets(offsets, self._consumer().consumer_group_metadata())
            crash_point("before_commit")
            if exported:
                crash_point("after_export")
            self._txn.commit(final=self._finishing())
            return
        with self._metrics.blocked("flush", self._txn_timeout_s):
            remaining = producer.flush(self._txn_timeout_s)
        # At-least-once: any failed delivery (transient ones too) means the offsets must
        # not be committed past it.
        err = self._out.delivery_error
        self._out.raise_if_undeliverable()
        if err is not None:
            raise AbortEpoch(f"a delivery failed: {err.name()}: {err.str()}")
        if remaining:
            raise AbortEpoch(f"{remaining} records not delivered within the transaction timeout")
        if exported:
            # The manifests are delivered (visible: nothing is transactional here), the
            # offsets are not committed.
            crash_point("after_export")
        if offsets:
            try:
                self._call(self._consumer().commit, None, offsets, False, what="commit offsets")
            except FatalKafkaError as exc:
                if cause_code(exc) not in _STALE_MEMBER:
                    raise
                # The group moved on (a rebalance while this epoch ran): the offsets are
                # not committed, so the epoch's records are processed again (at-least-once).
                raise AbortEpoch(f"offsets not committed: {exc}") from exc

    def _apply_locally(
        self, ckpt: int, writes: dict[int, dict[str, dict[bytes, bytes | None]]]
    ) -> None:
        """Write a committed epoch's changes to the local databases."""
        # Success reports are off, so the next changelog offsets come from the broker: only
        # the owner of key group g writes changelog partition g, and all of it is acked.
        admin = self._admin()
        assert admin is not None
        touched = [
            TopicPartition(changelog_topic(self._name, name), g)
            for g, per_store in writes.items()
            for name in per_store
        ]
        stop_by = self._txn.stop_by if self._txn is not None else None
        within = 60.0 if stop_by is None else max(1.0, stop_by - time.monotonic())
        try:
            changelog_next = admin.end_offsets(touched, within_s=within)
        except FatalKafkaError:
            if stop_by is None:
                raise
            # Stopping, within the stop budget: exact without it (the committed changes
            # are in the changelog; the next start restores them from the offsets that
            # the local databases name, as after a crash right after the commit).
            log.warning(
                "stopping: the committed epoch's changelog offsets cannot be read in time; "
                "its state reaches the local databases at the next start (from the changelog)"
            )
            # No later epoch may commit from this instance: its local write would name
            # changelog offsets past this epoch's changes, which the next start would then
            # never restore.
            self._stop_committing = True
            return
        # Committed: now (and only now) the changes may reach the local databases.
        crash_point("after_commit")
        ckpt_bytes = str(ckpt).encode()
        now_bytes = str(int(time.time() * 1000)).encode()
        for g, per_store in writes.items():
            meta_entries = {META_CHECKPOINT: ckpt_bytes, META_UPDATED_MS: now_bytes}
            for name in per_store:
                nxt = changelog_next.get((changelog_topic(self._name, name), g))
                if nxt is not None:
                    meta_entries[META_CHANGELOG_PREFIX + name.encode()] = str(nxt).encode()
            self._kgs[g].db.apply(per_store, meta_entries)
        # snapshot hook (processors/_task/snapshots.py): the databases hold this commit now
        restorer = self._restorer()
        if restorer is not None and restorer.snapshots is not None:
            restorer.snapshots.after_commit(self._kgs, writes)
        for kg in self._kgs.values():  # read-only key groups grow their caches too
            for cache in kg.caches.values():
                cache.trim(self._settings.state_cache_entries)

    def _is_downstream(self, g: int) -> bool:
        """Whether key group ``g`` reads upstream lockgate writers.

        Its checkpoints then come from their barriers; otherwise it is a source.
        """
        return self._positions.is_downstream(g)

    def live_source(self, g: int) -> bool:
        """Whether key group ``g`` is a source that is not halted (it ends epochs itself)."""
        return g not in self._halted and not self._is_downstream(g)

    def _source_checkpoint_id(self) -> tuple[int, dict[str, Any] | None]:
        """Return the id a source key group's epoch ends with, and the savepoint it takes.

        Ids are milliseconds rounded down to the interval and strictly increasing
        (``max(last + 1, now)``), so independent sources agree without a coordinator
        and apps with different intervals still compare. A savepoint request names the
        id to jump to (ahead of every clock); an instance already past it ends the
        epoch at its next id instead (the savepoint's barriers then carry that id: a
        downstream completes on barriers >= the savepoint's, see ``_alignment``).
        """
        interval = self._settings.checkpoint_interval_ms
        now_ms = int(time.time() * 1000)
        ckpt = max(self._open.checkpoint + 1, now_ms // interval * interval)
        request = self._sp_requests.current_unexpired(now_ms)
        if request is None or not any(self.live_source(g) for g in self._kgs):
            return ckpt, None
        seeding = [g for g in self._kgs if self._marks.seeding(g)]
        if seeding:
            # Half-restored state with pre-restore offsets: the request waits until every
            # restore of this instance is done (or it expires).
            if not request.get("waiting"):
                request["waiting"] = True
                log.info(
                    "savepoint request waits for a restore from a savepoint to finish",
                    extra={"savepoint": request["savepoint"], "key_groups": seeding},
                )
            return ckpt, None
        if self._sp_rules().defers(request):
            # A bounded run's final savepoint: taken once the bound is reached (and
            # drained), by every owned key group in the same epoch.
            return ckpt, None
        # A key group already past the savepoint (a previous owner took it) is skipped
        # by _write_barriers_and_checkpoints; the others end this epoch at its id.
        return max(self._open.checkpoint + 1, int(request["checkpoint"])), request

    def _commit_positions(
        self, ckpt: int
    ) -> tuple[list[TopicPartition], dict[tuple[str, int], Snapshot]]:
        """The offsets to commit and the alignment snapshots that go with them.

        A source partition commits its next offset. An aligned partition commits the
        first record its aligner still holds (``low``); the snapshot tells a replay
        from there which records were already included (docs/architecture.md).
        """
        offsets = []
        snaps: dict[tuple[str, int], Snapshot] = {}
        # Names this epoch's offset commit: read back, it says whether a commit that got
        # no answer went through (_settle_unknown_commit).
        self._epoch_token = token = secrets.token_hex(8)
        for t, g in self._owned_partitions():
            key = (t, g)
            offset, snap = self._positions.commit_position(key)
            if snap is None:
                done = ckpt
            else:
                snaps[key] = snap
                done = self._marks.done(g, snap.done)
            # The origin travels with the offsets too: under at-least-once the control
            # record is written before the offsets commit, so only this is atomic with them.
            origin = self._marks.origin(g)
            meta = orjson.dumps({"ckpt": done, "origin": origin, "txn": token})
            offsets.append(TopicPartition(t, g, offset, metadata=meta.decode()))
        return offsets, snaps

    def write_barriers(self, g: int, ckpt: int, savepoint: dict[str, Any] | None) -> None:
        """Produce barrier ``ckpt`` of key group ``g`` to each internal output partition."""
        self._checkpoints.write_barriers(g, self._kgs[g], ckpt, savepoint)

    def _write_barriers_and_checkpoints(
        self,
        ckpt: int,
        savepoint: dict[str, Any] | None,
        offsets: list[TopicPartition],
        snaps: dict[tuple[str, int], Snapshot],
        writes: dict[int, dict[str, dict[bytes, bytes | None]]],
    ) -> dict[int, dict[str, Any]]:
        """Write source barriers, savepoint exports and every checkpoint record.

        All in the open transaction. Returns the manifests written, by key group.
        """
        by_group: dict[int, dict[str, int]] = {}
        for tp in offsets:
            by_group.setdefault(tp.partition, {})[tp.topic] = tp.offset
        manifests: dict[int, dict[str, Any]] = {}
        now_ms = int(time.time() * 1000)
        for g in self._kgs:
            source = not self._is_downstream(g)
            live_source = source and g not in self._halted
            if live_source:
                saving = savepoint
                if saving is not None and self._sp_rules().taken(g, saving):
                    saving = None  # a previous owner took this savepoint already
                elif saving is not None and self._marks.restored_since(
                    g, int(saving.get("requested_ms") or 0)
                ):
                    # Aimed at the state this restore replaced: a failed manifest makes
                    # the trigger fail at once (and cancel its halts) instead of waiting.
                    log.warning(
                        "ignoring a savepoint request issued before this key group's restore",
                        extra={"savepoint": saving["savepoint"], "key_group": g},
                    )
                    saving = {
                        **saving,
                        "error": f"key group {g} was restored from a savepoint after this "
                        "savepoint was requested: trigger it again",
                    }
                if saving is not None:
                    manifests[g] = self._sp_files.export(
                        g, self._kgs[g], saving, ckpt, by_group.get(g, {}), {}, writes.get(g, {})
                    )
                    if manifests[g]["error"] is not None:
                        saving = None  # downstream takes it (and stops) only where we did
                self.write_barriers(g, ckpt, saving)
            elif not source and g not in self._halted:
                self._checkpoints.reannounce(g, self._kgs[g], self._marks.done(g))
            align = {t: snap.to_json() for (t, kg), snap in snaps.items() if kg == g}
            halted = self._halted.get(g)
            made = manifests.get(g)
            if made is not None and made["error"] is None and made["stop"]:
                halted = made["savepoint"]  # halts once this transaction commits
            record = {
                "checkpoint": ckpt if live_source else self._marks.done(g),
                "aligned": True if source else self._marks.aligned(g),
                "offsets": by_group.get(g, {}),
                "align": align,
                "origin": self._marks.origin(g),
                "seeding": self._marks.seeding(g),
                "halted": halted,
                "ts": now_ms,
            }
            if self._globals:
                record["globals"] = self._globals.snapshot()
            bounded = self._sp_rules().bounded(g)
            if bounded is not None:
                record["bounded"] = bounded  # reached its end in a bounded run
            self._checkpoints.write_checkpoint(g, record)
        return manifests

    # -- slow records -----------------------------------------------------------------

    def _replace_producer(self, why: str, timed_out: bool = False) -> None:
        """Replace a producer that cannot go on (epoch bumped, stuck state or hung call).

        The new producer's ``init_transactions`` (same transactional id) fences the old
        one and ends its open transaction (committed if its commit reached the
        coordinator, else aborted).
        """
        assert self._txn is not None
        self._txn.replace(why)
        self._use_txn_producer()
        self._out.delivery_error = None  # reports of the old producer's aborted records
        self._timed_out = timed_out  # then the slow record, if any, caused it

    def _settle_unknown_commit(self, offsets: list[TopicPartition], why: str) -> bool:
        """Learn whether a commit that got no definite answer committed.

        The producer is replaced first: the new one's ``init_transactions`` completes a
        commit that reached the coordinator and aborts any other, so the group's
        committed offsets are final after it. They are read ``read_committed`` (KIP-447
        stable offsets: the broker answers only once no transaction holds offsets of
        these partitions); each epoch's offset commit carries its token in the metadata.

        Returns:
            True when the epoch committed (it goes on as committed: its state reaches the
            local databases, nothing is processed again), False when it did not (the
            caller aborts and replays it).

        Raises:
            FatalKafkaError: the outcome cannot be learned (the restart restores the
                local state from what committed: exact either way).
            Stopping: a stop was requested while the new producer initialised.
        """
        log.warning(
            "the commit got no answer in time: learning its outcome from the broker",
            extra={"error": why},
        )
        self._metrics.commits_unknown += 1
        self._replace_producer(f"the commit's outcome is unknown ({why})")
        if not offsets:
            raise FatalKafkaError(
                f"the outcome of a commit without offsets is unknown ({why}); restarting "
                "(the restart restores what committed)"
            )
        query = [TopicPartition(tp.topic, tp.partition) for tp in offsets]
        wait_s = self._txn_timeout_s
        stop_by = self._txn.stop_by if self._txn is not None else None
        if stop_by is not None:  # stopping: within the stop budget's share
            wait_s = max(1.0, min(wait_s, stop_by - time.monotonic()))
        try:
            committed = self._call(
                self._consumer().committed,
                query,
                wait_s,
                what="committed offsets",
                timeout_s=wait_s,
            )
        except AbortEpoch as exc:
            raise FatalKafkaError(
                f"the outcome of a commit is unknown ({why}) and the committed offsets "
                f"cannot be read ({exc}); restarting (the restart restores what committed)"
            ) from exc
        failed = [tp for tp in committed if tp.error is not None]
        if failed:
            raise FatalKafkaError(
                f"the outcome of a commit is unknown ({why}) and the committed offsets of "
                f"{len(failed)} partition(s) cannot be read ({failed[0].error}); restarting "
                "(the restart restores what committed)"
            )
        token = self._epoch_token
        ours = [tp for tp in committed if offset_metadata(tp.metadata).get("txn") == token]
        if ours and len(ours) != len(committed):
            raise FatalKafkaError(
                f"the commit without an answer shows in {len(ours)} of {len(committed)} "
                "partitions' committed offsets (a transaction commits all or none); "
                "restarting (the restart restores what committed)"
            )
        if ours:
            log.warning(
                "the commit without an answer had committed: going on from it (nothing is "
                "processed again)",
                extra={"partitions": len(ours)},
            )
            self._metrics.commits_rolled_forward += 1
            return True
        log.warning("the commit without an answer did not commit: the epoch is replayed")
        return False

    def _poison_slow_record(self) -> None:
        """A record alone outlived the epoch budget and the epoch failed: apply the policy.

        The record is dead-lettered on the replay (``on_error=dlq``) with a
        :class:`SlowRecordError`, so the replay cannot time out on it again.

        Raises:
            UserCodeError: ``LOCKGATE_ON_ERROR=fail`` (the app stops naming the record).
        """
        assert self._open.slow is not None
        msg, seconds = self._open.slow
        self._open.slow = None
        text = (
            f"record {where(msg)} kept user code busy for {seconds:.1f}s, more than the "
            f"epoch budget of {self.budget_s:.1f}s (half of "
            f"LOCKGATE_TRANSACTION_TIMEOUT_MS={self._settings.transaction_timeout_ms})"
        )
        slow = SlowRecordError(f"{text}; raise the timeout or make the handler faster")
        stop = stop_error(self._settings.on_error, f"record {where(msg)}", slow, "process")
        if stop is not None:
            raise stop
        log.error("%s: dead-lettering it on the replay", text)
        self._poison.mark(
            (msg.topic(), msg.partition(), msg.offset()), SlowRecordError(text), "process"
        )

    # -- abort ----------------------------------------------------------------------------

    def abort_epoch(self, reason: str, *, sink_outage: bool = False, back_off: bool = True) -> None:
        """Abort the open epoch: drop uncommitted state, rewind inputs, begin again.

        Args:
            reason: why, for the log.
            sink_outage: a sink could not take the epoch (its database or store is down or
                too slow: ``SinkUnavailable``). Not counted as a replay loop: the instance
                stays up and waits before the replay, 0.5 s doubled after each such abort
                in a row up to 10 s (``SINK_OUTAGE_BACKOFF_S``), until a commit succeeds.
            back_off: with ``sink_outage``, wait here (``False`` in a rebalance callback:
                the group would wait for it).

        Raises:
            FatalKafkaError: too many aborts in a row without a commit (a replay loop),
                or another live instance fenced this one. An abort that cannot complete
                (timeout, stuck state, hung call) replaces the producer instead.
        """
        log.warning("aborting epoch", extra={"reason": reason})
        self._checkpoints.forget()  # what the aborted barriers said never reached anyone
        if sink_outage:
            self._sink_outage_aborts += 1
        elif not self._barrier_only:
            # A barrier-only epoch that fails (an outage) replays nothing: not a replay loop.
            self._consecutive_aborts += 1
        self._barrier_only = False
        if self._consecutive_aborts > _MAX_CONSECUTIVE_ABORTS and not reason.startswith("user"):
            raise FatalKafkaError(
                f"{self._consecutive_aborts} epochs aborted in a row without a commit "
                f"(last: {reason}); stopping instead of replaying forever"
            )
        self._out.record_error = None
        self._out.producer_error = None
        if self._txn is not None:
            generation = self._txn.generation
            # Aborts on the producer, or replaces it when it cannot (a commit without an
            # answer pending, an abort that does not complete, a state it cannot leave).
            timed_out_fence = self._txn.abort()
            if self._txn.generation != generation:
                self._use_txn_producer()
                self._out.delivery_error = None  # reports of the old producer's aborted records
                self._timed_out = self._timed_out or timed_out_fence
        timed_out, self._timed_out = self._timed_out, False
        if timed_out and self._open.slow is not None:
            self._poison_slow_record()
        # A permanent delivery failure would fail the replay the same way: stop now.
        self._out.raise_if_undeliverable()  # transient ones: the replay produces them again
        for kg in self._kgs.values():
            kg.discard()
        self._sinks.abort()  # sink hook: drop the epoch's rows, roll back what was prepared
        self._rewind(list(self._kgs))
        self._open.uncommitted = 0
        self._out.epoch_done()
        self._open.fetched_bytes = 0
        self._metrics.epochs_aborted += 1
        if sink_outage and back_off:  # before the next transaction begins: its time runs
            self._wait_out_sink_outage(reason)
        if self._eos and not self._stop_committing:  # closing after a failure: nothing begins
            self._begin()
        self.reset_deadline()

    def _wait_out_sink_outage(self, reason: str) -> None:
        """Wait before replaying an epoch a sink could not take (see :meth:`abort_epoch`).

        Waits in short slices: a stop request ends the wait at once, and the loop's
        heartbeat stays fresh (a sink outage is not a stalled loop for /livez).
        """
        wait_s = sink_outage_wait_s(self._sink_outage_aborts)
        log.error(
            "a sink could not take the epoch: waiting before the replay",
            extra={"wait_s": wait_s, "aborts_in_a_row": self._sink_outage_aborts, "reason": reason},
        )
        until = time.monotonic() + wait_s
        while not self._stop_requested() and time.monotonic() < until:
            self._metrics.beat()
            time.sleep(min(0.2, max(0.0, until - time.monotonic())))

    def _rewind(self, groups: list[int]) -> None:
        """Seek the inputs of ``groups`` back to their last committed positions.

        Their alignment, completed checkpoint and halt go back to what the last commit
        made of them (a halt of the aborted epoch is undone: the replay halts again).
        """
        self._open.released.clear()
        self._open.active = False
        for g in groups:
            rewound = self._marks.rewind(g)
            if rewound.halt_undone:
                self._consumer().resume([TopicPartition(t, g) for t in self._inputs])
            # Each aligner from its committed snapshot, next offsets to the committed ones.
            back = self._positions.rewind(g, keep_frozen=rewound.committed_halt is not None)
            self._open.released.extend(back.released)
            if self._interleaver is not None:
                self._interleaver.drop([g])  # fetched again from the committed offsets
            for topic, offset in back.seeks:
                self._seek(topic, g, offset)
