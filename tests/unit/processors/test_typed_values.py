"""Typed values in apps (Model codecs in TestDriver) and TopicConfig outputs."""

from __future__ import annotations

import logging
from typing import Any

import pytest
from pydantic import BaseModel

from processors import App, Context, Model, OutputSpec, TopicConfig
from processors._checkpoint.protocol import record_error_headers
from processors._dsl.record import Record
from processors._dsl.topics import check_output_topics, output_topic_configs, output_topic_specs
from processors.exceptions import ConfigError, TopicError
from processors.testing import TestDriver
from state.codecs import BYTES, STR, DecodeError
from state.primitives import ValueState


class Order(BaseModel):
    id: str
    qty: int


class Total(BaseModel):
    orders: int
    qty: int


ORDERS = Model(Order)


def _typed_app() -> App:
    app = App("typed")
    totals: ValueState[Total] = app.value_state("totals", codec=Model(Total))

    @app.process("orders", value=ORDERS, outputs=[TopicConfig("totals", value=Model(Total))])
    def handle(key: str, order: Order, ctx: Context) -> None:
        assert isinstance(order, Order)
        total = totals.value() or Total(orders=0, qty=0)
        total = Total(orders=total.orders + 1, qty=total.qty + order.qty)
        totals.update(total)
        if order.qty > 100:  # an output that does not validate: a user error
            ctx.emit("totals", key, {"orders": total.orders, "qty": "lots"})
        ctx.emit("totals", key, total)

    return app


def _send_bytes(driver: TestDriver, monkeypatch: pytest.MonkeyPatch, key: str, raw: bytes) -> None:
    """Send bytes as another producer wrote them (TestDriver encodes what it is given)."""
    with monkeypatch.context() as m:
        m.setattr(ORDERS, "encode", lambda value: value)
        driver.send(key, raw)


def test_typed_values_flow_through_state_and_outputs() -> None:
    d = TestDriver(_typed_app())
    d.send("c1", Order(id="o1", qty=2))
    [out] = d.send("c1", Order(id="o2", qty=5))
    assert out.value == Total(orders=2, qty=7) and isinstance(out.value, Total)
    d.commit()
    assert d.state("totals", "c1") == Total(orders=2, qty=7)
    assert d.dead_letters == []


def test_a_validation_error_is_dead_lettered_naming_the_field(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    d = TestDriver(_typed_app())
    d.send("c1", Order(id="o1", qty=2))
    _send_bytes(d, monkeypatch, "c1", b'{"id": "o2", "qty": "x"}')
    d.send("c1", Order(id="o3", qty=1))
    [dl] = d.dead_letters
    assert dl.stage == "deserialize" and isinstance(dl.error, DecodeError)
    assert str(dl.error).startswith("Order.qty: Input should be a valid integer"), dl.error
    assert "(got 'x')" in str(dl.error)
    assert dl.value == b'{"id": "o2", "qty": "x"}'  # undecodable: kept as bytes
    assert [e.value.qty for e in d.emitted] == [2, 3]  # the app went on
    # In production the same exception becomes the dead letter's headers.
    rec = Record("orders", 0, 7, b"c1", dl.value, 1000, None)
    headers = dict(record_error_headers(rec, dl.error, dl.stage))
    assert headers["lockgate-error-type"] == "DecodeError"
    assert str(headers["lockgate-error-message"]).startswith("Order.qty: Input should be")


def test_an_output_that_does_not_validate_dead_letters_its_record() -> None:
    d = TestDriver(_typed_app())
    d.send("c1", Order(id="o1", qty=2))
    assert d.send("c1", Order(id="o2", qty=500)) == []
    [dl] = d.dead_letters
    assert dl.stage == "process" and "Total.qty: Input should be a valid integer" in str(dl.error)
    assert d.state("totals", "c1") == Total(orders=1, qty=2)  # its state change was undone


def test_model_keys() -> None:
    class Customer(BaseModel):
        region: str
        id: int

    app = App("keys")

    @app.process("in", key=Model(Customer), outputs=["out"])
    def handle(key: Customer, value: Any, ctx: Context) -> None:
        ctx.emit("out", key.region, value)

    d = TestDriver(app)
    assert d.send(Customer(region="eu", id=1), {"v": 1})[0].key == "eu"


# ------------------------------------------------------------------ TopicConfig declarations


def test_topic_config_is_accepted_wherever_outputs_are_declared() -> None:
    app = App("cfg")
    cfg = TopicConfig("a", partitions=8, compact=True, key=BYTES, value=ORDERS)

    @app.process("in", outputs=[cfg, "b", OutputSpec("c")])
    def handle(key: Any, value: Any, ctx: Context) -> None: ...

    app.output(TopicConfig("d", retention_ms=-1))
    app.stream("in2").to(TopicConfig("e", config={"max.message.bytes": 2_000_000}))
    outs = app.outputs
    assert (outs["a"].key, outs["a"].value, outs["a"].partitions) == (BYTES, ORDERS, 8)
    assert outs["a"].topic_config is cfg and outs["b"].topic_config is None
    specs, replication = output_topic_specs(outs.values(), 4)
    assert specs == {
        "a": (8, {"cleanup.policy": "compact"}),
        "b": (4, {}),
        "c": (4, {}),
        "d": (4, {"retention.ms": "-1"}),
        "e": (4, {"max.message.bytes": "2000000"}),
    }
    assert replication == {}
    assert [c.topic for c in output_topic_configs(outs.values())] == ["a", "d", "e"]
    assert output_topic_specs([app.output(TopicConfig("f", replication_factor=3))], 2)[1] == {
        "f": 3
    }


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"partitions": 0}, "partitions must be an int >= 1"),
        ({"replication_factor": True}, "replication_factor must be an int"),
        ({"retention_ms": -2}, "retention_ms must be an int >= -1"),
        ({"compact": "yes"}, "compact must be True, False or None"),
        ({"config": {"a": None}}, "config entry 'a'=None is not a setting"),
        (
            {"compact": True, "config": {"cleanup.policy": "delete"}},
            "cleanup.policy is given twice",
        ),
        ({"retention_ms": 5, "config": {"retention.ms": "6"}}, "retention.ms is given twice"),
    ],
)
def test_topic_config_refuses_bad_settings(kwargs: dict[str, Any], match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        TopicConfig("t", **kwargs)


def test_topic_config_settings_and_illegal_uses() -> None:
    cfg = TopicConfig("t", compact=False, retention_ms=1000, config={"x.enable": True})
    assert cfg.topic_settings() == {
        "x.enable": "true",
        "cleanup.policy": "delete",
        "retention.ms": "1000",
    }
    app = App("bad")
    with pytest.raises(ConfigError, match="give key=, value= and partitions= to its TopicConfig"):
        app.output(TopicConfig("t"), key=BYTES)
    with pytest.raises(ConfigError, match="not a legal Kafka topic name"):
        app.process("in", outputs=[TopicConfig("bad topic")])
    assert app.output(TopicConfig("t", key=STR)).topic_config is not None


# ------------------------------------------------------------------ checks of existing topics


class _FakeAdmin:
    def __init__(self, layout: dict[str, tuple[int, int]], conf: dict[str, dict[str, str]]):
        self.layout, self.conf = layout, conf

    def layout_of(self, topics: Any) -> dict[str, tuple[int, int]]:
        return {t: self.layout[t] for t in topics if t in self.layout}

    def topic_config(self, topic: str) -> dict[str, str]:
        return self.conf[topic]


_DEFAULTS = {"cleanup.policy": "delete", "retention.ms": "604800000", "max.message.bytes": "1"}


def _check(cfg: TopicConfig, parts: int = 8, rf: int = 1, **conf: str) -> None:
    actual = {**_DEFAULTS, **{k.replace("_", "."): v for k, v in conf.items()}}
    check_output_topics(_FakeAdmin({cfg.topic: (parts, rf)}, {cfg.topic: actual}), [cfg])  # type: ignore[arg-type]


def test_matching_topics_pass() -> None:
    _check(TopicConfig("t", partitions=8, compact=False, retention_ms=604800000))
    _check(TopicConfig("t", compact=True), cleanup_policy="compact")
    _check(
        TopicConfig("t", config={"cleanup.policy": "delete,compact"}),
        cleanup_policy="compact,delete",
    )
    _check(TopicConfig("t"), parts=3)  # nothing declared: nothing checked


@pytest.mark.parametrize(
    ("cfg", "actual", "message"),
    [
        (
            TopicConfig("sums", partitions=8),
            {"parts": 4},
            "output topic sums has 4 partitions, TopicConfig declares 8",
        ),
        (
            TopicConfig("sums", compact=True),
            {},
            "output topic sums has cleanup.policy=delete, TopicConfig declares compact",
        ),
        (
            TopicConfig("sums", retention_ms=-1),
            {"retention_ms": "86400000"},
            "output topic sums has retention.ms=86400000, TopicConfig declares -1",
        ),
    ],
)
def test_mismatches_that_lose_data_are_refused(
    cfg: TopicConfig, actual: dict[str, Any], message: str
) -> None:
    with pytest.raises(TopicError, match=message):
        _check(cfg, **actual)


def test_harmless_mismatches_only_warn(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="lockgate.topics")
    _check(
        TopicConfig(
            "t", replication_factor=3, retention_ms=1000, config={"max.message.bytes": "2"}
        ),
        rf=1,
    )
    messages = [(r.getMessage(), getattr(r, "expected", None)) for r in caplog.records]
    assert messages == [
        ("output topic replication factor differs from its TopicConfig", 3),
        ("output topic setting differs from its TopicConfig (not altered)", "2"),
        ("output topic keeps records longer than its TopicConfig declares", "1000"),
    ]


def test_every_refusal_is_named_in_one_error() -> None:
    cfgs = [TopicConfig("a", partitions=2), TopicConfig("b", compact=True)]
    admin = _FakeAdmin({"a": (3, 1), "b": (1, 1)}, {"a": _DEFAULTS, "b": _DEFAULTS})
    with pytest.raises(TopicError) as err:
        check_output_topics(admin, cfgs)  # type: ignore[arg-type]
    assert "output topic a has 3 partitions" in str(err.value)
    assert "output topic b has cleanup.policy=delete" in str(err.value)
