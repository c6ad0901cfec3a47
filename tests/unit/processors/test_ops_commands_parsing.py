"""Pure parts of `lockgate topics|send|dlq|reset` (processors/_ops/), no Kafka."""

from __future__ import annotations

import orjson
import pytest
from click.testing import CliRunner

from processors import App
from processors._ops.catalog import OpsError
from processors._ops.dlq import REPLAYED_FROM, parse_offsets, preview, replay_headers
from processors._ops.reset import parse_reset_position
from processors._ops.send import parse_send_lines
from processors._ops.topics import TopicFacts, app_needs, check_topics
from processors.cli import main
from state.codecs import JSON, STR


def test_send_lines_encode_with_codecs() -> None:
    lines = [
        '{"key": "a", "value": {"v": 1}, "headers": {"h": "x"}, "timestamp": 5}\n',
        "\n",
        '{"value": {"id": 7, "v": 2}}',
        '{"key": null, "value": null}',
    ]
    recs = parse_send_lines(lines, STR, JSON, key_field="id")
    assert [r.line for r in recs] == [1, 3, 4]
    assert recs[0].key == b"a" and orjson.loads(recs[0].value or b"") == {"v": 1}
    assert recs[0].headers == [("h", b"x")] and recs[0].timestamp == 5
    assert recs[1].key == b"7"  # from --key-field, encoded with the key codec
    assert recs[2].key is None and recs[2].value is None


def test_send_bad_lines_are_named_and_nothing_is_returned() -> None:
    lines = ['{"value": 1}', "not json", '{"value": 1, "extra": 2}', '{"key": "k"}', "[1]"]
    with pytest.raises(OpsError) as err:
        parse_send_lines(lines, STR, JSON)
    text = str(err.value)
    assert err.value.exit_code == 2
    assert "4 bad line(s), nothing was produced" in text
    for n in (2, 3, 4, 5):
        assert f"line {n}:" in text
    assert "line 1:" not in text


def test_send_line_checks() -> None:
    with pytest.raises(OpsError, match="line 1: no key, and the value has no field 'id'"):
        parse_send_lines(['{"value": {"x": 1}}'], STR, JSON, key_field="id")
    with pytest.raises(OpsError, match="timestamp"):
        parse_send_lines(['{"value": 1, "timestamp": -1}'], STR, JSON)
    with pytest.raises(OpsError, match="header 'h' must be a string"):
        parse_send_lines(['{"value": 1, "headers": {"h": 1}}'], STR, JSON)


def test_parse_offsets() -> None:
    assert parse_offsets("0:5, 1:2,0:3,0:5") == {0: [3, 5], 1: [2]}
    for bad in ("", "x", "0:", "0:-1", "a:1"):
        with pytest.raises(OpsError):
            parse_offsets(bad)


def test_parse_reset_position() -> None:
    assert parse_reset_position("earliest") == "earliest"
    assert parse_reset_position("LATEST") == "latest"
    assert parse_reset_position("1700000000000") == 1_700_000_000_000
    assert parse_reset_position("2023-11-14T22:13:20Z") == 1_700_000_000_000
    assert parse_reset_position("2023-11-14T22:13:20") == 1_700_000_000_000  # UTC
    assert parse_reset_position("2023-11-14T23:13:20+01:00") == 1_700_000_000_000
    with pytest.raises(OpsError, match="--to"):
        parse_reset_position("yesterday")


def test_replay_headers_drop_the_error_description() -> None:
    headers: list[tuple[str, bytes | str | None]] = [
        ("lockgate-error-type", b"ValueError"),
        ("lockgate-source-topic", b"in"),
        ("trace", b"t1"),
        (REPLAYED_FROM, b"0:1"),
        ("lockgate-timer-name", b"x"),
    ]
    assert replay_headers(headers, 2, 9) == [("trace", b"t1"), (REPLAYED_FROM, b"2:9")]


def test_preview() -> None:
    assert preview(None) == "null"
    assert preview(b"abc") == "abc"
    assert preview(b"x" * 100, 10) == "x" * 7 + "..."


def _app() -> App:
    app = App("demo")
    app.value_state("totals")

    @app.process("in", outputs=["out"])
    def handle(key, value, ctx):  # type: ignore[no-untyped-def]
        ctx.emit("out", key, value)

    return app


def test_topic_checks() -> None:
    app = _app()
    needs = app_needs(app, "demo", 4)
    topics = {n.topic: n.role for n in needs}
    assert topics == {
        "in": "input",
        "out": "output",
        "demo.totals.changelog": "changelog",
        "demo.dlq": "dlq",
        "demo.control": "control",
        "lockgate.registry": "registry",
    }
    compact = {"cleanup.policy": "compact"}
    facts = {
        "in": TopicFacts(True, 4, {"cleanup.policy": "delete"}),
        "out": TopicFacts(True, 2, {"cleanup.policy": "delete"}),  # a note only
        "demo.totals.changelog": TopicFacts(True, 3, {"cleanup.policy": "delete"}),
        "demo.dlq": TopicFacts(False),
        "demo.control": TopicFacts(True, 4, compact),
        "lockgate.registry": TopicFacts(True, 1, compact),
    }
    rows = {r["topic"]: r for r in check_topics(needs, facts)}
    assert rows["in"]["problems"] == []
    assert rows["out"]["problems"] == [] and rows["out"]["notes"]
    assert len(rows["demo.totals.changelog"]["problems"]) == 2  # count and policy
    assert rows["demo.dlq"]["problems"] and not rows["demo.dlq"]["exists"]
    assert rows["demo.control"]["problems"] == []


def test_commands_are_registered() -> None:
    runner = CliRunner()
    for args in (["topics"], ["send"], ["dlq", "list"], ["dlq", "replay"], ["reset"]):
        result = runner.invoke(main, [*args, "--help"])
        assert result.exit_code == 0, result.output
    result = runner.invoke(main, ["dlq", "replay", "--app", "x"])
    assert result.exit_code == 2
    assert "--offsets" in result.output
