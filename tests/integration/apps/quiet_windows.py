"""Tumbling one-second windows whose last window closes when the input goes quiet.

Input ``LOCKGATE_INPUT_TOPIC``: key = UTF-8 string, value ``{"ts": <epoch ms>}``. Watermarks:
bounded by 0 ms, an input quiet for 1 s is idle, and ``idle_advance``: once every input of
a key group is idle, processing time moves its watermark (now - 1) when a window's end is
due, so the last window fires without new data. Output ``LOCKGATE_OUTPUT_TOPIC``: key =
input key, value ``{"start", "end", "count"}`` once per window.
"""

import os
from typing import Any

from processors import App, Tumbling, Watermarks, WindowResult

INPUT = os.environ.get("LOCKGATE_INPUT_TOPIC", "events")
OUTPUT = os.environ.get("LOCKGATE_OUTPUT_TOPIC", "window-counts")

app = App("quiet-windows")


def _ts(value: dict[str, Any]) -> int:
    return int(value["ts"])


def _out(window: WindowResult[int]) -> dict[str, int]:
    return {"start": window.start, "end": window.end, "count": window.value}


(
    app.stream(
        INPUT, timestamp=_ts, watermarks=Watermarks.bounded(0, idle_ms=1000, idle_advance=True)
    )
    .window(Tumbling(1000))
    .count()
    .map(_out)
    .to(OUTPUT)
)
