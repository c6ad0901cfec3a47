"""Rebalances: taking key groups over (restore) and handing them back.

:class:`KeyGroupAssignment` serves the consumer's rebalance callbacks
(``subscribe(on_assign=..., on_revoke=..., on_lost=...)``):

* **Assign**: commit what is open (so the restore cannot outlive the transaction),
  read the committed offsets (``read_committed`` waits for pending transactional
  offsets, KIP-447), restore each key group from its local DB and changelog tail, then
  ``incremental_assign`` at the committed offsets. The epoch deadline restarts after
  the restore. The checkpoint id never goes backwards: its floor is the largest of the
  local DB's, this instance's and the committed offsets' metadata.
* **Revoke**: commit (or abort) the open epoch before letting go.
* **Lost**: abort, never commit (another owner may already be writing).
* **State budgets** (hooks into the above): every key group of the process shares one
  RocksDB block cache and write-buffer manager and one read-cache budget
  (``processors._task.keygroups.StateMemory``); a released key group's directory is removed
  after ``state_cleanup_delay_ms`` unless it comes back (``StateCleaner``, swept at
  each epoch end); both are made by the runner.

What the component owns: the steps of an assignment, a revoke and a loss; which key
groups are open (it adds them to, and removes them from, the runner's key-group dict,
which the rest of the runtime reads; the runner clears it when it closes); whether the
stop's explicit group leave is under way (:meth:`KeyGroupAssignment.leave`).

Invariants:

* key group ``g`` is partition ``g`` of every input: only the first input is
  subscribed, the others' partitions are assigned and unassigned with it here;
* state moves only with its key group: a key group is opened (restored) before its
  partitions are fetched, and closed, with its positions, checkpoint state, buffered
  records and replay poison forgotten, when they are revoked or lost;
* nothing is taken over before the open epoch committed, nothing of a lost key group
  is committed, and after a callback failed nothing is taken over (the runner raises
  the failure once ``consume()`` returns; until then nothing commits);
* an exception never leaves a callback (librdkafka would swallow it): it is handed to
  the runner's ``failed``.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any, Protocol

from confluent_kafka import TopicPartition

from processors._checkpoint.alignment import Snapshot
from processors._checkpoint.control_topics import checkpoint_key, latest_records
from processors._checkpoint.input_positions import InputPositions
from processors._checkpoint.keygroup_state import KeyGroupCheckpoints
from processors._checkpoint.txn import TransactionalProducer
from processors._kafka.clients import Admin
from processors._kafka.errors import AbortEpoch, Stopping
from processors._kafka.faults import crash_point
from processors._runtime.checkpoint_writer import CheckpointWriter
from processors._runtime.epoch import offset_metadata
from processors._runtime.health import Metrics
from processors._runtime.open_epoch import OpenEpoch
from processors._sinks import Sinks
from processors._sinks.errors import SinkUnavailable
from processors._task.failures import ReplayPoison
from processors._task.global_tables import GlobalTables
from processors._task.interleave import Interleaver
from processors._task.keygroups import KeyGroup, ReadCacheBudget, Restorer, StateCleaner
from processors.exceptions import ConfigError, FatalKafkaError
from state.base.store import checkpoint_of
from state.primitives import StateHandle

__all__ = ["AbortEpochCall", "BoundedCall", "KeyGroupAssignment"]

log = logging.getLogger("lockgate.runtime")


class AbortEpochCall(Protocol):
    """The epoch abort (``EpochCommitter.abort_epoch``)."""

    def __call__(self, reason: str, *, sink_outage: bool = ..., back_off: bool = ...) -> None:
        """Abort the open epoch, rewind the owned inputs, begin again."""


class BoundedCall(Protocol):
    """The runner's bounded blocking call (``Runner._call``)."""

    def __call__(self, fn: Any, *args: Any, what: str, timeout_s: float | None = None) -> Any:
        """Call ``fn(*args)``, retried while transient, bounded by ``timeout_s``."""


class KeyGroupAssignment:
    """Takes key groups over and hands them back: the consumer's rebalance callbacks.

    Made when the runner is; :meth:`start` gives it what start-up makes (the admin
    client, the key-group count, the restorer, the transactional producer) before the
    consumer subscribes. Called by one thread at a time: the loop's (inside
    ``consume()``, or :meth:`release` after a fence), or the consumer's ``close()`` (its
    final revoke).

    Args:
        inputs: the co-partitioned input topics (the first is the subscribed one).
        handles: the app's state handles (every key group opens these stores).
        kgs: the runner's open key groups by index (one dict for the runner's life:
            this component adds and removes them, everything else reads them).
        positions: the owned input partitions' offsets and alignment.
        marks: per key group: checkpoint, origin, halt, seeding (and the halts, read).
        open_epoch: the open epoch (checkpoint floor, ``active``, released records).
        checkpoints: the checkpoint writer (what barriers announced is forgotten).
        sinks: the sinks (an assigned key group's prepared rows are settled).
        global_tables: the global tables (caught up to what a checkpoint record needs).
        interleaver: the interleaver of several inputs (``None``: one input).
        state_cleaner: removes released key groups' directories (``None``: in memory).
        read_cache: the process's read-cache budget (given to the restorer).
        poison: the records the replay dead-letters (a released key group's are dropped).
        cancelled: the cancelled savepoint ids (read only: a halt at one is lifted).
        control_topic: the app's control topic (checkpoint records).
        metrics: the instance's metrics (assigned, restoring, restore progress, joined).
        wait_s: the transaction timeout: bounds the committed-offsets read (and, plus
            30 s, reads of the control topic and the global tables).
        consumer: the runner's current consumer (replaced when it rejoins).
        control_reader: the runner's group-less ``read_committed`` control-topic reader.
        call: the runner's bounded blocking call (shown on /livez, given up on a stop).
        should_stop: whether a stop was requested (a restore stops between key groups).
        end_epoch: commits the open epoch if anything happened (raises ``AbortEpoch``).
        abort_epoch: aborts the open epoch and rewinds the owned key groups' inputs.
        seed_from_savepoint: seeds a just-opened key group from its savepoint, if due.
        reset_epoch_deadline: restarts the open epoch's budget.
        uncommitted: whether the open epoch consumed or produced anything.
        callback_failed: whether a rebalance callback of this ``consume()`` failed.
        failed: hands a callback's failure to the runner (raised after ``consume()``;
            nothing commits until then).
    """

    def __init__(
        self,
        inputs: tuple[str, ...],
        handles: dict[str, StateHandle],
        kgs: dict[int, KeyGroup],
        positions: InputPositions,
        marks: KeyGroupCheckpoints,
        open_epoch: OpenEpoch,
        checkpoints: CheckpointWriter,
        sinks: Sinks,
        global_tables: GlobalTables,
        interleaver: Interleaver | None,
        state_cleaner: StateCleaner | None,
        read_cache: ReadCacheBudget,
        poison: ReplayPoison[tuple[str, int, int]],
        cancelled: set[str],
        control_topic: str,
        metrics: Metrics,
        wait_s: float,
        *,
        consumer: Callable[[], Any],
        control_reader: Callable[[], Any],
        call: BoundedCall,
        should_stop: Callable[[], bool],
        end_epoch: Callable[[], None],
        abort_epoch: AbortEpochCall,
        seed_from_savepoint: Callable[[int], bool],
        reset_epoch_deadline: Callable[[], None],
        uncommitted: Callable[[], bool],
        callback_failed: Callable[[], bool],
        failed: Callable[[BaseException], None],
    ) -> None:
        self._inputs = inputs
        self._handles = handles
        self._kgs = kgs
        self._positions = positions
        self._marks = marks
        #: The halted key groups (the checkpoint state's own dict; read here).
        self._halted = marks.halted
        self._open = open_epoch
        self._checkpoints = checkpoints
        self._sinks = sinks
        self._globals = global_tables
        self._interleaver = interleaver
        self._state_cleaner = state_cleaner
        self._read_cache = read_cache
        self._poison = poison
        self._cancelled = cancelled
        self._control_topic = control_topic
        self._metrics = metrics
        self._txn_timeout_s = wait_s
        self._consumer = consumer
        self._control_reader = control_reader
        self._call = call
        self._should_stop = should_stop
        self._end_epoch = end_epoch
        self._abort_epoch = abort_epoch
        self._seed_from_savepoint = seed_from_savepoint
        self._reset_epoch_deadline = reset_epoch_deadline
        self._uncommitted = uncommitted
        self._callback_failed = callback_failed
        self._failed_in_callback = failed
        #: The stop's explicit group leave is under way (:meth:`leave`).
        self._leaving = False
        #: Made at start-up (:meth:`start`).
        self._admin: Admin | None = None
        self._partitions = 0
        self._restorer: Restorer | None = None
        self._txn: TransactionalProducer | None = None

    def start(
        self,
        admin: Admin,
        partitions: int,
        restorer: Restorer,
        txn: TransactionalProducer | None,
    ) -> None:
        """Start-up made these; called before the consumer subscribes.

        Args:
            admin: the admin client (partition counts, log start and end offsets).
            partitions: the app's key-group count (the inputs' partitions at start).
            restorer: opens and restores key groups.
            txn: the transactional producer (``None``: at-least-once); its clock
                restarts after a restore.
        """
        self._admin = admin
        self._partitions = partitions
        self._restorer = restorer
        self._txn = txn

    def leave(self) -> None:
        """The stop's explicit group leave is under way: take nothing over from now on.

        A rebalance that was running when the leave's ``unsubscribe()`` came still hands
        out partitions; :meth:`on_assign` assigns them without taking anything over.
        """
        self._leaving = True

    def on_assign(self, consumer: Any, partitions: list[TopicPartition]) -> None:
        """The consumer's ``on_assign``: take the key groups of ``partitions`` over.

        A failure of the takeover goes to ``failed``, never out of the callback
        (librdkafka would swallow it); the loop raises it once ``consume()`` returns.
        After a failure, and during the stop's group leave, the partitions are assigned
        and nothing is taken over.
        """
        if self._callback_failed():
            # An earlier callback of this consume() failed: the loop stops once it
            # returns. Restoring or seeding now could not commit anything.
            consumer.incremental_assign(self._co_partitions(partitions))
            return
        if self._leaving:
            # A rebalance that was running when the leave's unsubscribe() came hands out
            # partitions anyway (librdkafka postpones the unsubscribe): take nothing over,
            # the pending unsubscribe revokes them again, and nothing is committed for them.
            consumer.incremental_assign(self._co_partitions(partitions))
            return
        try:
            self._assign(consumer, partitions)
        except AbortEpoch as exc:
            # The partitions would be fetched without key groups (confluent-kafka assigns
            # them when the callback did not): never carry on silently.
            self._failed_in_callback(FatalKafkaError(f"taking over {partitions}: {exc}"))
        except BaseException as exc:  # noqa: BLE001 - surfaced by the loop after consume()
            self._failed_in_callback(exc)

    def _co_partitions(self, partitions: list[TopicPartition]) -> list[TopicPartition]:
        """The group assigns the first input: key group ``g`` is partition ``g`` of each.

        Only the first input is subscribed, so the group's assignor (cooperative-sticky,
        or the broker's under KIP-848) moves key groups whole, with every input; the other
        inputs' partitions are assigned and unassigned here, in the same callbacks.
        """
        groups = sorted({tp.partition for tp in partitions})
        return [TopicPartition(t, g) for g in groups for t in self._inputs]

    def _assign(self, consumer: Any, partitions: list[TopicPartition]) -> None:
        """Take key groups over: the steps of an assignment (see the module docs).

        Commit what is open, read the committed offsets (stable: KIP-447), open and
        restore each key group, put its offsets and checkpoint records in place, seed
        those restored from a savepoint (committed at once), then fetch from there.
        """
        self._checkpoints.forget()  # re-announce watermarks to whoever reads them now
        if self._state_cleaner is not None:  # first: the epoch end below sweeps
            assigned = {tp.partition for tp in partitions}
            self._state_cleaner.claimed(assigned)
            self._state_cleaner.adopt(assigned | set(self._kgs))
        if self._restorer is not None and self._restorer.read_budget is None:
            self._restorer.read_budget = self._read_cache
        if not partitions:
            consumer.incremental_assign(partitions)
            self._metrics.joined = True
            return
        groups = sorted({tp.partition for tp in partitions})
        partitions = self._check_assignment(partitions, groups)
        log.info("assigned", extra={"key_groups": groups})
        # Commit what is open first, so the restore below cannot outlive the transaction.
        try:
            self._end_epoch()
        except AbortEpoch as exc:
            self._abort_epoch(str(exc))
        committed, origins = self._read_committed(consumer, partitions)
        self._metrics.joined = True  # joined with an assignment: /readyz says "restoring"
        self._open_key_groups(groups)
        self._start_positions(committed)
        # sink hook: prepared rows of these key groups are settled by the epoch token their
        # committed offsets name (that epoch committed; any other did not).
        self._sinks.settle(
            [(tp.partition, offset_metadata(tp.metadata).get("txn")) for tp in committed]
        )
        self._load_key_group_records(groups, origins)
        self._seed_assigned(groups)
        self._start_fetching(consumer, committed, groups)
        self._metrics.assigned = len(self._kgs)
        self._metrics.restoring = 0
        self._metrics.joined = True
        self._reset_epoch_deadline()  # the restore took time the next epoch must not pay
        if self._txn is not None:
            self._txn.idle()

    def _check_assignment(
        self, partitions: list[TopicPartition], groups: list[int]
    ) -> list[TopicPartition]:
        """Return every input's partitions of the assigned key groups; refuse what changed.

        Raises:
            ConfigError: the inputs are no longer co-partitioned, or have more partitions
                than the app's key groups (keys would move between key groups).
        """
        if len(self._inputs) > 1:
            partitions = self._co_partitions(partitions)
            assert self._admin is not None
            counts = self._admin.partitions_of(self._inputs)
            if set(counts.values()) != {self._partitions}:
                raise ConfigError(
                    f"input topics are no longer co-partitioned: {counts} (the app started "
                    f"with {self._partitions} partitions each): key group g must be partition "
                    "g of every input; stop the app and repartition the inputs alike"
                )
        beyond = [g for g in groups if g >= self._partitions]
        if beyond:
            raise ConfigError(
                f"input partitions {beyond} appeared after start: the inputs now have more "
                f"partitions than the app's {self._partitions} key groups. State is "
                "partitioned by key group, so keys would move between groups: stop every "
                "instance, take a savepoint, and rescale (or recreate the inputs with "
                f"{self._partitions} partitions)"
            )
        return partitions

    def _read_committed(
        self, consumer: Any, partitions: list[TopicPartition]
    ) -> tuple[list[TopicPartition], dict[int, str | None]]:
        """The group's committed offsets, and the savepoint each key group descends from.

        ``read_committed``: waits until no transaction holds pending offsets for these
        partitions (KIP-447), so the changelog read next is consistent with them. The
        checkpoint id floor rises to the offsets' metadata.

        Raises:
            FatalKafkaError: an offset could not be read.
        """
        committed: list[TopicPartition] = self._call(
            consumer.committed,
            partitions,
            self._txn_timeout_s,
            what="committed offsets",
            timeout_s=self._txn_timeout_s + 30,
        )
        origins: dict[int, str | None] = {}
        for tp in committed:
            if tp.error is not None:
                raise FatalKafkaError(f"committed offset of {tp.topic}[{tp.partition}]: {tp.error}")
            meta = offset_metadata(tp.metadata)
            ckpt = meta.get("ckpt", 0)
            self._open.reached(ckpt if isinstance(ckpt, int) else 0)
            if "origin" in meta:  # offsets of older versions (or reset by hand) do not say
                origin = meta["origin"]
                origins[tp.partition] = origin if isinstance(origin, str) else None
        return committed, origins

    def _open_key_groups(self, groups: list[int]) -> None:
        """Open (and restore from local state and changelog) the key groups not open yet."""
        self._metrics.restoring = len(groups)
        assert self._restorer is not None
        for g in groups:
            if self._should_stop():
                raise Stopping("stop requested")
            if g not in self._kgs:
                started = time.monotonic()
                kg = self._restorer.open(g, self._handles)
                self._kgs[g] = kg
                self._open.reached(checkpoint_of(kg.db))
                self._metrics.observe_restore(time.monotonic() - started)
            # Not ready until the end of the assignment (alignment records, seeding).
            self._metrics.restoring = max(1, self._metrics.restoring - 1)

    def _start_positions(self, committed: list[TopicPartition]) -> None:
        """Track the committed offsets; nothing committed yet: the log start."""
        unknown = [tp for tp in committed if tp.offset < 0]
        assert self._admin is not None
        log_start = self._admin.start_offsets(unknown) if unknown else {}
        for tp in committed:
            key = (tp.topic, tp.partition)
            # Nothing committed yet: the log start is where "earliest" begins, and an
            # explicit offset lets every commit name every owned partition.
            self._positions.assign(key, tp.offset if tp.offset >= 0 else log_start[key])

    def _seed_assigned(self, groups: list[int]) -> None:
        """Seed the key groups due a savepoint restore and commit that at once.

        The seeded state, offsets and checkpoint records commit before any record of
        these key groups is processed (an abort would otherwise rewind them to their
        pre-savepoint offsets).

        Raises:
            FatalKafkaError: a seeding commit failed (the restart seeds them again).
        """
        try:
            seeded = [g for g in groups if self._seed_from_savepoint(g)]
        except AbortEpoch as exc:
            raise FatalKafkaError(
                f"restoring key groups {groups} from a savepoint: {exc} (the restart seeds "
                "them again)"
            ) from exc
        if seeded:
            try:
                self._end_epoch()
            except AbortEpoch as exc:
                raise FatalKafkaError(
                    f"committing key groups {seeded} seeded from a savepoint: {exc} (the "
                    "restart seeds them again)"
                ) from exc

    def _start_fetching(
        self, consumer: Any, committed: list[TopicPartition], groups: list[int]
    ) -> None:
        """Assign the partitions at their tracked offsets; halted key groups stay paused."""
        # Records of these partitions that this consume() collected before the callback
        # (a revoke or loss of the same partitions just before) predate the new position:
        # they count as rewound, the loop drops them and seeks again (_drop_stale).
        start = [
            TopicPartition(t, g, offset)
            for (t, g), offset in self._positions.start_fetching(
                (tp.topic, tp.partition) for tp in committed
            )
        ]
        if self._interleaver is not None:
            self._interleaver.drop(groups)  # anything buffered for them predates this
        consumer.incremental_assign(start)
        # A pause survives unassign/assign in librdkafka: only halted groups stay paused.
        running = [tp for tp in start if tp.partition not in self._halted]
        if running:
            consumer.resume([TopicPartition(tp.topic, tp.partition) for tp in running])
        halted = [TopicPartition(t, g) for g in groups if g in self._halted for t in self._inputs]
        if halted:
            consumer.pause(halted)
            log.error(
                "key groups halted by a stop-with-savepoint stay paused: nothing of theirs is "
                "processed (/readyz says halted) until the app is started with "
                "--from-savepoint (or LOCKGATE_RESUME_FROM_STOP_SAVEPOINT=true)",
                extra={
                    "key_groups": sorted({tp.partition for tp in halted}),
                    "savepoints": sorted({self._halted[tp.partition] for tp in halted}),
                },
            )

    def _load_key_group_records(self, groups: list[int], origins: dict[int, str | None]) -> None:
        """Read each key group's last committed checkpoint record.

        It gives the completed checkpoint, savepoint origin, halt, and the alignment
        snapshot of each input. ``origins`` are the origins named by the committed
        offsets' metadata: committed atomically with the offsets (also under
        at-least-once, where the control record is written first), they win over the
        record's.

        The record was committed with the offsets just read (same transaction), so
        the snapshot's ``low`` is the committed offset; if not (offsets changed by
        hand, or records of an older version), the offsets win and the alignment
        starts afresh from them.
        """
        assert self._admin is not None
        topic = self._control_topic
        parts = [TopicPartition(topic, g) for g in groups]
        highs = self._admin.end_offsets(parts)
        lows = self._admin.start_offsets(parts)
        for g in groups:
            key = checkpoint_key(g)
            found = latest_records(
                self._control_reader(),
                topic,
                g,
                lows.get((topic, g), 0),
                highs.get((topic, g), 0),
                key,
                timeout_s=self._txn_timeout_s + 30,
                should_stop=self._should_stop,
            )
            record = found.get(key)
            if not isinstance(record, dict):
                record = {}
            done = int(record.get("checkpoint", 0) or 0)
            self._open.reached(done)
            if self._globals:
                self._globals.catch_up(
                    record.get("globals"), self._txn_timeout_s + 30, self._should_stop
                )
            halted_at = str(record["halted"]) if record.get("halted") else None
            if halted_at is not None and halted_at in self._cancelled:
                log.info(
                    "savepoint was cancelled: key group not halted",
                    extra={"key_group": g, "savepoint": halted_at},
                )
                self._open.active = True  # the next commit records it
                halted_at = None
            self._marks.load(
                g,
                done=done,
                aligned=bool(record.get("aligned", True)),
                origin=origins[g] if g in origins else record.get("origin"),
                seeding=str(record["seeding"]) if record.get("seeding") else None,  # redo it
                halted=halted_at,
            )
            snaps: dict[str, Snapshot] = {}
            for t in self._inputs:
                snap_data = (record.get("align") or {}).get(t)
                writers = self._positions.writers.get(t)
                if not snap_data and not writers:
                    continue  # a source partition (no upstream lockgate writers known)
                committed = self._positions.committed[(t, g)]
                snap = Snapshot.from_json(snap_data) if snap_data else None
                if snap is not None and snap.low != committed:
                    log.warning(
                        "alignment snapshot does not match the committed offset; "
                        "starting the alignment afresh there",
                        extra={"partition": f"{t}[{g}]", "low": snap.low, "committed": committed},
                    )
                    snap = None
                if snap is None:
                    snap = Snapshot(committed, committed, done, {}, False)
                snaps[t] = snap
            self._open.released.extend(self._positions.load(g, snaps))

    def on_revoke(self, consumer: Any, partitions: list[TopicPartition]) -> None:
        """The consumer's ``on_revoke``: commit (or abort) the open epoch, then let go.

        Never raises a failure of the epoch's end (it goes to ``failed``); the key
        groups are released and the partitions unassigned either way.
        """
        groups = sorted({tp.partition for tp in partitions})
        log.info("revoked", extra={"key_groups": groups})
        try:
            try:
                self._end_epoch()
            except AbortEpoch as exc:
                self._abort_epoch(
                    str(exc), sink_outage=isinstance(exc, SinkUnavailable), back_off=False
                )
        except BaseException as exc:  # noqa: BLE001 - surfaced by the loop
            self._failed_in_callback(exc)
        finally:
            self.release(groups)
            consumer.incremental_unassign(self._co_partitions(partitions))
        if partitions:
            crash_point("after_revoke")

    def on_lost(self, consumer: Any, partitions: list[TopicPartition]) -> None:
        """The consumer's ``on_lost``: release the key groups, abort, never commit.

        Never raises a failure of the abort (it goes to ``failed``); the partitions are
        unassigned either way.
        """
        groups = sorted({tp.partition for tp in partitions})
        log.warning("partitions lost: aborting the open epoch", extra={"key_groups": groups})
        self.release(groups)  # first: the rewind below must not touch lost partitions
        try:
            if self._uncommitted():
                self._abort_epoch("partitions lost")
        except BaseException as exc:  # noqa: BLE001 - surfaced by the loop
            self._failed_in_callback(exc)
        finally:
            consumer.incremental_unassign(self._co_partitions(partitions))

    def release(self, groups: list[int]) -> None:
        """Hand key groups back: close them and forget everything kept for them.

        Their halted partitions are resumed (a pause would outlive a re-assignment),
        their positions, checkpoint state, buffered records and replay poison dropped,
        and their directories become removable after the cleanup delay. Commits and
        aborts nothing: the caller does (a revoke first, a loss or a fence after).
        """
        halted = [TopicPartition(t, g) for g in groups if g in self._halted for t in self._inputs]
        if halted:
            try:
                self._consumer().resume(halted)  # a pause would outlive a re-assignment
            except Exception as exc:  # noqa: BLE001 - not assigned any more
                log.debug("resume on release failed: %s", exc)
        for g in groups:
            kg = self._kgs.pop(g, None)
            if kg is not None:
                kg.close()
            self._positions.forget(g)  # offsets, alignment, backpressure pauses
            self._marks.forget(g)
        if self._state_cleaner is not None:  # closed above: removable after the delay
            self._state_cleaner.released(groups)
        if self._interleaver is not None:
            self._interleaver.drop(groups)
        gone = set(groups)
        self._poison.keep({k: v for k, v in self._poison.entries.items() if k[1] not in gone})
        self._metrics.assigned = len(self._kgs)

    def restore_progress(self, new_records: int, remaining: int) -> None:
        """The restorer's ``progress``: records read in a batch and records remaining."""
        self._metrics.restore_records += new_records
        self._metrics.restore_remaining = remaining
        self._metrics.beat()
