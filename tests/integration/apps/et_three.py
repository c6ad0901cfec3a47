"""Event time through three apps: source -> middle -> windows (watermarks forwarded twice).

``source`` (``et3-src``) reads ``LOCKGATE_INPUT_TOPIC`` (key = user, value ``{"ts",
"region", "seq"}``, event time ``ts``, 100 ms bounded, idle after ``LOCKGATE_IDLE_MS``
(default 0: never idle, so its last barrier carries its final watermark) and re-keys by
region into ``LOCKGATE_REPART_TOPIC``. ``middle`` (``et3-mid``) reads it (watermarks from
the source's barriers) and passes every record on, keyed alike, to
``LOCKGATE_REPART2_TOPIC``. ``last`` (``et3-last``) counts each region's records in
tumbling 1 s windows to ``LOCKGATE_OUTPUT_TOPIC``; its watermark comes from the middle's
barriers, which must carry the middle's final watermark although the source sends no
barrier after its last one (the middle re-announces).
"""

import os
from typing import Any

from processors import App, Tumbling, Watermarks, WindowResult

INPUT = os.environ.get("LOCKGATE_INPUT_TOPIC", "et3-events")
REPART = os.environ.get("LOCKGATE_REPART_TOPIC", "et3-by-region")
REPART2 = os.environ.get("LOCKGATE_REPART2_TOPIC", "et3-by-region-2")
OUTPUT = os.environ.get("LOCKGATE_OUTPUT_TOPIC", "et3-counts")

IDLE_MS = int(os.environ.get("LOCKGATE_IDLE_MS", "0")) or None

source = App("et3-src", env=["LOCKGATE_REPART_TOPIC", "LOCKGATE_REPART2_TOPIC", "LOCKGATE_IDLE_MS"])
source.stream(
    INPUT, timestamp=lambda v: int(v["ts"]), watermarks=Watermarks.bounded(100, idle_ms=IDLE_MS)
).key_by(lambda v: v["region"], REPART, partitions=2)

middle = App("et3-mid", env=["LOCKGATE_REPART_TOPIC", "LOCKGATE_REPART2_TOPIC", "LOCKGATE_IDLE_MS"])
middle.stream(REPART, watermarks=Watermarks.monotonous()).key_by(
    lambda v: v["region"], REPART2, partitions=2
)


def as_output(window: WindowResult[int]) -> dict[str, Any]:
    """The output value of a fired window."""
    return {"start": window.start, "end": window.end, "count": window.value}


last = App("et3-last", env=["LOCKGATE_REPART_TOPIC", "LOCKGATE_REPART2_TOPIC", "LOCKGATE_IDLE_MS"])
(
    last.stream(REPART2, watermarks=Watermarks.monotonous())
    .window(Tumbling(1000), late_topic=f"{OUTPUT}.late")
    .count()
    .map(as_output)
    .to(OUTPUT)
)
