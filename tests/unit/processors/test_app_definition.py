"""Definition-time refusals: API traps fail where the app is written, not at run time."""

from typing import Any

import pytest

from processors import App, ConfigError


def handle(key: Any, value: Any, ctx: Any) -> None:
    ctx.emit("out", key, value)


@pytest.mark.parametrize(
    "after",
    [
        lambda s: s.to("out"),
        lambda s: s.map(str),
        lambda s: s.filter(bool),
        lambda s: s.flat_map(list),
        lambda s: s.process(handle),
    ],
)
def test_operators_after_process_are_refused(after: Any) -> None:
    app = App("a")
    stream = app.stream("in").process(handle)
    with pytest.raises(ConfigError, match=r"after \.process\(\) would never run"):
        after(stream)


def test_refused_to_after_process_declares_no_output() -> None:
    app = App("a")
    stream = app.stream("in").process(handle)
    with pytest.raises(ConfigError):
        stream.to("never")
    assert "never" not in app.outputs


@pytest.mark.parametrize("define", ["stream", "process"])
def test_several_input_topics_share_one_chain(define: str) -> None:
    app = App("a")
    if define == "stream":
        app.stream("a", "b").process(handle)
    else:
        app.process("a", "b", outputs=["out"])(handle)
    assert app.input_topics == ("a", "b")
    handlers = app.handlers()
    assert handlers["a"] is handlers["b"]


def test_one_chain_per_input_topic() -> None:
    app = App("a")
    app.stream("in").to("out")
    app.stream("other").to("out2")
    assert app.input_topics == ("in", "other")
    assert set(app.handlers()) == {"in", "other"}


def test_a_topic_declared_twice_is_refused_before_declaring_outputs() -> None:
    app = App("a")
    app.stream("in").to("out")
    with pytest.raises(ConfigError, match="topic 'in' is already an input of this app"):
        app.process("in", outputs=["sums"])
    assert set(app.outputs) == {"out"}
    with pytest.raises(ConfigError, match="repeat a topic"):
        app.stream("x", "x")


def test_process_decorator_twice_is_refused() -> None:
    app = App("a")
    app.process("in", outputs=["out"])(handle)
    with pytest.raises(ConfigError, match="already an input of this app"):
        app.process("in")(handle)


def test_process_decorator_without_topic_is_a_type_error() -> None:
    app = App("a")
    with pytest.raises(TypeError, match=r"@app.process\('topic'"):
        app.process(handle)  # type: ignore[arg-type]


def test_outputs_given_as_one_string_is_a_type_error() -> None:
    app = App("a")
    with pytest.raises(TypeError, match=r"outputs=\['sums'\]"):
        app.process("in", outputs="sums")


@pytest.mark.parametrize("op", ["map", "filter", "flat_map", "process"])
def test_operators_need_callables(op: str) -> None:
    stream = App("a").stream("in")
    with pytest.raises(TypeError, match=f"{op}\\(\\) needs a callable"):
        getattr(stream, op)("not callable")


def test_decorated_handler_must_be_callable() -> None:
    app = App("a")
    with pytest.raises(TypeError, match="callable"):
        app.process("in")("not callable")  # type: ignore[arg-type]
    assert app.handler is not None


@pytest.mark.parametrize("topic", ["", "has space", "x" * 250, "..", "a/b"])
def test_bad_topic_names_are_refused(topic: str) -> None:
    with pytest.raises(ConfigError, match="topic name"):
        App("a").stream(topic)
    with pytest.raises(ConfigError, match="topic name"):
        App("b").output(topic)


def test_stream_without_operators_has_no_handler() -> None:
    app = App("a")
    app.stream("in")
    with pytest.raises(ConfigError, match="has no operators"):
        app.handler()


def test_chain_that_ends_nowhere_is_refused() -> None:
    app = App("a")
    app.stream("in").map(str).filter(bool)
    with pytest.raises(
        ConfigError, match=r"ends without \.to\(\), \.key_by\(\), \.process\(\) or a join"
    ):
        app.handler()


def test_a_full_chain_still_compiles() -> None:
    app = App("a")
    app.stream("in").map(str).to("out")
    assert callable(app.handler())
