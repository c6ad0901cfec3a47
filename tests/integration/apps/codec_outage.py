"""running_sum whose output codec needs a service that can be down (a schema registry).

While the file ``OUTAGE_FLAG`` exists, encoding an output raises
:class:`state.codecs.CodecUnavailable`. With ``OUTAGE_SWALLOW=1`` the handler swallows
the exception (a careless user): the epoch must still not commit.
"""

import os
from pathlib import Path
from typing import Any

import orjson

from processors import App, Context
from state.codecs import CodecUnavailable

INPUT = os.environ["LOCKGATE_INPUT_TOPIC"]
OUTPUT = os.environ["LOCKGATE_OUTPUT_TOPIC"]
FLAG = Path(os.environ["OUTAGE_FLAG"])
SWALLOW = os.environ.get("OUTAGE_SWALLOW") == "1"


class FlakyService:
    """A JSON codec whose encoder fails while the flag file exists."""

    name = "flaky-json"

    def encode(self, value: Any) -> bytes:
        if FLAG.exists():
            raise CodecUnavailable("the registry at http://registry.invalid did not answer")
        return orjson.dumps(value)

    def decode(self, data: bytes) -> Any:
        return orjson.loads(data)


app = App("codec-outage")
totals = app.value_state("totals")
out = app.output(OUTPUT, value=FlakyService())


@app.process(INPUT, outputs=[out])
def handle(key: str, value: dict[str, Any], ctx: Context) -> None:
    total = totals.value() or [0, 0]
    total = [total[0] + value["v"], total[1] + 1]
    totals.update(total)
    try:
        ctx.emit(OUTPUT, key, {"sum": total[0], "count": total[1], "seq": value["seq"]})
    except CodecUnavailable:
        if not SWALLOW:
            raise
