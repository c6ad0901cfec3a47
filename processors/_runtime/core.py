"""What every part of the runtime shares: the instance's state and how it produces.

:class:`RunnerCore` holds the attributes the loop (``_runtime``) and the epoch sequence
(``_epoch``) read and write; the rebalance handling (``_rebalance``) is a component
handed what it uses of them. One thread owns all of it; the side thread of the health
server only reads :class:`Metrics`.

Where each owned input partition stands (next and committed offsets, alignment) is
:class:`~processors._checkpoint.input_positions.InputPositions` (``self._positions``):
offsets are tracked there, never read back from the consumer (``position()`` is INVALID
right after a ``seek()`` until the next fetch).
"""

from __future__ import annotations

import logging
from typing import Any

from confluent_kafka import Consumer, KafkaException, TopicPartition

from processors._checkpoint.alignment import Mode
from processors._checkpoint.control_topics import control_topic
from processors._checkpoint.input_positions import InputPositions
from processors._checkpoint.keygroup_state import KeyGroupCheckpoints
from processors._checkpoint.savepoint_requests import SavepointRequests
from processors._checkpoint.txn import WATCHDOG_MARGIN_S
from processors._config.settings import Alignment, Guarantee, Settings, StateBackendKind
from processors._dsl.app import App
from processors._kafka.clients import Admin, restore_consumer_config
from processors._kafka.errors import (
    Stopping,
    kafka_call,
)
from processors._runtime.bounded_end import EverySavepoint, SavepointRules
from processors._runtime.checkpoint_writer import CheckpointWriter
from processors._runtime.gauges import ProgressGauges
from processors._runtime.health import Metrics
from processors._runtime.open_epoch import OpenEpoch
from processors._runtime.output import OutputWriter
from processors._runtime.savepoint_files import SavepointFiles
from processors._runtime.timer_guard import TimerGuard
from processors._sinks import Sinks
from processors._task.failures import ReplayPoison
from processors._task.global_tables import GlobalTables
from processors._task.interleave import Interleaver
from processors._task.keygroups import (
    KeyGroup,
    MemoryPlan,
    Restorer,
    StateCleaner,
    StateMemory,
    cgroup_memory_limit,
)
from state.base.store import StateBackend
from state.cache import DELETED, MISSING
from state.memory.store import MemoryBackend
from state.rocksdb.store import RocksDBBackend

log = logging.getLogger("lockgate.runtime")


class StateEncodeError(Exception):
    """User code stored a value its store's codec cannot encode (e.g. a set under JSON)."""


class SlowRecordError(Exception):
    """One record kept user code busy longer than the transaction can stay open."""


def where(msg: Any) -> str:
    """Return ``topic[partition]@offset`` of a record."""
    return f"{msg.topic()}[{msg.partition()}]@{msg.offset()}"


class RunnerCore:
    """The state of one instance, shared by the loop, epochs and rebalances."""

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
        #: Orders the records of several co-partitioned inputs (``None``: one input).
        self._interleaver: Interleaver | None = None
        self._globals: GlobalTables = GlobalTables({}, settings, self.name, self.metrics)
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
