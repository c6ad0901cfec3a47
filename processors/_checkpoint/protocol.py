"""Every ``lockgate-*`` record header, encoded and decoded in one place.

lockgate talks to itself through record headers on ordinary topics:

* **barriers** (DESIGN.md 4): control records a writer key group appends to each internal
  output partition when its checkpoint ends; headers ``lockgate-type: barrier``,
  ``lockgate-ckpt``, ``lockgate-writer`` (``<app>/<key group>``), ``lockgate-writers`` (the
  writer app's key-group count), ``lockgate-wm`` (its watermark, ``-1`` without event
  time), ``lockgate-et: 1`` (it has event time), ``lockgate-idle: 1`` (its watermark is
  idle), ``lockgate-savepoint`` and ``lockgate-stop: 1`` (a savepoint, with stop), and
  ``lockgate-savepoint-apps`` (the apps the savepoint was requested for, comma-separated:
  an app not named ignores the savepoint). The value repeats them as JSON for people
  reading the topic.
* **the writer header** on every record of an internal output (``lockgate-writer``): the
  downstream aligner needs each record's writer;
* **the event-time header** that ``key_by`` sends (``lockgate-event-time``);
* **dead letters**: ``lockgate-error-*`` (type, message, stage), ``lockgate-source-*``
  (topic, partition, offset, timestamp of the failed record) or ``lockgate-timer-*`` (a
  failed timer), then the record's own headers; ``lockgate-replayed-from`` on a record
  re-injected by ``lockgate dlq replay``;
* **late records** of windows: ``lockgate-late-*`` (window, watermark, event time).

Any record with a ``lockgate-type`` header is a control record: user code never sees it.
A header that is not ``lockgate-*`` is the user's and is never interpreted.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import orjson

__all__ = [
    "CONTROL_TYPE",
    "ERROR_MESSAGE",
    "ERROR_PREFIXES",
    "ERROR_STAGE",
    "ERROR_TYPE",
    "ERROR_VALUE_DROPPED",
    "EVENT_TIME",
    "LATE_EVENT_TIME",
    "LATE_WATERMARK",
    "LATE_WINDOW",
    "PREFIX",
    "REPLAYED_FROM",
    "SOURCE_OFFSET",
    "SOURCE_PARTITION",
    "SOURCE_TIMESTAMP",
    "SOURCE_TOPIC",
    "WRITER",
    "Barrier",
    "HeaderList",
    "is_control_record",
    "lockgate_headers",
    "read_barrier",
    "record_error_headers",
    "timer_error_headers",
    "writer_header",
]

HeaderList = list[tuple[str, bytes | str]]

PREFIX = "lockgate-"
#: Present on control records only (value ``barrier``).
CONTROL_TYPE = "lockgate-type"
#: ``<app>/<key group>`` of the writer of a record on an internal topic, or of a barrier.
WRITER = "lockgate-writer"
#: Event time of a record sent by ``key_by`` (milliseconds, decimal).
EVENT_TIME = "lockgate-event-time"

_BARRIER = "barrier"
_CKPT = "lockgate-ckpt"
_WRITERS = "lockgate-writers"
_WATERMARK = "lockgate-wm"
_HAS_EVENT_TIME = "lockgate-et"
_IDLE = "lockgate-idle"
_SAVEPOINT = "lockgate-savepoint"
_STOP = "lockgate-stop"
_SAVEPOINT_APPS = "lockgate-savepoint-apps"

ERROR_TYPE = "lockgate-error-type"
ERROR_MESSAGE = "lockgate-error-message"
ERROR_STAGE = "lockgate-error-stage"
#: A dead letter too large to write went without its value; this says why.
ERROR_VALUE_DROPPED = "lockgate-error-value-dropped"
SOURCE_TOPIC = "lockgate-source-topic"
SOURCE_PARTITION = "lockgate-source-partition"
SOURCE_OFFSET = "lockgate-source-offset"
SOURCE_TIMESTAMP = "lockgate-source-timestamp"
_TIMER_TIME = "lockgate-timer-time"
_TIMER_NAME = "lockgate-timer-name"
#: Headers of a dead letter that describe the failure (dropped on replay).
ERROR_PREFIXES = ("lockgate-error-", "lockgate-source-", "lockgate-timer-")
#: Added to every record ``lockgate dlq replay`` re-injects: ``<dlq partition>:<offset>``.
REPLAYED_FROM = "lockgate-replayed-from"

LATE_WINDOW = "lockgate-late-window"
LATE_WATERMARK = "lockgate-late-watermark"
LATE_EVENT_TIME = "lockgate-late-event-time"

#: Longest error message kept in a dead letter's headers.
_MAX_MESSAGE = 2000


# -- barriers --------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Barrier:
    """One barrier record, as written by key group ``writer`` and read downstream.

    Attributes:
        checkpoint: the checkpoint it ends (strictly increasing per writer).
        writer: ``<app>/<key group>``.
        writers: the writer app's key-group count (0 if unknown).
        watermark: the writer's watermark (``-1`` without event time); ``None`` when a
            barrier read from a topic carried an unreadable one.
        event_time: the writer has event time (its watermark means something).
        idle: the writer's watermark is idle (left out of the downstream minimum).
        savepoint: the savepoint this checkpoint also takes, if any.
        stop: the savepoint stops the pipeline (stop-with-savepoint).
        apps: the apps the savepoint was requested for (empty: every app, as barriers
            written before this field existed).
    """

    checkpoint: int
    writer: str
    writers: int
    watermark: int | None = -1
    event_time: bool = False
    idle: bool = False
    savepoint: str | None = None
    stop: bool = False
    apps: tuple[str, ...] = ()

    def for_app(self, app: str) -> str | None:
        """The savepoint app ``app`` takes at this barrier (``None``: none, or not for it)."""
        if self.savepoint is None or (self.apps and app not in self.apps):
            return None
        return self.savepoint

    def encode(self) -> tuple[bytes, HeaderList]:
        """Return the record value (JSON, for people) and headers (for lockgate)."""
        wm = -1 if self.watermark is None else self.watermark
        value: dict[str, Any] = {
            "type": _BARRIER,
            "ckpt": self.checkpoint,
            "writer": self.writer,
            "writers": self.writers,
            "wm": wm,
        }
        headers: HeaderList = [
            (CONTROL_TYPE, b"barrier"),
            (_CKPT, str(self.checkpoint).encode()),
            (WRITER, self.writer.encode()),
            (_WRITERS, str(self.writers).encode()),
            (_WATERMARK, str(wm).encode()),
        ]
        if self.event_time:
            headers.append((_HAS_EVENT_TIME, b"1"))
            if self.idle:
                headers.append((_IDLE, b"1"))
        if self.savepoint is not None:
            value["savepoint"] = self.savepoint
            value["stop"] = self.stop
            headers.append((_SAVEPOINT, self.savepoint.encode()))
            if self.stop:
                headers.append((_STOP, b"1"))
            if self.apps:
                value["apps"] = list(self.apps)
                headers.append((_SAVEPOINT_APPS, ",".join(self.apps).encode()))
        return orjson.dumps(value), headers


def read_barrier(headers: dict[str, str]) -> Barrier | None:
    """Decode a control record's headers (from :func:`lockgate_headers`) as a barrier.

    Returns ``None`` for a control record that is not a barrier, or a barrier without a
    readable checkpoint id or writer. An unreadable watermark gives ``watermark=None``.
    """
    if headers.get(CONTROL_TYPE) != _BARRIER:
        return None
    try:
        checkpoint = int(headers[_CKPT])
        writer = headers[WRITER]
        writers = int(headers.get(_WRITERS) or 0)
    except (KeyError, ValueError):
        return None
    try:
        watermark: int | None = int(headers[_WATERMARK])
    except (KeyError, ValueError):
        watermark = None
    return Barrier(
        checkpoint,
        writer,
        writers,
        watermark,
        event_time=headers.get(_HAS_EVENT_TIME) == "1",
        idle=headers.get(_IDLE) == "1",
        savepoint=headers.get(_SAVEPOINT),
        stop=headers.get(_STOP) == "1",
        apps=tuple(a for a in (headers.get(_SAVEPOINT_APPS) or "").split(",") if a),
    )


# -- reading headers -------------------------------------------------------------------


def lockgate_headers(headers: list[tuple[str, bytes | None]]) -> dict[str, str]:
    """Return the ``lockgate-*`` headers of a record as text.

    The first of each name wins: the runtime puts its own first, user code may copy
    upstream headers after them.
    """
    out: dict[str, str] = {}
    for name, value in headers:
        if name.startswith(PREFIX) and name not in out:
            out[name] = value.decode(errors="replace") if value is not None else ""
    return out


def is_control_record(headers: Iterable[tuple[str, Any]] | Mapping[str, Any] | None) -> bool:
    """Whether a record with these headers is a control record (never for user code)."""
    if isinstance(headers, Mapping):
        return CONTROL_TYPE in headers
    return any(name == CONTROL_TYPE for name, _ in headers or ())


def writer_header(app: str, key_group: int) -> HeaderList:
    """The header every record of key group ``key_group`` of ``app`` carries on internal topics."""
    return [(WRITER, f"{app}/{key_group}".encode())]


# -- dead letters ----------------------------------------------------------------------


def record_error_headers(msg: Any, exc: BaseException, stage: str) -> HeaderList:
    """Return the dead-letter headers of record ``msg`` that failed with ``exc`` in ``stage``.

    The failure's description first, then the record's own headers.
    """
    headers: HeaderList = [
        (ERROR_TYPE, type(exc).__name__),
        (ERROR_MESSAGE, str(exc)[:_MAX_MESSAGE]),
        (ERROR_STAGE, stage),
        (SOURCE_TOPIC, msg.topic()),
        (SOURCE_PARTITION, str(msg.partition())),
        (SOURCE_OFFSET, str(msg.offset())),
        (SOURCE_TIMESTAMP, str(msg.timestamp()[1])),
    ]
    headers.extend(msg.headers() or [])
    return headers


def timer_error_headers(exc: BaseException, time_ms: int, name: str) -> HeaderList:
    """Return the dead-letter headers of timer ``name`` at ``time_ms`` that raised ``exc``."""
    return [
        (ERROR_TYPE, type(exc).__name__),
        (ERROR_MESSAGE, str(exc)[:_MAX_MESSAGE]),
        (ERROR_STAGE, "timer"),
        (_TIMER_TIME, str(time_ms)),
        (_TIMER_NAME, name),
    ]
