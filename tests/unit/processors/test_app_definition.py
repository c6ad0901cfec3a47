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
def test_several_input_topics_are_refused_at_definition(define: str) -> None:
    app = App("a")
    with pytest.raises(ConfigError, match="multi-input apps are not supported yet"):
        if define == "stream":
            app.stream("a", "b")
        else:
            app.process("a", "b", outputs=["out"])(handle)
    assert app.outputs == {}


def test_two_streams_are_refused() -> None:
    app = App("a")
    app.stream("in").to("out")
    with pytest.raises(ConfigError, match="already has an input stream \\(topic 'in'\\)"):
        app.stream("other")


def test_stream_then_process_decorator_is_refused_before_declaring_outputs() -> None:
    app = App("a")
    app.stream("in").to("out")
    with pytest.raises(ConfigError, match="already has an input stream"):
        app.process("in", outputs=["sums"])
    assert set(app.outputs) == {"out"}


def test_process_decorator_twice_is_refused() -> None:
    app = App("a")
    app.process("in", outputs=["out"])(handle)
    with pytest.raises(ConfigError, match="already has an input stream"):
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
    with pytest.raises(ConfigError, match=r"ends without \.to\(\), \.key_by\(\) or \.process\(\)"):
        app.handler()


def test_a_full_chain_still_compiles() -> None:
    app = App("a")
    app.stream("in").map(str).to("out")
    assert callable(app.handler())
