"""Emits what a TTL'd value state held for the key before this record, then stores v.

``TTL_APP_TTL_MS`` (default 2000) is the store's ``ttl_ms``.
"""

import os
from typing import Any

from processors import App, Context

INPUT = os.environ["LOCKGATE_INPUT_TOPIC"]
OUTPUT = os.environ["LOCKGATE_OUTPUT_TOPIC"]

app = App("ttl")
last = app.value_state("last", ttl_ms=int(os.environ.get("TTL_APP_TTL_MS", "2000")))


@app.process(INPUT, outputs=[OUTPUT])
def handle(key: str, value: dict[str, Any], ctx: Context) -> None:
    ctx.emit(OUTPUT, key, {"prev": last.value(), "seq": value["seq"]})
    last.update(value["v"])
