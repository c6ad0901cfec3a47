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
"""

from __future__ import annotations

import logging
import time
from typing import Any

import orjson
from confluent_kafka import Producer, TopicPartition

from processors._core import RunnerCore, SlowRecordError, where
from processors._errors import FATAL_STATE, FENCED, AbortEpoch, CallHung, cause_code
from processors._faults import crash_point
from processors._kafka import CONTROL_TOPIC, producer_config
from processors._settings import OnError
from processors.exceptions import FatalKafkaError, UserCodeError
from state.base.store import META_CHANGELOG_PREFIX, META_CHECKPOINT, META_UPDATED_MS
from state.cache import changelog_topic
from state.primitives import DEFAULT_SWEEP_BUDGET, sweep_key_group

log = logging.getLogger("lockgate.runtime")

_MAX_CONSECUTIVE_ABORTS = 10


class EpochMixin(RunnerCore):
    """Commits and aborts epochs (see the module docs for the sequence)."""

    # -- the producer ---------------------------------------------------------------------

    def _open_producer(self) -> None:
        """Create the producer; under exactly-once, fence older incarnations and begin."""
        s = self.settings
        tid = f"{self.name}-{s.instance_id}" if self.eos else None
        pconf = producer_config(s, self.name, tid)
        # Python callbacks for failures only (a callback per record costs ~10%).
        pconf["delivery.report.only.error"] = True
        pconf["on_delivery"] = self._on_delivery_error
        self._producer = Producer(pconf)
        self._produce_fast = self._producer.produce
        if self.eos:
            # Fences an older incarnation with the same id and aborts its open transaction.
            # librdkafka resumes a timed-out init_transactions when it is called again, so
            # the producer is never used before it completes (e.g. while the broker is
            # unreachable); SIGTERM ends the wait (Stopping).
            attempt = 0
            while True:
                attempt += 1
                try:
                    self._call(
                        self._producer.init_transactions,
                        self._txn_timeout_s,
                        what="init_transactions",
                    )
                    break
                except AbortEpoch as exc:
                    log.warning(
                        "init_transactions not complete yet; resuming it",
                        extra={"attempt": attempt, "error": str(exc)},
                    )
                    self._check_stop()
            self._begin()

    def _begin(self) -> None:
        self._producer.begin_transaction()
        self._txn_began = time.monotonic()

    def _timed_out_fence(self, exc: BaseException) -> bool:
        """Whether ``exc`` is the coordinator aborting our own transaction on its timeout.

        True when librdkafka reports a fence (``_FENCED``) and the open transaction is
        older than the transaction timeout (its age is measured from the last commit,
        abort, idle epoch or restore: never shorter than the coordinator's). Any other
        fence is another live instance with our transactional id: never re-initialise
        then, or the two would fence each other back and forth.
        """
        return (
            self.eos
            and cause_code(exc) in (FENCED, FATAL_STATE)
            and time.monotonic() - self._txn_began >= self._txn_timeout_s
        )

    # -- commit ---------------------------------------------------------------------------

    def _owned_partitions(self) -> list[tuple[str, int]]:
        return [(t, g) for g in self._kgs for t in self._inputs]

    def _end_epoch(self) -> None:
        """Commit the open epoch (no-op when nothing happened since the last one).

        Raises:
            AbortEpoch: the transaction must be aborted (the caller aborts and replays).
            FatalKafkaError: fenced, or a record can never be delivered.
            Stopping: a stop was requested while a commit call was retrying.
        """
        self._commit_now = False
        if self._stop_committing:
            return
        if self._ttl_stores:
            # Expired entries nobody reads again: bounded tombstones per epoch (before the
            # idle check, so an idle app is cleaned up too).
            now_ms = int(time.time() * 1000)
            for kg in self._kgs.values():
                sweep_key_group(kg.caches, self._handles, now_ms, DEFAULT_SWEEP_BUDGET)
        if self._uncommitted == 0 and not any(
            c.dirty for kg in self._kgs.values() for c in kg.caches.values()
        ):
            self._reset_epoch_deadline()  # nothing open: the next epoch starts now
            self._txn_began = time.monotonic()
            return
        started = time.monotonic()
        interval = self.settings.checkpoint_interval_ms
        ckpt = max(self._checkpoint + 1, int(time.time() * 1000) // interval)
        meta = orjson.dumps({"ckpt": ckpt}).decode()
        offsets = [
            TopicPartition(t, p, self._next[(t, p)], metadata=meta)
            for t, p in self._owned_partitions()
        ]
        try:
            writes = self._produce_changelogs()
            self._write_barriers_and_checkpoints(ckpt, offsets)
            self._commit(offsets)
        except CallHung as exc:
            # Nothing of this epoch may commit: a new producer fences the stuck one (its
            # transaction is aborted by the new one's init_transactions).
            log.error("%s; replacing the producer", exc)
            self._replace_producer(hung=True)
            raise AbortEpoch(str(exc)) from None
        except FatalKafkaError as exc:
            if not self._timed_out_fence(exc):
                raise
            # The coordinator aborted the transaction on its timeout (a slow record, or a
            # broker that was away longer than the timeout) and bumped the producer epoch:
            # a new producer with the same transactional id takes over.
            self._replace_producer(timed_out=True)
            raise AbortEpoch(f"the transaction outlived its timeout ({exc})") from None
        except AbortEpoch:
            self._producer.poll(0)  # serve delivery reports that explain the abort
            self._raise_if_undeliverable()
            raise
        self._consecutive_aborts = 0
        self._check_writes = False
        self._apply_locally(ckpt, writes)
        for tp in offsets:
            self._committed[(tp.topic, tp.partition)] = tp.offset
        if self._poison:  # dead-lettered records behind the committed positions are done
            self._poison = {
                k: v for k, v in self._poison.items() if k[2] >= self._committed.get(k[:2], 0)
            }
        self._checkpoint = ckpt
        self._last_epoch_records = self._uncommitted
        m = self.metrics
        m.records_in += self._uncommitted
        m.records_out += self._epoch_out
        m.dlq_records += self._epoch_dlq
        self._uncommitted = self._epoch_out = self._epoch_dlq = 0
        if self.eos:
            self._begin()
        self._reset_epoch_deadline()
        took = time.monotonic() - started
        if log.isEnabledFor(logging.DEBUG):
            log.debug(
                "epoch committed",
                extra={"checkpoint": ckpt, "records": self._last_epoch_records, "seconds": took},
            )
        m.epochs_committed += 1
        m.last_checkpoint_id = ckpt
        m.observe_commit(took)
        self._sample_lag(offsets)

    def _produce_changelogs(self) -> dict[int, dict[str, dict[bytes, bytes | None]]]:
        """Produce every dirty key's final value; return the writes per key group."""
        writes: dict[int, dict[str, dict[bytes, bytes | None]]] = {}
        for g, kg in self._kgs.items():
            per_store: dict[str, dict[bytes, bytes | None]] = {}
            for name, cache in kg.caches.items():
                try:
                    changes = cache.drain()
                except Exception as exc:  # noqa: BLE001 - the store's codec may raise anything
                    if self._check_writes:
                        # Already checked record by record: not attributable to one record.
                        raise FatalKafkaError(
                            f"state store {name!r}, key group {g}: a value cannot be encoded "
                            f"with its codec ({type(exc).__name__}: {exc})"
                        ) from exc
                    # Find the record that wrote it: replay the epoch checking each
                    # record's state writes (the culprit is dead-lettered).
                    self._check_writes = True
                    raise AbortEpoch(
                        f"state store {name!r}, key group {g}: a value cannot be encoded "
                        f"({type(exc).__name__}: {exc}); replaying to find the record"
                    ) from exc
                if not changes:
                    continue
                per_store[name] = changes
                topic = changelog_topic(self.name, name)
                for key, value in changes.items():
                    self._produce(topic, value, key, partition=g)
            if per_store:
                writes[g] = per_store
        return writes

    def _commit(self, offsets: list[TopicPartition]) -> None:
        producer = self._producer
        if self.eos:
            crash_point("before_send_offsets")
            self._guarded_call(
                producer.send_offsets_to_transaction,
                offsets,
                self._consumer.consumer_group_metadata(),
                self._txn_timeout_s,
                what="send_offsets_to_transaction",
            )
            crash_point("before_commit")
            self._guarded_call(
                producer.commit_transaction, self._txn_timeout_s, what="commit_transaction"
            )
            return
        with self.metrics.blocked("flush", self._txn_timeout_s):
            remaining = producer.flush(self._txn_timeout_s)
        # At-least-once: any failed delivery (transient ones too) means the offsets must
        # not be committed past it.
        err = self._delivery_error
        self._raise_if_undeliverable()
        if err is not None:
            raise AbortEpoch(f"a delivery failed: {err.name()}: {err.str()}")
        if remaining:
            raise AbortEpoch(f"{remaining} records not delivered within the transaction timeout")
        if offsets:
            self._call(self._consumer.commit, None, offsets, False, what="commit offsets")

    def _apply_locally(
        self, ckpt: int, writes: dict[int, dict[str, dict[bytes, bytes | None]]]
    ) -> None:
        """Write a committed epoch's changes to the local databases."""
        # Success reports are off, so the next changelog offsets come from the broker: only
        # the owner of key group g writes changelog partition g, and all of it is acked.
        assert self._admin is not None
        touched = [
            TopicPartition(changelog_topic(self.name, name), g)
            for g, per_store in writes.items()
            for name in per_store
        ]
        changelog_next = self._admin.end_offsets(touched)
        # Committed: now (and only now) the changes may reach the local databases.
        crash_point("after_commit")
        ckpt_bytes = str(ckpt).encode()
        now_bytes = str(int(time.time() * 1000)).encode()
        for g, per_store in writes.items():
            meta_entries = {META_CHECKPOINT: ckpt_bytes, META_UPDATED_MS: now_bytes}
            for name in per_store:
                nxt = changelog_next.get((changelog_topic(self.name, name), g))
                if nxt is not None:
                    meta_entries[META_CHANGELOG_PREFIX + name.encode()] = str(nxt).encode()
            self._kgs[g].db.apply(per_store, meta_entries)
        for kg in self._kgs.values():  # read-only key groups grow their caches too
            for cache in kg.caches.values():
                cache.trim(self.settings.state_cache_entries)

    def _write_barriers_and_checkpoints(self, ckpt: int, offsets: list[TopicPartition]) -> None:
        by_group: dict[int, dict[str, int]] = {}
        for tp in offsets:
            by_group.setdefault(tp.partition, {})[tp.topic] = tp.offset
        for g in self._kgs:
            writer = f"{self.name}/{g}"
            wm = "-1"  # event time arrives with the watermark issue
            barrier = orjson.dumps({"type": "barrier", "ckpt": ckpt, "writer": writer, "wm": -1})
            headers = [
                ("lockgate-type", b"barrier"),
                ("lockgate-ckpt", str(ckpt).encode()),
                ("lockgate-writer", writer.encode()),
                ("lockgate-wm", wm.encode()),
            ]
            for topic in self._internal_outputs:
                for p in range(self._internal_partitions[topic]):
                    self._produce(topic, barrier, None, partition=p, headers=headers)
            record = {
                "app": self.name,
                "key_group": g,
                "checkpoint": ckpt,
                "instance": self.settings.instance_id,
                "offsets": by_group.get(g, {}),
                "ts": int(time.time() * 1000),
            }
            self._produce(
                CONTROL_TOPIC,
                orjson.dumps(record),
                f"ckpt/{self.name}/{g}".encode(),
                partition=0,
            )

    # -- slow records -----------------------------------------------------------------

    def _replace_producer(self, hung: bool = False, timed_out: bool = False) -> None:
        """Replace a producer that cannot go on (epoch bumped, stuck state or hung call).

        The new producer's ``init_transactions`` (same transactional id) fences the old
        one and aborts its open transaction.
        """
        if not hung:
            try:
                self._producer.flush(1)
            except Exception:  # noqa: BLE001, S110 - the old producer is unusable anyway
                pass
        self._open_producer()
        self._delivery_error = None  # reports of the old producer's aborted records
        self._fresh_producer = True  # nothing is open to abort
        self._timed_out = timed_out  # then the slow record, if any, caused it

    def _poison_slow_record(self) -> None:
        """A record alone outlived the epoch budget and the epoch failed: apply the policy.

        The record is dead-lettered on the replay (``on_error=dlq``) with a
        :class:`SlowRecordError`, so the replay cannot time out on it again.

        Raises:
            UserCodeError: ``LOCKGATE_ON_ERROR=fail`` (the app stops naming the record).
        """
        assert self._slow is not None
        msg, seconds = self._slow
        self._slow = None
        text = (
            f"record {where(msg)} kept user code busy for {seconds:.1f}s, more than the "
            f"epoch budget of {self._budget_s:.1f}s (half of "
            f"LOCKGATE_TRANSACTION_TIMEOUT_MS={self.settings.transaction_timeout_ms})"
        )
        if self.settings.on_error is OnError.FAIL:
            raise UserCodeError(
                f"{text}; raise the timeout or make the handler faster "
                "(LOCKGATE_ON_ERROR=fail; with dlq the record is dead-lettered)"
            )
        log.error("%s: dead-lettering it on the replay", text)
        self._poison[(msg.topic(), msg.partition(), msg.offset())] = (
            SlowRecordError(text),
            "process",
        )

    # -- abort ----------------------------------------------------------------------------

    def _abort_epoch(self, reason: str) -> None:
        """Abort the open epoch: drop uncommitted state, rewind inputs, begin again.

        Raises:
            FatalKafkaError: too many aborts in a row without a commit (a replay loop),
                or another live instance fenced this one. An abort that cannot complete
                (timeout, stuck state, hung call) replaces the producer instead.
        """
        log.warning("aborting epoch", extra={"reason": reason})
        self._consecutive_aborts += 1
        if self._consecutive_aborts > _MAX_CONSECUTIVE_ABORTS and not reason.startswith("user"):
            raise FatalKafkaError(
                f"{self._consecutive_aborts} epochs aborted in a row without a commit "
                f"(last: {reason}); stopping instead of replaying forever"
            )
        self._record_error = None
        self._producer_error = None
        if self.eos and not self._fresh_producer:
            try:
                self._guarded_call(
                    self._producer.abort_transaction,
                    self._txn_timeout_s,
                    what="abort_transaction",
                )
                self._producer.poll(0)  # serve the purge reports of the aborted records now
            except CallHung as exc:
                log.error("%s; replacing the producer", exc)
                self._replace_producer(hung=True)
            except AbortEpoch as exc:
                # Not done within the transaction timeout (e.g. the broker is down): a new
                # producer's init_transactions aborts it instead, resuming until it can.
                log.warning(
                    "abort did not complete; replacing the producer", extra={"error": str(exc)}
                )
                self._replace_producer()
            except FatalKafkaError as exc:
                if cause_code(exc) == FENCED and not self._timed_out_fence(exc):
                    raise  # another live instance has our transactional id
                # The transaction was aborted for us (its timeout, e.g. user code raised
                # after a very slow call) or the producer is in a state it cannot leave
                # (seen after a broker crash: INVALID_TXN_STATE). Either way nothing of
                # this epoch can commit: a new producer fences the old one and begins.
                log.warning("abort failed; replacing the producer", extra={"error": str(exc)})
                self._replace_producer(timed_out=self._timed_out_fence(exc))
        timed_out, self._timed_out = self._timed_out, False
        if timed_out and self._slow is not None:
            self._poison_slow_record()
        fresh, self._fresh_producer = self._fresh_producer, False
        # A permanent delivery failure would fail the replay the same way: stop now.
        self._raise_if_undeliverable()  # transient ones: the replay produces them again
        for kg in self._kgs.values():
            kg.discard()
        self._rewind(list(self._kgs))
        self._uncommitted = self._epoch_out = self._epoch_dlq = 0
        self.metrics.epochs_aborted += 1
        if self.eos and not fresh:
            self._begin()
        self._reset_epoch_deadline()

    def _rewind(self, groups: list[int]) -> None:
        """Seek the inputs of ``groups`` back to their last committed positions."""
        for g in groups:
            for topic in self._inputs:
                offset = self._committed.get((topic, g))
                if offset is None:
                    continue
                self._next[(topic, g)] = offset
                self._rewound.add((topic, g))
                self._seek(topic, g, offset)

    def _sample_lag(self, offsets: list[Any]) -> None:
        lag = 0
        for tp in offsets:
            try:
                _, high = self._consumer.get_watermark_offsets(tp, cached=True)
            except Exception:  # noqa: BLE001, S112 - a gauge, best effort
                continue
            if high >= 0 and tp.offset >= 0:
                lag += max(0, high - tp.offset)
        self.metrics.consumer_lag = lag
