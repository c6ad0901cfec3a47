"""Multi-input apps through the TestDriver: as-of joins, interval joins, several topics per
chain, global tables, and the definition errors of the multi-input API."""

from __future__ import annotations

from typing import Any

import pytest

from examples.enrich_orders import CUSTOMERS, ORDERS, OUTPUT
from examples.enrich_orders import app as enrich_app
from processors import App
from processors.exceptions import ConfigError
from processors.testing import Emitted, TestDriver

# ----------------------------------------------------------------------------- enrich_orders


def order(d: TestDriver, cid: str, oid: str, ts: int, amount: int = 1) -> list[Emitted]:
    return d.send(cid, {"order_id": oid, "amount": amount}, topic=ORDERS, timestamp=ts)


def customer(d: TestDriver, cid: str, value: Any, ts: int) -> list[Emitted]:
    return d.send(cid, value, topic=CUSTOMERS, timestamp=ts)


def seen(d: TestDriver, cid: str, oid: str, ts: int) -> Any:
    """The customer value the order is enriched with (checks the output record's shape)."""
    [out] = order(d, cid, oid, ts, amount=7)
    assert (out.topic, out.key) == (OUTPUT, cid)
    assert out.value["order_id"] == oid and out.value["amount"] == 7
    assert set(out.value) == {"order_id", "amount", "customer"}
    return out.value["customer"]


def test_enrich_declares_a_table_and_a_stream() -> None:
    assert enrich_app.input_topics == (CUSTOMERS, ORDERS)
    assert set(enrich_app.handlers()) == {CUSTOMERS, ORDERS}
    assert set(enrich_app.outputs) == {OUTPUT}
    assert f"table.{CUSTOMERS}" in enrich_app.stores


def test_enrich_order_before_any_customer_gets_null() -> None:
    d = TestDriver(enrich_app)
    assert seen(d, "c1", "o1", 100) is None
    assert customer(d, "c1", {"name": "Ann"}, 200) == []  # a table update emits nothing
    assert seen(d, "c1", "o2", 150) is None  # as of 150: still nothing
    assert seen(d, "c1", "o3", 200) == {"name": "Ann"}
    assert seen(d, "c2", "o4", 300) is None  # another customer


def test_enrich_as_of_the_orders_timestamp() -> None:
    d = TestDriver(enrich_app)
    customer(d, "c1", {"v": 1}, 100)
    customer(d, "c1", {"v": 2}, 300)
    got = [seen(d, "c1", f"o{ts}", ts) for ts in (99, 100, 200, 299, 300, 10**6)]
    assert got == [None, {"v": 1}, {"v": 1}, {"v": 1}, {"v": 2}, {"v": 2}]
    # Same timestamp twice: the later record wins.
    customer(d, "c1", {"v": 3}, 300)
    assert seen(d, "c1", "o-tie", 300) == {"v": 3}


def test_enrich_tombstone_gives_null_and_a_recreated_customer_comes_back() -> None:
    d = TestDriver(enrich_app)
    customer(d, "c1", {"v": 1}, 100)
    customer(d, "c1", None, 200)
    assert seen(d, "c1", "o1", 250) is None
    assert seen(d, "c1", "o2", 200) is None
    assert seen(d, "c1", "o3", 150) == {"v": 1}  # before the deletion
    customer(d, "c1", {"v": 2}, 300)
    assert seen(d, "c1", "o4", 300) == {"v": 2}
    assert seen(d, "c1", "o5", 250) is None
    assert d.state(f"table.{CUSTOMERS}", "c1") == [[100, {"v": 1}], [200, None], [300, {"v": 2}]]


def test_enrich_out_of_order_customer_timestamps() -> None:
    d = TestDriver(enrich_app)
    customer(d, "c1", {"v": 1}, 100)
    customer(d, "c1", {"v": 3}, 300)
    customer(d, "c1", {"v": 2}, 200)  # late: only orders in [200, 300) see it
    assert [seen(d, "c1", f"o{ts}", ts) for ts in (150, 200, 250, 300, 350)] == [
        {"v": 1},
        {"v": 2},
        {"v": 2},
        {"v": 3},
        {"v": 3},
    ]
    customer(d, "c1", None, 250)  # a late deletion
    assert [seen(d, "c1", f"p{ts}", ts) for ts in (240, 250, 299, 300)] == [
        {"v": 2},
        None,
        None,
        {"v": 3},
    ]


def test_enrich_late_record_older_than_the_first_deletion_stays_deleted() -> None:
    d = TestDriver(enrich_app)
    customer(d, "c1", None, 200)
    customer(d, "c1", {"v": 1}, 100)
    assert seen(d, "c1", "o1", 150) == {"v": 1}
    assert seen(d, "c1", "o2", 250) is None


def test_enrich_crash_and_replay_gives_the_same_outputs() -> None:
    d = TestDriver(enrich_app)
    customer(d, "c1", {"v": 1}, 100)
    order(d, "c1", "o1", 150)
    d.commit()
    committed = d.emitted

    def rest() -> list[Emitted]:
        out = customer(d, "c1", {"v": 2}, 200)
        out += order(d, "c1", "o2", 250)
        out += customer(d, "c1", None, 300)
        out += order(d, "c1", "o3", 350)
        out += order(d, "c2", "o4", 100)
        out += customer(d, "c1", {"v": 0}, 120)  # late
        out += order(d, "c1", "o5", 130)
        return out

    first = rest()
    assert [e.value["customer"] for e in first] == [{"v": 2}, None, None, {"v": 0}]
    d.crash()
    assert d.emitted == committed
    assert d.state(f"table.{CUSTOMERS}", "c1") == [[100, {"v": 1}]]
    again = rest()
    assert again == first
    assert d.emitted == committed + first


def test_enrich_bad_order_is_dead_lettered_and_the_epoch_replayed() -> None:
    d = TestDriver(enrich_app)
    customer(d, "c1", {"v": 1}, 100)
    good = order(d, "c1", "o1", 150)
    assert d.send("c1", {"order_id": "bad"}, topic=ORDERS, timestamp=160) == []  # no amount
    [dl] = d.dead_letters
    assert (dl.topic, dl.key, dl.timestamp, dl.stage) == (ORDERS, "c1", 160, "process")
    assert isinstance(dl.error, KeyError)
    # The epoch was replayed without it: the customer version and the first output stay.
    assert d.emitted == good
    assert seen(d, "c1", "o2", 170) == {"v": 1}


# ----------------------------------------------------------------------------- as-of joins


def asof_app(how: str, combine: Any = None) -> tuple[App, Any]:
    app = App(f"asof-{how}")
    dim = app.table("dim", retention_ms=1000)
    app.stream("facts").filter(lambda v: v != "skip").join_asof(dim, how=how, combine=combine).map(
        lambda pair: pair
    ).to("out")
    return app, dim


def test_inner_join_asof_drops_records_without_a_value() -> None:
    app, _ = asof_app("inner")
    d = TestDriver(app)
    assert d.send("k", "f0", topic="facts", timestamp=50) == []
    d.send("k", {"d": 1}, topic="dim", timestamp=100)
    assert d.send("k", "f1", topic="facts", timestamp=99) == []
    [out] = d.send("k", "f2", topic="facts", timestamp=100)
    assert (out.topic, out.key, out.value) == ("out", "k", ["f2", {"d": 1}])
    d.send("k", None, topic="dim", timestamp=200)
    assert d.send("k", "f3", topic="facts", timestamp=200) == []
    assert [e.value for e in d.send("k", "f4", topic="facts", timestamp=199)] == [["f4", {"d": 1}]]
    assert d.send("k", "skip", topic="facts", timestamp=150) == []  # filtered before
    assert d.send("other", "f5", topic="facts", timestamp=150) == []


def test_left_join_asof_without_combine_passes_the_pair() -> None:
    app, _ = asof_app("left")
    d = TestDriver(app)
    assert [e.value for e in d.send("k", "f0", topic="facts", timestamp=50)] == [["f0", None]]


def test_table_read_from_a_handler() -> None:
    app = App("reader")
    dim = app.table("dim")

    @app.process("ev", outputs=["out"])
    def handle(key: Any, value: Any, ctx: Any) -> None:
        ctx.emit("out", key, {"latest": dim.latest(), "as_of": dim.as_of(ctx.timestamp)})

    d = TestDriver(app)
    assert d.send("k", 0, topic="ev", timestamp=0)[0].value == {"latest": None, "as_of": None}
    d.send("k", "a", topic="dim", timestamp=10)
    d.send("k", "b", topic="dim", timestamp=20)
    assert d.send("k", 0, topic="ev", timestamp=15)[0].value == {"latest": "b", "as_of": "a"}
    d.send("k", None, topic="dim", timestamp=30)
    assert d.send("k", 0, topic="ev", timestamp=25)[0].value == {"latest": None, "as_of": "b"}


# ----------------------------------------------------------------------------- interval join


def interval_app(combine: Any = None, grace_ms: int = 0) -> App:
    app = App("ij")
    clicks = app.stream("clicks")
    views = app.stream("views")
    clicks.interval_join(views, lower_ms=-5, upper_ms=10, combine=combine, grace_ms=grace_ms).to(
        "pairs"
    )
    return app


def test_interval_join_bounds_are_inclusive() -> None:
    d = TestDriver(interval_app(combine=lambda c, v: {"c": c, "v": v}))
    # In timestamp order: views before the click match when the click comes, later ones
    # when they come. The click at 100 matches views in [95, 110].
    out = []
    for topic, value, ts in [
        ("views", "v94", 94),
        ("views", "v95", 95),
        ("clicks", "c100", 100),
        ("views", "v110", 110),
        ("views", "v111", 111),
    ]:
        out += d.send("u1", value, topic=topic, timestamp=ts)
    assert [(e.topic, e.key, e.value) for e in out] == [
        ("pairs", "u1", {"c": "c100", "v": "v95"}),
        ("pairs", "u1", {"c": "c100", "v": "v110"}),
    ]


def test_interval_join_pairs_every_match_once_and_only_within_a_key() -> None:
    d = TestDriver(interval_app(grace_ms=50))
    out = []
    for key, topic, value, ts in [
        ("u1", "clicks", "c1", 100),
        ("u2", "views", "x", 100),  # another key: never matches u1
        ("u1", "views", "v1", 105),
        ("u1", "clicks", "c2", 103),  # late within grace: matches v1 (in [98, 113])
        ("u1", "views", "v2", 97),  # late: matches c2 ([98, 113])? no; c1 ([95, 110]) yes
    ]:
        out += d.send(key, value, topic=topic, timestamp=ts)
    assert [e.value for e in out] == [["c1", "v1"], ["c2", "v1"], ["c1", "v2"]]
    assert all(e.key == "u1" for e in out)


def test_interval_join_crash_and_replay() -> None:
    d = TestDriver(interval_app())
    d.send("u", "c0", topic="clicks", timestamp=0)
    d.commit()
    first = d.send("u", "v1", topic="views", timestamp=5)
    assert [e.value for e in first] == [["c0", "v1"]]
    assert d.state("interval-join-1.right", "u") == [[5, "v1"]]
    d.crash()
    assert d.state("interval-join-1.right", "u") is None
    assert d.send("u", "v1", topic="views", timestamp=5) == first


# ----------------------------------------------------------------------------- several topics


def test_one_chain_over_several_topics() -> None:
    app = App("both")
    count = app.value_state("count")

    def handle(key: Any, value: Any, ctx: Any) -> None:
        n = (count.value() or 0) + 1
        count.update(n)
        ctx.emit("out", key, {"topic": ctx.topic, "n": n, "v": value, "p": ctx.partition})

    app.stream("a", "b").map(lambda v: v * 2).process(handle)
    app.output("out")
    d = TestDriver(app, partitions=8)
    out = []
    for topic, v in [("a", 1), ("b", 2), ("a", 3)]:
        out += d.send("k", v, topic=topic, timestamp=0)
    assert [(e.value["topic"], e.value["n"], e.value["v"]) for e in out] == [
        ("a", 1, 2),
        ("b", 2, 4),
        ("a", 3, 6),
    ]
    assert len({e.value["p"] for e in out}) == 1  # the same key group for both topics
    assert d.state("count", "k") == 3


def test_send_needs_a_known_topic_with_several_inputs() -> None:
    d = TestDriver(interval_app())
    with pytest.raises(ConfigError, match="name the topic"):
        d.send("k", 1)
    with pytest.raises(ConfigError, match="'nope' is not an input"):
        d.send("k", 1, topic="nope")


# ----------------------------------------------------------------------------- global tables


def global_app() -> tuple[App, Any]:
    app = App("with-rules")
    rules = app.global_table("rules")

    @app.process("events", outputs=["out"])
    def handle(key: Any, value: Any, ctx: Any) -> None:
        ctx.emit("out", key, {"rule": rules.get(value["rule"]), "n": len(rules)})

    return app, rules


def test_global_table_read_from_a_handler() -> None:
    app, rules = global_app()
    assert app.input_topics == ("events",)
    assert set(app.global_tables) == {"rules"}
    d = TestDriver(app, partitions=16)
    assert d.send("r1", {"limit": 5}, topic="rules") == []
    assert d.send("r2", {"limit": 9}, topic="rules") == []
    # Any key group reads every key of the global table.
    for key in ("a", "b", "c", "d"):
        [out] = d.send(key, {"rule": "r2"}, topic="events")
        assert out.value == {"rule": {"limit": 9}, "n": 2}
    d.send("r2", None, topic="rules")
    assert d.send("a", {"rule": "r2"})[0].value == {"rule": None, "n": 1}  # one stream input
    d.crash()  # the global topic's records were produced: a restart reads them again
    assert rules.get("r1") == {"limit": 5}


def test_a_new_driver_starts_with_empty_global_tables() -> None:
    app, _ = global_app()
    TestDriver(app).send("r1", {"limit": 5}, topic="rules")
    d = TestDriver(app)
    assert d.send("a", {"rule": "r1"})[0].value == {"rule": None, "n": 0}


# ----------------------------------------------------------------------------- definitions


def handle(key: Any, value: Any, ctx: Any) -> None:
    pass


def test_join_asof_needs_a_table_of_this_app() -> None:
    other = App("other")
    foreign = other.table("dim")
    app = App("a")
    app.table("dim")
    rules = app.global_table("rules")
    s = app.stream("facts")
    with pytest.raises(ConfigError, match="needs a table of this app"):
        s.join_asof(foreign)
    with pytest.raises(ConfigError, match="needs a table of this app"):
        s.join_asof(rules)  # type: ignore[arg-type]


def test_join_asof_how_is_left_or_inner() -> None:
    app = App("a")
    dim = app.table("dim")
    s = app.stream("facts")
    with pytest.raises(ConfigError, match=r"how='outer'"):
        s.join_asof(dim, how="outer")
    with pytest.raises(TypeError, match="callable"):
        s.join_asof(dim, combine="nope")  # type: ignore[arg-type]
    s.join_asof(dim, how="inner").to("out")
    assert set(app.handlers()) == {"dim", "facts"}


def test_interval_join_definition_errors() -> None:
    app = App("a")
    left, right = app.stream("l"), app.stream("r")
    with pytest.raises(ConfigError, match="lower_ms 11 > upper_ms 10"):
        left.interval_join(right, lower_ms=11, upper_ms=10)
    with pytest.raises(ConfigError, match="max_per_key"):
        left.interval_join(right, lower_ms=0, upper_ms=10, max_per_key=0)
    with pytest.raises(ConfigError, match="grace_ms"):
        left.interval_join(right, lower_ms=0, upper_ms=10, grace_ms=-1)
    with pytest.raises(ConfigError, match="another input stream"):
        left.interval_join(left, lower_ms=0, upper_ms=10)
    with pytest.raises(ConfigError, match="another input stream"):
        left.interval_join(App("b").stream("x"), lower_ms=0, upper_ms=10)
    assert app.stores == {}  # nothing declared by the refused joins
    joined = left.interval_join(right, lower_ms=0, upper_ms=10)
    with pytest.raises(ConfigError, match="joins two input streams"):
        joined.interval_join(app.stream("z"), lower_ms=0, upper_ms=1)


def test_a_refused_interval_join_declares_nothing() -> None:
    app = App("a")
    left = app.stream("l")
    right = app.stream("r").process(handle)
    with pytest.raises(ConfigError, match="terminal"):
        left.interval_join(right, lower_ms=0, upper_ms=10)
    assert app.stores == {}
    left.to("out")  # the left chain is still open


def test_an_interval_join_that_ends_nowhere_is_refused_by_handlers() -> None:
    app = App("a")
    app.stream("a").interval_join(app.stream("b"), lower_ms=0, upper_ms=10)
    with pytest.raises(ConfigError):
        app.handlers()


def test_an_interval_join_whose_result_only_maps_is_refused_by_handlers() -> None:
    app = App("a")
    app.stream("a").interval_join(app.stream("b"), lower_ms=0, upper_ms=10).map(str)
    with pytest.raises(ConfigError, match="ends without"):
        TestDriver(app)


@pytest.mark.parametrize(
    "first, second",
    [
        ("stream", "table"),
        ("table", "stream"),
        ("table", "table"),
        ("table", "global_table"),
        ("global_table", "stream"),
        ("global_table", "table"),
        ("global_table", "global_table"),
        ("stream", "process"),
    ],
)
def test_a_topic_is_declared_once(first: str, second: str) -> None:
    app = App("a")
    declare = {
        "stream": lambda: app.stream("t"),
        "table": lambda: app.table("t"),
        "global_table": lambda: app.global_table("t"),
        "process": lambda: app.process("t", outputs=["o"]),
    }
    declare[first]()
    stores, globals_ = app.stores, app.global_tables
    with pytest.raises(ConfigError, match="topic 't' is already an input of this app"):
        declare[second]()
    assert app.stores == stores and app.global_tables == globals_
    assert "o" not in app.outputs


def test_a_topic_repeated_in_one_stream_is_refused() -> None:
    app = App("a")
    with pytest.raises(ConfigError, match="repeat a topic"):
        app.stream("x", "y", "x")
    assert app._def.inputs == {}


def test_an_app_with_only_tables_has_no_handlers() -> None:
    app = App("a")
    app.table("t1")
    app.table("t2")
    app.global_table("g")
    with pytest.raises(ConfigError, match="has only tables"):
        app.handlers()
    with pytest.raises(ConfigError, match="has only tables"):
        TestDriver(app)


def test_an_app_with_only_global_tables_has_no_input() -> None:
    app = App("a")
    app.global_table("g")
    with pytest.raises(ConfigError, match="has no input"):
        app.handlers()


def test_table_retention_must_not_be_negative() -> None:
    app = App("a")
    with pytest.raises(ConfigError, match="retention_ms must be >= 0"):
        app.table("t", retention_ms=-1)
    assert app.stores == {}
    app.table("t", retention_ms=0)


@pytest.mark.parametrize("topic", ["_customers", "c" * 240])
def test_a_table_accepts_any_legal_topic_name(topic: str) -> None:
    app = App("a")
    app.table(topic)
