"""Typed values: pydantic Order records in, a pydantic Total per customer out.

The output is declared with a TopicConfig (3 partitions, delete policy, retention and a
``max.message.bytes``): created with it when missing, checked when it exists.
"""

import os

from pydantic import BaseModel

from processors import App, Context, Model, TopicConfig
from state import ValueState

INPUT = os.environ["LOCKGATE_INPUT_TOPIC"]
OUTPUT = os.environ["LOCKGATE_OUTPUT_TOPIC"]


class Order(BaseModel):
    id: str
    qty: int


class Total(BaseModel):
    orders: int
    qty: int
    last: str


TOTALS = TopicConfig(
    OUTPUT,
    partitions=3,
    compact=False,
    retention_ms=3 * 86_400_000,
    config={"max.message.bytes": 2_000_000},
    value=Model(Total),
)

app = App("typed")
totals: ValueState[Total] = app.value_state("totals", codec=Model(Total))


@app.process(INPUT, value=Model(Order), outputs=[TOTALS])
def handle(key: str, order: Order, ctx: Context) -> None:
    total = totals.value() or Total(orders=0, qty=0, last="")
    total = Total(orders=total.orders + 1, qty=total.qty + order.qty, last=order.id)
    totals.update(total)
    ctx.emit(OUTPUT, key, total)
