"""Two window operators declared in either order, for restoring a savepoint into reordered code.

Inputs ``LOCKGATE_CLICKS_TOPIC`` and ``LOCKGATE_VIEWS_TOPIC`` (co-partitioned; key =
string, value ``{"ts": <ms>, "seq": <int>}``; event time ``ts``, monotonous
watermarks). Clicks are counted in tumbling windows of 1000 ms, views in tumbling
windows of 1500 ms; each fired window emits ``{"op": "clicks"|"views", "start", "end",
"value"}`` (the count) to ``LOCKGATE_OUTPUT_TOPIC``. Both declare the inputs clicks first;
``v1`` then declares the clicks window first, ``v2`` the views window first: the same
operators, reordered. Neither gives
``uid=``: their ids are derived from the topics they read.
"""

import os
from typing import Any

from processors import App, Tumbling, Watermarks, WindowResult

CLICKS_ENV, VIEWS_ENV = "LOCKGATE_CLICKS_TOPIC", "LOCKGATE_VIEWS_TOPIC"
CLICKS = os.environ.get(CLICKS_ENV, "clicks")
VIEWS = os.environ.get(VIEWS_ENV, "views")
OUTPUT = os.environ.get("LOCKGATE_OUTPUT_TOPIC", "window-counts")
SIZES = {"clicks": 1000, "views": 1500}


def _event_time(value: dict[str, Any]) -> int:
    return int(value["ts"])


def _declare(app: App, order: tuple[str, str]) -> None:
    """Declare both inputs (always in the same order), then their windows in ``order``."""
    streams = {
        op: app.stream(topic, timestamp=_event_time, watermarks=Watermarks.monotonous())
        for op, topic in (("clicks", CLICKS), ("views", VIEWS))
    }
    for op in order:

        def tagged(result: WindowResult[int], op: str = op) -> dict[str, Any]:
            return {"op": op, **result.as_dict()}

        streams[op].window(Tumbling(SIZES[op])).count().map(tagged).to(OUTPUT)


v1 = App("reordered-windows", env=["LOCKGATE_CLICKS_TOPIC", "LOCKGATE_VIEWS_TOPIC"])
_declare(v1, ("clicks", "views"))

v2 = App("reordered-windows", env=["LOCKGATE_CLICKS_TOPIC", "LOCKGATE_VIEWS_TOPIC"])
_declare(v2, ("views", "clicks"))
