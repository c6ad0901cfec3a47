"""Sessionization: each user's clicks grouped into event-time sessions.

The contract (independent checkers drive it):

- app name ``sessions``;
- input ``LOCKGATE_INPUT_TOPIC`` (default ``clicks``): key = user id (UTF-8 string),
  value = ``{"ts": <epoch ms>, "page": <str>}`` (``ts`` is the event time);
- watermarks with bounded out-of-orderness ``LOCKGATE_MAX_DELAY_MS`` (default 5000): a
  key group's watermark is the newest ``ts`` seen on its partition minus the delay
  minus 1;
- session windows with gap ``LOCKGATE_SESSION_GAP_MS`` (default 30000): a click at
  ``t`` opens ``[t, t + gap)``; windows of a user that overlap merge into one session
  ``[first click, last click + gap)``. A session fires once the watermark reaches
  ``end - 1``; allowed lateness 0 (a fired session is gone: a later click that does
  not overlap any open session opens a new one);
- when a session fires, exactly one record on ``LOCKGATE_OUTPUT_TOPIC`` (default
  ``sessions``): key = the user, value ``{"start": <ms>, "end": <ms>, "clicks": <int>,
  "pages": [<str>, ...]}`` where ``pages`` lists the distinct pages of the session in
  order of their first visit (by event time; pages first visited at the same ``ts``
  in name order);
- a click whose session ``[t, t + gap)`` (merged with the open sessions it overlaps)
  would end at or before the watermark (``end - 1 <= watermark``) is late: it goes,
  unchanged (key, value and headers), to ``<app name>.late`` (``LOCKGATE_APP_NAME``,
  default ``sessions``) with headers
  ``lockgate-late-window`` (``"<start>-<end>"``), ``lockgate-late-watermark`` and
  ``lockgate-late-event-time``.

Run: ``LOCKGATE_BOOTSTRAP_SERVERS=127.0.0.1:9092 lockgate run examples.sessions:app``
"""

import os
from typing import Any

from processors import App, Session, Watermarks, WindowResult

INPUT = os.environ.get("LOCKGATE_INPUT_TOPIC", "clicks")
OUTPUT = os.environ.get("LOCKGATE_OUTPUT_TOPIC", "sessions")
SESSION_GAP_MS = int(os.environ.get("LOCKGATE_SESSION_GAP_MS", "30000"))
MAX_DELAY_MS = int(os.environ.get("LOCKGATE_MAX_DELAY_MS", "5000"))

app = App("sessions", env=["LOCKGATE_SESSION_GAP_MS", "LOCKGATE_MAX_DELAY_MS"])

#: The accumulator of a session: ``[clicks, {page: event time of its first visit}]``
#: (JSON-storable; independent of the order clicks arrive in, so merges are exact).
Acc = list[Any]


def event_time(value: dict[str, Any]) -> int:
    """The event time of a click: its ``ts`` field."""
    return int(value["ts"])


class SessionAggregator:
    """Counts a session's clicks and keeps each page's first visit (mergeable)."""

    def create_accumulator(self) -> Acc:
        """No click yet."""
        return [0, {}]

    def add(self, value: dict[str, Any], acc: Acc) -> Acc:
        """One more click."""
        clicks, first = acc
        page, ts = str(value["page"]), int(value["ts"])
        seen = first.get(page)
        return [clicks + 1, {**first, page: ts if seen is None else min(seen, ts)}]

    def merge(self, a: Acc, b: Acc) -> Acc:
        """Two sessions bridged by a click: clicks add, first visits are the earlier."""
        first = dict(a[1])
        for page, ts in b[1].items():
            seen = first.get(page)
            first[page] = ts if seen is None else min(seen, ts)
        return [a[0] + b[0], first]

    def get_result(self, acc: Acc) -> dict[str, Any]:
        """``{"clicks", "pages"}``: pages by first visit (ties by name)."""
        clicks, first = acc
        pages = [page for page, _ in sorted(first.items(), key=lambda item: (item[1], item[0]))]
        return {"clicks": clicks, "pages": pages}


def as_output(window: WindowResult[dict[str, Any]]) -> dict[str, Any]:
    """The output value of a fired session."""
    return {"start": window.start, "end": window.end, **window.value}


(
    app.stream(INPUT, timestamp=event_time, watermarks=Watermarks.bounded(MAX_DELAY_MS))
    .window(Session(SESSION_GAP_MS), late_topic=True)
    .aggregate(SessionAggregator())
    .map(as_output)
    .to(OUTPUT)
)
