"""Bounded runs: process the inputs up to a bound, drain event time, commit, exit 0.

``lockgate run MODULE:APP --until BOUND`` (``LOCKGATE_UNTIL``) is Flink's bounded
execution for a Kafka source: each input partition gets an end offset when the instance
starts, records at or past it are never processed, and once every owned key group reached
its ends the instance advances event time to the end (the final watermark: every window
fires, every event-time timer runs; ``--no-drain`` skips this), commits, and stops with
exit code 0. The bound is one of:

* ``now`` — each partition's last stable offset at start (what ``read_committed`` could
  read then: records of transactions still open then are not included);
* a time (ms since the epoch, or ISO 8601; without an offset UTC) — the records with a
  timestamp before it (per partition: the first offset at or after that time; a partition
  without such a record ends at its last stable offset at start);
* ``offsets:TOPIC:P=O,P=O[;TOPIC:...]`` — explicit end offsets (the record at ``O`` is not
  processed); partitions not named end at their last stable offset at start.

Contract: the committed output is the same as an unbounded run's up to the bound, once
(the usual epoch protocol: a crash before the final commit replays from the last
checkpoint; the next run with the same bound finds nothing left and exits 0 at once).
The drain is final: event time stays at its end in the state, so records of a later run
older than it are late (``late_topic``) — run with ``--no-drain`` when later runs continue
the same event time. Apps that read internal topics of other lockgate apps are refused
(their end is the upstream's barriers, not an offset).

With ``--savepoint`` (``LOCKGATE_UNTIL_SAVEPOINT``) the run ends with a savepoint of the app
instead of stopping at once: processors/_runtime/final_savepoint.py (what the runtime
sees of it) and processors/_ops/bounded_savepoint.py (the semantics).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from confluent_kafka import TopicPartition

from processors._config.times import time_ms
from processors._kafka.clients import PARTITION_EOF, Admin
from processors.exceptions import ConfigError

log = logging.getLogger("lockgate.runtime")

#: The final watermark of a drained bounded run: every event-time timer is at or below it.
END_OF_TIME = 2**63 - 1


@dataclass(frozen=True)
class Bound:
    """A parsed ``--until``.

    Attributes:
        text: as given.
        time_ms: records with a timestamp before it (``None``: not a time bound).
        offsets: explicit end offsets by (topic, partition).
    """

    text: str
    time_ms: int | None = None
    offsets: dict[tuple[str, int], int] = field(default_factory=dict)


def parse_until(text: str) -> Bound:
    """Parse a ``--until`` bound (see the module docs).

    Raises:
        ConfigError: not ``now``, a time, or ``offsets:...`` with valid numbers.
    """
    value = text.strip()
    if value == "now":
        return Bound(value)
    if value.startswith("offsets:"):
        offsets: dict[tuple[str, int], int] = {}
        for part in value[len("offsets:") :].split(";"):
            topic, sep, pairs = part.rpartition(":")
            if not sep or not topic or not pairs:
                raise ConfigError(
                    f"--until {text!r}: expected offsets:TOPIC:P=O,P=O[;TOPIC:P=O...]"
                )
            for pair in pairs.split(","):
                p, eq, o = pair.partition("=")
                if not eq or not p.strip().isdigit() or not o.strip().isdigit():
                    raise ConfigError(
                        f"--until {text!r}: {pair!r} is not PARTITION=OFFSET (non-negative "
                        "integers)"
                    )
                offsets[(topic, int(p))] = int(o)
        return Bound(value, offsets=offsets)
    ms = time_ms(value)
    if ms is None:
        raise ConfigError(
            f"--until {text!r}: expected now, a time (ms since the epoch or ISO 8601, e.g. "
            "2026-01-31T12:00:00Z) or offsets:TOPIC:P=O,..."
        )
    return Bound(value, time_ms=ms)


class BoundedRun:
    """The end offsets of a bounded run and when an instance has reached them.

    Args:
        bound: the parsed bound.
        ends: the offset each input partition stops before.
    """

    def __init__(self, bound: Bound, ends: Mapping[tuple[str, int], int]) -> None:
        self.bound = bound
        self.ends = dict(ends)
        #: Per input topic, the end of each partition (the per-batch trim reads it).
        self._by_topic: dict[str, dict[int, int]] = {}
        #: Per partition: the highest offset (a record past the end, or a partition-end
        #: event) before which every record was delivered, and the last record delivered
        #: below the end (offsets never change: stale values stay true after a rewind).
        self._evidence: dict[tuple[str, int], int] = {}
        self._delivered: dict[tuple[str, int], int] = {}
        for (t, p), end in self.ends.items():
            self._by_topic.setdefault(t, {})[p] = end

    @classmethod
    def plan(cls, bound: Bound, admin: Admin, inputs: Sequence[str], partitions: int) -> BoundedRun:
        """Read the end offsets of every input partition for ``bound`` (at start).

        Raises:
            ConfigError: ``offsets:`` names a topic that is not an input or a partition
                out of range.
            FatalKafkaError: the offsets could not be read.
        """
        tps = [TopicPartition(t, p) for t in inputs for p in range(partitions)]
        stable = admin.stable_offsets(tps)
        ends = dict(stable)
        if bound.time_ms is not None:
            at = admin.offsets_for_time(tps, bound.time_ms)
            for tp, offset in at.items():
                if offset >= 0:
                    ends[tp] = min(offset, stable[tp])
        for (t, p), offset in bound.offsets.items():
            if t not in inputs or not 0 <= p < partitions:
                raise ConfigError(
                    f"--until {bound.text!r}: {t}[{p}] is not an input partition of the app "
                    f"(inputs {list(inputs)}, {partitions} partitions each)"
                )
            ends[(t, p)] = offset
        return cls(bound, ends)

    def trim(self, msgs: list[Any]) -> list[Any]:
        """Drop the fetched records at or past their partition's end; note the evidence.

        A record at or past the end, or a partition-end event, proves that every record
        before it was delivered (a partition's records arrive in offset order, and under
        ``read_committed`` nothing below the last stable offset changes): the partition is
        done once the last record delivered before it is processed. Errors are kept.
        """
        by_topic = self._by_topic
        evidence = self._evidence
        delivered = self._delivered
        kept = []
        for m in msgs:
            ends = by_topic.get(m.topic())
            if ends is None:
                kept.append(m)
                continue
            tp = (m.topic(), m.partition())
            err = m.error()
            if err is not None:
                if err.code() == PARTITION_EOF and m.offset() > evidence.get(tp, -1):
                    evidence[tp] = m.offset()
                kept.append(m)
                continue
            offset = m.offset()
            if offset >= ends.get(m.partition(), 0):
                if offset > evidence.get(tp, -1):
                    evidence[tp] = offset
                continue
            if offset > delivered.get(tp, -1):
                delivered[tp] = offset
            kept.append(m)
        return kept

    def reached(
        self,
        owned: Iterable[tuple[str, int]],
        next_offsets: Mapping[tuple[str, int], int],
        buffered: Mapping[tuple[str, int], int],
    ) -> bool:
        """Whether every owned input partition was processed up to its end.

        A partition is done when its next record to process is at or past its end, or
        when :meth:`trim` saw the proof that nothing before the end is left to deliver
        (transaction markers or aborted records fill the gap) and the last record
        delivered before it was processed and is not waiting in a buffer.

        Args:
            owned: the owned input partitions (topic, partition).
            next_offsets: the next record to process of each owned input partition.
            buffered: records fetched but not processed yet (the interleaver's), per
                partition.
        """
        for tp in owned:
            end = self.ends.get(tp)
            nxt = next_offsets.get(tp, 0)
            if end is None or nxt >= end:
                continue
            if (
                self._evidence.get(tp, -1) >= end
                and nxt > self._delivered.get(tp, -1)
                and not buffered.get(tp)
            ):
                continue
            return False
        return True
