"""examples/running_sum.py with Avro values through a schema registry (benchmarks/avro_vs_json.py).

Input values ``{"v": long, "seq": long}`` and outputs ``{"sum", "count", "seq"}`` are Avro
records in the Confluent wire format; keys stay UTF-8 strings.
"""

import os
from typing import Any

import orjson

from processors import App, Context, OutputSpec
from state.schema_registry import Avro, SchemaRegistry

INPUT = os.environ.get("LOCKGATE_INPUT_TOPIC", "numbers")
OUTPUT = os.environ.get("LOCKGATE_OUTPUT_TOPIC", "sums")


def _record(name: str, fields: list[str]) -> str:
    return orjson.dumps(
        {
            "type": "record",
            "name": name,
            "namespace": "lockgate.bench",
            "fields": [{"name": f, "type": "long"} for f in fields],
        }
    ).decode()


IN_SCHEMA = _record("Number", ["v", "seq"])
OUT_SCHEMA = _record("Sum", ["sum", "count", "seq"])

registry = SchemaRegistry(os.environ.get("LOCKGATE_SCHEMA_REGISTRY_URL", "http://127.0.0.1:8081"))
app = App("avro-running-sum", env=["LOCKGATE_SCHEMA_REGISTRY_URL"])
totals = app.value_state("totals")


@app.process(
    INPUT,
    value=Avro(registry, IN_SCHEMA),
    outputs=[OutputSpec(OUTPUT, value=Avro(registry, OUT_SCHEMA))],
)
def running_sum(key: str, value: dict[str, Any], ctx: Context) -> None:
    total = totals.value() or [0, 0]
    total = [total[0] + value["v"], total[1] + 1]
    totals.update(total)
    ctx.emit(OUTPUT, key, {"sum": total[0], "count": total[1], "seq": value["seq"]})
