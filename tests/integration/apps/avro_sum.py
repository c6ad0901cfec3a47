"""Running sum per account over Avro records (Confluent wire format, schema registry).

Input values are read with their writer schema (decode-only codec), so a newer
compatible version produced mid-stream is read as it comes; the optional ``note``
field of version 2 is carried to the output. Keys are Avro strings.
"""

import os

import orjson

from processors import App, Context, OutputSpec
from state import ValueState
from state.schema_registry import Avro, SchemaRegistry

INPUT = os.environ["LOCKGATE_INPUT_TOPIC"]
OUTPUT = os.environ["LOCKGATE_OUTPUT_TOPIC"]

SUM_SCHEMA = orjson.dumps(
    {
        "type": "record",
        "name": "Sum",
        "namespace": "lockgate.test",
        "fields": [
            {"name": "account", "type": "string"},
            {"name": "sum", "type": "long"},
            {"name": "count", "type": "long"},
            {"name": "note", "type": "string", "default": ""},
        ],
    }
).decode()

registry = SchemaRegistry(os.environ["LOCKGATE_TEST_SCHEMA_REGISTRY_URL"])
KEY = Avro(registry, '"string"')

app = App("avro_sum", env=["LOCKGATE_TEST_SCHEMA_REGISTRY_URL"])
totals: ValueState[list[int]] = app.value_state("totals")


@app.process(
    INPUT,
    key=KEY,
    value=Avro(registry),
    outputs=[OutputSpec(OUTPUT, key=KEY, value=Avro(registry, SUM_SCHEMA))],
)
def handle(key: str, value: dict[str, object], ctx: Context) -> None:
    total, count = totals.value() or [0, 0]
    amount = value["amount"]
    assert isinstance(amount, int)
    total, count = total + amount, count + 1
    totals.update([total, count])
    note = value.get("note", "")
    ctx.emit(OUTPUT, key, {"account": key, "sum": total, "count": count, "note": note})
