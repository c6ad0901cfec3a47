"""Processing-time timers (the timer integration test app).

Input ``LOCKGATE_INPUT_TOPIC``: key = string, value ``{"seq": <int>, "boom": <bool>}``.
Each record sets a processing-time timer of its key half a second later, named after its
seq; the timer emits ``{"seq": <int>}`` to ``LOCKGATE_OUTPUT_TOPIC``, or raises when the
record had ``boom`` (the timer is dead-lettered).
"""

import os
from typing import Any

from processors import App, Context
from state import ValueState

INPUT = os.environ.get("LOCKGATE_INPUT_TOPIC", "jobs")
OUTPUT = os.environ.get("LOCKGATE_OUTPUT_TOPIC", "reminders")

app = App("proc-timers")
booms: ValueState[list[int]] = app.value_state("booms")


@app.process(INPUT, outputs=[OUTPUT])
def schedule(key: str, value: dict[str, Any], ctx: Context) -> None:
    """Remind this key of the record in 500 ms of processing time."""
    if value.get("boom"):
        booms.update([*(booms.value() or []), value["seq"]])
    ctx.timers.set_processing_time(ctx.timers.processing_time + 500, name=str(value["seq"]))


@app.on_timer
def remind(key: str, ctx: Any) -> None:
    """Emit the reminder; fail for records that asked for it."""
    seq = int(ctx.name)
    if seq in (booms.value() or []):
        raise RuntimeError(f"boom {seq}")
    ctx.emit(OUTPUT, key, {"seq": seq})
