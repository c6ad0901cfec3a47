"""TestDriver behaves like the production runtime: commits, crashes, errors, TTL, sweep."""

from typing import Any

import pytest

from processors import App, Context
from processors.exceptions import ConfigError, UserCodeError
from processors.testing import DeadLetter, TestDriver
from state.primitives import MapState, StoreSpec


def _counter_app(ttl_ms: int | None = None) -> App:
    """Counts per key and emits the count; value {"boom": true} raises after its effects."""
    app = App("counter")
    counts = app.value_state("counts", default=0, ttl_ms=ttl_ms)

    @app.process("in", outputs=["out"])
    def handle(key: str, value: dict[str, Any], ctx: Context) -> None:
        n = counts.value() + 1
        counts.update(n)
        ctx.emit("out", key, {"n": n, "ts": ctx.timestamp, "off": ctx.offset})
        if value.get("boom"):
            raise ValueError(f"boom on {key}")

    return app


def test_crash_keeps_committed_state_and_emits_and_drops_the_rest() -> None:
    d = TestDriver(_counter_app())
    d.send("a", {})
    d.send("b", {})
    d.commit()
    d.send("a", {})
    assert [e.value["n"] for e in d.emitted] == [1, 1, 2]
    d.crash()
    assert [(e.key, e.value["n"]) for e in d.emitted] == [("a", 1), ("b", 1)]  # committed stay
    assert d.state("counts", "a") == 1
    assert d.send("a", {})[0].value["n"] == 2  # replayed from the committed state
    d.crash()
    d.crash()
    assert d.state("counts", "a") == 1 and d.state("counts", "b") == 1


def test_crash_rewinds_offsets_to_the_last_commit() -> None:
    d = TestDriver(_counter_app(), partitions=1)
    for _ in range(3):
        d.send("a", {})
    d.commit()
    assert d.send("a", {})[0].value["off"] == 3
    d.crash()
    assert d.send("a", {})[0].value["off"] == 3  # the same position is consumed again
    assert d.send("a", {})[0].value["off"] == 4


def test_user_exception_dead_letters_the_record_and_keeps_the_rest_of_the_epoch() -> None:
    d = TestDriver(_counter_app())
    d.send("a", {})
    d.commit()
    d.send("a", {})  # n=2, same epoch as the failing record
    d.send("b", {})  # n=1
    out = d.send("a", {"boom": True}, timestamp=77)  # wrote n=3 and emitted, then raised
    assert out == []
    assert [(e.key, e.value["n"]) for e in d.emitted] == [("a", 1), ("a", 2), ("b", 1)]
    assert d.state("counts", "a") == 2 and d.state("counts", "b") == 1
    [dl] = d.dead_letters
    assert isinstance(dl, DeadLetter)
    assert (dl.topic, dl.key, dl.value, dl.stage, dl.timestamp) == (
        "in",
        "a",
        {"boom": True},
        "process",
        77,
    )
    assert isinstance(dl.error, ValueError) and str(dl.error) == "boom on a"
    d.crash()  # production commits right after dead-lettering: nothing of it is lost
    assert d.state("counts", "a") == 2 and d.state("counts", "b") == 1
    assert len(d.dead_letters) == 1 and len(d.emitted) == 3
    assert d.send("a", {})[0].value["n"] == 3


def test_a_record_failing_only_on_replay_is_dead_lettered_too() -> None:
    app = App("flaky")
    seen = app.value_state("seen", default=0)
    calls: dict[str, int] = {}

    @app.process("in", outputs=["out"])
    def handle(key: str, value: Any, ctx: Context) -> None:
        calls[key] = calls.get(key, 0) + 1
        seen.update(seen.value() + 1)
        ctx.emit("out", key, calls[key])
        if key == "x" or (key == "y" and calls[key] > 1):
            raise RuntimeError(key)

    d = TestDriver(app)
    d.send("y", 0)
    d.send("z", 0)
    assert d.send("x", 0) == []
    # y failed when replayed: both dead-lettered, in input order (as in <app>.dlq)
    assert [dl.key for dl in d.dead_letters] == ["y", "x"]
    assert [e.key for e in d.emitted] == ["z"]
    assert d.state("seen", "z") == 1 and d.state("seen", "y") is None
    assert calls == {"y": 2, "z": 2, "x": 1}


def test_on_error_fail_raises_and_loses_the_epoch() -> None:
    d = TestDriver(_counter_app(), on_error="fail")
    d.send("a", {})
    d.commit()
    d.send("a", {})
    with pytest.raises(UserCodeError, match="boom on a") as info:
        d.send("a", {"boom": True})
    assert isinstance(info.value.__cause__, ValueError)
    assert d.state("counts", "a") == 1 and len(d.emitted) == 1 and d.dead_letters == []


def test_ttl_uses_the_driver_clock_not_record_timestamps() -> None:
    d = TestDriver(_counter_app(ttl_ms=1000))
    assert d.now_ms == 0
    d.send("a", {}, timestamp=10**13)  # an event-time stamp far ahead: irrelevant to TTL
    d.advance(999)
    assert d.state("counts", "a") == 1
    assert d.send("a", {})[0].value["ts"] == 999  # the timestamp defaults to the clock
    d.advance(999)
    assert d.state("counts", "a") == 2  # the write at 999 renewed it until 1999
    d.advance(1)
    assert d.now_ms == 1999
    assert d.state("counts", "a") is None
    assert d.send("a", {})[0].value["n"] == 1
    with pytest.raises(ValueError, match="backwards"):
        d.advance(-1)


def test_injected_clock() -> None:
    now = [5_000]
    d = TestDriver(_counter_app(ttl_ms=100), clock=lambda: now[0])
    d.send("a", {})
    now[0] = 5_099
    assert d.state("counts", "a") == 1
    d.advance(1)
    assert d.now_ms == 5_100 and d.state("counts", "a") is None


def test_state_honours_entry_ttl_of_maps() -> None:
    app = App("maps")
    seen: MapState[int] = app._def.add_store(
        MapState(StoreSpec("seen", "map", ttl_ms=100, entry_ttl=True), app.cursor)
    )

    @app.process("in")
    def handle(key: str, value: str, ctx: Context) -> None:
        seen.put(value, 1)

    d = TestDriver(app)
    d.send("k", "a")
    d.advance(50)
    d.send("k", "b")
    assert d.state("seen", "k") == {"a": 1, "b": 1}
    d.advance(50)
    assert d.state("seen", "k") == {"b": 1}
    d.advance(50)
    assert d.state("seen", "k") is None


def test_commit_sweeps_expired_state_never_read_again() -> None:
    d = TestDriver(_counter_app(ttl_ms=100), partitions=1, sweep_budget=2)
    for key in ("a", "b", "c"):
        d.send(key, {})
    d.commit()
    db = d.key_group_store(0)
    assert sorted(k for k, _ in db.iter_from("counts", None, 10)) == [b"a", b"b", b"c"]
    d.advance(100)
    d.commit()  # two keys examined per commit
    assert [k for k, _ in db.iter_from("counts", None, 10)] == [b"c"]
    d.commit()
    assert list(db.iter_from("counts", None, 10)) == []


def test_multi_topic_apps_need_the_topic_named() -> None:
    app = App("two-inputs")

    @app.process("in1", "in2", outputs=["out"])
    def handle(key: Any, value: Any, ctx: Context) -> None:
        ctx.emit("out", key, {"topic": ctx.topic, "v": value})

    driver = TestDriver(app)
    with pytest.raises(ConfigError, match=r"reads in1, in2: name the topic"):
        driver.send("k", 1)
    with pytest.raises(ConfigError, match=r"'in3' is not an input of app 'two-inputs'"):
        driver.send("k", 1, topic="in3")
    assert driver.send("k", 1, topic="in2")[0].value == {"topic": "in2", "v": 1}
    assert driver.send("k", 2, topic="in1")[0].value == {"topic": "in1", "v": 2}


def test_emit_to_an_undeclared_topic_stops_like_production() -> None:
    app = App("bad-emit")

    @app.process("in")
    def handle(key: Any, value: Any, ctx: Context) -> None:
        ctx.emit("nowhere", key, value)

    with pytest.raises(ConfigError, match="nowhere"):
        TestDriver(app).send("k", 1)


class _PickyCodec:
    """Encodes anything, refuses to decode b"bad" (an upstream writer's bug)."""

    name = "picky"

    def encode(self, value: Any) -> bytes:
        return str(value).encode()

    def decode(self, data: bytes) -> Any:
        if data == b"bad":
            raise ValueError("cannot decode")
        return data.decode()


def _picky_app() -> App:
    app = App("picky")
    n = app.value_state("n", default=0)

    @app.process("in", outputs=["out"], value=_PickyCodec())
    def handle(key: str, value: str, ctx: Context) -> None:
        n.update(n.value() + 1)
        ctx.emit("out", key, value)

    return app


def test_undecodable_input_is_dead_lettered_without_an_abort() -> None:
    d = TestDriver(_picky_app())
    d.send("a", "ok")
    assert d.send("a", "bad") == []
    d.send("a", "ok2")
    [dl] = d.dead_letters
    assert (dl.stage, dl.value, type(dl.error)) == ("deserialize", b"bad", ValueError)
    assert d.state("n", "a") == 2 and [e.value for e in d.emitted] == ["ok", "ok2"]
    d.crash()  # not committed: the dead letter was part of the open epoch
    assert d.dead_letters == [] and d.emitted == [] and d.state("n", "a") is None


def test_undecodable_input_with_on_error_fail() -> None:
    d = TestDriver(_picky_app(), on_error="fail")
    d.send("a", "ok")
    with pytest.raises(UserCodeError, match="deserialize"):
        d.send("a", "bad")
    assert d.state("n", "a") is None and d.emitted == []


def test_commit_trims_the_read_cache_and_state_stays_right() -> None:
    d = TestDriver(_counter_app(), partitions=1, cache_entries=3)
    for key in "abcdefgh":
        d.send(key, {})
    d.commit()
    cache = d._kg(0).caches["counts"]
    assert len(cache) == 3
    assert [d.send(key, {})[0].value["n"] for key in "abcdefgh"] == [2] * 8
