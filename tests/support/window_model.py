"""An independent model of lockgate's event-time windows (no lockgate window code).

Given the input records in arrival order as ``(key, event time, value)`` and the partition
count, :func:`run` computes what a window operator must produce, from the semantics alone:

* a key lives in partition ``murmur2(utf-8 key) % partitions`` (its key group);
* per partition the watermark is ``max event time seen - max_delay_ms - 1``, never going
  back (``NO_WATERMARK`` before any record); a record is judged with the watermark from
  *before* it, then the watermark advances and every window whose last millisecond
  (``end - 1``) it reaches fires, in time order;
* tumbling / sliding: a record goes into each of its windows ``[start, end)`` with
  ``end - 1 + allowed_lateness > watermark``; when none is left it is *late* (it goes to
  the late topic, with every window it belongs to and the watermark); a record into a
  window that fired already re-emits the updated result at once; a window's state is
  gone once the watermark reaches ``end - 1 + allowed_lateness``;
* session: a record at ``t`` opens ``[t, t + gap)``, merged with the key's open sessions
  it overlaps; late when the merged session is past its lateness;
* count(n): every ``n`` records of a key form a window (``start`` = their earliest event
  time, ``end`` = latest + 1), fired and forgotten; global(every=n): the key's running
  result over all its records, every ``n`` records.

For on-time data (no record behind the watermark) the fired results are a plain group-by
of the records over their windows: :func:`group_by` computes that directly, and the
model's sanity tests check both agree.

A window's result is ``fold(values)`` over its values in arrival order.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from processors import key_group

NO_WATERMARK = -(2**63)


# -- window kinds ---------------------------------------------------------------------------


@dataclass(frozen=True)
class TumblingSpec:
    size: int
    offset: int = 0


@dataclass(frozen=True)
class SlidingSpec:
    size: int
    slide: int
    offset: int = 0


@dataclass(frozen=True)
class SessionSpec:
    gap: int


@dataclass(frozen=True)
class CountSpec:
    size: int


@dataclass(frozen=True)
class GlobalSpec:
    every: int = 1


Spec = TumblingSpec | SlidingSpec | SessionSpec | CountSpec | GlobalSpec


def windows_of(spec: TumblingSpec | SlidingSpec, ts: int) -> list[tuple[int, int]]:
    """Every window ``[start, end)`` that contains ``ts``, by increasing start.

    Computed by enumerating window indexes: window ``k`` starts at ``k * step + offset``.
    """
    if isinstance(spec, TumblingSpec):
        size, step, offset = spec.size, spec.size, spec.offset
    else:
        size, step, offset = spec.size, spec.slide, spec.offset
    # k * step + offset <= ts  and  ts < k * step + offset + size
    k_hi = (ts - offset) // step
    k_lo = -((size - 1 - (ts - offset)) // step)  # ceil((ts - offset - size + 1) / step)
    out = []
    for k in range(k_lo, k_hi + 1):
        start = k * step + offset
        if start <= ts < start + size:
            out.append((start, start + size))
    return out


# -- records and outcomes -------------------------------------------------------------------


@dataclass(frozen=True)
class Rec:
    key: str
    ts: int
    value: Any


@dataclass(frozen=True)
class Result:
    """A fired window result. ``at``: index of the record whose processing emitted it
    (``-1``: the final flush); ``timer``: fired by the watermark (else by a record
    arriving in an already fired window, or by a count/global window)."""

    key: str
    start: int
    end: int
    value: Any
    partition: int
    at: int
    timer: bool

    def row(self) -> tuple[str, int, int, Any]:
        return (self.key, self.start, self.end, freeze(self.value))


@dataclass(frozen=True)
class Late:
    """A record set aside as late: the windows it belongs to and the watermark then."""

    index: int
    key: str
    ts: int
    value: Any
    windows: tuple[tuple[int, int], ...]
    watermark: int


@dataclass
class _Window:
    start: int
    end: int
    values: list[tuple[int, Any]] = field(default_factory=list)  # (arrival index, value)

    def ordered(self) -> list[Any]:
        return [v for _, v in sorted(self.values, key=lambda p: p[0])]


@dataclass
class Outcome:
    results: list[Result]
    late: list[Late]
    #: partition of each record, the watermark before it and after it
    partition: list[int]
    wm_before: list[int]
    wm_after: list[int]
    #: the watermark of every partition at the end (after the flush)
    final_watermarks: dict[int, int]
    #: key -> open windows (start, end) at the end (after the flush), sorted
    open_windows: dict[str, list[tuple[int, int]]]
    #: key -> records pending in a count window / seen by a global window
    pending: dict[str, int]

    def rows(self) -> Counter[tuple[str, int, int, Any]]:
        return Counter(r.row() for r in self.results)

    def per_key(self) -> dict[str, list[tuple[int, int, Any]]]:
        out: dict[str, list[tuple[int, int, Any]]] = defaultdict(list)
        for r in self.results:
            out[r.key].append((r.start, r.end, freeze(r.value)))
        return dict(out)


def freeze(value: Any) -> Any:
    """A hashable, comparable copy of a JSON-like value."""
    if isinstance(value, dict):
        return tuple(sorted((k, freeze(v)) for k, v in value.items()))
    if isinstance(value, (list, tuple)):
        return tuple(freeze(v) for v in value)
    return value


def partition_of(key: str, partitions: int) -> int:
    """The key group of a UTF-8 string key (Kafka's murmur2 partitioner)."""
    return key_group(key.encode(), partitions)


# -- the model ------------------------------------------------------------------------------


class _Partition:
    """The event-time state of one partition: watermark and open windows per key."""

    def __init__(self, index: int, spec: Spec, lateness: int) -> None:
        self.index = index
        self.spec = spec
        self.lateness = lateness
        self.max_ts: int | None = None
        self.wm = NO_WATERMARK
        #: key -> open windows (time windows: by start; sessions: disjoint)
        self.windows: dict[str, list[_Window]] = defaultdict(list)

    def advance(self, to: int, fold: Callable[[list[Any]], Any], at: int) -> list[Result]:
        """Raise the watermark to ``to``; fire what it reaches, forget what is past."""
        before = self.wm
        if to <= before:
            return []
        self.wm = to
        due = []
        for key, wins in self.windows.items():
            for w in wins:
                if before < w.end - 1 <= to:
                    due.append((w.end - 1, key.encode(), key, w))
        due.sort(key=lambda d: (d[0], d[1]))
        fired = [
            Result(key, w.start, w.end, fold(w.ordered()), self.index, at, True)
            for _, _, key, w in due
        ]
        for key in list(self.windows):
            kept = [w for w in self.windows[key] if w.end - 1 + self.lateness > to]
            if kept:
                self.windows[key] = kept
            else:
                del self.windows[key]
        return fired


def run(
    records: Sequence[Rec | tuple[str, int, Any]],
    partitions: int,
    spec: Spec,
    *,
    max_delay_ms: int = 0,
    allowed_lateness_ms: int = 0,
    fold: Callable[[list[Any]], Any] = len,
    flush_to: int | None = None,
) -> Outcome:
    """Compute what a window over ``records`` (in arrival order) must produce.

    Args:
        records: ``Rec`` or ``(key, event time, value)`` in arrival order.
        partitions: the number of partitions (key groups).
        spec: the window kind.
        max_delay_ms: the bounded out-of-orderness of the input's watermarks.
        allowed_lateness_ms: how long after firing a window still takes records.
        fold: a window's result from its values (in arrival order).
        flush_to: at the end, raise every partition's watermark to this (as
            ``TestDriver.advance_watermark(flush_to)`` does, partitions in order).
    """
    recs = [r if isinstance(r, Rec) else Rec(*r) for r in records]
    parts = [_Partition(p, spec, allowed_lateness_ms) for p in range(partitions)]
    results: list[Result] = []
    late: list[Late] = []
    part_of: list[int] = []
    wm_before: list[int] = []
    wm_after: list[int] = []
    counting: dict[str, list[tuple[int, Any]]] = defaultdict(list)  # count/global windows
    for i, rec in enumerate(recs):
        p = parts[partition_of(rec.key, partitions)]
        part_of.append(p.index)
        wm = p.wm
        wm_before.append(wm)
        if isinstance(spec, (TumblingSpec, SlidingSpec)):
            results += _time_record(p, spec, i, rec, wm, fold, late)
        elif isinstance(spec, SessionSpec):
            results += _session_record(p, spec, i, rec, wm, fold, late)
        else:
            results += _count_record(p.index, spec, i, rec, counting, fold)
        # then the watermark advances, firing what it reaches
        p.max_ts = rec.ts if p.max_ts is None else max(p.max_ts, rec.ts)
        results += p.advance(p.max_ts - max_delay_ms - 1, fold, i)
        wm_after.append(p.wm)
    if flush_to is not None:
        for p in parts:
            results += p.advance(flush_to, fold, -1)
    open_windows = {
        key: sorted((w.start, w.end) for w in wins)
        for p in parts
        for key, wins in p.windows.items()
        if wins
    }
    return Outcome(
        results,
        late,
        part_of,
        wm_before,
        wm_after,
        {p.index: p.wm for p in parts},
        open_windows,
        {k: len(v) for k, v in counting.items() if v},
    )


def _time_record(
    p: _Partition,
    spec: TumblingSpec | SlidingSpec,
    i: int,
    rec: Rec,
    wm: int,
    fold: Callable[[list[Any]], Any],
    late: list[Late],
) -> list[Result]:
    mine = windows_of(spec, rec.ts)
    accepting = [(s, e) for s, e in mine if e - 1 + p.lateness > wm]
    if not accepting:
        late.append(Late(i, rec.key, rec.ts, rec.value, tuple(mine), wm))
        return []
    out = []
    wins = p.windows[rec.key]
    for s, e in accepting:
        found = [w for w in wins if w.start == s]
        if found:
            w = found[0]
        else:
            w = _Window(s, e)
            wins.append(w)
            wins.sort(key=lambda x: x.start)
        w.values.append((i, rec.value))
        if e - 1 <= wm:  # fired already, within the allowed lateness: updated result now
            out.append(Result(rec.key, s, e, fold(w.ordered()), p.index, i, False))
    return out


def _session_record(
    p: _Partition,
    spec: SessionSpec,
    i: int,
    rec: Rec,
    wm: int,
    fold: Callable[[list[Any]], Any],
    late: list[Late],
) -> list[Result]:
    start, end = rec.ts, rec.ts + spec.gap
    wins = p.windows[rec.key]
    touching = [w for w in wins if w.start < end and start < w.end]
    values: list[tuple[int, Any]] = [(i, rec.value)]
    for w in touching:
        start, end = min(start, w.start), max(end, w.end)
        values += w.values
    if end - 1 + p.lateness <= wm:
        late.append(Late(i, rec.key, rec.ts, rec.value, ((start, end),), wm))
        if not wins:
            del p.windows[rec.key]
        return []
    merged = _Window(start, end, values)
    p.windows[rec.key] = sorted(
        [w for w in wins if w not in touching] + [merged], key=lambda x: x.start
    )
    if end - 1 <= wm:
        return [Result(rec.key, start, end, fold(merged.ordered()), p.index, i, False)]
    return []


def _count_record(
    partition: int,
    spec: CountSpec | GlobalSpec,
    i: int,
    rec: Rec,
    counting: dict[str, list[tuple[int, Any]]],
    fold: Callable[[list[Any]], Any],
) -> list[Result]:
    seen = counting[rec.key]
    seen.append((rec.ts, rec.value))
    n = spec.size if isinstance(spec, CountSpec) else spec.every
    if isinstance(spec, CountSpec) and len(seen) < n:
        return []
    if isinstance(spec, GlobalSpec) and len(seen) % n:
        return []
    times = [t for t, _ in seen]
    res = Result(
        rec.key, min(times), max(times) + 1, fold([v for _, v in seen]), partition, i, False
    )
    if isinstance(spec, CountSpec):
        seen.clear()
    return [res]


# -- the batch view ---------------------------------------------------------------------------


def group_by(
    records: Iterable[Rec | tuple[str, int, Any]],
    spec: TumblingSpec | SlidingSpec | SessionSpec,
    fold: Callable[[list[Any]], Any] = len,
) -> Counter[tuple[str, int, int, Any]]:
    """The results of time windows over all ``records``, as a batch group-by.

    Tumbling/sliding: each record in each of its windows. Sessions: a key's records
    sorted by time, split where consecutive ones are ``gap`` or more apart. Values of a
    window in arrival order.
    """
    recs = [r if isinstance(r, Rec) else Rec(*r) for r in records]
    groups: dict[tuple[str, int, int], list[Any]] = defaultdict(list)
    if isinstance(spec, SessionSpec):
        by_key: dict[str, list[tuple[int, int, Any]]] = defaultdict(list)
        for i, r in enumerate(recs):
            by_key[r.key].append((r.ts, i, r.value))
        for key, items in by_key.items():
            items.sort()
            run_: list[tuple[int, int, Any]] = []
            for item in items:
                if run_ and item[0] - run_[-1][0] >= spec.gap:
                    _close_session(groups, key, run_, spec.gap)
                    run_ = []
                run_.append(item)
            _close_session(groups, key, run_, spec.gap)
    else:
        for r in recs:
            for s, e in windows_of(spec, r.ts):
                groups[(r.key, s, e)].append(r.value)
    return Counter((k, s, e, freeze(fold(vs))) for (k, s, e), vs in groups.items())


def _close_session(
    groups: dict[tuple[str, int, int], list[Any]],
    key: str,
    items: list[tuple[int, int, Any]],
    gap: int,
) -> None:
    ordered = sorted(items, key=lambda x: x[1])  # arrival order
    groups[(key, items[0][0], items[-1][0] + gap)] = [v for _, _, v in ordered]
