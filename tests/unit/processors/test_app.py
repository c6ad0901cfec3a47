from typing import Any

import pytest

from processors import App, ConfigError


class Recorder:
    def __init__(self) -> None:
        self.emitted: list[tuple[str, Any, Any]] = []

    def emit(self, topic: str, key: Any, value: Any, headers: Any = None) -> None:
        self.emitted.append((topic, key, value))


def test_chain_map_filter_flat_map_to() -> None:
    app = App("chain")
    app.stream("in").map(lambda v: v * 2).filter(lambda v: v % 3 != 0).flat_map(
        lambda v: [v, v + 1]
    ).to("out")
    handler = app.handler()
    ctx = Recorder()
    for v in range(5):
        handler("k", v, ctx)  # type: ignore[arg-type]
    # 0,2,4,6,8 -> drop 0 and 6 -> 2,3,4,5,8,9
    assert [v for _, _, v in ctx.emitted] == [2, 3, 4, 5, 8, 9]
    assert {t for t, _, _ in ctx.emitted} == {"out"}
    assert "out" in app.outputs


def test_process_decorator_registers_outputs_and_input() -> None:
    app = App("p")

    @app.process("numbers", outputs=["sums"])
    def handle(key: str, value: Any, ctx: Any) -> None:
        ctx.emit("sums", key, value)

    assert app.input_topics == ("numbers",)
    assert set(app.outputs) == {"sums"}


@pytest.mark.parametrize("bad", ["", "has space", "x" * 300, "-lead"])
def test_bad_names_rejected(bad: str) -> None:
    with pytest.raises(ConfigError):
        App(bad)


def test_duplicate_store_and_missing_input() -> None:
    app = App("a")
    app.value_state("s")
    with pytest.raises(ConfigError, match="declared twice"):
        app.value_state("s")
    with pytest.raises(ConfigError, match="no input"):
        app.handler()
    app.stream("x")
    with pytest.raises(ConfigError, match="already an input"):
        app.stream("x")
