"""A backfill task's Kafka input: its key group's offset ranges, in live order.

Each input partition of the key group is read with read_committed from its range's start
to its end (transaction markers and aborted records leave gaps that the reader steps
over). Several co-partitioned inputs are merged as the live runtime's interleaver does:
the smallest record timestamp at the heads first, ties to the input declared first, each
partition in offset order. A partition far ahead of the others is paused.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Iterator
from typing import Any

from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition

from processors._checkpoint.protocol import is_control_record
from processors._config.settings import Settings
from processors._kafka.clients import restore_consumer_config
from processors._spark.backfill_spec import TaskSpec

__all__ = ["kafka_steps"]

#: A partition that neither delivers nor reports its end for this long fails the task.
_STALL_S = 120.0
#: Buffered records per input partition above which it is paused (multi-input merge).
_PAUSE_AT = 20_000
_RESUME_AT = 2_000


def kafka_steps(settings: Settings, spec: TaskSpec, inputs: tuple[str, ...]) -> Iterator[Any]:
    """Yield the key group's input records in live order (see the module docs).

    Control records (barriers of upstream lockgate apps) are skipped.

    Raises:
        TimeoutError: a partition neither delivered nor reported its end for 120 s.
        KafkaException: the consumer failed.
    """
    g = spec.key_group
    ranges = {r.topic: r for r in spec.ranges if r.end > r.start}
    if not ranges:
        return
    conf = restore_consumer_config(settings, spec.app_name)
    conf["client.id"] = f"{spec.app_name}-backfill-{g}"
    conf["fetch.wait.max.ms"] = 100
    conf["auto.offset.reset"] = "error"  # a start deleted by retention fails, never skips
    consumer = Consumer(conf)
    rank = {t: i for i, t in enumerate(inputs)}
    queues: dict[str, deque[Any]] = {t: deque() for t in ranges}
    done: set[str] = set()
    paused: set[str] = set()
    try:
        consumer.assign([TopicPartition(t, g, r.start) for t, r in ranges.items()])
        deadline = time.monotonic() + _STALL_S

        def fetch() -> None:
            nonlocal deadline
            msgs = consumer.consume(1000, 0.5)
            if not msgs and time.monotonic() > deadline:
                waiting = sorted(t for t in ranges if t not in done)
                raise TimeoutError(
                    f"key group {g}: {waiting} delivered nothing and reported no end for "
                    f"{_STALL_S:.0f}s (topic deleted or truncated?)"
                )
            for msg in msgs:
                topic = str(msg.topic())
                if topic in done:
                    continue
                end = ranges[topic].end
                offset = msg.offset() or 0
                err = msg.error()
                if err is not None:
                    if err.code() == KafkaError._PARTITION_EOF:  # noqa: SLF001 - public code
                        if offset >= end:  # past any marker gap: nothing more below end
                            done.add(topic)
                        continue
                    if err.code() == KafkaError._AUTO_OFFSET_RESET:  # noqa: SLF001
                        raise RuntimeError(
                            f"key group {g}: {topic} offset {ranges[topic].start} is no longer "
                            f"in the log (deleted by retention?): {err.str()}"
                        )
                    raise KafkaException(err)
                deadline = time.monotonic() + _STALL_S
                if offset >= end:
                    done.add(topic)
                    continue
                headers = msg.headers()  # None without headers: no check (as live)
                if headers is None or not is_control_record(headers):
                    queues[topic].append(msg)
                if offset == end - 1:
                    done.add(topic)
                if len(queues[topic]) > _PAUSE_AT and topic not in paused:
                    consumer.pause([TopicPartition(topic, g)])
                    paused.add(topic)
            for topic in list(paused):
                if len(queues[topic]) < _RESUME_AT:
                    consumer.resume([TopicPartition(topic, g)])
                    paused.discard(topic)

        if len(ranges) == 1:  # one input: its partition in offset order
            (only,) = ranges
            q = queues[only]
            while True:
                while not q and only not in done:
                    fetch()
                if not q:
                    return
                yield q.popleft()
        while True:
            # Every input that can still deliver must show its head before one is taken.
            while any(not queues[t] and t not in done for t in ranges):
                fetch()
            heads = [(q[0].timestamp()[1], rank[t], t) for t, q in queues.items() if q]
            if not heads:
                return
            _, _, topic = min(heads)
            yield queues[topic].popleft()
    finally:
        consumer.close()
