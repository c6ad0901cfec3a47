"""The progress gauges an instance publishes: consumer lag and event-time watermark.

:class:`ProgressGauges` sets ``lockgate_consumer_lag_records``,
``lockgate_partition_lag_records``, ``lockgate_watermark_timestamp_seconds`` and
``lockgate_key_group_watermark_timestamp_seconds`` (through
:class:`~processors._runtime.health.Metrics`) at each commit and, for the lag, every
``LAG_SAMPLE_S`` between commits, so the gauges stay honest when nothing commits (key
groups halted at a stop-with-savepoint, a stuck instance). Gauges are best effort: a value
that cannot be had is left out, never an error.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import Any

from confluent_kafka import TopicPartition

from processors._runtime.health import Metrics
from processors._task.keygroups import KeyGroup
from processors._task.time import NO_WATERMARK, TIME_STORE, TimeService

#: How often the lag gauge is set from the committed offsets between commits (seconds).
LAG_SAMPLE_S = 5.0


class ProgressGauges:
    """Samples lag and watermark into the metrics (the loop thread only).

    Args:
        metrics: where the gauges are published.
        time_service: the app's event-time service (``None``: no watermark gauge).
        consumer: returns the current group consumer (it is replaced on a rejoin).
        committed: offsets in the last committed transaction per owned input partition
            (the runner's live mapping, read only).
        halted: the halted key groups (read only): their partitions are not fetched, so
            their high watermark is asked from the broker.
        kgs: the owned key groups (read only).
    """

    def __init__(
        self,
        metrics: Metrics,
        time_service: TimeService | None,
        consumer: Callable[[], Any],
        committed: Mapping[tuple[str, int], int],
        halted: Mapping[int, Any],
        kgs: Mapping[int, KeyGroup],
    ) -> None:
        self._metrics = metrics
        self._svc = time_service
        self._consumer = consumer
        self._committed = committed
        self._halted = halted
        self._kgs = kgs
        self._next_sample = 0.0

    def at_commit(self, offsets: list[TopicPartition]) -> None:
        """Set the gauges after a commit: lag from the offsets just committed, watermark."""
        self.watermark()
        self._publish_lag(offsets, lambda g: False)

    def between_commits(self) -> None:
        """Set the lag gauge from the committed offsets when ``LAG_SAMPLE_S`` passed.

        Halted partitions are not fetched, so their high watermark is asked for (1 s at
        most each, 2 s in all per sample; past that the last one fetched counts); the
        others' comes from the fetches.
        """
        now = time.monotonic()
        if now < self._next_sample:
            return
        self._next_sample = now + LAG_SAMPLE_S
        asked_until = now + 2.0  # the loop waits at most this long for it
        positions = [TopicPartition(t, g, c) for (t, g), c in list(self._committed.items())]
        halted = self._halted
        self._publish_lag(positions, lambda g: g in halted and time.monotonic() < asked_until)

    def watermark(self) -> None:
        """Set the watermark gauges: the lowest of the owned key groups, and each one's.

        The lowest: idle key groups are left out unless every one is idle (as downstream
        watermarks leave idle writers out); key groups without a watermark yet are left
        out. None (the series is absent) without event time or without any watermark.
        Each key group's watermark and whether it is idle go to
        ``Metrics.key_group_watermarks`` (key groups without a watermark left out), read
        from the same announcement at each commit: nothing per record.
        """
        svc = self._svc
        if svc is None or not svc.strategies:
            return
        active: list[int] = []
        idle: list[int] = []
        per_group: dict[int, tuple[int, bool]] = {}
        for g, kg in list(self._kgs.items()):
            cache = kg.caches.get(TIME_STORE)
            if cache is None:
                continue
            try:
                wm, is_idle = svc.announce(cache)
            except Exception:  # noqa: BLE001, S112 - a gauge, best effort
                continue
            if wm != NO_WATERMARK:
                (idle if is_idle else active).append(wm)
                per_group[g] = (wm, bool(is_idle))
        marks = active or idle
        self._metrics.watermark_ms = min(marks) if marks else None
        # Published whole (a new dict each time): the HTTP thread reads it at scrape time.
        self._metrics.key_group_watermarks = per_group

    def _publish_lag(
        self, positions: list[TopicPartition], ask_broker: Callable[[int], bool]
    ) -> None:
        """Set the lag gauges: each partition's high watermark minus its ``positions`` offset.

        The high watermark is the consumer's cached one (from the fetches), or asked from
        the broker (1 s at most) where ``ask_broker(partition)`` says so. Partitions whose
        watermark cannot be had are left out.
        """
        consumer = self._consumer()
        per_partition: dict[tuple[str, int], int] = {}
        for tp in positions:
            try:
                if ask_broker(tp.partition):
                    _, high = consumer.get_watermark_offsets(
                        TopicPartition(tp.topic, tp.partition), timeout=1.0, cached=False
                    )
                else:
                    _, high = consumer.get_watermark_offsets(tp, cached=True)
            except Exception:  # noqa: BLE001, S112 - a gauge, best effort
                continue
            if high >= 0 and tp.offset >= 0:
                per_partition[(tp.topic, tp.partition)] = max(0, high - tp.offset)
        self._metrics.consumer_lag = sum(per_partition.values())
        self._metrics.partition_lag = per_partition
