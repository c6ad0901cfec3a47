"""Event time: timestamps, per-key-group watermarks and keyed timers (DESIGN 9).

Everything here is keyed state of the key group, kept in one store (``lockgate.time``)
that commits, restores and savepoints like any other:

- ``b"w"``: the key group's watermark, the highest event time seen on each of its
  input partitions, and for inputs written by other lockgate apps the watermark each
  upstream writer announced in its last barrier;
- ``b"t" + kind + be64(time) + key``: a timer (``kind`` ``e`` event time, ``p``
  processing time) of one key at one time; the value lists the timer names set there.
  Keys sort by kind, then time, then key: the store is the ordered timer queue.

A key group's watermark is the minimum over its inputs of each input's watermark:
``max event time seen - max_delay_ms - 1`` for external inputs (bounded
out-of-orderness; ``max_delay_ms=0`` is monotonous), the minimum over the expected
upstream writers' barrier watermarks for another lockgate app's internal topic. An
input with no record for ``idle_ms`` (a writer that announced itself idle) is left out
of the minimum; when every input (writer) is idle, the highest watermark they reached
counts (as Flink's watermark valve does). It never goes back.

It advances after each record (and each barrier, and on a processing-time tick for
idleness) and fires every event-time timer at or below it, in time order, in the open
epoch: the timer's deletion, its outputs and its state changes commit together, so a
timer fires exactly once across crashes, and a replay from a checkpoint fires the same
timers at the same records as the original run (idleness, a processing-time decision,
is the exception). Processing-time timers fire on the wall clock between batches.
"""

from __future__ import annotations

import heapq
import logging
import struct
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from processors.exceptions import ConfigError
from state.cache import DELETED, KeyCursor, StoreCache
from state.codecs import JSON
from state.exceptions import StateError
from state.primitives import StateHandle, StoreSpec

__all__ = [
    "NO_WATERMARK",
    "TIME_STORE",
    "TimeService",
    "TimerContext",
    "Timers",
    "Watermarks",
]

log = logging.getLogger("lockgate.time")

#: The store holding watermarks and timers.
TIME_STORE = "lockgate.time"
#: Barrier watermarks kept per upstream writer until their checkpoint completes; beyond
#: it the oldest are dropped (they are stored with the key group's time state).
MAX_PENDING_PER_WRITER = 32
#: ... and for all writers of a key group together (about 80 bytes each in its time
#: state, rewritten to the changelog each epoch): with many writers each keeps fewer.
MAX_PENDING_ENTRIES = 4096
#: The watermark before any event time was seen.
NO_WATERMARK = -(2**63)
_NEVER = 2**63
_BIAS = 2**63
_WM_KEY = b"w"
_BE64 = struct.Struct(">Q")
_PACK = _BE64.pack
_EVENT = b"e"
_PROC = b"p"

#: ``fn(raw_key, time, name, ctx)``: fires one timer of an owner (a window operator, or
#: the app's ``on_timer`` handler).
TimerCallback = Callable[[bytes | None, int, str, "TimerContext"], None]


@dataclass(frozen=True)
class Watermarks:
    """How an input's watermark follows the event times seen on each of its partitions.

    Attributes:
        max_delay_ms: bounded out-of-orderness: a record may be up to this much older
            than the newest seen before it and still be on time. ``0``: monotonous.
        idle_ms: a partition with no record for this long (processing time) stops
            holding its key group's watermark back; ``None``: never idle.
        idle_advance: when every input of a key group is idle, let processing time move
            its watermark to ``now - max_delay_ms - 1`` once an event-time timer (a
            window's end) is due there, so the last windows fire without new data
            (needs ``idle_ms``; a processing-time decision: a replay may fire them at
            another moment, docs/event-time.md).
    """

    max_delay_ms: int = 0
    idle_ms: int | None = None
    idle_advance: bool = False

    def __post_init__(self) -> None:
        if self.max_delay_ms < 0:
            raise ConfigError(f"Watermarks: max_delay_ms must be >= 0, got {self.max_delay_ms}")
        if self.idle_ms is not None and self.idle_ms <= 0:
            raise ConfigError(f"Watermarks: idle_ms must be > 0 (or None), got {self.idle_ms}")
        if self.idle_advance and self.idle_ms is None:
            raise ConfigError(
                "Watermarks: idle_advance needs idle_ms (how long an input is quiet before "
                "processing time moves its watermark)"
            )

    @classmethod
    def bounded(
        cls, max_delay_ms: int, *, idle_ms: int | None = None, idle_advance: bool = False
    ) -> Watermarks:
        """Bounded out-of-orderness: records up to ``max_delay_ms`` late are on time."""
        return cls(max_delay_ms, idle_ms, idle_advance)

    @classmethod
    def monotonous(cls, *, idle_ms: int | None = None, idle_advance: bool = False) -> Watermarks:
        """Event times never go back: the watermark follows the newest one."""
        return cls(0, idle_ms, idle_advance)


def timer_key(kind: bytes, time_ms: int, raw_key: bytes) -> bytes:
    """Return the timer store key of a timer (ordered by kind, time, key)."""
    return b"t" + kind + _PACK(time_ms + _BIAS) + raw_key


def _split_timer_key(tk: bytes) -> tuple[int, bytes]:
    return _BE64.unpack_from(tk, 2)[0] - _BIAS, tk[10:]


class _TimeHandle(StateHandle):
    """The runtime's handle on the time store (bound per key group like any handle)."""

    __slots__ = ()

    @property
    def cache(self) -> StoreCache:
        return self._cache


class _Clock:
    """The event-time state of one key group, mirrored in memory for speed.

    The heaps hold every live timer (lazily: a deleted timer's entry stays in its heap
    until it surfaces, and is skipped because it is not in ``live``).
    """

    __slots__ = (
        "cache",
        "dirty_wm",
        "event",
        "expected",
        "idle_since",
        "internal",
        "last_seen",
        "live",
        "max_ts",
        "pending",
        "proc",
        "record",
        "wm",
        "writers",
    )

    def __init__(self, cache: StoreCache) -> None:
        self.cache = cache
        self.wm = NO_WATERMARK
        self.max_ts: dict[str, int] = {}
        #: topic -> writer -> [watermark, idle]
        self.writers: dict[str, dict[str, list[Any]]] = {}
        #: topic -> upstream app -> key-group count
        self.expected: dict[str, dict[str, int]] = {}
        #: inputs written by lockgate apps: their watermark comes from barriers only
        self.internal: set[str] = set()
        #: upstream barriers read whose checkpoint has not completed here yet:
        #: [topic, checkpoint, writer, writer count, watermark, idle]
        self.pending: list[list[Any]] = []
        self.last_seen: dict[str, int] = {}  # processing time of the last record, per input
        self.idle_since: int | None = None
        self.live: dict[bytes, list[str]] = {}
        self.event: list[tuple[int, bytes]] = []
        self.proc: list[tuple[int, bytes]] = []
        self.dirty_wm = False
        stored = cache.get(_WM_KEY)
        if stored is not DELETED:
            self.wm = stored["wm"]
            self.max_ts = dict(stored.get("max", {}))
            self.writers = {t: dict(w) for t, w in stored.get("writers", {}).items()}
            self.expected = {t: dict(e) for t, e in stored.get("expected", {}).items()}
            self.internal = set(stored.get("internal", ()))
            self.pending = [list(p) for p in stored.get("pending", ())]
        # Every timer of the key group: the committed ones (the cache holds no
        # uncommitted timer of a key group whose clock is being (re)built).
        decode = cache.codec.decode
        live = self.live
        for tk, raw in cache.db.iter_from(cache.name, b"t", 1 << 62):
            if not tk.startswith(b"t"):
                break
            live[tk] = decode(raw)
        # Timers written in the open epoch and not applied yet (e.g. seeded from a
        # savepoint, or drained by a commit in progress) count too.
        for tk in cache.dirty:
            if tk.startswith(b"t"):
                value = cache.values[tk]
                if value is DELETED:
                    live.pop(tk, None)
                else:
                    live[tk] = value
        for tk in live:
            t, _ = _split_timer_key(tk)
            (self.event if tk[1:2] == _EVENT else self.proc).append((t, tk))
        heapq.heapify(self.event)
        heapq.heapify(self.proc)

        #: The stored ``w`` entry: one dict, updated in place and put again when changed.
        self.record: dict[str, Any] = {
            "wm": self.wm,
            "max": self.max_ts,
            "writers": self.writers,
            "expected": self.expected,
            "internal": sorted(self.internal),
            "pending": self.pending,
        }

    def save(self) -> None:
        self.record["wm"] = self.wm
        self.cache.put(_WM_KEY, self.record)


class Timers:
    """Keyed timers of the record (or timer) in progress: ``ctx.timers``.

    Times are ms since the Unix epoch. A timer is identified by its key, time, kind and
    ``name``: setting it again is a no-op, and it fires once (the app's ``on_timer``
    handler gets the name). Event-time timers fire when the key group's watermark
    reaches their time, processing-time timers when the wall clock does.
    """

    __slots__ = ("_svc",)

    def __init__(self, svc: TimeService) -> None:
        self._svc = svc

    @property
    def watermark(self) -> int:
        """The key group's current watermark (``NO_WATERMARK`` before any event time)."""
        return self._svc.clock().wm

    @property
    def processing_time(self) -> int:
        """The processing time of the batch in progress (ms)."""
        return self._svc.cursor.now_ms

    def set_event_time(self, time_ms: int, name: str = "") -> None:
        """Fire ``on_timer`` for this key when the watermark reaches ``time_ms``.

        Raises:
            processors.exceptions.ConfigError: no ``@app.on_timer``, or no input of the
                app has event time (the watermark would never move).
        """
        self._svc.check_user_timers()
        if not self._svc.strategies:
            raise ConfigError(
                "event-time timers need an input with event time (watermarks=... on "
                "app.stream or @app.process): without one the watermark never moves"
            )
        self._svc.register(_EVENT, int(time_ms), "u" + name)

    def set_processing_time(self, time_ms: int, name: str = "") -> None:
        """Fire ``on_timer`` for this key when the wall clock reaches ``time_ms``."""
        self._svc.check_user_timers()
        self._svc.register(_PROC, int(time_ms), "u" + name)

    def delete_event_time(self, time_ms: int, name: str = "") -> None:
        """Delete this key's event-time timer at ``time_ms`` named ``name`` (if set)."""
        self._svc.delete(_EVENT, int(time_ms), "u" + name)

    def delete_processing_time(self, time_ms: int, name: str = "") -> None:
        """Delete this key's processing-time timer at ``time_ms`` named ``name``."""
        self._svc.delete(_PROC, int(time_ms), "u" + name)


class TimerContext:
    """What a timer callback (or a window result downstream of one) sees as ``ctx``.

    The same surface as a record's :class:`~processors.Context` where it makes sense:
    ``timestamp``/``event_time`` are the timer's time, ``emit`` sends into the open
    epoch, ``timers`` sets more timers. There is no record: ``topic``/``offset`` are ``None``.
    """

    __slots__ = (
        "_emit",
        "event_time",
        "key",
        "name",
        "partition",
        "raw_key",
        "timers",
        "watermark",
    )

    def __init__(self, emit: Callable[..., None], timers: Timers) -> None:
        self._emit = emit
        self.timers = timers
        self.event_time = 0
        self.watermark = NO_WATERMARK
        self.partition = -1
        self.key: Any = None
        #: The serialized key the timer belongs to.
        self.raw_key: bytes | None = None
        self.name = ""

    topic = None
    offset = None
    message = None
    headers: list[tuple[str, bytes]] = []  # noqa: RUF012 - read-only, shared

    @property
    def timestamp(self) -> int:
        """The timer's time (ms)."""
        return self.event_time

    def emit(
        self, topic: str, key: Any, value: Any, headers: Any = None, timestamp: int | None = None
    ) -> None:
        """Send ``key``/``value`` to ``topic`` in the open epoch (as ``Context.emit``)."""
        self._emit(topic, key, value, headers, timestamp)


def _chain_order(name: str) -> tuple[int, int, str]:
    """Window timers (``w<n>:...``) in operator order first, then the user's."""
    if name.startswith("w"):
        head = name[1:].split(":", 1)[0]
        if head.isdigit():
            return 0, int(head), name
    return 1, 0, name


class TimerHooks(Protocol):
    """What the runtime does around each timer callback."""

    def timer_started(self, raw_key: bytes | None, t: int, name: str) -> bool:
        """A callback is about to run; ``False``: skip it (it was dead-lettered)."""

    def timer_done(self, raw_key: bytes | None, t: int, name: str) -> None:
        """It returned (it may still have had an output rejected)."""

    def timer_failed(self, raw_key: bytes | None, t: int, name: str, exc: BaseException) -> None:
        """It raised ``exc``."""


class TimeService:
    """Watermarks and timers of every key group of an app (one per :class:`App`).

    The runtime (and the test driver) call :meth:`observe` after each record,
    :meth:`on_barrier_watermark` for upstream barriers and :meth:`tick` between batches;
    window operators and ``ctx.timers`` call :meth:`register` / :meth:`delete`.
    """

    def __init__(self, cursor: KeyCursor) -> None:
        self.cursor = cursor
        self.handle = _TimeHandle(StoreSpec(TIME_STORE, "value", JSON), cursor)
        self._owners: dict[str, TimerCallback] = {}
        self._user: TimerCallback | None = None
        #: topic -> watermark strategy of every input that uses event time
        self.strategies: dict[str, Watermarks] = {}
        self.timers = Timers(self)
        #: Set by the runtime / test driver: how timer outputs are produced, how a
        #: failing timer is reported, how the key codec decodes timer keys.
        self.emit: Callable[..., None] | None = None
        self.on_error: Callable[[bytes | None, int, str, BaseException], None] | None = None
        self.decode_key: Callable[[bytes], Any] = lambda b: b
        self._firing = False
        #: The event-time timer being fired, if any (see :meth:`operator_watermark`).
        self.firing_at: int | None = None
        #: The runtime's bookkeeping around each timer (see :class:`TimerHooks`).
        self.hooks: TimerHooks | None = None
        self.needs_tick = False
        #: The runtime reads upstream barriers (single-input apps): internal inputs'
        #: watermarks come from them. Otherwise (multi-input apps, the test driver) from
        #: record times like any input.
        self.reads_barriers = False
        self._single: int | None | bool = False  # see _single_delay (False: not known yet)
        #: Internal inputs whose upstream has no event time: record times it is.
        self.record_time_inputs: set[str] = set()
        #: An aborted epoch leaves nothing in the changelog (exactly-once: the changelog
        #: is written in the epoch's transaction). Only then may a timer set and fired
        #: within one epoch skip its writes (StoreCache.put_new): under at-least-once an
        #: aborted epoch's changelog records stay, so a timer it wrote, set again and
        #: fired in the replay, needs its tombstone. Off unless whoever runs the app
        #: says its epochs are atomic (the runtime under exactly-once, the test driver,
        #: a backfill task), so a new way of running an app cannot skip them by mistake.
        self.atomic_epochs = False

    # -- owners ---------------------------------------------------------------------------

    def add_owner(self, prefix: str, callback: TimerCallback) -> None:
        """Route timers whose name starts with ``prefix`` to ``callback``."""
        self._owners[prefix] = callback

    def set_user_handler(self, callback: TimerCallback) -> None:
        """Route ``ctx.timers`` timers to the app's ``on_timer`` handler."""
        self._user = callback
        self.needs_tick = True  # processing-time timers

    def check_user_timers(self) -> None:
        if self._user is None:
            raise ConfigError(
                "ctx.timers.set_*() needs a timer handler: declare one with @app.on_timer"
            )

    # -- clocks ---------------------------------------------------------------------------

    def clock(self) -> _Clock:
        """The clock of the key group the handles are bound to (rebuilt after an abort).

        Kept on the store's cache (``derived``): a new key-group incarnation has a new
        cache, and an aborted epoch's ``discard()`` drops it.
        """
        cache = self.handle._cache  # noqa: SLF001 - our own handle
        clock: _Clock | None = cache.derived
        if clock is None:
            clock = cache.derived = _Clock(cache)
        return clock

    def watermark(self) -> int:
        """The watermark of the bound key group."""
        return self.clock().wm

    def announce(self, cache: StoreCache) -> tuple[int, bool]:
        """(watermark, idle) of the key group of ``cache``: what its barriers carry."""
        clock: _Clock | None = cache.derived
        if clock is not None:
            return clock.wm, clock.idle_since is not None
        stored = cache.get(_WM_KEY)  # no clock yet: nothing moved it since it was stored
        return (NO_WATERMARK if stored is DELETED else stored["wm"]), False

    # -- timers ---------------------------------------------------------------------------

    def register(self, kind: bytes, time_ms: int, name: str) -> None:
        """Set a timer of the current key (idempotent)."""
        raw_key = self.cursor.key
        if raw_key is None:
            raise StateError("timers need a record key; this record has none")
        clock: _Clock | None = self.handle._cache.derived  # noqa: SLF001 - our own handle
        if clock is None:
            clock = self.clock()
        tk = b"t" + kind + _PACK(time_ms + _BIAS) + raw_key  # timer_key(), inlined
        live = clock.live
        names = live.get(tk)
        if names is None:
            live[tk] = names = [name]
            heapq.heappush(clock.event if kind == _EVENT else clock.proc, (time_ms, tk))
            # Not live: absent from the store now (``live`` mirrors it), so a firing
            # within this epoch writes nothing at all (StoreCache.put_new).
            if self.atomic_epochs:
                clock.cache.put_new(tk, names)
            else:
                clock.cache.put(tk, names)
            return
        if name in names:
            return
        live[tk] = names = [*names, name]
        clock.cache.put(tk, names)

    def delete(self, kind: bytes, time_ms: int, name: str) -> None:
        """Delete a timer of the current key (no-op when not set)."""
        raw_key = self.cursor.key
        if raw_key is None:
            return
        clock = self.clock()
        tk = timer_key(kind, time_ms, raw_key)
        names = clock.live.get(tk)
        if names is None or name not in names:
            return
        rest = [n for n in names if n != name]
        if rest:
            clock.live[tk] = rest
            clock.cache.put(tk, rest)
        else:
            del clock.live[tk]  # its heap entry is skipped when it surfaces
            clock.cache.delete(tk)

    def _fire(self, clock: _Clock, heap: list[tuple[int, bytes]], upto: int, g: int) -> None:
        """Fire the timers of ``heap`` at or before ``upto``, in time order.

        Timers set meanwhile at or before ``upto`` fire in the same pass. The names of
        one key's timer at one time fire in chain order (window operators in declaration
        order, then ``on_timer``), and while an event-time timer at ``t`` fires, window
        operators see the watermark ``t - 1``: a window result (event time ``end - 1``)
        reaching a later window is judged as of its own time, not as of the final
        watermark of the pass.
        """
        if self._firing:
            return  # re-entered from a callback: the pass in progress continues
        self._firing = True
        event = heap is clock.event
        cursor = self.cursor
        saved = cursor.key
        assert self.emit is not None, "the runtime sets TimeService.emit"
        tctx = TimerContext(self.emit, self.timers)
        tctx.partition = g
        hooks = self.hooks
        try:
            while heap and heap[0][0] <= upto:
                t, tk = heapq.heappop(heap)
                names = clock.live.pop(tk, None)
                if names is None:
                    continue  # deleted
                clock.cache.delete(tk)
                raw_key = tk[10:]  # after b"t", the kind and the time (see timer_key)
                cursor.key = raw_key
                tctx.event_time = t
                tctx.watermark = clock.wm
                tctx.key = self.decode_key(raw_key)
                tctx.raw_key = raw_key
                self.firing_at = t if event else None
                for name in sorted(names, key=_chain_order) if len(names) > 1 else names:
                    tctx.name = name[1:] if name.startswith("u") else name
                    if hooks is not None and not hooks.timer_started(raw_key, t, tctx.name):
                        continue  # poisoned: dead-lettered instead of run
                    try:
                        self._dispatch(raw_key, t, name, tctx)
                    except ConfigError:
                        raise
                    except Exception as exc:  # noqa: BLE001 - user code may raise anything
                        if hooks is not None:
                            hooks.timer_failed(raw_key, t, tctx.name, exc)
                        elif self.on_error is not None:
                            self.on_error(raw_key, t, tctx.name, exc)
                        else:
                            raise
                    else:
                        if hooks is not None:
                            hooks.timer_done(raw_key, t, tctx.name)
        finally:
            cursor.key = saved
            self._firing = False
            self.firing_at = None

    def operator_watermark(self) -> int:
        """The watermark a window operator judges lateness by (see :meth:`_fire`)."""
        clock: _Clock | None = self.handle._cache.derived  # noqa: SLF001 - our own handle
        wm = (self.clock() if clock is None else clock).wm
        at = self.firing_at
        return wm if at is None else min(wm, at - 1)

    def _dispatch(self, raw_key: bytes, t: int, name: str, tctx: TimerContext) -> None:
        if name.startswith("u"):
            assert self._user is not None
            self._user(raw_key, t, name[1:], tctx)
            return
        owner = self._owners.get(name)
        if owner is None:
            owner = self._owners.get(name.split(":", 1)[0])
        if owner is None:
            log.warning("dropping a timer nobody owns", extra={"timer": name, "time": t})
            return
        owner(raw_key, t, name, tctx)

    # -- watermarks -----------------------------------------------------------------------

    def observe(self, topic: str, ts: int, internal: bool = False) -> None:
        """A record of ``topic`` at event time ``ts`` was processed in the bound key group.

        Advances the key group's watermark and fires the event-time timers it passed
        (and those the record set at or below the watermark). ``internal``: the record
        was written by another lockgate app (its watermark comes from barriers only).
        """
        clock: _Clock | None = self.handle._cache.derived  # noqa: SLF001 - our own handle
        if clock is None:
            clock = self.clock()
        clock.last_seen[topic] = self.cursor.now_ms
        if clock.idle_since is not None:
            clock.idle_since = None
            clock.dirty_wm = True
        if (
            internal
            and self.reads_barriers
            and topic not in clock.internal
            and topic not in self.record_time_inputs
        ):
            clock.internal.add(topic)
            clock.record["internal"] = sorted(clock.internal)
            clock.dirty_wm = True
        if ts > clock.max_ts.get(topic, NO_WATERMARK):
            clock.max_ts[topic] = ts
            delay = self._single_delay
            if delay is not None and not clock.dirty_wm and not clock.internal:
                # One input, never idle (the common case): its watermark is the key group's.
                wm = ts - delay - 1
                if wm > clock.wm:
                    clock.wm = wm
                clock.save()
                if clock.event and clock.event[0][0] <= clock.wm:
                    self._fire(clock, clock.event, clock.wm, clock.cache.db.key_group)
                return
            clock.dirty_wm = True
        if clock.dirty_wm:
            self._advance(clock, self.cursor.now_ms)
        elif clock.event and clock.event[0][0] <= clock.wm:  # set by this record, already due
            self._fire(clock, clock.event, clock.wm, clock.cache.db.key_group)

    @property
    def _single_delay(self) -> int | None:
        """The max delay of the only input with event time, if it is never idle."""
        single = self._single
        if single is False:
            only = list(self.strategies.values())
            single = only[0].max_delay_ms if len(only) == 1 and only[0].idle_ms is None else None
            self._single = single
        return single

    def on_barrier_watermark(
        self, topic: str, writer: str, count: int, wm: int, idle: bool
    ) -> None:
        """An upstream writer's barrier announced its watermark (and key-group count)."""
        clock = self.clock()
        app = writer.rpartition("/")[0]
        if count:
            expected = clock.expected.setdefault(topic, {})
            if expected.get(app) != count:
                expected[app] = count
                clock.dirty_wm = True
                ws = clock.writers.get(topic, {})
                for w in [w for w in ws if w.rpartition("/")[0] == app]:
                    if int(w.rpartition("/")[2]) >= count:
                        del ws[w]
        entry = clock.writers.setdefault(topic, {}).get(writer)
        if entry is None or entry[0] != wm or entry[1] != idle:
            clock.writers[topic][writer] = [max(wm, entry[0]) if entry else wm, idle]
            clock.dirty_wm = True
        self._advance(clock, self.cursor.now_ms)

    def stash_barrier(
        self, topic: str, ckpt: int, writer: str, count: int, wm: int, idle: bool
    ) -> None:
        """Keep an upstream barrier's watermark until :meth:`apply_pending`.

        The same barrier read again after a rewind replaces its entry.
        """
        clock = self.clock()
        entry = [topic, ckpt, writer, count, wm, idle]
        for i, old in enumerate(clock.pending):
            if old[0] == topic and old[1] == ckpt and old[2] == writer:
                if old == entry:
                    return
                clock.pending[i] = entry
                break
        else:
            clock.pending.append(entry)
            self._bound_pending(clock, topic, writer)
        clock.save()

    @staticmethod
    def _bound_pending(clock: Any, topic: str, writer: str) -> None:
        """Keep at most :data:`MAX_PENDING_PER_WRITER` pending entries of one writer.

        Fewer with many writers (:data:`MAX_PENDING_ENTRIES` in all, at least 4 each).

        Completions stopped coming (e.g. another writer sends no barriers). An entry is
        dropped only when it changes nothing but the watermark (same idleness and key-group
        count as the state before it): the watermark then advances at the next entry's
        completion instead, later but never past what that writer announced. An entry that
        makes the writer active again (or changes its count) is always kept.
        """
        mine = []
        writers = set()
        for p in clock.pending:
            writers.add((p[0], p[2]))
            if p[0] == topic and p[2] == writer:
                mine.append(p)
        mine.sort(key=lambda p: p[1])
        bound = max(4, min(MAX_PENDING_PER_WRITER, MAX_PENDING_ENTRIES // len(writers)))
        excess = len(mine) - bound
        if excess <= 0:
            return
        applied = clock.writers.get(topic, {}).get(writer)
        count_now = clock.expected.get(topic, {}).get(writer.rpartition("/")[0])
        # (key-group count, idle) of the writer as the entries apply one after another.
        before = None if applied is None else (count_now, bool(applied[1]))
        drop = []
        for entry in mine:
            state = (entry[3] or count_now, bool(entry[5]))
            if excess > 0 and state == before:
                drop.append(entry)
                excess -= 1
            else:
                before = state
        if drop:
            clock.pending[:] = [p for p in clock.pending if not any(p is d for d in drop)]

    def apply_pending(self, topic: str, upto: int) -> bool:
        """Apply the pending barrier watermarks of ``topic`` of checkpoints up to ``upto``.

        Returns whether any was applied.
        """
        clock = self.clock()
        due = [p for p in clock.pending if p[0] == topic and p[1] <= upto]
        if not due:
            return False
        clock.pending[:] = [p for p in clock.pending if not (p[0] == topic and p[1] <= upto)]
        clock.dirty_wm = True
        for _topic, _ckpt, writer, count, wm, idle in due:
            self.on_barrier_watermark(topic, writer, count, wm, idle)
        if clock.dirty_wm:
            self._advance(clock, self.cursor.now_ms)
        return True

    def on_barrier_without_event_time(self, topic: str) -> None:
        """An upstream writer of ``topic`` has no event time: its records' times count."""
        if topic not in self.record_time_inputs:
            self.record_time_inputs.add(topic)
            log.warning(
                "an upstream app writing this input has no event time: its watermark "
                "follows the records' times (declare watermarks on the upstream's inputs "
                "to carry them across)",
                extra={"topic": topic},
            )
        clock = self.clock()
        if topic in clock.internal:
            clock.internal.discard(topic)
            clock.record["internal"] = sorted(clock.internal)
            clock.dirty_wm = True
            self._advance(clock, self.cursor.now_ms)

    def _input_watermark(self, clock: _Clock, topic: str, now_ms: int) -> tuple[int, bool] | None:
        """(watermark, idle) of one input partition; ``None``: it does not take part.

        An idle input's watermark is what it reached (for barriers: the highest of its
        writers'); it counts only when every input is idle.
        """
        writers = clock.writers.get(topic)
        if not writers and topic in clock.internal and self.reads_barriers:
            return NO_WATERMARK, False  # no barrier yet: record times say nothing of others
        if writers:
            expected = clock.expected.get(topic, {})
            if sum(expected.values()) > len(writers):
                return NO_WATERMARK, False  # a writer not heard from yet holds it back
            active = [w[0] for w in writers.values() if not w[1]]
            if active:
                return min(active), False
            return max(w[0] for w in writers.values()), True
        strategy = self.strategies.get(topic)
        if strategy is None:
            return None  # an input without event time does not hold the watermark
        high = clock.max_ts.get(topic)
        wm = NO_WATERMARK if high is None else high - strategy.max_delay_ms - 1
        if strategy.idle_ms is not None:
            seen = clock.last_seen.get(topic)
            if seen is None:
                clock.last_seen[topic] = seen = now_ms  # idle counts from now
            if now_ms - seen >= strategy.idle_ms:
                return wm, True
        return wm, False

    def _advance(self, clock: _Clock, now_ms: int) -> None:
        """Recompute the bound key group's watermark and fire the timers it passed.

        The minimum over active inputs; when every input is idle, the highest they
        reached (as Flink's watermark valve does).
        """
        lowest: int | None = None
        highest_idle: int | None = None
        advance: int | None = None  # idle inputs let processing time move it, delay
        for topic in self.strategies:
            got = self._input_watermark(clock, topic, now_ms)
            if got is None:
                continue
            wm, idle = got
            if idle:
                if highest_idle is None or wm > highest_idle:
                    highest_idle = wm
                strategy = self.strategies[topic]
                if strategy.idle_advance and advance != -1:
                    advance = max(advance or 0, strategy.max_delay_ms)
                else:
                    advance = -1  # an idle input without it: nothing moves
            elif lowest is None or wm < lowest:
                lowest = wm
        if lowest is None:  # every input idle (or none): the highest they reached
            if highest_idle is not None and clock.idle_since is None:
                clock.idle_since = now_ms
                clock.dirty_wm = True  # an epoch (and barriers announcing it) must follow
            lowest = highest_idle
            if lowest is not None and advance is not None and advance >= 0:
                # Quiet inputs: processing time moves the watermark, but only when that
                # fires a timer (a watermark moving every tick would commit every epoch).
                target = now_ms - advance - 1
                if target > lowest and clock.event and clock.event[0][0] <= target:
                    lowest = target
        if lowest is not None and lowest > clock.wm:
            clock.wm = lowest
            clock.dirty_wm = True
        if clock.dirty_wm:
            clock.dirty_wm = False
            clock.save()
        if clock.event and clock.event[0][0] <= clock.wm:
            self._fire(clock, clock.event, clock.wm, clock.cache.db.key_group)

    def is_idle(self) -> bool:
        """Whether every input of the bound key group is idle (announced downstream)."""
        clock = self.clock()
        return clock.idle_since is not None

    def advance_to(self, wm: int) -> None:
        """Force the bound key group's watermark to at least ``wm`` (tests, tooling)."""
        clock = self.clock()
        if wm > clock.wm:
            clock.wm = wm
            clock.save()
        if clock.event and clock.event[0][0] <= clock.wm:
            self._fire(clock, clock.event, clock.wm, clock.cache.db.key_group)

    def tick(self, now_ms: int) -> None:
        """Between batches: idleness may advance the watermark; fire processing timers."""
        clock = self.clock()
        self._advance(clock, now_ms)
        if clock.proc and clock.proc[0][0] <= now_ms:
            self._fire(clock, clock.proc, now_ms, clock.cache.db.key_group)
