"""The most viewed pages per key in sliding event-time windows.

The contract (independent checkers drive it):

- app name ``top-pages``;
- input ``LOCKGATE_INPUT_TOPIC`` (default ``pageviews``): key = user or site id (UTF-8
  string), value = ``{"ts": <epoch ms>, "page": <str>}`` (``ts`` is the event time);
- sliding windows ``[start, start + LOCKGATE_WINDOW_MS)`` (default 60000) for every
  ``start`` that is a multiple of ``LOCKGATE_SLIDE_MS`` (default 10000): a view at
  ``t`` is in every such window containing ``t``;
- watermarks with bounded out-of-orderness ``LOCKGATE_MAX_DELAY_MS`` (default 5000): a
  key group's watermark is the newest ``ts`` seen on its partition minus the delay
  minus 1, and window ``[start, end)`` fires once it reaches ``end - 1``; allowed
  lateness 0: a view counts in those of its windows that had not fired when it came;
- when a window of a key fires, exactly one record on ``LOCKGATE_OUTPUT_TOPIC``
  (default ``top-pages``): key = the input key, value ``{"start": <ms>, "end": <ms>,
  "top": [[<page>, <views>], ...]}``: the ``LOCKGATE_TOP_N`` (default 3) pages with
  the most views in the window, most viewed first, ties by page name (fewer when the
  window has fewer pages);
- a view whose every window has already fired is late: it goes, unchanged (key, value
  and headers), to ``<app name>.late`` (``LOCKGATE_APP_NAME``, default ``top-pages``)
  with headers ``lockgate-late-window``
  (``"<start>-<end>,..."``, its windows oldest first), ``lockgate-late-watermark`` and
  ``lockgate-late-event-time``.

Windows keep a count per page (not the views themselves), in slices of
``LOCKGATE_SLIDE_MS`` (the aggregator merges): a view updates one slice, and a window's
counts are its slices' merged when it fires.

Run: ``LOCKGATE_BOOTSTRAP_SERVERS=127.0.0.1:9092 lockgate run examples.top_pages:app``
"""

import os
from typing import Any

from processors import App, Sliding, Watermarks, WindowResult

INPUT = os.environ.get("LOCKGATE_INPUT_TOPIC", "pageviews")
OUTPUT = os.environ.get("LOCKGATE_OUTPUT_TOPIC", "top-pages")
WINDOW_MS = int(os.environ.get("LOCKGATE_WINDOW_MS", "60000"))
SLIDE_MS = int(os.environ.get("LOCKGATE_SLIDE_MS", "10000"))
TOP_N = int(os.environ.get("LOCKGATE_TOP_N", "3"))
MAX_DELAY_MS = int(os.environ.get("LOCKGATE_MAX_DELAY_MS", "5000"))

app = App(
    "top-pages",
    env=["LOCKGATE_WINDOW_MS", "LOCKGATE_SLIDE_MS", "LOCKGATE_TOP_N", "LOCKGATE_MAX_DELAY_MS"],
)


def event_time(value: dict[str, Any]) -> int:
    """The event time of a view: its ``ts`` field."""
    return int(value["ts"])


def top(counts: dict[str, int], n: int) -> list[list[Any]]:
    """The ``n`` most viewed pages as ``[page, views]``, most first, ties by name."""
    ranked = sorted(counts.items(), key=lambda item: (-item[1], item[0]))
    return [[page, views] for page, views in ranked[:n]]


class TopPagesAggregator:
    """Views per page of a window; the result is its top ``n``."""

    def __init__(self, n: int) -> None:
        self.n = n

    def create_accumulator(self) -> dict[str, int]:
        """No view yet."""
        return {}

    def add(self, value: dict[str, Any], acc: dict[str, int]) -> dict[str, int]:
        """One more view of ``value["page"]``."""
        page = str(value["page"])
        acc[page] = acc.get(page, 0) + 1
        return acc

    def merge(self, a: dict[str, int], b: dict[str, int]) -> dict[str, int]:
        """Views add up page by page."""
        out = dict(a)
        for page, views in b.items():
            out[page] = out.get(page, 0) + views
        return out

    def get_result(self, acc: dict[str, int]) -> list[list[Any]]:
        """The top ``n`` pages of the window."""
        return top(acc, self.n)


def as_output(window: WindowResult[list[list[Any]]]) -> dict[str, Any]:
    """The output value of a fired window."""
    return {"start": window.start, "end": window.end, "top": window.value}


(
    app.stream(INPUT, timestamp=event_time, watermarks=Watermarks.bounded(MAX_DELAY_MS))
    .window(Sliding(WINDOW_MS, SLIDE_MS), late_topic=True)
    .aggregate(TopPagesAggregator(TOP_N))
    .map(as_output)
    .to(OUTPUT)
)
