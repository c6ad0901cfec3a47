"""Event time across two apps: watermarks ride the upstream's barriers.

``upstream`` (``et-up``) reads ``LOCKGATE_INPUT_TOPIC``: key = user, value ``{"ts": <ms>,
"region": <str>, "seq": <int>}``, event time ``ts`` with 100 ms bounded
out-of-orderness and an idleness timeout of ``LOCKGATE_IDLE_MS`` (default 3000; ``0``:
never idle); it re-keys every record by region into the internal topic
``LOCKGATE_REPART_TOPIC`` (its event time travels in a header).

``downstream`` (``et-down``) reads that topic; its key groups' watermarks are the minimum
of the upstream key groups' barrier watermarks (idle writers left out). It counts each
region's records in tumbling 1 s windows: ``{"start", "end", "count"}`` to
``LOCKGATE_OUTPUT_TOPIC``; late records (there should be none) to ``<output>.late``.
"""

import os
from typing import Any

from processors import App, Tumbling, Watermarks, WindowResult

INPUT = os.environ.get("LOCKGATE_INPUT_TOPIC", "et-events")
REPART = os.environ.get("LOCKGATE_REPART_TOPIC", "et-by-region")
OUTPUT = os.environ.get("LOCKGATE_OUTPUT_TOPIC", "et-counts")
IDLE_MS = int(os.environ.get("LOCKGATE_IDLE_MS", "3000")) or None
upstream = App("et-up", env=["LOCKGATE_REPART_TOPIC", "LOCKGATE_IDLE_MS"])
(
    upstream.stream(
        INPUT,
        timestamp=lambda v: int(v["ts"]),
        watermarks=Watermarks.bounded(100, idle_ms=IDLE_MS),
    ).key_by(lambda v: v["region"], REPART, partitions=2)
)


def as_output(window: WindowResult[int]) -> dict[str, Any]:
    """The output value of a fired window."""
    return {"start": window.start, "end": window.end, "count": window.value}


downstream = App("et-down", env=["LOCKGATE_REPART_TOPIC", "LOCKGATE_IDLE_MS"])
(
    downstream.stream(REPART, watermarks=Watermarks.monotonous())
    .window(Tumbling(1000), late_topic=f"{OUTPUT}.late")
    .count()
    .map(as_output)
    .to(OUTPUT)
)
