"""The processing loop of one instance: consume, process, end epochs.

One thread owns the consumer, the operator chain and the producer. The parts:

* this module — ``Runner``: the instance's wiring and shared state (one class, no
  base class), bounded waits (``_call``), life cycle (start, signals, stop) and the
  per-record path;
* the components it owns, each owning its state (docs/architecture.md has the table):
  the epoch sequence (``EpochCommitter``: commits, aborts, rewinds, the producer),
  barriers (``BarrierAlignment``: barriers read downstream), the key-group assignment
  (``KeyGroupAssignment``: rebalances: assign, restore, revoke, lost), output, txn,
  savepoint requests, files and seeding, the savepoint participant
  (``SavepointParticipant``: halts, cancels, a restore's positions), the timer guard,
  gauges, membership, query routing, bounded runs (``BoundedEnd``: the end phase, asked
  once per loop iteration), sinks.

Per record the loop checks the epoch budget (half the transaction timeout): when it
is spent, the rest of the batch is handed back (``seek``) and the epoch commits, so
slow user code never outlives ``transaction.timeout.ms``. A record that alone runs
longer than the budget is remembered; if the epoch then fails, that record is
dead-lettered on the replay (or the app stops naming it, with
``LOCKGATE_ON_ERROR=fail``) instead of timing out again forever.

A record that makes user code raise aborts the epoch; the replay sends that record to
the dead-letter topic instead of calling user code again, so its partial effects never
commit.

Who writes what the loop and the epoch sequence share: the open epoch's records
consumed, bytes fetched, deadline and slow record live in the ``OpenEpoch`` (the loop
adds to them once per batch; the epoch sequence resets them); the runner keeps the
consumer (replaced on a rejoin), the admin client and restorer (made at start-up), the
stop flags and a callback's failure, and hands them to the components as getters.

Where each owned input partition stands (next and committed offsets, alignment) is
:class:`~processors._checkpoint.input_positions.InputPositions` (``self._positions``):
offsets are tracked there, never read back from the consumer (``position()`` is INVALID
right after a ``seek()`` until the next fetch). One thread owns all of it; the side
thread of the health server only reads :class:`Metrics`.
"""

from __future__ import annotations

import faulthandler
import gc
import logging
import os
import signal
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime
from types import FrameType
from typing import Any

from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition

from processors._checkpoint.alignment import Aligner, Decision, Forced, Mode
from processors._checkpoint.control_topics import (
    control_topic,
    read_registry_and_cancels,
    writers_of,
)
from processors._checkpoint.input_positions import InputPositions
from processors._checkpoint.keygroup_state import KeyGroupCheckpoints
from processors._checkpoint.protocol import (
    CONTROL_TYPE,
    WRITER,
    lockgate_headers,
    writer_header,
)
from processors._checkpoint.savepoint_requests import SavepointRequests
from processors._checkpoint.txn import CONSUMER_CLOSE_S, PRODUCER_FLUSH_S, WATCHDOG_MARGIN_S
from processors._config.settings import Alignment, Guarantee, Settings, StateBackendKind
from processors._dsl.app import App
from processors._dsl.context import direct_context
from processors._kafka.authz import authorization_error, is_authorization_failure
from processors._kafka.clients import (
    PARTITION_EOF,
    Admin,
    consumer_config,
    restore_consumer_config,
)
from processors._kafka.errors import AbortEpoch, Stopping, kafka_call
from processors._runtime.barriers import BarrierAlignment, WatermarkUpdate
from processors._runtime.bounded import END_OF_TIME
from processors._runtime.bounded_end import (
    BoundedEnd,
    EverySavepoint,
    SavepointRules,
    plan_bounded_run,
)
from processors._runtime.checkpoint_writer import CheckpointWriter
from processors._runtime.epoch import EpochCommitter, where
from processors._runtime.final_savepoint import FinalSavepointFactory
from processors._runtime.gauges import ProgressGauges
from processors._runtime.health import HealthServer, Metrics
from processors._runtime.membership import GroupWatch, leave_group, leave_reason
from processors._runtime.open_epoch import OpenEpoch
from processors._runtime.operator_plan import check_operator_layout
from processors._runtime.output import OutputWriter
from processors._runtime.query import QueryService
from processors._runtime.query_routing import QueryRouter
from processors._runtime.rebalance import KeyGroupAssignment
from processors._runtime.savepoint_files import SavepointFiles
from processors._runtime.savepoint_seeding import SavepointSeeding
from processors._runtime.savepoints import SavepointParticipant
from processors._runtime.startup import prepare_topics
from processors._runtime.timer_guard import TimerGuard, TimerRewind
from processors._sinks import Sinks
from processors._sinks.errors import SinkUnavailable
from processors._task.failures import ReplayPoison, stop_error
from processors._task.global_tables import GlobalTables
from processors._task.interleave import Interleaver
from processors._task.keygroups import (
    KeyGroup,
    MemoryPlan,
    Restorer,
    StateCleaner,
    StateMemory,
    cgroup_memory_limit,
    with_fetch_limits,
)
from processors._task.snapshots import state_snapshots
from processors.exceptions import ConfigError, FatalKafkaError, UserCodeError
from state.base.store import StateBackend
from state.cache import DELETED, MISSING
from state.codecs import CodecUnavailable
from state.memory.store import MemoryBackend
from state.rocksdb.store import RocksDBBackend

log = logging.getLogger("lockgate.runtime")

#: The signal of a SIGTERM/SIGINT that arrived before a runner handled them (while the
#: CLI loaded the app and built the runner), see :func:`defer_stop_signals`; 0 if none.
_early_stop_signal = 0


def _note_early_stop(signum: int, frame: FrameType | None) -> None:
    global _early_stop_signal  # noqa: PLW0603 - written by a signal handler, read once
    if _early_stop_signal:
        # Asked twice (e.g. an import that hangs): the default action, now.
        signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum)
        return
    _early_stop_signal = signum


def defer_stop_signals() -> None:
    """Hold SIGTERM/SIGINT until :meth:`Runner.run` installs its handlers.

    Called first thing by ``lockgate run``: a stop asked for while the app module is
    imported (seconds for a heavy app on a busy node) is honoured when the runner starts
    (it returns at once, exit code 0, before starting anything) instead of killing the
    process by the default action. A second signal meanwhile takes the default action
    (an import that hangs can still be interrupted).
    """
    signal.signal(signal.SIGTERM, _note_early_stop)
    signal.signal(signal.SIGINT, _note_early_stop)


#: How often a multi-input app checks that its inputs are still co-partitioned (seconds).
_INPUT_CHECK_S = 30.0


class StateEncodeError(Exception):
    """User code stored a value its store's codec cannot encode (e.g. a set under JSON)."""


class _InstanceIdInUse(FatalKafkaError):
    """The group still has a member with this instance id (KIP-848 fences the newcomer)."""


class _StaticMemberFenced(FatalKafkaError):
    """The broker fenced this static member (FENCED_INSTANCE_ID).

    Seen after a broker restart: the session timed out while the broker was away, the
    consumer rejoined with a new member id, and the reloaded group still held the old
    one. Also what a second live process with the same instance id causes.
    """


#: Rejoins after a static-member fence allowed within _FENCE_WINDOW_S before exiting 1.
_MAX_FENCE_REJOINS = 3
_FENCE_WINDOW_S = 600.0


class _Rewind(Exception):  # noqa: N818 - internal control flow
    """User code raised: abort the epoch and replay with the record dead-lettered."""


def stopped_fields(checkpoint: int) -> dict[str, Any]:
    """Return the fields of the ``stopped`` log line for the last checkpoint id.

    A checkpoint id is a time in ms since the epoch (its interval's start, or later), so
    ``last_checkpoint`` shows it as an ISO 8601 UTC time (``none`` before the first
    checkpoint) and ``checkpoint_id`` keeps the number (as ``lockgate checkpoints list``
    shows it).
    """
    if checkpoint <= 0:
        return {"last_checkpoint": "none", "checkpoint_id": checkpoint}
    when = datetime.fromtimestamp(checkpoint / 1000, tz=UTC)
    iso = when.isoformat(timespec="milliseconds").replace("+00:00", "Z")
    return {"last_checkpoint": iso, "checkpoint_id": checkpoint}


class Runner:
    """Runs an :class:`App` until stopped; one instance of the app's consumer group."""

    def __init__(self, app: App, settings: Settings) -> None:
        self.app = app
        self.settings = settings
        self.name = settings.app_name or app.name
        app.run_as(self.name)  # per-app topics (late topics) named before outputs are read
        self.eos = settings.guarantee is Guarantee.EXACTLY_ONCE
        self.metrics = Metrics(self.name, settings.instance_id)
        self._handles = app.stores
        self._inputs = app.input_topics
        self._control_topic = control_topic(self.name)
        self._init_checkpoint_parts(app, settings)
        self._stop = False
        self._stop_at: float | None = None  # when the stop was requested (monotonic)
        self._fatal: BaseException | None = None
        self._kgs: dict[int, KeyGroup] = {}
        #: Around each timer callback (apps with timers; set up by the Runner).
        self._timer_guard: TimerGuard | None = None
        #: Records to dead-letter instead of processing on the replay: coords -> cause.
        self._poison: ReplayPoison[tuple[str, int, int]] = ReplayPoison()
        self._partitions = 0
        self._changelog_retention_ms: int | None = None
        self._init_state_store(settings)
        self._consumer: Any = None
        self._restorer: Restorer | None = None
        self._admin: Admin | None = None
        #: A rebalance callback failed; nothing commits until the loop has raised it
        #: (set by ``Runner._failed_in_callback``, cleared when the loop raises it).
        self._callback_failed = False
        self._finishing = False  # the final commit after a stop request
        #: Producers abandoned inside a hung call (kept referenced, never used again).
        self._hung_clients: list[Any] = []
        self._gauges = ProgressGauges(
            self.metrics,
            app.time_service,
            lambda: self._consumer,
            self._positions.committed,
            self._halted,
            self._kgs,
        )
        self._handlers = app.handlers()
        self._decoders = {
            t: (codecs[0].decode, codecs[1].decode)
            for t in self._inputs
            for codecs in [app.input_codecs(t)]
        }
        #: Several co-partitioned inputs: their records go through the interleaver, which
        #: breaks timestamp ties tables first (a table version at the time of a stream
        #: record is seen by it), then in declaration order (``None``: one input).
        tables = [t for t in self._inputs if t in app.tables]
        order = (*tables, *(t for t in self._inputs if t not in app.tables))
        self._interleaver: Interleaver | None = (
            Interleaver(order, settings.max_idle_ms / 1000, settings.max_fetch_wait_ms / 1000)
            if len(self._inputs) > 1
            else None
        )
        self._bp_limit = max(10_000, 4 * settings.consume_batch_size)
        #: A bounded run's end phase (``LOCKGATE_UNTIL``): its end offsets, planned at
        #: start-up, and its final savepoint (``LOCKGATE_UNTIL_SAVEPOINT``).
        self._bounded: BoundedEnd | None = None
        #: Builds the final savepoint (``processors/cli.py`` hands the operator commands'
        #: implementation).
        self.final_savepoint_factory: FinalSavepointFactory | None = None
        #: The group-probe child's checks: subscriptions at start, stranded partitions.
        self._group_watch = GroupWatch(self.name, app.subscribed_input, settings, self._waiting)
        #: Set when the stranded-partition heal elected this member to rejoin.
        self._resubscribe = False
        self._next_input_check = 0.0
        self._globals = GlobalTables(app.global_tables, settings, self.name, self.metrics)
        self._init_time(app, settings)
        self._init_epoch_components(app, settings)
        self._http: HealthServer | None = None
        self._fence_rejoins: list[float] = []
        #: Queryable state: the HTTP thread's hand-off and the loop's answers.
        self._queries = self._query_router(app, settings)

    def _query_router(self, app: App, settings: Settings) -> QueryRouter | None:
        """Queryable state (``LOCKGATE_QUERY_ENABLED``), else ``None``.

        The HTTP thread's hand-off and the loop's answers (local key groups, or the owner
        from the group's description).
        """
        if not settings.query_enabled:
            return None
        key_codec = app.key_codec
        token = settings.query_token
        service = QueryService(
            lambda text: key_codec.encode(text),
            None if token is None else token.get_secret_value(),
            settings.query_timeout_ms / 1000,
        )
        return QueryRouter(
            service,
            self.name,
            app.subscribed_input,
            settings,
            self._handles,
            self._kgs,
            lambda: self._partitions,
        )

    def _init_checkpoint_parts(self, app: App, settings: Settings) -> None:
        """The parts every epoch writes through: outputs, sinks, checkpoints, positions."""
        #: Producing into the open transaction: outputs, the runtime's own records, and
        #: the epoch's tallies and errors of both.
        #: Exactly-once outputs outside Kafka (processors/_sinks): called at the "sink hook"s.
        self._sinks = Sinks(self.name, app.sinks, settings.transaction_timeout_ms / 1000, self.eos)
        self._out = OutputWriter(
            self.name, app.outputs, settings.transaction_timeout_ms / 1000, self._sinks
        )
        #: The savepoint files: the location, exports, and a restore's checks and reads.
        self._sp_files = SavepointFiles(
            self.name, app, settings, self._out, self._control_topic, self.metrics.beat
        )
        #: Per key group: last completed checkpoint, whether it was aligned, the savepoint
        #: its state descends from, a halt, a restore under way; and their committed state.
        self._marks = KeyGroupCheckpoints()
        #: Registrations, barriers and checkpoint records in each epoch's transaction.
        self._checkpoints = CheckpointWriter(
            self.name, app, settings.instance_id, self._out, self._sp_files, self._control_topic
        )
        #: The halted key groups (the component's own dict; read here, changed there).
        self._halted = self._marks.halted
        #: Savepoint requests (one in progress at a time), cancels, barrier announcements.
        self._sp_requests = SavepointRequests()
        self._mode = Mode.UNALIGNED if settings.alignment is Alignment.NONE else Mode.ALIGNED
        #: Per owned input partition: next and committed offsets, aligners and their
        #: committed snapshots, halted partitions' frozen snapshots, savepoint alignment
        #: of unaligned partitions, rewound and backpressured partitions.
        self._positions = InputPositions(
            self._inputs,
            self._mode,
            settings.alignment_timeout_ms / 1000,
            settings.alignment_max_held,
            grouped=len(self._inputs) > 1,  # several inputs go through the interleaver
            cancelled=self._sp_requests.cancelled,
        )
        #: The open epoch's flags (commit it, commit now, check writes), the highest
        #: checkpoint id, and the records alignments released (processed before the next
        #: fetched record, with upstream watermark updates in their place among them).
        self._open = OpenEpoch()
        self._reader: Any = None
        #: What the epoch and savepoint code ask of the run's end: whether a savepoint
        #: request waits, whether a key group took it, a key group's ``bounded`` ends. A
        #: bounded run replaces it with its end phase at start-up (``_runtime/bounded_end.py``).
        self._sp_rules: SavepointRules = EverySavepoint(self._marks)

    def _init_state_store(self, settings: Settings) -> None:
        """The state backend and its memory plan (one cache for every key group)."""
        self._backend: StateBackend = (
            MemoryBackend()
            if settings.state_backend is StateBackendKind.MEMORY
            else RocksDBBackend(settings.state_dir)
        )
        plan = MemoryPlan.of(settings, cgroup_memory_limit())
        #: One block cache, write-buffer manager and read-cache budget for every key group.
        self._state_memory = StateMemory(plan)
        log.info(
            "state memory",
            extra={
                "memory_limit_bytes": plan.limit_bytes,
                "limit_from": plan.limit_source,
                "rocksdb_bytes": plan.rocksdb_bytes,
                "read_cache_bytes": plan.read_cache_bytes,
                "consumer_bytes": plan.consumer_bytes,
            },
        )
        #: Removes released key groups' directories when due (swept at each epoch end).
        self._state_cleaner: StateCleaner | None = None
        if isinstance(self._backend, RocksDBBackend):
            # Before any database is opened: all of them share the cache and manager.
            self._backend.memory = self._state_memory.rocksdb
            self._state_cleaner = StateCleaner(
                self.name, self._backend, settings.state_cleanup_delay_ms / 1000
            )

    def _init_time(self, app: App, settings: Settings) -> None:
        """The operator context, and the timer guard around timers (apps with event time)."""
        self._cursor = app.cursor
        svc = app.time_service
        self._ctx = direct_context(self._out.emit, None if svc is None else svc.timers)
        self._tick_time = svc is not None and svc.needs_tick
        if svc is not None:
            svc.emit = self._out.emit
            self._timer_guard = TimerGuard(
                self._out,
                settings.on_error,
                checking_writes=lambda: self._open.check_writes,
                key_state_error=self._key_state_error,
                commit_soon=self._commit_soon,
            )
            svc.hooks = self._timer_guard
            svc.decode_key = app.key_codec.decode
            svc.reads_barriers = True
            svc.atomic_epochs = self.eos  # at-least-once: the changelog is not transactional

    def _init_epoch_components(self, app: App, settings: Settings) -> None:
        """The components the loop hands work to, wired to each other by callbacks.

        Order matters: the savepoint participant before the epoch sequence (which it ends
        through a late-bound lambda), the epoch sequence before barriers and rebalances
        (:meth:`_init_downstream_components`: their callbacks are its methods).
        """
        #: Restores from a savepoint: which key groups, checked, written in chunks (each
        #: chunk commits an epoch: the participant's ``commit_seed_chunk``).
        seeding = SavepointSeeding(
            self._sp_files,
            self._marks,
            settings,
            self._inputs,
            lambda: self._savepoints.commit_seed_chunk(),
        )
        #: The runtime's side of savepoints: requests followed, halts and their lifting
        #: by a cancel, a restore's seeding and positions.
        self._savepoints = SavepointParticipant(
            settings,
            self.name,
            self._control_topic,
            self._inputs,
            self._sp_requests,
            seeding,
            self._marks,
            self._positions,
            self._open,
            self._kgs,
            lambda: self._partitions,
            lambda: self._consumer,
            self._call,
            lambda: self._epochs.end_epoch(),
            self.metrics.beat,
        )
        #: The epoch sequence: commit, abort, rewind; the producer.
        self._epochs = EpochCommitter(
            settings,
            self.name,
            self.eos,
            self.metrics,
            self._inputs,
            self._handles,
            self._kgs,
            self._halted,
            self._positions,
            self._marks,
            self._open,
            self._out,
            self._sinks,
            self._checkpoints,
            self._sp_files,
            self._sp_requests,
            self._savepoints,
            self._gauges,
            self._globals,
            self._interleaver,
            self._state_cleaner,
            self._poison,
            self._timer_guard,
            call=self._call,
            seek=self._seek,
            consumer=lambda: self._consumer,
            admin=lambda: self._admin,
            restorer=lambda: self._restorer,
            sp_rules=lambda: self._sp_rules,
            stop_requested=lambda: self._stop,
            finishing=lambda: self._finishing,
            callback_failed=lambda: self._callback_failed,
        )
        self._init_downstream_components(app)

    def _init_downstream_components(self, app: App) -> None:
        """Barriers and rebalances: their callbacks are the epoch sequence's methods."""
        #: Barriers read downstream: alignment, checkpoint completion, forwarding.
        self._barriers = BarrierAlignment(
            name=self.name,
            inputs=self._inputs,
            mode=self._mode,
            positions=self._positions,
            marks=self._marks,
            sp_requests=self._sp_requests,
            sp_files=self._sp_files,
            metrics=self.metrics,
            time_service=app.time_service,
            kgs=self._kgs,  # one dict for the runner's life (cleared, never replaced)
            halted=self._halted,
            open_epoch=self._open,
            write_barriers=self._epochs.write_barriers,
            halt=self._savepoints.halt,
        )
        #: The rebalance callbacks: key groups taken over (restored) and handed back.
        self._assignment = KeyGroupAssignment(
            self._inputs,
            self._handles,
            self._kgs,
            self._positions,
            self._marks,
            self._open,
            self._checkpoints,
            self._sinks,
            self._globals,
            self._interleaver,
            self._state_cleaner,
            self._state_memory.read_cache,
            self._poison,
            self._sp_requests.cancelled,
            self._control_topic,
            self.metrics,
            self._txn_timeout_s,
            consumer=lambda: self._consumer,
            control_reader=self._control_reader,
            call=self._call,
            should_stop=lambda: self._stop,
            end_epoch=self._epochs.end_epoch,
            abort_epoch=self._epochs.abort_epoch,
            seed_from_savepoint=self._savepoints.seed,
            reset_epoch_deadline=self._epochs.reset_deadline,
            uncommitted=lambda: bool(
                self._open.uncommitted or self._out.records or self._out.dead_letters
            ),
            callback_failed=lambda: self._callback_failed,
            failed=self._failed_in_callback,
        )

    # -- bounded waits --------------------------------------------------------------------

    @property
    def _txn_timeout_s(self) -> float:
        return self.settings.transaction_timeout_ms / 1000

    def _call(self, fn: Any, *args: Any, what: str, timeout_s: float | None = None) -> Any:
        """Call a blocking client API, bounded by ``timeout_s`` (default: the txn timeout).

        Shows the wait on /livez (bounded calls are not a stall until their deadline) and
        gives up with :class:`Stopping` when a stop is requested during retries.
        """
        timeout = self._txn_timeout_s if timeout_s is None else timeout_s
        with self.metrics.blocked(what, timeout + WATCHDOG_MARGIN_S + 5):
            return kafka_call(
                fn,
                *args,
                what=what,
                timeout_s=timeout,
                should_stop=lambda: self._stop and not self._finishing,
                on_wait=self.metrics.beat,
            )

    def _state_write_error(self, caches: Any, key: bytes | None) -> BaseException | None:
        """Encode the current key's dirty values in ``caches``; return the codec's error."""
        if key is None:
            return None
        for cache in caches.values():
            if key in cache.dirty:
                value = cache.peek(key)
                if value is DELETED or value is MISSING:
                    continue
                try:
                    cache.codec.encode(value)
                except Exception as exc:  # noqa: BLE001 - the store's codec may raise anything
                    return StateEncodeError(
                        f"state store {cache.name!r} cannot encode the value written for this "
                        f"record ({type(exc).__name__}: {exc})"
                    )
        return None

    def _seek(self, topic: str, partition: int, offset: int) -> None:
        """Make ``offset`` the next record fetched from an owned input partition."""
        tp = TopicPartition(topic, partition, offset)
        try:
            self._consumer.seek(tp)
        except KafkaException:
            # Not fetching yet: re-assigning at the offset has the same effect.
            self._consumer.incremental_unassign([TopicPartition(topic, partition)])
            self._consumer.incremental_assign([tp])

    def _control_reader(self) -> Any:
        """A group-less ``read_committed`` consumer for control-topic reads."""
        if self._reader is None:
            conf = restore_consumer_config(self.settings, self.name)
            conf["client.id"] = f"{self.name}-{self.settings.instance_id}-control"
            self._reader = Consumer(conf)
        return self._reader

    def _check_stop(self) -> None:
        if self._stop:
            raise Stopping("stop requested")

    # -- life cycle ---------------------------------------------------------------------

    @property
    def savepoint_result(self) -> str | None:
        """The id of the complete savepoint a bounded run with ``--savepoint`` ended with."""
        return None if self._bounded is None else self._bounded.savepoint_result

    def request_stop(self, signum: int | None = None, frame: FrameType | None = None) -> None:
        """Ask the loop to finish the epoch and stop (signal-safe)."""
        if not self._stop:
            self._stop_at = time.monotonic()  # the stop budget runs from here
            txn = self._epochs.txn
            if txn is not None:
                # The batch in progress, a commit running now and the final one end by
                # this deadline (processors/_checkpoint/txn.py: stop_budget_s).
                txn.stop_within_budget(self._stop_at)
        self._stop = True

    def run(self) -> int:
        """Run until SIGTERM/SIGINT (exit code 0) or a fatal error (non-zero).

        Raises:
            ConfigError: the app is misconfigured (before any record is processed), or
                the health port is taken.
            TopicError: the topics are misconfigured (before any record is processed).
        """
        signal.signal(signal.SIGTERM, self.request_stop)
        signal.signal(signal.SIGINT, self.request_stop)
        if _early_stop_signal:
            # Nothing was started yet (no server, no client, no group membership).
            log.info(
                "stop requested while starting: exiting before start-up",
                extra={"signal": signal.Signals(_early_stop_signal).name},
            )
            return self._final_code(0)
        if hasattr(signal, "SIGUSR2"):
            # `kill -USR2 <pid>` prints every thread's stack to stderr: what a stuck
            # instance is waiting in, without stopping it.
            faulthandler.register(signal.SIGUSR2, all_threads=True, chain=False)
        self._warn_about_settings()
        s = self.settings
        if s.http_port:
            self._http = HealthServer(
                self.metrics,
                s.http_host,
                s.http_port,
                s.liveness_timeout_ms,
                None if self._queries is None else self._queries.service,
            )
            self._http.start()
        unfreeze = False
        try:
            try:
                self._setup()
            except Stopping:
                log.info("stopped during start-up")
                self._close(graceful=False)
                return self._final_code(0)
            except AbortEpoch as exc:
                raise FatalKafkaError(f"start-up: {exc}") from exc
            # What start-up built (modules, the app, clients, settings) lives as long as
            # the process: the cyclic collector need not walk it again. Its full
            # collections walked it each time: 11-14% of a busy instance's CPU (keyed sum,
            # exactly-once, measured with gc.callbacks: 0.65-1.26 s of gen-2 collections
            # per 400,000 records, 0.1 s frozen). Unreachable cycles are collected first
            # (none is frozen); unfrozen at the end, so an embedding process (tests)
            # collects this runner's cycles once it is gone. Process-wide: when the
            # embedding process froze objects itself, they stay frozen.
            gc.collect()
            unfreeze = gc.get_freeze_count() == 0
            gc.freeze()
            code = self._final_code(self._loop())
        finally:
            if unfreeze:
                gc.unfreeze()
            if self._http is not None:
                self._http.stop()
            if self._bounded is not None:
                self._bounded.close()
        txn = self._epochs.txn
        if txn is not None:
            self._hung_clients.extend(txn.abandoned)
        if self._hung_clients:
            # A producer abandoned inside a hung librdkafka call cannot be destroyed (its
            # destructor would wait for that call): leave without running destructors.
            log.warning(
                "exiting without destroying %d replaced or hung producer(s) (librdkafka may "
                "abort destroying one with a call still pending)",
                len(self._hung_clients),
            )
            logging.shutdown()
            os._exit(code)
        return code

    def _final_code(self, code: int) -> int:
        """The exit code: with a final savepoint, 0 only when it completed.

        A bounded run with ``--savepoint`` stopped (SIGTERM) before its savepoint was
        complete exits 1: exit 0 tells the caller the savepoint exists.
        """
        if code == 0 and self.settings.until_savepoint is not None and not self.savepoint_result:
            log.error(
                "bounded run stopped before its savepoint was complete: exiting 1 (run it "
                "again: it continues from its last checkpoint and takes the savepoint)"
            )
            return 1
        return code

    def _warn_about_settings(self) -> None:
        """Warn about settings that work against each other (they are not errors)."""
        s = self.settings
        if s.http_port and s.liveness_timeout_ms <= s.transaction_timeout_ms:
            # One record may legitimately run up to the transaction timeout (then it is
            # dead-lettered): a shorter liveness timeout restarts the instance first, and
            # the replay meets the same record again (a crash loop).
            log.warning(
                "LOCKGATE_LIVENESS_TIMEOUT_MS is not longer than "
                "LOCKGATE_TRANSACTION_TIMEOUT_MS: a record slower than the liveness timeout "
                "gets the instance restarted (and replayed) instead of dead-lettered",
                extra={
                    "liveness_timeout_ms": s.liveness_timeout_ms,
                    "transaction_timeout_ms": s.transaction_timeout_ms,
                },
            )
        if s.query_enabled and not s.http_port:
            log.warning("LOCKGATE_QUERY_ENABLED has no effect: LOCKGATE_HTTP_PORT=0 (no server)")
        elif s.query_enabled and s.query_token is None:
            log.warning(
                "queryable state without LOCKGATE_QUERY_TOKEN: anyone who reaches "
                "LOCKGATE_HTTP_PORT can read the app's state"
            )

    def _setup(self) -> None:
        s = self.settings  # cross-field rules were checked by the Settings model
        self._admin = admin = Admin(s)
        admin.connect()  # a refused password or certificate: one clear error, at once
        topology = prepare_topics(
            admin,
            self.app,
            self.name,
            self._out,
            self._control_topic,
            s.input_wait_ms,
            self._waiting,
        )
        self._partitions = p = topology.partitions
        self._changelog_retention_ms = topology.changelog_retention_ms
        self._checkpoints.start(p, topology.internal_partitions)
        self._out.compacted = set(topology.compacted)
        self._out.writer_headers = {g: writer_header(self.name, g) for g in range(p)}
        registry = self._read_registry(admin)
        check_operator_layout(
            self.name,
            registry.get(self.name),
            self.app.operators,
            from_savepoint=s.from_savepoint,
            allow_non_restored_state=s.allow_non_restored_state,
        )
        self._positions.expect_writers(
            {t: ws for t in self._inputs for ws in [writers_of(registry, (t,))] if ws}
        )
        upstream = self._positions.writers
        if upstream:
            log.info(
                "reading internal topics: checkpoints come from upstream barriers",
                extra={
                    "writers": sum(map(len, upstream.values())),
                    "internal_inputs": sorted(upstream),
                    "alignment": self._mode.value,
                },
            )
        if s.until is not None:
            self._plan_bounded_run(admin)
        self._savepoints.open_request_reader()
        self._epochs.open_producer()
        self._restorer = Restorer(
            self.name,
            self._backend,
            Consumer(
                with_fetch_limits(restore_consumer_config(s, self.name), self._state_memory.plan)
            ),
            admin.end_offsets,
            self._assignment.restore_progress,
            s.restore_batch_records,
            should_stop=lambda: self._stop,
            stall_timeout_s=self._txn_timeout_s + 30,
            tombstone_retention_ms=self._changelog_retention_ms,
        )
        # snapshot hook: where key groups without local state start (None: off)
        self._restorer.snapshots = state_snapshots(
            s, self.name, self._backend, admin.start_offsets, admin.end_offsets
        )
        self._assignment.start(admin, p, self._restorer, self._epochs.txn)
        self._group_watch.check_subscriptions(admin.principal)
        self._globals.load(admin, self._txn_timeout_s + 30, lambda: self._stop)
        self._subscribe()
        self.metrics.started = True
        log.info(
            "started",
            extra={
                "app": self.name,
                "instance": s.instance_id,
                "guarantee": s.guarantee.value,
                "inputs": list(self._inputs),
                "key_groups": p,
                "checkpoint_interval_ms": s.checkpoint_interval_ms,
            },
        )

    def _read_registry(self, admin: Admin) -> dict[str, Any]:
        """The registry's registrations (and the cancelled savepoints, noted).

        Unreadable (e.g. a transaction of a dead instance still open there): start
        without it; barriers name their writers' key-group counts anyway.
        """
        try:
            registry, cancelled = read_registry_and_cancels(
                self._control_reader(), admin.end_offsets, timeout_s=self._txn_timeout_s + 30
            )
        except FatalKafkaError as exc:
            log.warning(
                "registry not readable; learning writers from barriers", extra={"error": str(exc)}
            )
            return {}
        self._sp_requests.note_cancelled(cancelled)
        return registry

    def _plan_bounded_run(self, admin: Admin) -> None:
        """Read a bounded run's end offsets; its end phase is :class:`BoundedEnd`'s.

        Raises:
            ConfigError: a malformed bound, or the app reads internal topics.
        """
        self._bounded = BoundedEnd(
            plan_bounded_run(
                admin,
                self.settings,
                self.name,
                self._inputs,
                self._partitions,
                self._positions.writers,
                self.final_savepoint_factory,
            ),
            self.settings,
            self.name,
            self._inputs,
            self._partitions,
            self._kgs,
            self._halted,
            self._positions.next,
            None if self._interleaver is None else self._interleaver.backlog,
            self._open,
            self._marks,
            self._sp_requests,
            self.final_savepoint_factory,
            None if self.app.time_service is None else self._drain_event_time,
            self._epochs.end_epoch,
            self._epochs.live_source,
            self._stop_loop,
        )
        self._sp_rules = self._bounded

    def _drain_event_time(self) -> None:
        """Advance event time to its end in each owned key group (a bounded run's drain)."""
        svc = self.app.time_service
        assert svc is not None
        self._in_each_key_group(lambda: svc.advance_to(END_OF_TIME))

    def _stop_loop(self) -> None:
        """End the loop (it finishes the open epoch and stops); not a stop request."""
        self._stop = True

    def _waiting(self) -> None:
        """Called while a start-up check waits: stop when asked, show liveness."""
        self._check_stop()
        self.metrics.beat()

    def _subscribe(self) -> None:
        conf = with_fetch_limits(consumer_config(self.settings, self.name), self._state_memory.plan)
        if self._interleaver is not None or self._bounded is not None:
            # The interleaver needs "caught up"; a bounded run, the end of a partition
            # whose last records before its end are transaction markers.
            conf["enable.partition.eof"] = True
        self._consumer = Consumer(conf)
        for topic in self._inputs:
            if topic != self.app.subscribed_input:
                # Without metadata for the other inputs librdkafka starts fetching them
                # only after its next metadata refresh (measured: ~1.1 s at start-up).
                self._consumer.list_topics(topic, timeout=10)
        # Only one input is subscribed: the group assigns its partitions, and key group
        # g takes partition g of every other input with it (KeyGroupAssignment).
        self._consumer.subscribe(
            [self.app.subscribed_input],
            on_assign=self._assignment.on_assign,
            on_revoke=self._assignment.on_revoke,
            on_lost=self._assignment.on_lost,
        )

    def _rejoin_after_fence(self, exc: _StaticMemberFenced) -> None:
        """Drop everything owned and join again with a fresh consumer (bounded).

        Raises:
            FatalKafkaError: fenced again and again: another live process most likely
                runs with this instance id.
        """
        now = time.monotonic()
        self._fence_rejoins = [t for t in self._fence_rejoins if now - t < _FENCE_WINDOW_S]
        if len(self._fence_rejoins) >= _MAX_FENCE_REJOINS:
            raise FatalKafkaError(
                f"{exc} ({len(self._fence_rejoins) + 1} times within {_FENCE_WINDOW_S:.0f}s)"
            ) from exc
        self._fence_rejoins.append(now)
        if self._kgs:
            groups = list(self._kgs)
            self._assignment.release(groups)  # first: the abort's rewind must not touch them
            if self._open.uncommitted or self._out.records or self._out.dead_letters:
                self._epochs.abort_epoch("static member fenced")
        self._rejoin_later(exc)

    def _rejoin_later(self, exc: FatalKafkaError) -> None:
        """The previous incarnation of this instance id still holds its membership.

        Under KIP-848 the broker fences the *new* member until the old one's session
        expires; nothing is assigned yet, so wait and join again with a fresh consumer.
        """
        log.warning(
            "consumer fenced or instance id still held by a previous incarnation; rejoining "
            "in 2s with a fresh consumer (if this repeats, another process runs with "
            "this LOCKGATE_INSTANCE_ID)",
            extra={"instance": self.settings.instance_id, "detail": str(exc)},
        )
        self.metrics.joined = False
        try:
            self._consumer.close()
        except Exception as exc:  # noqa: BLE001 - a fenced consumer may refuse to close
            log.warning("consumer close failed: %s", exc)
        deadline = time.monotonic() + 2.0
        while time.monotonic() < deadline and not self._stop:
            self.metrics.beat()
            time.sleep(0.1)
        self._subscribe()

    def _epoch_bytes_bound(self) -> int | None:
        """How many fetched bytes end an epoch early (``None``: the interval only)."""
        if self._out.internal_set:
            # Every epoch of a barrier writer is a barrier downstream: early epochs would
            # multiply barriers and make aligned readers hold records for longer (their
            # checkpoint is the slowest writer's). Its epochs follow the interval only.
            return None
        # A backlog makes epochs as long as the interval allows (tens of thousands of
        # records): bound what one epoch fetches, which bounds its state, changelog and
        # commit-time memory (tests/integration/test_memory_budget.py).
        if self.settings.checkpoint_max_bytes is not None:
            return self.settings.checkpoint_max_bytes
        return self._state_memory.plan.epoch_bytes

    def _loop(self) -> int:
        """Consume, process and commit epochs until a stop; return the exit code."""
        batch = self.settings.consume_batch_size
        interval = self.settings.checkpoint_interval_ms / 1000
        epoch_bytes = self._epoch_bytes_bound()
        bounded = self._bounded
        metrics = self.metrics
        rewound = self._positions.rewound  # one set for the component's life
        open_epoch = self._open
        epochs = self._epochs
        next_epoch = time.monotonic() + interval
        try:
            while not self._stop:
                try:
                    rewound.clear()
                    msgs = self._consumer.consume(batch, 0.1)
                    if msgs and epoch_bytes is not None:
                        open_epoch.fetched_bytes += sum(map(len, msgs))  # C speed: value sizes
                    if self._fatal is not None:
                        fatal, self._fatal = self._fatal, None
                        # Handled below: an abort rewinds first, anything else stops.
                        self._callback_failed = False
                        raise fatal
                    if self._resubscribe:
                        self._subscribe_again()
                    if rewound and msgs:
                        msgs = self._drop_stale(msgs)
                    if bounded is not None and msgs:
                        msgs = bounded.trim(msgs)
                    if self._interleaver is not None:
                        msgs = self._interleave(msgs)
                    if msgs:
                        self._process(msgs)
                    self._between_batches()
                    if bounded is not None and bounded.after_batch():
                        continue
                except _Rewind:
                    open_epoch.slow = None  # user code raised: that record is the cause
                    epochs.abort_epoch("user code raised: replaying with the record dead-lettered")
                except TimerRewind:
                    open_epoch.slow = None
                    epochs.abort_epoch(
                        "user code (a timer) wrote state that cannot be encoded: replaying "
                        "with the timer dead-lettered"
                    )
                except AbortEpoch as exc:
                    epochs.abort_epoch(str(exc))
                except _StaticMemberFenced as exc:
                    self._rejoin_after_fence(exc)
                    continue
                except _InstanceIdInUse as exc:
                    if self._kgs:
                        raise FatalKafkaError(str(exc)) from exc
                    self._rejoin_later(exc)
                    continue
                now = time.monotonic()
                metrics.heartbeat = now
                if (
                    now >= next_epoch
                    or open_epoch.commit_now
                    or (epoch_bytes is not None and open_epoch.fetched_bytes >= epoch_bytes)
                ):
                    try:
                        epochs.end_epoch()
                    except AbortEpoch as exc:
                        epochs.abort_epoch(str(exc), sink_outage=isinstance(exc, SinkUnavailable))
                    next_epoch = time.monotonic() + interval
            self._finish()
        except Stopping as exc:
            return self._stopped_while_waiting(exc)
        except (FatalKafkaError, UserCodeError, ConfigError) as exc:
            return self._fail(exc)
        except Exception:
            # Kafka, RocksDB (e.g. a locked or unreadable state dir) or anything else: stop
            # without committing; the orchestrator restarts from the last checkpoint.
            log.exception("stopping on an unexpected error")
            self._close(graceful=False)
            return 1
        self._close(graceful=True)
        if isinstance(self._fatal, Stopping):  # the final revoke's wait was cut: a stop
            log.warning("the final revoke stopped waiting: %s", self._fatal)
            self._fatal = None
        if self._fatal is not None:  # raised by the final revoke (e.g. fenced)
            log.error("stopped after a fatal error during shutdown: %s", self._fatal)
            return 1
        log.info("stopped", extra=stopped_fields(self._open.checkpoint))
        return 0 if bounded is None else bounded.exit_code

    def _subscribe_again(self) -> None:
        """Subscribe anew (asked for by the stranded-partition heal)."""
        # Records returned with the revoke are of partitions released (committed up to
        # what was processed): _process skips them.
        self._resubscribe = False
        self._consumer.subscribe(
            [self.app.subscribed_input],
            on_assign=self._assignment.on_assign,
            on_revoke=self._assignment.on_revoke,
            on_lost=self._assignment.on_lost,
        )

    def _failed_in_callback(self, exc: BaseException) -> None:
        """A rebalance callback failed: the loop raises ``exc`` once ``consume()`` returns.

        Until then nothing commits: a later callback of the same ``consume()`` call could
        otherwise commit positions that the failure left behind (a settle that could not
        read the committed offsets rewinds to the positions before the epoch).
        """
        self._fatal = self._fatal or exc
        self._callback_failed = True

    def _between_batches(self) -> None:
        """What the loop does after each batch: side inputs, alignments, requests, timers.

        Global tables, alignment timeouts (and the records they release), savepoint
        requests, queries, processing-time timers and the stranded-partition heal.
        """
        if self._globals:
            self._globals.poll()
            if time.monotonic() >= self._globals.next_refresh:
                self._globals.refresh()
        if self._positions.aligners:
            self._barriers.tick()
            if self._open.released:
                self._process([])
        self._savepoints.poll_requests()
        self._gauges.between_commits()
        if self._queries is not None:
            self._queries.serve()
        if self._tick_time:
            self._tick_timers()
        if self._group_watch.heal_due(time.monotonic()) and self._group_watch.stranded_heal(
            self._partitions
        ):
            self._consumer.unsubscribe()  # the revoke is served by the next consume()
            self._resubscribe = True
        if len(self._halted) != len(self.metrics.halted) or (
            self._halted and dict(self.metrics.halted) != self._halted
        ):
            self.metrics.halted = tuple(sorted(self._halted.items()))

    def _finish(self) -> None:
        """After a stop request: commit the open epoch, leave the group if going for good."""
        log.info("stopping: finishing the open epoch")
        self._finishing = True  # the last commit may retry up to its bound
        txn = self._epochs.txn
        if txn is not None and txn.stop_by is None:  # stopped in-process
            txn.stop_within_budget(time.monotonic())
        try:
            self._epochs.end_epoch()
        except AbortEpoch as exc:  # the stop ends any back-off at once
            self._epochs.abort_epoch(str(exc), sink_outage=isinstance(exc, SinkUnavailable))
        # sink hook: commits still pending are done within the stop budget (else left
        # prepared, for the next owner), then the sinks close.
        self._sinks.close(None if txn is None else txn.stop_by)
        self._leave_group_maybe()

    def _leave_group_maybe(self) -> None:
        """On a clean stop, make a static member leave the group when it goes for good.

        See :func:`processors._runtime.membership.leave_group`. Records fetched meanwhile
        are dropped unprocessed: every commit (the revoke's included) covers processed
        records only, so the next owner reads them from the committed offsets.
        """
        if self._consumer is None or self._fatal is not None:
            return
        reason = leave_reason(self.settings)
        if reason is None:
            return
        self._assignment.leave()  # the revoke it causes is the leave's
        leave_group(
            self._consumer,
            reason,
            lambda: bool(self._kgs),
            self.metrics.beat,
            self.settings.consume_batch_size,
        )

    def _stopped_while_waiting(self, exc: Stopping) -> int:
        """SIGTERM arrived while a bounded call or a restore waited: stop without it."""
        log.warning(
            "stop requested while waiting; the open epoch is aborted (replayed by the next owner)",
            extra={"waiting_for": str(exc)},
        )
        self._close(graceful=False)
        log.info("stopped", extra=stopped_fields(self._open.checkpoint))
        return 0

    def _fail(self, exc: BaseException) -> int:
        hint = ""
        text = str(exc)
        if "_FENCED" in text or "UNRELEASED_INSTANCE_ID" in text or "FENCED_INSTANCE_ID" in text:
            hint = (
                f" (another process runs with LOCKGATE_INSTANCE_ID={self.settings.instance_id}"
                " for this app: instance ids must be unique per live instance)"
            )
        log.error("stopping on a fatal error: %s%s", exc, hint)
        if isinstance(exc, UserCodeError):
            code = 3
        elif isinstance(exc, ConfigError):
            code = 2
        else:
            code = 1
        self._close(graceful=False)
        return code

    def _close(self, graceful: bool) -> None:
        self._group_watch.close()
        if self._queries is not None:
            self._queries.close()
        if not graceful:
            # Never commit on the way out after a failure, and end the transaction before
            # the consumer leaves the group, so a new owner does not wait for it.
            self._epochs.never_commit_again()
            txn = self._epochs.txn
            if txn is not None and txn.is_open and txn.pending is None:
                try:
                    txn.producer.abort_transaction(5)
                except Exception:  # noqa: BLE001 - fenced producers cannot abort
                    # Possibly still in progress inside the client: never destroyed.
                    self._hung_clients.append(txn.producer)
        if self._consumer is not None and not self._close_consumer():
            # Its revoke may still run in the close thread (an epoch end, key groups
            # released): touch nothing it may use. The process exits without
            # destructors (run), and the group's session timeout hands the key groups on.
            self._kgs.clear()
            return
        for kg in list(self._kgs.values()):
            try:
                kg.close()
            except Exception as exc:  # noqa: BLE001 - best effort on the way out
                log.warning("closing key group %s failed: %s", kg.index, exc)
        self._kgs.clear()
        if self._restorer is not None and self._restorer.snapshots is not None:
            self._restorer.snapshots.close()  # snapshot hook: the upload in flight ends
        producer = self._epochs.producer
        txn = self._epochs.txn
        if (
            producer is not None
            and producer not in self._hung_clients
            and (txn is None or txn.pending is None)
        ):
            try:
                producer.flush(PRODUCER_FLUSH_S)
            except Exception as exc:  # noqa: BLE001 - a fatal producer cannot flush
                log.warning("producer flush on close failed: %s", exc)
        self._globals.close()
        if self._reader is not None:
            try:
                self._reader.close()
            except Exception as exc:  # noqa: BLE001 - best effort on the way out
                log.debug("side consumer close failed: %s", exc)
        self._sp_requests.close()

    def _close_consumer(self) -> bool:
        """Close the consumer within :data:`CONSUMER_CLOSE_S`, else abandon it.

        Returns whether it closed (else its close still runs in a helper thread).

        ``close()`` serves the final revoke and leaves the group; cut off from the broker
        it can wait much longer. Abandoned, it is never destroyed (the process exits
        without destructors: ``run``), and the group's session timeout applies.
        """
        consumer = self._consumer
        failed: list[BaseException] = []

        def close() -> None:
            try:
                consumer.close()
            except BaseException as exc:  # noqa: BLE001 - reported by the caller
                failed.append(exc)

        worker = threading.Thread(target=close, name="lockgate-consumer-close", daemon=True)
        with self.metrics.blocked("consumer close", CONSUMER_CLOSE_S + 5):
            worker.start()
            worker.join(CONSUMER_CLOSE_S)
        if worker.is_alive():
            log.warning(
                "the consumer did not close within %.0fs: leaving without it (the group's "
                "session timeout hands its key groups on)",
                CONSUMER_CLOSE_S,
            )
            self._hung_clients.append(consumer)
            return False
        if failed:
            log.warning("consumer close failed: %s", failed[0])
        return True

    # -- the per-record path ------------------------------------------------------------

    def _process(self, msgs: list[Any]) -> None:
        """Process a fetched batch (and the records alignments release on the way).

        Records of upstream lockgate writers go through their partition's aligner:
        processed, held until a checkpoint completes, or skipped (already included
        in the committed state, after a restore). Barriers complete checkpoints; the
        records a completion releases are processed before the next fetched record.

        Flat on purpose: this is the per-record path. Every call and attribute lookup
        here is paid per record (the locals below are the attributes it reads, looked
        up once per batch); components are called per batch or per epoch, never from
        here unless a record needs them (a barrier, an error, a dead letter).
        """
        handlers = self._handlers
        decoders = self._decoders
        multi = self._interleaver is not None
        handler = handlers[self._inputs[0]]
        kdec, vdec = decoders[self._inputs[0]]
        ctx = self._ctx
        cursor = self._cursor
        kgs = self._kgs
        poison = self._poison.entries
        nxt = self._positions.next  # one dict for the component's life
        open_epoch = self._open
        aligners = self._positions.aligners
        barriers = self._barriers
        halted = self._halted
        released = self._open.released
        clock = time.monotonic
        metrics = self.metrics
        out = self._out
        cursor.now_ms = int(time.time() * 1000)
        current = -1  # partition of the fetched records in progress
        bound = -1  # partition whose key group the state handles point at
        topic = ""
        aligner: Aligner | None = None  # of ``current``
        last = -1  # offset of the last fetched record handled in ``current``
        count = 0
        out_before = out.records
        deadline = open_epoch.deadline
        budget = self._epochs.budget_s
        started = clock()
        prev: Any = None  # the previous record, to time it
        index = 0
        total = len(msgs)
        while True:
            if released:
                msg = released.popleft()
                fresh = False
            elif index < total:
                msg = msgs[index]
                index += 1
                fresh = True
            else:
                break
            now = clock()
            if prev is not None and now - started > budget:
                self._note_slow(prev, now - started)
            started = now
            metrics.heartbeat = now  # progress: /livez stalls only on one slow record
            prev = None
            if fresh:
                if now > deadline:
                    # The epoch budget is spent (slow user code): end the epoch well
                    # inside transaction.timeout.ms and hand the rest of the batch back.
                    self._put_back(msgs[index - 1 :])
                    break
                if msg.error() is not None:
                    self._consume_error(msg.error())
                    continue
                part = msg.partition()
                if part != current or msg.topic() != topic:
                    if current >= 0:
                        nxt[(topic, current)] = last + 1
                    kg = kgs.get(part)
                    if kg is None or part in halted:  # revoked, or halted at a savepoint
                        current = -1
                        topic = ""
                        continue
                    topic = msg.topic()
                    current = part
                    if multi:
                        handler = handlers[topic]
                        kdec, vdec = decoders[topic]
                    aligner = aligners.get((topic, part))
                    if bound != part:
                        kg.bind()
                        bound = part
                        out.writer_header = out.writer_headers[part]
                last = msg.offset()
                count += 1
                headers = msg.headers()
                writer = None  # records of non-lockgate producers have none
                if headers is not None:
                    lg = lockgate_headers(headers)
                    if CONTROL_TYPE in lg:
                        if lg[CONTROL_TYPE] == "barrier":
                            barriers.on_barrier(topic, part, last, lg)
                            aligner = aligners.get((topic, part))
                            if part in halted:  # a stop-with-savepoint completed here
                                nxt[(topic, part)] = last + 1
                                current = -1
                                topic = ""
                        continue  # control records never reach user code
                    writer = lg.get(WRITER)
                    if aligner is None and writer is not None:
                        aligner = barriers.start_alignment(topic, part)
                if aligner is not None:
                    decision = aligner.on_record(last, writer, msg)
                    if decision is not Decision.PROCESS:
                        if isinstance(decision, Forced):  # this record is the last released
                            barriers.note_forced(topic, part, "the held-record bound")
                            released.extend(decision.released)
                        continue
            else:
                if type(msg) is WatermarkUpdate:
                    if msg.g in kgs and msg.g not in halted:
                        if bound != msg.g:
                            kgs[msg.g].bind()
                            bound = msg.g
                            out.writer_header = out.writer_headers[msg.g]
                        self._apply_watermarks(msg)
                    continue
                part = msg.partition()
                if part in halted or part not in kgs:
                    # Released after its key group halted (or went away): the committed
                    # alignment counts it as not processed, so a cancel's rewind or a
                    # restore reads it again from Kafka.
                    continue
                open_epoch.active = True
                if bound != part:
                    kgs[part].bind()
                    bound = part
                    out.writer_header = out.writer_headers[part]
                if multi:
                    handler = handlers[msg.topic()]
                    kdec, vdec = decoders[msg.topic()]
            raw_key = msg.key()
            cursor.key = raw_key
            ctx.message = msg
            if poison:
                entry = poison.get((msg.topic(), part, msg.offset()))
                if entry is not None:
                    out.dead_letter(msg, entry[0], entry[1])
                    open_epoch.commit_now = True  # keep the replay span short
                    continue
            try:
                key = None if raw_key is None else kdec(raw_key)
                raw_value = msg.value()
                value = None if raw_value is None else vdec(raw_value)
            except CodecUnavailable:
                raise  # e.g. the schema registry is down: not the record's fault, stop
            except Exception as exc:  # noqa: BLE001 - any decode failure is bad input
                self._bad_input(msg, exc, "deserialize")
                continue
            prev = msg
            try:
                handler(key, value, ctx)  # _record_error is None here: reset on every abort
            except ConfigError:
                raise  # a programming error (e.g. emit to an undeclared topic): stop
            except Exception as exc:  # noqa: BLE001 - user code may raise anything
                if out.codec_error is not None:
                    raise out.codec_error from exc  # a registry outage: not the record
                if out.producer_error is None:
                    out.record_error = None
                    self._bad_input(msg, exc, "process", replay=True)
            if out.producer_error is not None:
                # The producer refused a record (e.g. the transaction is in an abortable
                # state): not the record's fault, even if user code swallowed the error.
                self._raise_producer_error()
            if out.record_error is not None:
                # An output of this record can never be written, and user code caught
                # the error: the record still failed.
                rejected, out.record_error = out.record_error, None
                self._bad_input(msg, rejected, "emit", replay=True)
            if open_epoch.check_writes:
                bad = self._state_write_error(kgs[part].caches, raw_key)
                if bad is not None:
                    self._bad_input(msg, bad, "state", replay=True)
        now = clock()
        if prev is not None and now - started > budget:
            self._note_slow(prev, now - started)
        if current >= 0:
            nxt[(topic, current)] = last + 1
        open_epoch.uncommitted += count
        m = self.metrics
        m.records_in_attempts += count
        m.records_out_attempts += out.records - out_before
        self._epochs.producer.poll(0)

    def _interleave(self, msgs: list[Any]) -> list[Any]:
        """Buffer fetched records; return what the interleaver releases, in order.

        Records of key groups not owned (fetched before a revoke in this ``consume()``)
        are dropped; consumer errors are handled first. Input partitions whose buffer
        passes ``_bp_limit`` records are paused until it drains below half.
        """
        il = self._interleaver
        assert il is not None
        now = time.monotonic()
        if msgs:
            kgs = self._kgs
            owned = [m for m in msgs if m.error() is not None or m.partition() in kgs]
            for err in il.push(owned, now):
                self._consume_error(err.error())
        out = il.pop(now) if il else []
        backlog = il.backlog()
        limit = self._bp_limit
        paused = self._positions.backpressured
        full = [tp for tp, n in backlog.items() if n > limit and tp not in paused]
        if full:
            self._consumer.pause([TopicPartition(t, g) for t, g in full])
            paused.update(full)
        if paused:
            drained = [
                (t, g)
                for t, g in paused
                if backlog.get((t, g), 0) < limit // 2 and g not in self._halted
            ]
            if drained:
                paused.difference_update(drained)
                parts = [TopicPartition(t, g) for t, g in drained if g in self._kgs]
                if parts:
                    self._consumer.resume(parts)
        if now >= self._next_input_check:
            self._next_input_check = now + _INPUT_CHECK_S
            self._check_inputs()
        return out

    def _check_inputs(self) -> None:
        """Stop if the inputs stopped being co-partitioned (metadata errors: check later).

        Raises:
            ConfigError: an input's partition count changed, or an input is gone.
        """
        assert self._admin is not None
        try:
            with self.metrics.blocked("input metadata", 15):
                counts = self._admin.partitions_of_each(self._inputs, timeout=5)
        except Exception as exc:  # noqa: BLE001 - brokers unreachable: check again later
            log.debug("input metadata check failed: %s", exc)
            return
        changed = {t: counts.get(t) for t in self._inputs if counts.get(t) != self._partitions}
        if changed:
            raise ConfigError(
                f"input topics are no longer co-partitioned: {changed} (the app started with "
                f"{self._partitions} partitions each; None: the topic is gone): key group g "
                "must be partition g of every input; stop the app and repartition the inputs "
                "alike"
            )

    def _drop_stale(self, msgs: list[Any]) -> list[Any]:
        """Drop records of partitions rewound by a callback during this ``consume()``.

        librdkafka serves rebalance callbacks in the middle of a batch: records collected
        before the callback's ``seek()`` are returned too (they predate the rewind). The
        partitions are sought again to their tracked next offset, so the records collected
        after the seek come back with the next fetch.
        """
        rewound = self._positions.rewound
        nxt = self._positions.next
        kept = [m for m in msgs if (m.topic(), m.partition()) not in rewound]
        for topic, part in rewound:
            offset = nxt.get((topic, part))
            if offset is not None and part in self._kgs:
                self._seek(topic, part, offset)
        if len(kept) < len(msgs):
            # Routine at every start and rebalance: the records are read again, none is lost.
            log.debug(
                "discarded a batch's records of partitions rewound meanwhile; they are "
                "fetched again from the restored position (no record is skipped)",
                extra={"records": len(msgs) - len(kept), "partitions": sorted(rewound)},
            )
        rewound.clear()
        return kept

    def _note_slow(self, msg: Any, seconds: float) -> None:
        log.warning(
            "a single record took longer than the epoch budget",
            extra={
                "record": where(msg),
                "seconds": round(seconds, 3),
                "budget": self._epochs.budget_s,
            },
        )
        self._open.slow = (msg, seconds)
        self._open.commit_now = True

    def _put_back(self, msgs: list[Any]) -> None:
        """Seek every partition in ``msgs`` to its first unprocessed record.

        The tracked next offsets already point there (every handled record advanced
        them), so the commit that follows names them whatever ``position()`` says.
        """
        self._open.commit_now = True
        if self._interleaver is not None:
            # Not sought: the interleaver still buffers later records of these partitions.
            self._interleaver.unread(msgs, time.monotonic())
            log.warning(
                "epoch cut short: the batch took too long (slow user code?)",
                extra={"records_put_back": len(msgs)},
            )
            return
        first: dict[tuple[str, int], int] = {}
        for msg in msgs:
            if msg.error() is None:
                first.setdefault((msg.topic(), msg.partition()), msg.offset())
        for (topic, part), offset in first.items():
            if part in self._kgs:
                self._consumer.seek(TopicPartition(topic, part, offset))
        self._open.commit_now = True
        log.warning(
            "epoch cut short: the batch took too long (slow user code?)",
            extra={"records_put_back": len(msgs)},
        )

    def _consume_error(self, err: KafkaError) -> None:
        if err.code() == PARTITION_EOF:
            return
        if is_authorization_failure(err):
            # Retrying cannot help until someone grants the ACL: stop (exit 2) naming it.
            group = err.code() == KafkaError.GROUP_AUTHORIZATION_FAILED
            raise authorization_error(
                self._admin.principal if self._admin is not None else None,
                "READ",
                "GROUP" if group else "TOPIC",
                self.name if group else ", ".join(self._inputs),
                f"{err.name()}: {err.str()}",
            )
        if err.fatal() or err.code() == KafkaError._FATAL:  # noqa: SLF001 - public code
            detail = f"consumer: {err.name()}: {err.str()}"
            if "instance ID is still used" in err.str():
                raise _InstanceIdInUse(detail)
            if "fenced by other consumer with same group.instance.id" in err.str():
                raise _StaticMemberFenced(detail)
            raise FatalKafkaError(detail)
        log.warning("consumer error", extra={"error": err.name(), "detail": err.str()})

    def _raise_producer_error(self) -> None:
        """The producer refused an output (not its record's or timer's fault).

        Raises:
            FatalKafkaError: the producer is in a fatal state.
            AbortEpoch: otherwise (the transaction went abortable): replay the epoch.
        """
        err, self._out.producer_error = self._out.producer_error, None
        assert err is not None
        if err.fatal():
            raise FatalKafkaError(f"produce: {err.name()}: {err.str()}")
        raise AbortEpoch(f"produce failed: {err.name()}: {err.str()}")

    def _apply_watermarks(self, update: WatermarkUpdate) -> None:
        """Apply upstream barrier watermarks to the bound key group (timers may fire)."""
        svc = self.app.time_service
        assert svc is not None
        if svc.apply_pending(update.topic, update.checkpoint):
            self._open.active = True
        if self._out.producer_error is not None:  # a timer's output was refused
            self._raise_producer_error()

    def _tick_timers(self) -> None:
        """Fire due processing-time timers; let idleness advance watermarks.

        Raises:
            AbortEpoch: the producer refused an output of a timer.
        """
        svc = self.app.time_service
        assert svc is not None
        now_ms = int(time.time() * 1000)
        self._cursor.now_ms = now_ms
        self._in_each_key_group(lambda: svc.tick(now_ms))

    def _in_each_key_group(self, step: Callable[[], None]) -> None:
        """Run ``step`` bound to each owned key group that is not halted (timers fire).

        Raises:
            AbortEpoch: the producer refused an output of ``step``.
        """
        out_before = self._out.records
        for g, kg in self._kgs.items():
            if g in self._halted:
                continue
            kg.bind()
            self._out.key_group(g)
            step()
            if self._out.producer_error is not None:
                self._raise_producer_error()
        self.metrics.records_out_attempts += self._out.records - out_before

    def _key_state_error(self, raw_key: bytes | None) -> BaseException | None:
        """The encode error of the bound key group's pending writes of ``raw_key``."""
        svc = self.app.time_service
        assert svc is not None
        kg = self._kgs.get(svc.handle.cache.db.key_group)
        return None if kg is None else self._state_write_error(kg.caches, raw_key)

    def _commit_soon(self) -> None:
        self._open.commit_now = True

    def _bad_input(self, msg: Any, exc: BaseException, stage: str, replay: bool = False) -> None:
        """Apply the failure policy (processors/_task/failures.py) to input record ``msg``.

        Raises:
            UserCodeError: under ``LOCKGATE_ON_ERROR=fail``.
            _Rewind: ``replay``: user code ran for it; the epoch is aborted and replayed
                with the record dead-lettered.
        """
        stop = stop_error(self.settings.on_error, f"record {where(msg)}", exc, stage)
        if stop is not None:
            raise stop
        log.warning(
            "bad record: dead-lettering",
            extra={"record": where(msg), "stage": stage, "error": f"{type(exc).__name__}: {exc}"},
        )
        if replay:
            # Its partial state changes and emits must not commit: abort, then replay
            # the epoch and dead-letter this record instead of calling user code.
            self._poison.mark((msg.topic(), msg.partition(), msg.offset()), exc, stage)
            raise _Rewind
        self._out.dead_letter(msg, exc, stage)


def run_app(
    app: App,
    settings: Settings,
    on_started: Callable[[Runner], None] | None = None,
    final_savepoint: FinalSavepointFactory | None = None,
) -> int:
    """Run ``app`` with ``settings`` in this thread; return the exit code.

    ``final_savepoint`` builds a bounded run's final savepoint (required with
    ``LOCKGATE_UNTIL_SAVEPOINT``; ``lockgate run`` passes
    :class:`~processors._ops.bounded_savepoint.BoundedSavepoint`). Its location, when
    ``LOCKGATE_UNTIL_SAVEPOINT`` names one (not ``default``), is the run's
    ``savepoint_dir``.
    """
    location = settings.until_savepoint_dir()
    if location is not None and location != settings.savepoint_dir:
        settings = settings.model_copy(update={"savepoint_dir": location})
    runner = Runner(app, settings)
    runner.final_savepoint_factory = final_savepoint
    if on_started is not None:
        on_started(runner)
    return runner.run()
