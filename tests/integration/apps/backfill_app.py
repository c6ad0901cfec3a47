"""An app for backfill task tests: a running sum whose records can misbehave on purpose.

Input ``LOCKGATE_TEST_BF_IN``, output ``LOCKGATE_TEST_BF_OUT``. Value fields: ``v`` (added
to the key's total), ``pad`` (the output carries that many bytes), ``nokey`` (the output has
no key), ``bad`` (the state becomes a set, which JSON cannot encode), ``outage`` (the output
codec's service is unavailable: it raises CodecUnavailable), ``hdr`` (the output is
emitted with a header and the input's timestamp plus one, by keyword).
"""

import os
from typing import Any

import orjson

from processors import App, Context
from state.codecs import CodecUnavailable

INPUT = os.environ.get("LOCKGATE_TEST_BF_IN", "bf-in")
OUTPUT = os.environ.get("LOCKGATE_TEST_BF_OUT", "bf-out")


class _OutputCodec:
    """JSON, unless the value asks for an outage of the codec's service."""

    name = "json-or-outage"

    def encode(self, value: Any) -> bytes:
        if value.get("outage"):
            raise CodecUnavailable("the schema registry did not answer")
        return orjson.dumps(value)

    def decode(self, data: bytes) -> Any:
        return orjson.loads(data)


app = App("backfill-app")
totals = app.value_state("totals")


@app.process(INPUT, outputs=[app.output(OUTPUT, value=_OutputCodec())])
def handle(key: str, value: dict[str, Any], ctx: Context) -> None:
    total = (totals.value() or 0) + value.get("v", 1)
    totals.update({1, 2} if value.get("bad") else total)
    out = {"sum": total, "i": value.get("i"), "pad": "x" * value.get("pad", 0)}
    if value.get("outage"):
        out["outage"] = True
    if value.get("hdr"):
        ctx.emit(OUTPUT, key, out, headers=[("h", b"x")], timestamp=ctx.timestamp + 1)
        return
    ctx.emit(OUTPUT, None if value.get("nokey") else key, out)
