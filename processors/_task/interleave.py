"""Deterministic interleaving of a key group's co-partitioned inputs.

Key group ``g`` owns partition ``g`` of every input. Fetches of different partitions
arrive in any order and any batch size, so processing them as fetched would make a
join's result depend on timing. The :class:`Interleaver` buffers fetched records per
partition and releases, per key group, the head with the smallest record timestamp
(ties: the input declared first), each partition in offset order — only while every
input of the group has a buffered head. When one has none, the group waits:

* up to ``idle_s`` (``LOCKGATE_MAX_IDLE_MS``) after its oldest waiting record arrived
  if that input is *caught up* (the consumer reported the partition's end since its
  last record): covers a record produced just before, whose fetch is still on its way;
* up to ``fetch_wait_s`` (``LOCKGATE_MAX_FETCH_WAIT_MS``) if the input is known to have
  unfetched records (no end reported since its last record), counted from when the group
  first waited on it and reset whenever it delivers: a replay or a catch-up reads both
  inputs' backlogs in the same order as the live run did, however long it takes, as long
  as each input keeps delivering.

Past the bound the group goes on without that input until it delivers again. Control
records (barriers) are released when they reach the head of their partition, whatever
their timestamp. Buffered records are not processed: they
are neither counted in offsets nor committed, so after a crash they are fetched again.
"""

from __future__ import annotations

from collections import deque
from typing import Any

from confluent_kafka import KafkaError

from processors._checkpoint.protocol import is_control_record

PARTITION_EOF = KafkaError._PARTITION_EOF  # noqa: SLF001 - public code


class Interleaver:
    """Buffers fetched records per input partition; releases them in timestamp order."""

    def __init__(self, inputs: tuple[str, ...], idle_s: float, fetch_wait_s: float) -> None:
        self.inputs = inputs
        self._rank = {t: i for i, t in enumerate(inputs)}
        self.idle_s = idle_s
        self.fetch_wait_s = fetch_wait_s
        #: key group -> one queue per input (in declared order).
        self._queues: dict[int, list[deque[tuple[float, Any]]]] = {}
        #: Partitions whose end the consumer reported after their last fetched record.
        self._at_end: set[tuple[str, int]] = set()
        #: (key group, input index) -> when the group began waiting on that input, empty
        #: and not at its end (cleared when it delivers).
        self._empty_since: dict[tuple[int, int], float] = {}
        self._buffered = 0

    def __len__(self) -> int:
        """Records buffered, not yet released."""
        return self._buffered

    def _group(self, g: int) -> list[deque[tuple[float, Any]]]:
        queues = self._queues.get(g)
        if queues is None:
            queues = self._queues[g] = [deque() for _ in self.inputs]
        return queues

    def push(self, msgs: list[Any], now: float) -> list[Any]:
        """Buffer fetched records; return the consumer errors among them (not buffered).

        Partition-end events mark their partition caught up; they are consumed here.
        """
        errors: list[Any] = []
        rank = self._rank
        for msg in msgs:
            err = msg.error()
            topic = msg.topic()
            if err is not None:
                if err.code() == PARTITION_EOF and topic in rank:
                    self._at_end.add((topic, msg.partition()))
                else:
                    errors.append(msg)
                continue
            g = msg.partition()
            i = rank[topic]
            self._group(g)[i].append((now, msg))
            self._at_end.discard((topic, g))
            self._empty_since.pop((g, i), None)
            self._buffered += 1
        return errors

    def unread(self, msgs: list[Any], now: float) -> None:
        """Put released but unprocessed records back at the front, in their order."""
        for msg in reversed(msgs):
            if msg.error() is None:
                self._group(msg.partition())[self._rank[msg.topic()]].appendleft((now, msg))
                self._buffered += 1

    def drop(self, groups: list[int]) -> None:
        """Forget the buffered records of ``groups`` (rewound, revoked or lost)."""
        for g in groups:
            queues = self._queues.pop(g, None)
            if queues is not None:
                self._buffered -= sum(len(q) for q in queues)
            for i, topic in enumerate(self.inputs):
                self._at_end.discard((topic, g))
                self._empty_since.pop((g, i), None)

    def backlog(self) -> dict[tuple[str, int], int]:
        """Buffered records per input partition (non-empty ones only)."""
        return {
            (self.inputs[i], g): len(q)
            for g, queues in self._queues.items()
            for i, q in enumerate(queues)
            if q
        }

    def drop_partition(self, topic: str, g: int) -> None:
        """Forget the buffered records of one input partition (it is sought elsewhere)."""
        queues = self._queues.get(g)
        if queues is not None:
            q = queues[self._rank[topic]]
            self._buffered -= len(q)
            q.clear()
        self._at_end.discard((topic, g))
        self._empty_since.pop((g, self._rank[topic]), None)

    def pop(self, now: float) -> list[Any]:
        """Release every record that may go now, in processing order."""
        out: list[Any] = []
        inputs = self.inputs
        at_end = self._at_end
        for g, queues in self._queues.items():
            while True:
                best = -1
                best_ts = 0
                oldest = now
                blocked = False
                for i, q in enumerate(queues):
                    if not q:
                        continue
                    arrived, msg = q[0]
                    oldest = min(oldest, arrived)
                    headers = msg.headers()
                    if headers is not None and is_control_record(headers):
                        best = i
                        break
                    ts = msg.timestamp()[1]
                    if best < 0 or ts < best_ts:
                        best, best_ts = i, ts
                if best < 0:
                    break  # nothing buffered in this group
                if not _is_head_control(queues[best]):
                    for i, q in enumerate(queues):
                        if q:
                            continue
                        if (inputs[i], g) in at_end:
                            # Caught up: wait for a record produced just before the head.
                            blocked = blocked or now - oldest < self.idle_s
                        else:  # records in Kafka not fetched yet
                            since = self._empty_since.setdefault((g, i), now)
                            blocked = blocked or now - since < self.fetch_wait_s
                if blocked:
                    break
                out.append(queues[best].popleft()[1])
        self._buffered -= len(out)
        return out


def _is_head_control(q: deque[tuple[float, Any]]) -> bool:
    msg = q[0][1]
    headers = msg.headers()
    return headers is not None and is_control_record(headers)
