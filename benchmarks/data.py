"""Inputs (pre-produced once, with a model of the expected results) and output checks."""

from __future__ import annotations

import heapq
import random
import time
from array import array
from bisect import bisect_left
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import orjson
from confluent_kafka import Consumer, KafkaError, TopicPartition

from benchmarks.admin import Admin
from benchmarks.producers import input_producer
from benchmarks.progress import say
from processors import key_group

PAD = "x" * 60  # key (8 B) + value (~92 B) = ~100 B per record


def key_of(i: int) -> bytes:
    """The key of key index ``i`` (8 bytes)."""
    return b"k%07d" % i


@dataclass
class Dataset:
    """One pre-produced input topic and what a correct run must output for it."""

    kind: str  # "numbers" (passthrough / running sum) or "events" (tumbling window)
    topic: str
    records: int
    keys: int
    partitions: int
    produce_seconds: float = 0.0
    bytes_total: int = 0
    # numbers: final sum and count per key index
    sums: list[int] = field(default_factory=list)
    counts: list[int] = field(default_factory=list)
    # events: (key index, window start ms) -> count, for every window a correct run closes
    window_ms: int = 0
    delay_ms: int = 0  # bounded out-of-orderness of the event times (and of the watermark)
    windows: int = 0
    closed: dict[tuple[int, int], int] = field(default_factory=dict)
    t0_ms: int = 0
    # events: input records between the first and the last record that closes a window
    trigger_span: int = 0
    # events: windows open per key group after each record (mean over records, peak)
    open_mean: float = 0.0
    open_max: int = 0


def produce_numbers(
    admin: Admin, topic: str, records: int, keys: int, partitions: int, seed: int = 7
) -> Dataset:
    """Produce ``records`` running-sum inputs over ``keys`` keys; return the model."""
    admin.create({topic: partitions}, {"retention.ms": "-1"})
    rng = random.Random(seed)
    sums = [0] * keys
    counts = [0] * keys
    p = input_producer(admin.bootstrap)
    produce = p.produce
    dumps = orjson.dumps
    started = time.monotonic()
    total = 0
    for seq in range(records):
        k = rng.randrange(keys)
        v = rng.randrange(100)
        sums[k] += v
        counts[k] += 1
        value = dumps({"v": v, "seq": seq, "pad": PAD})
        key = key_of(k)
        total += len(value) + len(key)
        while True:
            try:
                produce(topic, value, key)
                break
            except BufferError:
                p.poll(0.05)
        if seq % 20_000 == 0:
            p.poll(0)
    if p.flush(120) != 0:
        raise RuntimeError(f"could not produce every input record to {topic}")
    took = time.monotonic() - started
    say(f"  produced {records:,} records to {topic} in {took:.1f}s ({records / took:,.0f}/s)")
    return Dataset("numbers", topic, records, keys, partitions, took, total, sums, counts)


def event_times(
    records: int,
    keys: int,
    windows: int,
    window_ms: int,
    delay_ms: int,
    t0: int,
    seed: int = 11,
) -> Iterator[tuple[int, int]]:
    """The (key index, event time ms) of each window input record, in production order.

    Event time rises with the sequence number over ``windows`` windows of ``window_ms``
    from ``t0``; with ``delay_ms`` > 0 each record is moved back by a uniformly random
    0..``delay_ms`` ms (never before ``t0``): bounded out-of-orderness, so a record is at
    most ``delay_ms`` older than any record produced before it (in its partition too),
    and no record is late for a watermark of ``max seen - delay_ms - 1``.
    """
    rng = random.Random(seed)
    span = windows * window_ms
    for seq in range(records):
        k = rng.randrange(keys)
        ts = t0 + seq * span // records
        if delay_ms:
            ts = max(t0, ts - rng.randrange(delay_ms + 1))
        yield k, ts


class WindowModel:
    """What a tumbling-window count per key must output, with partition watermarks.

    The semantics of lockgate's window operator (``processors/windows.py``) with
    ``Watermarks.bounded(delay_ms)`` and allowed lateness 0, and of Quix Streams'
    ``tumbling_window(grace_ms=delay_ms).count().final(closing_strategy="partition")``:
    the watermark of a partition (key group) is the highest event time seen on it minus
    ``delay_ms`` (minus 1 in lockgate, whose windows fire at ``end - 1``); window
    ``[start, end)`` of any key of the partition closes, with every record counted so
    far, after the first record that takes the partition's highest event time to
    ``end + delay_ms`` or beyond. A record whose window closed before it is late
    (dropped, counted in ``late``). Records must be fed in each partition's order.

    Also tracked, per key group: the windows open (created, not yet closed) after each
    record, i.e. the window operator's state size, and the records that close windows.
    """

    def __init__(self, partitions: int, window_ms: int, delay_ms: int) -> None:
        self.partitions = partitions
        self.window_ms = window_ms
        self.delay_ms = delay_ms
        self.counts: dict[tuple[int, int], int] = {}
        self.part: dict[int, int] = {}  # key index -> partition
        self.max_ts = [-1] * partitions
        self._pending: list[dict[int, int]] = [{} for _ in range(partitions)]  # end -> n
        self._ends: list[list[int]] = [[] for _ in range(partitions)]  # heap of ends
        self.open = [0] * partitions
        self.open_sum = 0
        self.open_max = 0
        self.records = 0
        self.late = 0
        self.first_trigger = -1
        self.last_trigger = -1

    def add(self, seq: int, k: int, partition: int, ts: int) -> None:
        """Record ``seq`` of key ``k`` (in ``partition``) at event time ``ts``."""
        w = self.window_ms
        p = partition
        start = ts - ts % w
        self.records += 1
        if start + w <= self.max_ts[p] - self.delay_ms:
            self.late += 1
            self.open_sum += self.open[p]
            return
        self.part[k] = p
        kw = (k, start)
        c = self.counts.get(kw)
        if c is None:
            self.counts[kw] = 1
            end = start + w
            pending = self._pending[p]
            n = pending.get(end)
            if n is None:
                pending[end] = 1
                heapq.heappush(self._ends[p], end)
            else:
                pending[end] = n + 1
            self.open[p] += 1
        else:
            self.counts[kw] = c + 1
        if ts > self.max_ts[p]:
            self.max_ts[p] = ts
            limit = ts - self.delay_ms
            ends = self._ends[p]
            if ends and ends[0] <= limit:
                pending = self._pending[p]
                while ends and ends[0] <= limit:
                    self.open[p] -= pending.pop(heapq.heappop(ends))
                if self.first_trigger < 0:
                    self.first_trigger = seq
                self.last_trigger = seq
        o = self.open[p]
        self.open_sum += o
        if o > self.open_max:
            self.open_max = o

    def closed(self) -> dict[tuple[int, int], int]:
        """(key index, window start) -> count of every window that closes."""
        w, d, part, max_ts = self.window_ms, self.delay_ms, self.part, self.max_ts
        return {kw: c for kw, c in self.counts.items() if kw[1] + w <= max_ts[part[kw[0]]] - d}

    @property
    def open_mean(self) -> float:
        """Open windows of the record's key group after each record, averaged."""
        return self.open_sum / self.records if self.records else 0.0


def produce_events(
    admin: Admin,
    topic: str,
    records: int,
    keys: int,
    partitions: int,
    windows: int,
    window_ms: int,
    delay_ms: int = 0,
    seed: int = 11,
) -> Dataset:
    """Produce events whose timestamps (event time) span ``windows`` tumbling windows.

    Event times: :func:`event_times` (rising, moved back by up to ``delay_ms``). What a
    correct run outputs: :class:`WindowModel` (partition watermarks, every key placed by
    murmur2 like the producer's ``murmur2_random`` partitioner).
    """
    admin.create({topic: partitions}, {"retention.ms": "-1"})
    # One hour back, aligned to the window size: inside the broker's timestamp limits.
    t0 = (int(time.time() * 1000) - 3_600_000) // window_ms * window_ms
    part = [key_group(key_of(k), partitions) for k in range(keys)]
    model = WindowModel(partitions, window_ms, delay_ms)
    add = model.add
    p = input_producer(admin.bootstrap)
    produce = p.produce
    dumps = orjson.dumps
    started = time.monotonic()
    total = 0
    events = event_times(records, keys, windows, window_ms, delay_ms, t0, seed)
    for seq, (k, ts) in enumerate(events):
        add(seq, k, part[k], ts)
        value = dumps({"v": 1, "seq": seq, "pad": PAD})
        key = key_of(k)
        total += len(value) + len(key)
        while True:
            try:
                produce(topic, value, key, timestamp=ts)
                break
            except BufferError:
                p.poll(0.05)
        if seq % 20_000 == 0:
            p.poll(0)
    if p.flush(120) != 0:
        raise RuntimeError(f"could not produce every input record to {topic}")
    took = time.monotonic() - started
    closed = model.closed()
    say(
        f"  produced {records:,} events to {topic} in {took:.1f}s; "
        f"{len(closed):,} (key, window) results expected, "
        f"{model.open_mean:,.0f} windows open per key group on average"
    )
    if model.late:
        raise RuntimeError(f"{model.late} late records in {topic}: the generator is broken")
    ds = Dataset("events", topic, records, keys, partitions, took, total)
    ds.window_ms = window_ms
    ds.delay_ms = delay_ms
    ds.windows = windows
    ds.closed = closed
    ds.t0_ms = t0
    ds.trigger_span = max(0, model.last_trigger - model.first_trigger)
    ds.open_mean = round(model.open_mean, 1)
    ds.open_max = model.open_max
    return ds


# ------------------------------------------------------------------ reading and checking


class Output:
    """Everything read back from one output topic (read_committed), checked on the fly."""

    def __init__(self, workload: str, ds: Dataset) -> None:
        self.workload = workload
        self.ds = ds
        self.offsets: list[array[int]] = [array("q") for _ in range(ds.partitions)]
        self.total = 0
        self.bad = 0
        self.first_ts = 1 << 62  # LogAppendTime (ms) of the first and last output record
        self.last_ts = 0
        self._seen = bytearray(ds.records) if workload == "passthrough" else bytearray()
        n = ds.keys if ds.kind == "numbers" else 0
        self._last_count = [0] * n
        self._last_sum = [0] * n
        self._windows: dict[tuple[int, int], int] = {}
        self._window_dupes = 0
        self._tail_counts: dict[tuple[int, int], int] = {}

    def feed(
        self, partition: int, offset: int, ts: int, key: bytes | None, value: bytes | None
    ) -> None:
        """Record one output record (``ts``: its LogAppendTime in ms)."""
        self.offsets[partition].append(offset)
        self.total += 1
        if ts < self.first_ts:
            self.first_ts = ts
        if ts > self.last_ts:
            self.last_ts = ts
        try:
            k = int(key[1:]) if key is not None else -1  # type: ignore[index]
            v: Any = orjson.loads(value) if value is not None else None
            if self.workload == "passthrough":
                self._seen[v["seq"]] = min(255, self._seen[v["seq"]] + 1)
            elif self.workload.startswith("sum"):
                c = v["count"]
                if c > self._last_count[k]:
                    self._last_count[k] = c
                    self._last_sum[k] = v["sum"]
            else:
                kw = (k, int(v["start"]))
                if kw in self._windows:
                    self._window_dupes += 1
                self._windows[kw] = int(v["count"])
        except (ValueError, KeyError, TypeError, IndexError):
            self.bad += 1

    def committed_count(self, lso: list[int]) -> int:
        """Records whose offset is below the given last stable offsets (visible ones)."""
        return sum(bisect_left(self.offsets[p], o) for p, o in enumerate(lso) if p < len(lso))

    def check(self) -> dict[str, Any]:
        """Compare what was read against the model; ``ok`` is False on any loss or error."""
        ds = self.ds
        res: dict[str, Any] = {"records_out": self.total, "undecodable": self.bad}
        if self.workload == "passthrough":
            missing = self._seen.count(0)
            res.update(missing=missing, duplicates=self.total - (ds.records - missing))
            res["ok"] = missing == 0 and self.bad == 0
        elif self.workload.startswith("sum"):
            wrong = sum(
                1
                for k in range(ds.keys)
                if self._last_count[k] != ds.counts[k] or self._last_sum[k] != ds.sums[k]
            )
            res.update(
                wrong_final_sums=wrong,
                duplicates=self.total - ds.records,
                missing=max(0, ds.records - self.total),
            )
            res["ok"] = wrong == 0 and self.total >= ds.records and self.bad == 0
        else:
            expected = ds.closed
            got = self._windows
            missing = sum(1 for kw in expected if kw not in got)
            wrong = sum(1 for kw, c in expected.items() if kw in got and got[kw] != c)
            extra = sum(1 for kw in got if kw not in expected)
            res.update(
                expected_windows=len(expected),
                missing=missing,
                wrong_counts=wrong,
                unexpected=extra,
                duplicates=self._window_dupes,
            )
            res["ok"] = missing == 0 and wrong == 0 and extra == 0 and self.bad == 0
        return res


def read_output(bootstrap: str, topic: str, workload: str, ds: Dataset) -> Output:
    """Read ``topic`` from the start to its last stable offset with read_committed."""
    out = Output(workload, ds)
    c = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"bench-reader-{topic}",
            "enable.auto.commit": False,
            "isolation.level": "read_committed",
            "enable.partition.eof": True,
            "fetch.max.bytes": 52_428_800,
            "max.partition.fetch.bytes": 10_485_760,
            "log_level": 0,
        }
    )
    md = c.list_topics(topic, timeout=10).topics[topic]
    parts = sorted(md.partitions)
    c.assign([TopicPartition(topic, p, 0) for p in parts])
    eof: set[int] = set()
    idle_deadline = time.monotonic() + 60
    feed = out.feed
    try:
        while len(eof) < len(parts):
            msgs = c.consume(10_000, 1.0)
            if msgs:
                idle_deadline = time.monotonic() + 60
            elif time.monotonic() > idle_deadline:
                raise TimeoutError(f"reading {topic}: no progress for 60s")
            for m in msgs:
                err = m.error()
                if err is None:
                    feed(m.partition(), m.offset(), m.timestamp()[1], m.key(), m.value())
                elif err.code() == KafkaError._PARTITION_EOF:  # noqa: SLF001
                    eof.add(m.partition())
                else:
                    raise RuntimeError(f"reading {topic}: {err}")
    finally:
        c.close()
    return out
