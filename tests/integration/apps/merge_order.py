"""Records the order in which a key sees two co-partitioned inputs (the interleaving test app).

Inputs ``LOCKGATE_LEFT_TOPIC`` and ``LOCKGATE_RIGHT_TOPIC`` (declared in that order, one chain),
key = UTF-8 string, value ``{"id": <str>}``. For every input record one output on
``LOCKGATE_OUTPUT_TOPIC``: ``{"id", "n": <records of the key so far>, "digest": <hash of the
sequence of ids the key has seen>}``, so any difference in processing order shows.
"""

import hashlib
import os
from typing import Any

from processors import App, Context

LEFT = os.environ.get("LOCKGATE_LEFT_TOPIC", "left")
RIGHT = os.environ.get("LOCKGATE_RIGHT_TOPIC", "right")
OUTPUT = os.environ.get("LOCKGATE_OUTPUT_TOPIC", "merged")

app = App("merge-order", env=["LOCKGATE_LEFT_TOPIC", "LOCKGATE_RIGHT_TOPIC"])
seen = app.value_state("seen")


def digest(previous: str, record_id: str) -> str:
    """The running digest after ``record_id`` (the test's model uses the same function)."""
    return hashlib.sha256(f"{previous}|{record_id}".encode()).hexdigest()[:16]


@app.process(LEFT, RIGHT, outputs=[OUTPUT])
def merge(key: str, value: dict[str, Any], ctx: Context) -> None:
    n, d = seen.value() or [0, ""]
    d = digest(d, value["id"])
    seen.update([n + 1, d])
    ctx.emit(OUTPUT, key, {"id": value["id"], "n": n + 1, "digest": d})
