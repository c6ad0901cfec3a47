"""Global tables: topics every instance reads whole, applied between batches.

At start-up each global table is read from its log start to its end (as of then), before
the instance joins the group, so ``/readyz`` stays false until they are loaded. Afterwards
new records are applied on the loop's thread between batches (``poll``), so a handler
never sees a half-applied record. Each key group's checkpoint record names the positions
its committed state was computed with; a key group taken over later first reads the
tables at least that far (``catch_up``), so no key group goes back to older reference
data than it already used. Which version of a global table a record sees is timing, not
part of the exactly-once contract (as in Kafka Streams' GlobalKTable): documented in
docs/joins.md.
"""

from __future__ import annotations

import logging
import time
from typing import Any, Protocol

from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, TopicPartition

from processors._config.settings import Settings
from processors._kafka.clients import Admin, restore_consumer_config
from processors._kafka.errors import Stopping
from processors.exceptions import FatalKafkaError, TopicError
from processors.joins import GlobalTable

log = logging.getLogger("lockgate.globals")

_EOF = KafkaError._PARTITION_EOF  # noqa: SLF001 - public code
_PROGRESS_S = 5.0
_REFRESH_S = 30.0


class LoadProgress(Protocol):
    """What the global-table reader reports while it loads (``Metrics`` provides it)."""

    globals_loading: bool

    def beat(self) -> None:
        """Record progress (liveness) during a long load."""


class GlobalTables:
    """The app's global tables and the consumer that keeps them current."""

    def __init__(
        self, tables: dict[str, GlobalTable], settings: Settings, app: str, metrics: LoadProgress
    ) -> None:
        self.tables = tables
        self._settings = settings
        self._app = app
        self._metrics = metrics
        self._consumer: Any = None
        self._admin: Admin | None = None
        #: When :meth:`refresh` looks for partitions added to the tables' topics next.
        self.next_refresh = time.monotonic() + _REFRESH_S
        #: Next offset to read, per (topic, partition).
        self.positions: dict[tuple[str, int], int] = {}
        self.skipped = 0  # undecodable records (logged, not applied)

    def __bool__(self) -> bool:
        return bool(self.tables)

    def load(self, admin: Admin, timeout_s: float, should_stop: Any) -> None:
        """Read every global table to its current end.

        Raises:
            TopicError: a global table's topic does not exist.
            FatalKafkaError: a table could not be read to its end within ``timeout_s``
                after the last progress (e.g. an open transaction that never ends).
            Stopping: a stop was requested.
        """
        if not self.tables:
            return
        self._admin = admin
        parts = admin.partitions_of(list(self.tables))
        missing = [t for t in self.tables if t not in parts]
        if missing:
            raise TopicError(
                f"global table topic(s) {', '.join(missing)} do not exist: create them first "
                "(lockgate never creates input topics)"
            )
        tps = [TopicPartition(t, p) for t in self.tables for p in range(parts[t])]
        ends = admin.end_offsets(tps)
        conf = restore_consumer_config(self._settings, self._app)
        conf["client.id"] = f"{self._app}-{self._settings.instance_id}-globals"
        self._consumer = Consumer(conf)
        self._consumer.assign(
            [TopicPartition(tp.topic, tp.partition, OFFSET_BEGINNING) for tp in tps]
        )
        for tp in tps:
            self.positions[(tp.topic, tp.partition)] = 0
        self._metrics.globals_loading = True
        started = time.monotonic()
        try:
            self._read_until(ends, timeout_s, should_stop, "loading")
        finally:
            self._metrics.globals_loading = False
        log.info(
            "global tables loaded",
            extra={
                "tables": {t: len(g) for t, g in self.tables.items()},
                "seconds": round(time.monotonic() - started, 3),
                "skipped": self.skipped,
            },
        )

    def catch_up(
        self,
        required: dict[str, dict[str, int]] | None,
        timeout_s: float,
        should_stop: Any = lambda: False,
    ) -> None:
        """Read the tables at least to ``required`` (``{topic: {partition: offset}}``).

        Raises:
            FatalKafkaError: not reached within ``timeout_s`` after the last progress.
        """
        if not required or self._consumer is None:
            return
        want = {
            (t, int(p)): int(o)
            for t, per in required.items()
            if t in self.tables
            for p, o in per.items()
            if self.positions.get((t, int(p)), 0) < int(o)
        }
        if not want or self._admin is None:
            return
        # A recreated or truncated topic may never reach the recorded positions, and a
        # partition may have been added since this instance looked.
        counts = self._admin.partitions_of_each(sorted({t for t, _ in want}), timeout=10)
        gone = [k for k in want if k[1] >= counts.get(k[0], 0)]
        for key in gone:
            log.warning(
                "a checkpoint names a global-table partition that does not exist (any more)",
                extra={"partition": f"{key[0]}[{key[1]}]"},
            )
            del want[key]
        ends = self._admin.end_offsets([TopicPartition(t, p) for t, p in want])
        for key, needed in list(want.items()):
            end = ends.get(key, 0)
            if needed > end:
                log.warning(
                    "a checkpoint names a global-table position beyond the topic's end "
                    "(recreated or truncated?): reading to the end instead",
                    extra={"partition": f"{key[0]}[{key[1]}]", "recorded": needed, "end": end},
                )
                want[key] = end
        new = [k for k in want if k not in self.positions]
        if new:
            self._add_partitions(new)
        want = {k: o for k, o in want.items() if self.positions.get(k, 0) < o}
        if want:
            self._read_until(want, timeout_s, should_stop, "catching up")

    def refresh(self) -> None:
        """Start reading partitions added to the tables' topics since the last look."""
        self.next_refresh = time.monotonic() + _REFRESH_S
        if self._admin is None:
            return
        try:
            counts = self._admin.partitions_of_each(list(self.tables), timeout=5)
        except Exception as exc:  # noqa: BLE001 - metadata may be briefly unavailable
            log.debug("global table metadata refresh failed: %s", exc)
            return
        new = [(t, p) for t, n in counts.items() for p in range(n) if (t, p) not in self.positions]
        if new:
            log.info("global table partitions added: reading them", extra={"partitions": new})
            self._add_partitions(new)

    def _add_partitions(self, keys: list[tuple[str, int]]) -> None:
        self._consumer.incremental_assign([TopicPartition(t, p, OFFSET_BEGINNING) for t, p in keys])
        for key in keys:
            self.positions[key] = 0

    def _read_until(
        self, ends: dict[tuple[str, int], int], timeout_s: float, should_stop: Any, what: str
    ) -> None:
        pending = {k for k, end in ends.items() if self.positions.get(k, 0) < end}
        last_progress = time.monotonic()
        next_log = last_progress + _PROGRESS_S
        while pending:
            if should_stop():
                raise Stopping(f"{what} global tables")
            before = {k: self.positions.get(k, 0) for k in pending}
            self._consume(1000, 0.1)
            now = time.monotonic()
            if any(self.positions.get(k, 0) != o for k, o in before.items()):
                last_progress = now  # progress on what is awaited, not on any partition
            pending = {k for k in pending if self.positions.get(k, 0) < ends[k]}
            self._metrics.beat()
            if pending and now - last_progress > timeout_s:
                raise FatalKafkaError(
                    f"{what} global tables: no progress for {timeout_s:.0f}s, still behind on "
                    f"{sorted(pending)[:5]} (an open transaction that never ends?)"
                )
            if pending and now >= next_log:
                next_log = now + _PROGRESS_S
                left = sum(ends[k] - self.positions.get(k, 0) for k in pending)
                log.info(f"{what} global tables", extra={"records_left": left})

    def poll(self) -> None:
        """Apply the records that arrived since the last call (never blocks)."""
        if self._consumer is not None:
            self._consume(500, 0)

    def _consume(self, n: int, timeout: float) -> None:
        positions = self.positions
        for msg in self._consumer.consume(n, timeout):
            err = msg.error()
            key = (msg.topic(), msg.partition())
            if err is not None:
                if err.code() == _EOF:
                    # The end as the consumer sees it: past trailing transaction markers.
                    off = msg.offset()
                    if off is not None and off > positions.get(key, 0):
                        positions[key] = off
                    continue
                if err.fatal():
                    raise FatalKafkaError(f"reading global table {key[0]}: {err}")
                log.warning("global table consumer error", extra={"error": err.str()})
                continue
            table = self.tables[msg.topic()]
            try:
                table.apply(msg.key(), msg.value(), msg.timestamp()[1])
            except Exception as exc:  # noqa: BLE001 - codecs may raise anything
                self.skipped += 1
                log.warning(
                    "global table record cannot be decoded: skipped",
                    extra={
                        "record": f"{msg.topic()}[{msg.partition()}]@{msg.offset()}",
                        "error": f"{type(exc).__name__}: {exc}",
                    },
                )
            positions[key] = msg.offset() + 1

    def snapshot(self) -> dict[str, dict[str, int]]:
        """Positions for a checkpoint record: ``{topic: {partition: next offset}}``."""
        out: dict[str, dict[str, int]] = {}
        for (topic, part), off in self.positions.items():
            out.setdefault(topic, {})[str(part)] = off
        return out

    def close(self) -> None:
        """Close the consumer (best effort)."""
        if self._consumer is not None:
            try:
                self._consumer.close()
            except Exception as exc:  # noqa: BLE001 - best effort on the way out
                log.debug("global table consumer close failed: %s", exc)
            self._consumer = None
