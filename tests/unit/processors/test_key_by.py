"""``Stream.key_by``: the re-key step of a pipeline (a terminal operator)."""

import pytest

from processors import App, ConfigError
from processors.testing import TestDriver


def _stage_one() -> App:
    app = App("rekey-stage-one")
    app.stream("orders").filter(lambda v: v["qty"] > 0).key_by(
        lambda v: v["customer"], "orders-by-customer"
    )
    return app


def test_key_by_emits_every_value_keyed_by_the_selector() -> None:
    d = TestDriver(_stage_one())
    out = d.send("order-1", {"customer": "c7", "qty": 2})
    out += d.send("order-2", {"customer": "c9", "qty": 0})  # filtered out
    out += d.send("order-3", {"customer": "c7", "qty": 1})
    assert [(e.topic, e.key, e.value) for e in out] == [
        ("orders-by-customer", "c7", {"customer": "c7", "qty": 2}),
        ("orders-by-customer", "c7", {"customer": "c7", "qty": 1}),
    ]


def test_the_repartition_topic_is_an_internal_output() -> None:
    spec = _stage_one().outputs["orders-by-customer"]
    assert spec.internal  # barriers flow through it to the next stage


def test_key_by_is_terminal_and_checked_where_written() -> None:
    app = App("rekey-terminal")
    stream = app.stream("in").key_by(lambda v: v, "by-value")
    with pytest.raises(ConfigError, match=r"after \.key_by\(\)"):
        stream.map(lambda v: v)
    with pytest.raises(TypeError):
        App("rekey-bad").stream("in").key_by("not callable", "t")  # type: ignore[arg-type]
    with pytest.raises(ConfigError):
        App("rekey-bad-topic").stream("in").key_by(lambda v: v, "no spaces allowed")
