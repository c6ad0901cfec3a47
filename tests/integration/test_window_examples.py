"""The event-time window examples end to end, against an independent model of their contracts.

Each test runs one example (``examples/window_count.py``, ``examples/sessions.py``,
``examples/top_pages.py``) as a ``lockgate run`` subprocess on a seeded input topic of 3-4
partitions, produced with the Java-compatible murmur2 partitioner: several keys, event
times (the value's ``ts``) with bounded disorder, and some records older than the bound
allows, so late records exist. At the end one *flush* record per partition (a key of that
partition, an event time far ahead) moves every partition's watermark past every window
of the data. The first 40% of the input is a backlog; the rest is produced live while the
app runs, and the app is killed (SIGKILL) in the middle of it; a second process (same
instance id; for sessions an empty state directory, so its watermarks, timers and windows
come from the changelogs alone) takes over and gets the flush records.

The model is plain Python written from the examples' docstrings (it never imports
``processors.windows``) and runs on the input as stored, partition by partition in offset
order: a partition's watermark is ``max ts seen - max delay - 1`` (never going back), a
record is late when each of its windows ends at or before the watermark as it was before
the record (``end - 1 <= watermark``), and a window fires when the watermark after a
record reaches ``end - 1``. It gives the fired windows' values and the late records with
their headers. Outputs and late records are read with read_committed and must match it
exactly: one output per fired window (no duplicate, none missing, no result of a window
that must not have fired), equal values; every late record with its key, value and
original headers unchanged, after ``lockgate-late-window``, ``lockgate-late-watermark``
and ``lockgate-late-event-time``.

The examples declare the variables they read: ``App("window-count",
env=["LOCKGATE_WINDOW_MS", "LOCKGATE_MAX_DELAY_MS"])``, ``App("sessions",
env=["LOCKGATE_SESSION_GAP_MS", "LOCKGATE_MAX_DELAY_MS"])``, ``App("top-pages",
env=["LOCKGATE_WINDOW_MS", "LOCKGATE_SLIDE_MS", "LOCKGATE_TOP_N", "LOCKGATE_MAX_DELAY_MS"])``.
"""

from __future__ import annotations

import random
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson
from confluent_kafka import Producer

from processors import key_group
from tests.integration._util import app_env, committed_offsets
from tests.support.kafka import create_topic, read_all
from tests.support.procs import AppProcess

NO_WATERMARK = -(2**63)


@dataclass(frozen=True)
class Rec:
    """An input record as stored."""

    partition: int
    offset: int
    key: bytes
    value: bytes
    headers: tuple[tuple[str, bytes], ...]

    @property
    def ts(self) -> int:
        return int(orjson.loads(self.value)["ts"])

    @property
    def page(self) -> str:
        return str(orjson.loads(self.value)["page"])


@dataclass
class Expected:
    """What the model says the app must write."""

    #: (key, start, end) -> output value of every fired window
    outputs: dict[tuple[str, int, int], Any] = field(default_factory=dict)
    #: the ``seq`` header of each late input -> (the input, the headers of its late copy)
    late: dict[bytes, tuple[Rec, list[tuple[str, bytes]]]] = field(default_factory=dict)
    #: things the input exercised (asserted to be there, so the test keeps its teeth)
    cases: Counter[str] = field(default_factory=Counter)


# ------------------------------------------------------------------------ the models


class Model:
    """One example's windows over one partition; the driver below feeds it records."""

    def __init__(self, out: Expected) -> None:
        self.out = out

    def add(self, rec: Rec, wm: int) -> str | None:
        """Take a record given the watermark before it; return its late window header or None."""
        raise NotImplementedError

    def fire(self, wm: int) -> None:
        """Fire every window whose ``end - 1`` is at or before ``wm``."""
        raise NotImplementedError

    def emit(self, key: str, start: int, end: int, value: Any, wm: int) -> None:
        assert (key, start, end) not in self.out.outputs, "the model fired a window twice"
        if end - 1 == wm:
            self.out.cases["fired when the watermark hit its last ms"] += 1
        self.out.outputs[(key, start, end)] = value


class TumblingCount(Model):
    """examples/window_count.py: counts in tumbling windows ``[k*size, (k+1)*size)``."""

    def __init__(self, out: Expected, size: int) -> None:
        super().__init__(out)
        self.size = size
        self.open: dict[tuple[str, int], int] = {}

    def add(self, rec: Rec, wm: int) -> str | None:
        ts = rec.ts
        start = ts // self.size * self.size
        end = start + self.size
        if end - 1 <= wm:
            if end - 1 == wm:
                self.out.cases["late: the window's last ms is the watermark"] += 1
            return f"{start}-{end}"
        if (ts - 1) // self.size * self.size + self.size - 1 <= wm:
            self.out.cases["on time by 1 ms"] += 1  # a record 1 ms older is late
        slot = (rec.key.decode(), start)
        self.open[slot] = self.open.get(slot, 0) + 1
        return None

    def fire(self, wm: int) -> None:
        for (key, start), count in sorted(self.open.items()):
            if start + self.size - 1 <= wm:
                del self.open[(key, start)]
                self.emit(
                    key,
                    start,
                    start + self.size,
                    {"start": start, "end": start + self.size, "count": count},
                    wm,
                )


class Sessions(Model):
    """examples/sessions.py: per-user sessions ``[first click, last click + gap)``."""

    def __init__(self, out: Expected, gap: int) -> None:
        super().__init__(out)
        self.gap = gap
        #: key -> open sessions [start, end, clicks, {page: first visit}]
        self.open: dict[str, list[list[Any]]] = defaultdict(list)
        self.fired_keys: set[str] = set()

    def add(self, rec: Rec, wm: int) -> str | None:
        key, ts, page = rec.key.decode(), rec.ts, rec.page
        start, end, clicks, first = ts, ts + self.gap, 1, {page: ts}
        rest = []
        bridged = 0
        for sess in self.open[key]:
            s, e, n, f = sess
            if s < end and start < e:  # overlap (touching windows stay apart)
                bridged += 1
                start, end, clicks = min(start, s), max(end, e), clicks + n
                for p, t in f.items():
                    first[p] = min(t, first.get(p, t))
            else:
                if e == ts or s == ts + self.gap:
                    self.out.cases["exactly a gap apart"] += 1
                rest.append(sess)
        if end - 1 <= wm:
            if end - 1 == wm:
                self.out.cases["late: the window's last ms is the watermark"] += 1
            return f"{start}-{end}"
        if end - 1 == wm + 1 and not bridged:
            self.out.cases["on time by 1 ms"] += 1
        if bridged >= 2:
            self.out.cases["bridging click merges sessions"] += 1
        if bridged and ts < min(s for s, _, _, _ in self.open[key]):
            self.out.cases["out-of-order click extends a session backwards"] += 1
        if key in self.fired_keys and bridged == 0:
            self.out.cases["new session after a fired one"] += 1
        self.open[key] = [*rest, [start, end, clicks, first]]
        return None

    def fire(self, wm: int) -> None:
        for key in sorted(self.open):
            keep = []
            for s, e, n, f in self.open[key]:
                if e - 1 <= wm:
                    pages = [p for p, t in sorted(f.items(), key=lambda pt: (pt[1], pt[0]))]
                    self.emit(key, s, e, {"start": s, "end": e, "clicks": n, "pages": pages}, wm)
                    self.fired_keys.add(key)
                    if n > 1:
                        self.out.cases["multi-click session"] += 1
                else:
                    keep.append([s, e, n, f])
            self.open[key] = keep


class SlidingTop(Model):
    """examples/top_pages.py: top-N pages per key in sliding windows."""

    def __init__(self, out: Expected, size: int, slide: int, n: int) -> None:
        super().__init__(out)
        self.size, self.slide, self.n = size, slide, n
        #: (key, start) -> page -> views
        self.open: dict[tuple[str, int], Counter[str]] = {}

    def windows(self, ts: int) -> list[int]:
        """Starts of the windows containing ``ts``, oldest first."""
        starts = []
        s = ts // self.slide * self.slide
        while s > ts - self.size:
            starts.append(s)
            s -= self.slide
        return sorted(starts)

    def add(self, rec: Rec, wm: int) -> str | None:
        key, ts = rec.key.decode(), rec.ts
        starts = self.windows(ts)
        live = [s for s in starts if s + self.size - 1 > wm]
        newest_last_ms = starts[-1] + self.size - 1
        if not live:
            if newest_last_ms == wm:
                self.out.cases["late: the window's last ms is the watermark"] += 1
            return ",".join(f"{s}-{s + self.size}" for s in starts)
        if all(s + self.size - 1 <= wm for s in self.windows(ts - 1)):
            self.out.cases["on time by 1 ms"] += 1  # a view 1 ms older is late
        if len(live) < len(starts):
            self.out.cases["partly late view"] += 1
        for s in live:
            self.open.setdefault((key, s), Counter())[rec.page] += 1
        return None

    def fire(self, wm: int) -> None:
        for (key, start), counts in sorted(self.open.items()):
            end = start + self.size
            if end - 1 <= wm:
                del self.open[(key, start)]
                ranked = sorted(counts.items(), key=lambda pv: (-pv[1], pv[0]))
                if len(ranked) > self.n and ranked[self.n - 1][1] == ranked[self.n][1]:
                    self.out.cases["tie at the cut"] += 1
                top = [[p, v] for p, v in ranked[: self.n]]
                self.emit(key, start, end, {"start": start, "end": end, "top": top}, wm)


def run_model(records: Iterable[Rec], make: Callable[[Expected], Model], delay: int) -> Expected:
    """Feed each partition's records in offset order through a fresh model."""
    out = Expected()
    by_partition: dict[int, list[Rec]] = defaultdict(list)
    for rec in records:
        by_partition[rec.partition].append(rec)
    for recs in by_partition.values():
        recs.sort(key=lambda r: r.offset)
        model = make(out)
        wm = NO_WATERMARK
        high: int | None = None
        for rec in recs:
            window = model.add(rec, wm)
            if window is not None:
                headers = [
                    ("lockgate-late-window", window.encode()),
                    ("lockgate-late-watermark", str(wm).encode()),
                    ("lockgate-late-event-time", str(rec.ts).encode()),
                    *rec.headers,
                ]
                out.late[dict(rec.headers)["seq"]] = (rec, headers)
            if high is None or rec.ts > high:
                high = rec.ts
                wm = max(wm, high - delay - 1)
            model.fire(wm)
    out.cases["late"] = len(out.late)
    return out


# ------------------------------------------------------------------------ the inputs


Record = tuple[str, dict[str, Any], list[tuple[str, bytes]]]


def generate(
    rng: random.Random,
    n: int,
    keys: list[str],
    partitions: int,
    delay: int,
    *,
    step: int,
    beyond: int,
    edge: Callable[[int], int | None],
    late_share: float = 0.06,
    edge_share: float = 0.3,
    pages: list[str] | None = None,
    pauses: tuple[float, int] | None = None,
) -> list[Record]:
    """``n`` records ``(key, value, headers)`` with bounded disorder.

    A clock moves ``0..step`` ms (a 50 ms grid, so records often fall on window edges
    and on the watermark) per record; a record is up to ``delay`` behind it, or with
    ``late_share`` between ``delay`` and ``delay + beyond`` behind (beyond the bound).

    Edges: the generator follows each partition's watermark (``max ts - delay - 1``);
    ``edge(wm)`` gives the latest event time that is late at watermark ``wm`` when some
    window of the example ends exactly there (else None). With ``edge_share`` the
    record is then at that time or 1 ms after it (late by nothing / on time by 1 ms).

    ``pauses=(p, ms)``: after each record its key pauses with probability ``p`` for up
    to ``ms`` (event time), so sessions end.
    """
    hour = 3600 * 1000
    base = (int(time.time() * 1000) // hour - 2) * hour  # seeded runs align alike
    clock = base
    asleep: dict[str, int] = {}
    high: dict[int, int] = {}
    weights = [1.0 / (i + 1) for i in range(len(pages or []))]
    out = []
    for i in range(n):
        clock += rng.randrange(0, step + 1, 50)
        awake = [k for k in keys if asleep.get(k, 0) <= clock] or keys
        key = rng.choice(awake)
        p = key_group(key.encode(), partitions)
        at_edge = edge(high[p] - delay - 1) if p in high else None
        if at_edge is not None and rng.random() < edge_share:
            ts = at_edge + rng.randrange(2)
        elif rng.random() < late_share:
            ts = clock - rng.randrange(delay + 50, delay + beyond, 50)
        else:
            ts = clock - rng.randrange(0, delay + 1, 50)
        high[p] = max(high.get(p, ts), ts)
        value: dict[str, Any] = {"ts": ts}
        if pages is not None:
            value["page"] = rng.choices(pages, weights)[0]
        headers = [("seq", str(i).encode())]
        if rng.random() < 0.2:
            headers.append(("trace", rng.randbytes(6)))
        out.append((key, value, headers))
        if pauses is not None and rng.random() < pauses[0]:
            asleep[key] = clock + rng.randrange(0, pauses[1], 50)
    return out


def flush_keys(partitions: int) -> list[str]:
    """One key per partition (murmur2, as the app's key groups)."""
    found: dict[int, str] = {}
    i = 0
    while len(found) < partitions:
        key = f"flush-{i}"
        found.setdefault(key_group(key.encode(), partitions), key)
        i += 1
    return [found[p] for p in range(partitions)]


# ------------------------------------------------------------------------ one run


class WindowRun:
    """Topics, inputs and the app process of one test."""

    def __init__(
        self,
        bootstrap: str,
        names: Any,
        tmp_path: Path,
        spec: str,
        prefix: str,
        partitions: int,
        **settings: str,
    ) -> None:
        self.bootstrap = bootstrap
        self.spec = spec
        self.tmp_path = tmp_path
        self.partitions = partitions
        self.env = app_env(
            bootstrap, names, tmp_path, prefix, LOCKGATE_CHECKPOINT_INTERVAL_MS="200", **settings
        )
        self.input = self.env["LOCKGATE_INPUT_TOPIC"]
        self.output = self.env["LOCKGATE_OUTPUT_TOPIC"]
        self.late_topic = f"{self.env['LOCKGATE_APP_NAME']}.late"  # late_topic=True: per app
        create_topic(bootstrap, self.input, partitions)
        self.produced = 0

    def produce(self, records: list[Record], seconds: float = 0.0) -> None:
        """Produce ``records`` in order (spread over ``seconds``); flush."""
        p = Producer(
            {
                "bootstrap.servers": self.bootstrap,
                "partitioner": "murmur2_random",  # Java-compatible: the app's key groups
                "enable.idempotence": True,  # no reordering on retries
                "linger.ms": 5,
            }
        )
        started = time.monotonic()
        for n, (key, value, headers) in enumerate(records):
            ahead = n * seconds / len(records) - (time.monotonic() - started)
            if ahead > 0:
                time.sleep(ahead)
            while True:
                try:
                    p.produce(self.input, orjson.dumps(value), key.encode(), headers=headers)
                    break
                except BufferError:
                    p.poll(0.1)
            p.poll(0)
        assert p.flush(30) == 0
        self.produced += len(records)

    def stored(self) -> list[Rec]:
        msgs = read_all(self.bootstrap, self.input, expected=self.produced, idle=0.5)
        assert len(msgs) == self.produced
        recs = [
            Rec(m.partition(), m.offset(), m.key(), m.value(), tuple(m.headers() or ()))
            for m in msgs
        ]
        for r in recs:  # produced with murmur2: the partition is the key's key group
            assert r.partition == key_group(r.key, self.partitions), r
        # each partition holds its records in produce order (the model's watermark order)
        recs.sort(key=lambda r: (r.partition, r.offset))
        for p in range(self.partitions):
            seqs = [int(dict(r.headers)["seq"]) for r in recs if r.partition == p and r.headers]
            assert seqs == sorted(seqs), f"partition {p} is not in produce order"
        return recs

    def produced_live(self, feed: threading.Thread) -> str:
        """Committed input offsets vs records produced so far (when the app was killed)."""
        group = self.env["LOCKGATE_APP_NAME"]
        offsets = committed_offsets(self.bootstrap, group, self.input, self.partitions)
        done = sum(max(tp.offset, 0) for tp in offsets)
        return f"{done} input records committed, feeding {'on' if feed.is_alive() else 'done'}"

    def start(self, n: int, state_dir: str = "state") -> AppProcess:
        env = {**self.env, "LOCKGATE_STATE_DIR": str(self.tmp_path / state_dir)}
        return AppProcess(self.spec, env, self.tmp_path / f"app-{n}.log").start()

    def check(self, records: list[Record],
              make: Callable[[Expected], Model], delay: int, horizon: int,
              fresh_state: bool = False) -> Expected:  # fmt: skip
        """Run the app over ``records`` and the flush records; compare with the model.

        The first 40% are a backlog; once the app committed some outputs the rest is
        produced live, and the app is killed (SIGKILL) in the middle of it. A second
        process (same instance id and state directory) takes over and gets the flush
        records; it is stopped (SIGTERM) once the outputs are all there. ``fresh_state``:
        the second process has an empty state directory (its key groups, watermarks and
        timers included, are restored from the changelogs alone).
        """
        last = max(v["ts"] for _, v, _ in records)
        flush: list[Record] = [
            (k, {"ts": last + horizon, "page": "flush"}, []) for k in flush_keys(self.partitions)
        ]
        cut = len(records) * 2 // 5
        self.produce(records[:cut])
        started = time.monotonic()
        first = self.start(1)
        try:
            read_all(self.bootstrap, self.output, expected=20, idle=0, timeout=60)
            feed = threading.Thread(target=self.produce, args=(records[cut:], 2.0))
            feed.start()
            time.sleep(1.0)
            first.kill9()
            at_kill = self.produced_live(feed)
            feed.join(60)
        finally:
            if first.alive:
                first.kill9()
        assert self.produced == len(records), "the feeding thread failed"
        self.produce(flush)
        expected = run_model(self.stored(), make, delay)
        second = self.start(2, "state-2" if fresh_state else "state")
        try:
            outputs = read_all(self.bootstrap, self.output, expected=len(expected.outputs), idle=2)
            late = read_all(self.bootstrap, self.late_topic, expected=len(expected.late), idle=1)
        finally:
            code = second.terminate()
        took = time.monotonic() - started
        logs = first.log_text()[-1500:] + "\n--- after the kill ---\n" + second.log_text()[-2500:]
        problems = compare(expected, outputs, late)
        assert problems == [], "\n".join(problems[:30]) + "\n" + logs
        assert code == 0, logs
        print(
            f"{self.spec}: {len(records)} records, {len(expected.outputs)} windows, "
            f"{len(expected.late)} late; killed with {at_kill}; apps ran {took:.1f}s; "
            f"cases {dict(expected.cases)}"
        )
        return expected


def _data(msgs: list[Any]) -> list[Any]:
    """Records without a ``lockgate-type`` header (lockgate's own control records)."""
    return [m for m in msgs if not any(k == "lockgate-type" for k, _ in m.headers() or [])]


def compare(expected: Expected, outputs: list[Any], late: list[Any]) -> list[str]:
    """Every difference between the model and what the app committed."""
    problems = []
    seen: Counter[tuple[str, int, int]] = Counter()
    for m in _data(outputs):
        key = m.key().decode()
        value = orjson.loads(m.value())
        slot = (key, value["start"], value["end"])
        seen[slot] += 1
        if seen[slot] > 1:
            problems.append(f"duplicate output {slot}: {value}")
        elif slot not in expected.outputs:
            problems.append(f"output of a window that must not fire {slot}: {value}")
        elif value != expected.outputs[slot]:
            problems.append(f"window {slot}: got {value}, expected {expected.outputs[slot]}")
    problems += [
        f"missing output {s}: {v}" for s, v in sorted(expected.outputs.items()) if s not in seen
    ]
    by_seq: dict[bytes, Any] = {}
    for m in _data(late):
        seq = dict(m.headers() or []).get("seq")
        if seq is None or seq in by_seq:
            problems.append(f"unexpected late record {m.key()!r} {m.value()!r} {m.headers()}")
        else:
            by_seq[seq] = m
    return problems + _compare_late(expected, by_seq)


def _compare_late(expected: Expected, by_seq: dict[bytes, Any]) -> list[str]:
    """Late records: exactly the model's, key, value and headers unchanged."""
    problems = []
    for seq in by_seq.keys() - expected.late.keys():
        problems.append(f"input seq={seq.decode()} went to the late topic; model: on time")
    for seq, (rec, headers) in sorted(expected.late.items()):
        m = by_seq.get(seq)
        if m is None:
            problems.append(f"late input seq={seq.decode()} {rec} is not on the late topic")
            continue
        got = [(k, bytes(v)) for k, v in m.headers() or []]
        if (m.key(), m.value(), got) != (rec.key, rec.value, headers):
            problems.append(
                f"late input seq={seq.decode()}: got {m.key()!r} {m.value()!r} {got}, "
                f"expected {rec.key!r} {rec.value!r} {headers}"
            )
    return problems


# ------------------------------------------------------------------------ the tests


def assert_cases(cases: Counter[str], *more: str) -> None:
    """The input exercised late records, both sides of the edge, and ``more``."""
    assert cases["late"] >= 20, cases
    for case in (
        "late: the window's last ms is the watermark",
        "on time by 1 ms",
        "fired when the watermark hit its last ms",
        *more,
    ):
        assert cases[case] > 0, (case, cases)


def test_window_count_tumbling(kafka_bootstrap: str, names: Any, tmp_path: Path) -> None:
    size, delay, partitions = 5000, 1500, 4
    run = WindowRun(
        kafka_bootstrap, names, tmp_path, "examples.window_count:app", "wcount", partitions,
        LOCKGATE_WINDOW_MS=str(size), LOCKGATE_MAX_DELAY_MS=str(delay),
    )  # fmt: skip
    records = generate(
        random.Random(31), 2500, [f"user-{i}" for i in range(14)], partitions, delay,
        step=200, beyond=size, edge=lambda wm: wm if (wm + 1) % size == 0 else None,
    )  # fmt: skip
    expected = run.check(records, lambda out: TumblingCount(out, size), delay, horizon=10 * size)
    assert_cases(expected.cases)


def test_sessions(kafka_bootstrap: str, names: Any, tmp_path: Path) -> None:
    gap, delay, partitions = 3000, 2000, 3
    run = WindowRun(
        kafka_bootstrap, names, tmp_path, "examples.sessions:app", "sessions", partitions,
        LOCKGATE_SESSION_GAP_MS=str(gap), LOCKGATE_MAX_DELAY_MS=str(delay),
    )  # fmt: skip
    records = generate(
        random.Random(32), 2500, [f"user-{i}" for i in range(16)], partitions, delay,
        step=100, beyond=3 * gap, edge=lambda wm: wm - gap + 1, edge_share=0.03,
        pages=[f"/p{i}" for i in range(8)], pauses=(0.08, 4 * gap),
    )  # fmt: skip
    expected = run.check(
        records, lambda out: Sessions(out, gap), delay, horizon=10 * gap, fresh_state=True
    )
    assert_cases(
        expected.cases,
        "bridging click merges sessions",
        "out-of-order click extends a session backwards",
        "new session after a fired one",
        "multi-click session",
        "exactly a gap apart",
    )


def test_top_pages_sliding(kafka_bootstrap: str, names: Any, tmp_path: Path) -> None:
    size, slide, top_n, delay, partitions = 6000, 2000, 3, 1500, 4
    run = WindowRun(
        kafka_bootstrap, names, tmp_path, "examples.top_pages:app", "top-pages", partitions,
        LOCKGATE_WINDOW_MS=str(size), LOCKGATE_SLIDE_MS=str(slide), LOCKGATE_TOP_N=str(top_n),
        LOCKGATE_MAX_DELAY_MS=str(delay),
    )  # fmt: skip
    records = generate(
        random.Random(33), 2500, [f"site-{i}" for i in range(8)], partitions, delay,
        step=150, beyond=2 * size,
        edge=lambda wm: wm - size + slide if (wm + 1) % slide == 0 else None,
        pages=[f"/page/{c}" for c in "abcdefgh"],
    )  # fmt: skip
    expected = run.check(
        records, lambda out: SlidingTop(out, size, slide, top_n), delay, horizon=10 * size
    )
    assert_cases(expected.cases, "partly late view", "tie at the cut")
