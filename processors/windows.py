"""Windows: tumbling, sliding, session, count and global, on keyed state and timers.

A window operator keeps, per key, the accumulator of each open window in one value
store (``window-<n>``) and sets an event-time timer at each window's last millisecond
(``end - 1``); a sliding window whose aggregation merges keeps one accumulator per
slice of ``gcd(size, slide)`` instead, merged into each window's result when it fires
(see ``WindowOperator``). When the key group's watermark reaches ``end - 1``,
the window's result goes on down the chain (its event time is ``end - 1``); its state
is purged then, or ``allowed_lateness_ms`` later, when a late-but-allowed record
re-emits an updated result. A record whose every window is past that is *late*: it
goes, unchanged (the input record's bytes and headers), to the late topic with
``lockgate-late-window`` and ``lockgate-late-watermark`` headers, in the same
transaction.

Everything here runs the same way under the runtime and under
:class:`processors.testing.TestDriver`.
"""

from __future__ import annotations

import copy
import logging
import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, Generic, Protocol, TypeVar

from processors._checkpoint.protocol import LATE_EVENT_TIME, LATE_WATERMARK, LATE_WINDOW, WRITER
from processors._task.time import _EVENT, NO_WATERMARK, TimerContext, TimeService
from processors.exceptions import ConfigError
from state.codecs import Codec
from state.primitives import ValueState

__all__ = [
    "Count",
    "CountAggregator",
    "Global",
    "Session",
    "Sliding",
    "Tumbling",
    "WindowResult",
    "WindowedStream",
]

log = logging.getLogger("lockgate.windows")

V = TypeVar("V")

Next = Callable[[Any, Any, Any], None]


@dataclass(frozen=True, slots=True)
class WindowResult(Generic[V]):
    """A window's result, passed down the chain after ``aggregate``/``reduce``.

    Attributes:
        start: first millisecond of the window (count/global windows: the earliest
            event time in it).
        end: the millisecond after the window (count/global windows: the latest event
            time in it plus one).
        value: the aggregate.
    """

    start: int
    end: int
    value: V

    def as_dict(self) -> dict[str, Any]:
        """``{"start": ..., "end": ..., "value": ...}``."""
        return {"start": self.start, "end": self.end, "value": self.value}


@dataclass(frozen=True)
class Tumbling:
    """Fixed, non-overlapping event-time windows ``[k*size + offset, (k+1)*size + offset)``."""

    size_ms: int
    offset_ms: int = 0

    def __post_init__(self) -> None:
        if self.size_ms <= 0:
            raise ConfigError(f"Tumbling: size_ms must be > 0, got {self.size_ms}")

    def assign(self, ts: int) -> list[tuple[int, int]]:
        """The windows containing event time ``ts``."""
        start = ts - (ts - self.offset_ms) % self.size_ms
        return [(start, start + self.size_ms)]


@dataclass(frozen=True)
class Sliding:
    """Overlapping event-time windows of ``size_ms`` starting every ``slide_ms``."""

    size_ms: int
    slide_ms: int
    offset_ms: int = 0

    def __post_init__(self) -> None:
        if self.size_ms <= 0 or self.slide_ms <= 0:
            raise ConfigError("Sliding: size_ms and slide_ms must be > 0")

    def assign(self, ts: int) -> list[tuple[int, int]]:
        """The windows containing event time ``ts``, oldest first."""
        last = ts - (ts - self.offset_ms) % self.slide_ms
        out = []
        start = last
        while start > ts - self.size_ms:
            out.append((start, start + self.size_ms))
            start -= self.slide_ms
        out.reverse()
        return out


@dataclass(frozen=True)
class Session:
    """Per-key sessions: records less than ``gap_ms`` apart share a window (merging).

    A record at ``t`` opens ``[t, t + gap_ms)``; windows that overlap merge. The
    aggregate needs a ``merge(a, b)`` (``reduce`` and ``process`` have one).
    """

    gap_ms: int

    def __post_init__(self) -> None:
        if self.gap_ms <= 0:
            raise ConfigError(f"Session: gap_ms must be > 0, got {self.gap_ms}")


@dataclass(frozen=True)
class Count:
    """Every ``size`` records of a key form a window (fired and purged at the last one)."""

    size: int

    def __post_init__(self) -> None:
        if self.size <= 0:
            raise ConfigError(f"Count: size must be > 0, got {self.size}")


@dataclass(frozen=True)
class Global:
    """One window per key that never ends: its running result fires every ``every`` records."""

    every: int = 1

    def __post_init__(self) -> None:
        if self.every <= 0:
            raise ConfigError(f"Global: every must be > 0, got {self.every}")


Assigner = Tumbling | Sliding | Session | Count | Global


class _Agg(Protocol):
    def create(self) -> Any: ...
    def add(self, value: Any, acc: Any) -> Any: ...
    @property
    def merge(self) -> Any: ...
    def results(self, key: Any, start: int, end: int, acc: Any) -> Iterable[Any]: ...
    @property
    def sliceable(self) -> bool: ...


class CountAggregator:
    """Counts records: ``window(...).aggregate(CountAggregator())``."""

    def create_accumulator(self) -> int:
        """0."""
        return 0

    def add(self, value: Any, accumulator: int) -> int:
        """One more."""
        return accumulator + 1

    def get_result(self, accumulator: int) -> int:
        """The count."""
        return accumulator

    def merge(self, a: int, b: int) -> int:
        """Sessions merged: counts add."""
        return a + b


class _Aggregate:
    def __init__(self, aggregator: Any) -> None:
        self.aggregator = aggregator
        self.create = aggregator.create_accumulator
        self.add = aggregator.add
        self.merge = getattr(aggregator, "merge", None)
        #: Sliding windows keep one accumulator per slice and merge them when a window
        #: fires: only with the aggregator's own ``merge`` (see :class:`WindowOperator`).
        self.sliceable = callable(self.merge)

    def results(self, key: Any, start: int, end: int, acc: Any) -> Iterable[Any]:
        return (WindowResult(start, end, self.aggregator.get_result(acc)),)


class _Reduce:
    _EMPTY = None
    #: ``fn`` folds values in arrival order and need not be associative: a sliding
    #: window keeps its own accumulator (merging slices would fold in another order).
    sliceable = False

    def __init__(self, fn: Callable[[Any, Any], Any]) -> None:
        self.fn = fn

    def create(self) -> Any:
        return [False, None]

    def add(self, value: Any, acc: Any) -> Any:
        return [True, self.fn(acc[1], value) if acc[0] else value]

    def merge(self, a: Any, b: Any) -> Any:
        if not a[0]:
            return b
        if not b[0]:
            return a
        return [True, self.fn(a[1], b[1])]

    def results(self, key: Any, start: int, end: int, acc: Any) -> Iterable[Any]:
        return (WindowResult(start, end, acc[1]),)


class _Process:
    #: Sliding windows keep each value once, in its slice, with its arrival number (the
    #: window's values are handed over in arrival order, as with one list per window).
    sliceable = True

    def __init__(self, fn: Callable[[Any, WindowResult[list[Any]]], Iterable[Any] | None]) -> None:
        self.fn = fn

    def create(self) -> list[Any]:
        return []

    def add(self, value: Any, acc: list[Any]) -> list[Any]:
        acc.append(value)
        return acc

    def merge(self, a: list[Any], b: list[Any]) -> list[Any]:
        return a + b

    def results(self, key: Any, start: int, end: int, acc: Any) -> Iterable[Any]:
        out = self.fn(key, WindowResult(start, end, acc))
        return () if out is None else out


S = TypeVar("S")
S_co = TypeVar("S_co", covariant=True)


class _Windowable(Protocol[S_co]):
    """What a :class:`WindowedStream` needs of its stream: adding the window operator."""

    def _window(
        self,
        assigner: Assigner,
        agg: Any,
        lateness: int,
        late_topic: str | None,
        codec: Codec,
        uid: tuple[str, bool],
    ) -> S_co: ...


class WindowedStream(Generic[S]):
    """A stream cut into windows: finish it with ``aggregate``, ``reduce`` or ``process``.

    Each returns the stream of the windows' results (a :class:`~processors.Stream`:
    continue it with ``map``, ``to``, ...).
    """

    def __init__(
        self,
        stream: _Windowable[S],
        assigner: Assigner,
        allowed_lateness_ms: int,
        late_topic: str | None,
        codec: Codec,
        uid: tuple[str, bool],
    ) -> None:
        self._stream = stream
        self._assigner = assigner
        self._lateness = allowed_lateness_ms
        self._late = late_topic
        self._codec = codec
        self._uid = uid  # the operator's id, and whether the user gave it

    def aggregate(self, aggregator: Any) -> S:
        """Fold each window with a Flink-style aggregator.

        ``aggregator`` has ``create_accumulator()``, ``add(value, acc)``,
        ``get_result(acc)`` (and ``merge(a, b)`` for session windows); results are
        :class:`WindowResult` objects. With ``merge``, sliding windows keep one
        accumulator per slice of ``gcd(size_ms, slide_ms)`` and merge a window's slices
        (oldest first, into a fresh accumulator) when it fires: ``merge(a, b)`` must
        equal adding ``b``'s records to ``a``, whatever order they arrived in.

        Raises:
            ConfigError: a session window with an aggregator without ``merge``.
        """
        for name in ("create_accumulator", "add", "get_result"):
            if not callable(getattr(aggregator, name, None)):
                raise TypeError(f"aggregate() needs an aggregator with {name}()")
        agg = _Aggregate(aggregator)
        if isinstance(self._assigner, Session) and agg.merge is None:
            raise ConfigError(
                "aggregate() over session windows needs an aggregator with merge(a, b): "
                "sessions merge when a record bridges them"
            )
        return self._build(agg)

    def reduce(self, fn: Callable[[Any, Any], Any]) -> S:
        """Fold each window's values with ``fn(a, b)``; results are :class:`WindowResult`."""
        if not callable(fn):
            raise TypeError("reduce() needs a callable")
        return self._build(_Reduce(fn))

    def count(self) -> S:
        """Count each window's records; results are :class:`WindowResult` of ints."""
        return self.aggregate(CountAggregator())

    def process(self, fn: Callable[[Any, WindowResult[list[Any]]], Iterable[Any] | None]) -> S:
        """Call ``fn(key, window)`` with all of a window's values (``window.value``).

        Whatever ``fn`` returns (an iterable, or ``None``) goes on down the chain, one
        value at a time. Keeps every value of an open window in state.
        """
        if not callable(fn):
            raise TypeError("process() needs a callable")
        return self._build(_Process(fn))

    def _build(self, agg: _Agg) -> S:
        return self._stream._window(  # noqa: SLF001 - same package
            self._assigner, agg, self._lateness, self._late, self._codec, self._uid
        )


class WindowOperator:
    """The runtime half of a window: what happens per record and per timer.

    State layout (one value per key in ``window-<n>``, a dict for time windows):

    - ``"<start>": [end, acc]`` — one window's accumulator (tumbling windows, sliding
      windows whose aggregation cannot merge, and state written before slices existed);
    - ``"s<start>": [end, acc]`` — one *slice* of a sliding window whose aggregation can
      merge (``count()``, ``aggregate()`` with ``merge``, ``process()``): the windows
      are cut into slices of ``gcd(size_ms, slide_ms)``, a record updates the one slice
      it falls in, and a window's result is its slices merged (with its own
      ``"<start>"`` entry, if an earlier version left one) when it fires or is updated.
      A slice lives until the last window containing it is purged. For ``process()``
      ``acc`` is ``[n, value, n, value, ...]`` with ``n`` the key's arrival number
      (``"n": [0, next n]``), so a window's values come back in arrival order.

    Timers, per key: with one entry per window, one ``w<n>:f`` at each open window's
    ``end - 1`` (until it fires) and, with allowed lateness, one ``w<n>:c`` at
    ``end - 1 + allowed_lateness_ms``; sliced, a ``w<n>:f`` at the end of the first
    window with data that has not fired (each firing sets the next one) and a
    ``w<n>:c`` per slice where its last window is purged.
    """

    #: ``on_record(key, value, ctx)``: the chain step (set per assigner at construction).
    on_record: Callable[[Any, Any, Any], None]

    def __init__(
        self,
        n: int,
        assigner: Assigner,
        agg: _Agg,
        lateness: int,
        late_topic: str | None,
        *,
        store: ValueState[Any],
        time: TimeService,
    ) -> None:
        """The ``n``-th window operator of an app.

        Args:
            n: its number (its timers' owner names are ``w<n>:f`` and ``w<n>:c``).
            assigner: which windows a record belongs to.
            agg: how a window folds its records.
            lateness: ``allowed_lateness_ms``.
            late_topic: where records later than that go (``None``: dropped); its
                name as declared, ``{app}`` standing for the app's running name (the
                app names :attr:`late_topic` for it).
            store: the value store of its accumulators (``window-<n>``).
            time: the app's time service (its timers are registered there).
        """
        self.assigner = assigner
        self.agg = agg
        self.lateness = lateness
        #: The late topic as declared (``{app}``: the app's running name) ...
        self.late_template = late_topic
        #: ... and as written to (set by the app, :meth:`processors.App.run_as`).
        self.late_topic = late_topic
        self.prefix = f"w{n}"
        self._fire_name = self.prefix + ":f"
        self._clean_name = self.prefix + ":c"
        self.store = store
        self.time = time
        for suffix in (":f", ":c"):  # exact names: no parsing per timer
            self.time.add_owner(self.prefix + suffix, self.on_timer)
        self.nxt: Next = lambda k, v, c: None
        self.needs_event_time = isinstance(assigner, (Tumbling, Sliding, Session))
        #: The slice length of a sliced sliding window (``None``: one entry per window).
        self.slice_ms: int | None = None
        #: ``count()``: slices merge by summing.
        self._counts = isinstance(agg, _Aggregate) and type(agg.aggregator) is CountAggregator
        #: ``process()``: a slice holds ``[n, value, n, value, ...]`` (``n``: the key's
        #: arrival number, from its ``"n"`` entry), merged back into arrival order.
        self._ordered = isinstance(agg, _Process)
        if isinstance(assigner, Tumbling):
            self.on_record = self._on_tumbling_record
        elif isinstance(assigner, Sliding):
            if assigner.slide_ms < assigner.size_ms and agg.sliceable:
                self.slice_ms = math.gcd(assigner.size_ms, assigner.slide_ms)
                self.on_record = self._on_slice_record
            else:
                self.on_record = self._on_sliding_record
        elif isinstance(assigner, Session):
            self.on_record = self._on_session_record
        else:
            self.on_record = self._on_count_record

    # -- per record -------------------------------------------------------------------------

    def _late(self, ctx: Any, windows: list[tuple[int, int]], wm: int) -> None:
        """Send the input record (once, however many of its values were late) aside."""
        if self.late_topic is None:
            return  # dropped: the user asked for no late topic
        msg = ctx.message
        if msg is None:
            # A window result late for a window downstream of it: no input record to set
            # aside (a second window must allow for the first one's firing delay).
            log.warning(
                "dropping a late window result",
                extra={"window": f"{windows[0][0]}-{windows[-1][1]}", "watermark": wm},
            )
            return
        sent = ctx._late_ops  # noqa: SLF001 - set per record by the input wrapper
        if sent is None:
            ctx._late_ops = {self.prefix}  # noqa: SLF001
        elif self.prefix in sent:
            return
        else:
            sent.add(self.prefix)
        headers: list[tuple[str, bytes | str]] = [
            (LATE_WINDOW, ",".join(f"{s}-{e}" for s, e in windows)),
            (LATE_WATERMARK, str(wm)),
            (LATE_EVENT_TIME, str(ctx.event_time)),
        ]
        # The input's own headers, but not the writer's: the late topic is not an
        # internal topic (a lockgate app reading it would wait for that writer's barriers).
        headers.extend(h for h in msg.headers() or [] if h[0] != WRITER)
        ctx.emit(self.late_topic, msg.key(), msg.value(), headers)

    def _on_tumbling_record(self, key: Any, value: Any, ctx: Any) -> None:
        a: Tumbling = self.assigner  # type: ignore[assignment]  # set for Tumbling only
        ts = ctx.event_time
        size = a.size_ms
        s = ts - (ts - a.offset_ms) % size
        e = s + size
        time = self.time
        wm = time.operator_watermark()
        lateness = self.lateness
        if e - 1 + lateness <= wm:
            self._late(ctx, [(s, e)], wm)
            return
        store = self.store
        state = store.value()
        if state is None:
            state = {}
        sk = str(s)
        entry = state.get(sk)
        agg = self.agg
        if entry is None:
            acc = agg.add(value, agg.create())
            state[sk] = [e, acc]
            store.update(state)
            if e - 1 <= wm:
                # Fired already, within the allowed lateness: an updated result now.
                self._emit(key, s, e, acc, ctx)
            else:
                time.register(_EVENT, e - 1, self._fire_name)
            if lateness:
                time.register(_EVENT, e - 1 + lateness, self._clean_name)
            return
        entry[1] = acc = agg.add(value, entry[1])
        store.update(state)
        if e - 1 <= wm:
            self._emit(key, s, e, acc, ctx)

    def _on_sliding_record(self, key: Any, value: Any, ctx: Any) -> None:
        """One accumulator per window (sliding windows whose aggregation cannot merge)."""
        windows = self.assigner.assign(ctx.event_time)  # type: ignore[union-attr]  # Sliding
        time = self.time
        wm = time.operator_watermark()
        lateness = self.lateness
        live = [(s, e) for s, e in windows if e - 1 + lateness > wm]
        if not live:
            self._late(ctx, windows, wm)
            return
        store = self.store
        state = store.value() or {}
        agg = self.agg
        for s, e in live:
            sk = str(s)
            entry = state.get(sk)
            acc = agg.add(value, agg.create() if entry is None else entry[1])
            state[sk] = [e, acc]
            if e - 1 <= wm:
                # Fired already, within the allowed lateness: an updated result now.
                self._emit(key, s, e, acc, ctx)
            elif entry is None:
                time.register(_EVENT, e - 1, self._fire_name)
            if entry is None and lateness:
                time.register(_EVENT, e - 1 + lateness, self._clean_name)
        store.update(state)

    def _on_slice_record(self, key: Any, value: Any, ctx: Any) -> None:
        """A record updates the one slice it falls in (see the class docstring).

        The windows containing it are ``[s, s + size)`` for ``s`` on the slide grid from
        ``first`` to ``last``; those the watermark passed but whose allowed lateness it
        has not emit their updated result at once, as with one entry per window.
        """
        a: Sliding = self.assigner  # type: ignore[assignment]  # set for Sliding only
        g: int = self.slice_ms  # type: ignore[assignment]  # set with this method
        ts = ctx.event_time
        size, slide, offset = a.size_ms, a.slide_ms, a.offset_ms
        last = ts - (ts - offset) % slide
        time = self.time
        wm = time.operator_watermark()
        lateness = self.lateness
        if last + size - 1 + lateness <= wm:
            self._late(ctx, a.assign(ts), wm)
            return
        p = ts - (ts - offset) % g
        pk = "s" + str(p)
        store = self.store
        state = store.value()
        if state is None:
            state = {}
        entry = state.get(pk)
        if self._ordered:
            n = state.get("n")
            if n is None:
                state["n"] = n = [0, 0]
            seq = n[1]
            n[1] = seq + 1
            if entry is None:
                state[pk] = [p + g, [seq, value]]
            else:
                entry[1].append(seq)
                entry[1].append(value)
        else:
            agg = self.agg
            if entry is None:
                state[pk] = [p + g, agg.add(value, agg.create())]
            else:
                entry[1] = agg.add(value, entry[1])
        store.update(state)
        first = last - slide * ((last - ts + size - 1) // slide)
        if first + size - 1 <= wm:
            # Windows that fired already, within the allowed lateness: updated results.
            for s in range(first, last + 1, slide):
                e = s + size
                if e - 1 > wm:
                    break
                if e - 1 + lateness > wm:
                    self._emit(key, s, e, self._window_acc(state, s, e), ctx)
        if entry is None:
            # A new slice: a timer at the end of its first window that has not fired
            # (the firing sets the next one: the timers chain through the windows with
            # data), and one where its last window is purged.
            e = first + size
            if e - 1 <= wm:
                e += ((wm - e + 1) // slide + 1) * slide
            if e <= last + size:
                time.register(_EVENT, e - 1, self._fire_name)
            if lateness:
                time.register(_EVENT, last + size - 1 + lateness, self._clean_name)

    def _window_parts(self, state: dict[str, Any], s: int, e: int) -> tuple[Any, list[Any]]:
        """Window ``[s, e)``'s entry of an earlier version (or ``None``) and its slices.

        The slices' accumulators come oldest first.
        """
        g: int = self.slice_ms  # type: ignore[assignment]  # sliced operators only
        old = state.get(str(s))
        get = state.get
        parts = []
        for p in range(s, e, g):
            entry = get("s" + str(p))
            if entry is not None:
                parts.append(entry[1])
        return (old[1] if old is not None and old[0] == e else None), parts

    def _window_acc(self, state: dict[str, Any], s: int, e: int) -> Any:
        """The accumulator of window ``[s, e)``: its slices (and old entry) merged."""
        old, parts = self._window_parts(state, s, e)
        return self._merged(old, parts)

    def _merged(self, old: Any, parts: list[Any]) -> Any:
        """A window's accumulator: its old entry (or ``None``), then its slices', merged.

        Starts from a fresh accumulator, so a ``merge`` that changes its first argument
        never changes a stored slice; one that returns a stored accumulator as it is
        gets a copy to go on with. Counts (``count()``) are summed; ``process()`` values
        come in arrival order (an old entry's first: they all came before any slice).
        """
        if self._counts:
            return sum(parts, 0 if old is None else old)
        if self._ordered:
            values = [] if old is None else list(old)
            if len(parts) == 1:
                values.extend(parts[0][1::2])
            elif parts:
                pairs: list[tuple[int, Any]] = []
                for part in parts:
                    pairs.extend(zip(part[0::2], part[1::2], strict=True))
                pairs.sort(key=_first)  # sorted runs, one per slice: merged in C
                values.extend([v for _, v in pairs])
            return values
        agg = self.agg
        merge = agg.merge
        acc = agg.create()
        for part in parts if old is None else [old, *parts]:
            acc = merge(acc, part)
            if acc is part:
                acc = copy.deepcopy(acc)
        return acc

    def _on_session_record(self, key: Any, value: Any, ctx: Any) -> None:
        gap = self.assigner.gap_ms  # type: ignore[union-attr]  # set for Session only
        time = self.time
        wm = time.operator_watermark()
        lateness = self.lateness
        ts = ctx.event_time
        start, end = ts, ts + gap
        sessions: list[list[Any]] = self.store.value() or []
        agg = self.agg
        acc = agg.add(value, agg.create())
        keep = []
        merged = []
        for sess in sessions:
            if sess[0] < end and start < sess[1]:
                merged.append(sess)
            else:
                keep.append(sess)
        for s, e, a in merged:
            start, end = min(start, s), max(end, e)
            acc = agg.merge(a, acc)
        if end - 1 + lateness <= wm:
            self._late(ctx, [(start, end)], wm)
            return
        for _s, e, _ in merged:
            if e != end:
                time.delete(_EVENT, e - 1, self.prefix + ":f")
                if lateness:
                    time.delete(_EVENT, e - 1 + lateness, self.prefix + ":c")
        keep.append([start, end, acc])
        keep.sort(key=lambda x: x[0])
        self.store.update(keep)
        if end - 1 <= wm:
            self._emit(key, start, end, acc, ctx)
        else:
            time.register(_EVENT, end - 1, self.prefix + ":f")
        if lateness:
            time.register(_EVENT, end - 1 + lateness, self.prefix + ":c")

    def _on_count_record(self, key: Any, value: Any, ctx: Any) -> None:
        a: Count | Global = self.assigner  # type: ignore[assignment]  # Count/Global only
        ts = ctx.event_time
        state = self.store.value()
        if state is None:
            state = [0, ts, ts, self.agg.create()]
        n, first, last, acc = state
        acc = self.agg.add(value, acc)
        n += 1
        first, last = min(first, ts), max(last, ts)
        if isinstance(a, Count):
            if n >= a.size:
                self.store.clear()
                self._emit(key, first, last + 1, acc, ctx)
                return
        elif n % a.every == 0:
            self.store.update([n, first, last, acc])
            self._emit(key, first, last + 1, acc, ctx)
            return
        self.store.update([n, first, last, acc])

    def _emit(self, key: Any, start: int, end: int, acc: Any, ctx: Any) -> None:
        """Pass a window's result on, with the event time ``end - 1`` (also for updates)."""
        nxt = self.nxt
        timer_ctx = isinstance(ctx, TimerContext)
        saved = ctx.event_time if timer_ctx else ctx._event_time  # noqa: SLF001 - same package
        if timer_ctx:
            ctx.event_time = end - 1
        else:
            ctx._event_time = end - 1  # noqa: SLF001 - same package
        try:
            for out in self.agg.results(key, start, end, acc):
                nxt(key, out, ctx)
        finally:
            if timer_ctx:
                ctx.event_time = saved
            else:
                ctx._event_time = saved  # noqa: SLF001 - same package

    # -- per timer --------------------------------------------------------------------------

    def on_timer(self, raw_key: bytes | None, t: int, name: str, tctx: Any) -> None:
        """A window's end (``:f``) or its allowed lateness (``:c``) was reached."""
        state = self.store.value()
        if not state:
            return
        if self.slice_ms is not None:
            self._on_slice_timer(t, name == self._fire_name, state, tctx)
            return
        fire = name.endswith(":f")
        lateness = self.lateness
        key = tctx.key
        if isinstance(self.assigner, Session):
            keep = []
            for s, e, acc in state:
                if fire and e - 1 == t:
                    self._emit(key, s, e, acc, tctx)
                if e - 1 + lateness > t:
                    keep.append([s, e, acc])
            if len(keep) != len(state):
                if keep:
                    self.store.update(keep)
                else:
                    self.store.clear()
            return
        changed = False
        try:
            if len(state) > 1:
                order = sorted(state, key=int)
            else:
                order = list(state)
                int(order[0])
        except ValueError:  # slices a sliced window left (see _drop_slices)
            changed = self._drop_slices(state, t)
            order = sorted((sk for sk in state if sk[0] != "s" and sk != "n"), key=int)
        for sk in order:
            e, acc = state[sk]
            if fire and e - 1 == t:
                self._emit(key, int(sk), e, acc, tctx)
            if e - 1 + lateness <= t:
                del state[sk]
                changed = True
        if changed:
            if state:
                self.store.update(state)
            else:
                self.store.clear()

    def _drop_slices(self, state: dict[str, Any], t: int) -> bool:
        """Purge the slices a sliced window left, once ``t`` passed their end (+ lateness).

        An operator that keeps one entry per window (the app changed the assigner or the
        aggregation since) cannot tell which of its windows a slice's records belong to:
        they count in none, and the slice goes when the watermark passes its own end
        (``process()``'s arrival counter with the last slice). Returns whether anything
        was purged.
        """
        slices = [sk for sk in state if sk[0] == "s"]
        drop = [sk for sk in slices if state[sk][0] - 1 + self.lateness <= t]
        if len(drop) == len(slices) and "n" in state:
            drop.append("n")
        for sk in drop:
            del state[sk]
        return bool(drop)

    def _on_slice_timer(self, t: int, fire: bool, state: dict[str, Any], tctx: Any) -> None:
        """Fire the window ending at ``t + 1``; purge what no live window needs.

        One pass over the key's entries finds the window's slices, the ones to purge
        and the next window end with a slice: a firing sets the key's next ``:f`` timer
        there (the chain :meth:`_on_slice_record` starts). ``"<start>"`` entries an
        earlier version (or window size) left fire at their own end and are purged as
        one entry per window is (their timers were set with them).
        """
        a: Sliding = self.assigner  # type: ignore[assignment]  # sliced: Sliding only
        size, slide, offset = a.size_ms, a.slide_ms, a.offset_ms
        lateness = self.lateness
        e = t + 1
        s = e - size
        current = fire and (s - offset) % slide == 0
        drop = []
        nxt = None  # the first end of a window after e that holds a slice
        parts: list[tuple[int, Any]] = []  # (start, accumulator) of the window's slices
        old = None  # the window's entry of an earlier version
        due: list[tuple[int, int, Any]] = []  # old windows of another size ending at e
        for sk, (we, acc) in state.items():
            if sk[0] != "s":
                if sk == "n":
                    continue  # process(): the key's arrival counter
                if fire and we == e:
                    ws = int(sk)
                    if current and ws == s:
                        old = acc
                    else:
                        due.append((ws, we, acc))
                if we - 1 + lateness <= t:
                    drop.append(sk)
                continue
            p = int(sk[1:])
            last_end = p - (p - offset) % slide + size  # the last window containing it
            if last_end - 1 + lateness <= t:
                drop.append(sk)
            if fire and last_end > e:
                first_end = last_end - slide * ((last_end - p - 1) // slide)
                if nxt is None or first_end < nxt:
                    nxt = first_end
            if current and s <= p < e:
                parts.append((p, acc))
        if fire:
            if parts or old is not None:
                parts.sort(key=_first)
                due.append((s, e, self._merged(old, [part for _, part in parts])))
            key = tctx.key
            for ws, we, acc in sorted(due, key=_first) if len(due) > 1 else due:
                self._emit(key, ws, we, acc, tctx)
            if nxt is not None:
                self.time.register(_EVENT, max(nxt, e + slide) - 1, self._fire_name)
        if drop:
            for sk in drop:
                del state[sk]
            if len(state) > 1 or (state and "n" not in state):
                self.store.update(state)
            else:
                self.store.clear()  # nothing left (but perhaps process()'s counter)


def _first(x: tuple[Any, ...]) -> Any:
    return x[0]


_ = NO_WATERMARK  # re-exported for users of this module
