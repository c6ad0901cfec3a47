"""The late topic of a window: per app (``late_topic=True``, ``{app}``) or as named.

The app's running name (``LOCKGATE_APP_NAME``, applied with ``App.run_as``) names the
per-app late topic like the app's changelogs and DLQ, so two deployments of one code
write two late topics; a name given without ``{app}`` stays as it is.
"""

from __future__ import annotations

from typing import Any

import pytest

from processors import App, ConfigError, Tumbling, Watermarks
from processors.testing import TestDriver


def _app(late_topic: Any) -> App:
    app = App("clicks")
    (
        app.stream("in", timestamp=lambda v: int(v["ts"]), watermarks=Watermarks.monotonous())
        .window(Tumbling(100), late_topic=late_topic)
        .count()
        .map(lambda w: w.as_dict())
        .to("out")
    )
    return app


def _late_topics(app: App) -> list[str]:
    """Run one late record through ``app``; return the topics it went to."""
    d = TestDriver(app, partitions=1)
    d.send("k", {"ts": 50})
    d.send("k", {"ts": 250})  # watermark 249: [0, 100) fired
    return [e.topic for e in d.send("k", {"ts": 60})]


def test_true_names_the_late_topic_after_the_app() -> None:
    app = _app(True)
    assert set(app.outputs) == {"out", "clicks.late"}
    assert app.outputs["clicks.late"].topic == "clicks.late"
    assert _late_topics(app) == ["clicks.late"]


def test_two_app_names_get_two_late_topics() -> None:
    app = _app(True)
    app.run_as("clicks-eu")
    assert "clicks-eu.late" in app.outputs and "clicks.late" not in app.outputs
    assert _late_topics(app) == ["clicks-eu.late"]
    app.run_as("clicks-us")
    assert app.run_name == "clicks-us"
    assert _late_topics(app) == ["clicks-us.late"]


def test_a_given_name_is_kept_and_app_in_it_is_the_app_name() -> None:
    named = _app("all-clicks.late")
    named.run_as("clicks-eu")
    assert _late_topics(named) == ["all-clicks.late"]
    templated = _app("{app}.late-clicks")
    templated.run_as("clicks-eu")
    assert set(templated.outputs) == {"out", "clicks-eu.late-clicks"}
    assert _late_topics(templated) == ["clicks-eu.late-clicks"]


@pytest.mark.parametrize("late_topic", [None, False])
def test_no_late_topic_drops_late_records(late_topic: Any) -> None:
    app = _app(late_topic)
    assert set(app.outputs) == {"out"}
    assert _late_topics(app) == []


def test_illegal_late_topics_are_refused() -> None:
    with pytest.raises(ConfigError, match="late topic"):
        _app("{app}/late")
    with pytest.raises(TypeError, match="late_topic"):
        _app(3)
    app = _app(True)
    with pytest.raises(ConfigError, match="app name"):
        app.run_as("no spaces")
    templated = _app("{app}" + "x" * 200)
    with pytest.raises(ConfigError, match="late topic"):
        templated.run_as("a" * 100)  # a legal app name, a topic name over 249 characters
    assert templated.run_name == "clicks"  # refused: nothing changed
