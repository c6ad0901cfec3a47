"""``lockgate console`` without Kafka: graph, checkpoints, lag, rates, metrics, pages, routes."""

from __future__ import annotations

from typing import Any

import click
import orjson
import pytest

from processors._config.settings import Settings
from processors._ops.catalog import OpsError
from processors._ops.console.command import parse_instances
from processors._ops.console.data import Rates, Snapshotter, checkpoint_rows, partition_lag
from processors._ops.console.graph import pipeline_graph
from processors._ops.console.instances import InstanceDirectory, parse_metrics
from processors._ops.console.jobs import _savepoint_of
from processors._ops.console.pages import live_fragment, page, savepoint_page
from processors._ops.console.server import ConsoleServer

REGISTRY: dict[str, dict[str, Any]] = {
    "clicks": {"inputs": ["raw"], "outputs": ["counts"], "internal_outputs": ["counts"]},
    "regions": {"inputs": ["counts"], "outputs": ["totals"], "internal_outputs": []},
}


def test_graph_columns_follow_the_data() -> None:
    g = pipeline_graph(REGISTRY)
    levels = {n.id: n.level for n in g.nodes}
    assert levels == {
        "topic:raw": 0,
        "app:clicks": 1,
        "topic:counts": 2,
        "app:regions": 3,
        "topic:totals": 4,
    }
    kinds = {n.label: n.kind for n in g.nodes}
    assert kinds["raw"] == "input" and kinds["counts"] == "internal" and kinds["totals"] == "output"
    assert ("topic:counts", "app:regions") in {(e.source, e.target) for e in g.edges}
    assert g.width > 0 and g.height > 0


def test_graph_survives_a_cycle() -> None:
    cyc = {"a": {"inputs": ["x"], "outputs": ["y"]}, "b": {"inputs": ["y"], "outputs": ["x"]}}
    assert len(pipeline_graph(cyc).nodes) == 4


def test_checkpoint_rows_duration_and_records() -> None:
    history = {
        0: [
            {"checkpoint": 1000, "offsets": {"raw": 10}},
            {"checkpoint": 2000, "offsets": {"raw": 15}},
        ],
        1: [
            {"checkpoint": 1000, "offsets": {"raw": 7}},
            {"checkpoint": 2000, "offsets": {"raw": 9}},
        ],
    }
    rows = [
        {"checkpoint": 2000, "ts": 2250, "time": "t2", "aligned": True},
        {"checkpoint": 1000, "ts": 1100, "time": "t1", "aligned": True},
    ]
    out = checkpoint_rows(rows, history)
    assert [r["duration_ms"] for r in out] == [250, 100]
    assert [r["records"] for r in out] == [7, None]
    ahead = checkpoint_rows([{"checkpoint": 5000, "ts": 2500}], history)
    assert ahead[0]["duration_ms"] is None  # an id past the clock (after a savepoint)


def test_partition_lag() -> None:
    latest = {0: {"offsets": {"raw": 5}}, 1: {"offsets": {}}}
    rows = partition_lag(["raw"], 2, latest, {("raw", 0): 8, ("raw", 1): 3})
    assert rows == [
        {"topic": "raw", "partition": 0, "committed": 5, "end": 8, "lag": 3},
        {"topic": "raw", "partition": 1, "committed": None, "end": 3, "lag": None},
    ]


def test_rates_over_a_window_and_after_a_reset() -> None:
    now = [0.0]
    rates = Rates(window_s=10, clock=lambda: now[0])
    assert rates.add("a", 0) is None
    now[0] = 2.0
    assert rates.add("a", 100) == 50.0
    now[0] = 3.0
    assert rates.add("a", 40) is None  # went down: starts over


def test_parse_metrics_values_means_and_watermarks() -> None:
    text = "\n".join(
        [
            "# TYPE lockgate_records_in counter",
            'lockgate_records_in_total{app="a",lockgate_instance="i"} 42.0',
            "# TYPE lockgate_alignment_seconds histogram",
            'lockgate_alignment_seconds_bucket{app="a",lockgate_instance="i",le="+Inf"} 2.0',
            'lockgate_alignment_seconds_count{app="a",lockgate_instance="i"} 2.0',
            'lockgate_alignment_seconds_sum{app="a",lockgate_instance="i"} 0.5',
            "# TYPE lockgate_watermark_ms gauge",
            'lockgate_watermark_ms{app="a",lockgate_instance="i",key_group="3"} 1000.0',
            "",
        ]
    )
    values, marks = parse_metrics(text)
    assert values["records_in"] == 42.0
    assert values["alignment_mean_s"] == 0.25
    assert marks == [
        {"name": "lockgate_watermark_ms", "labels": {"key_group": "3"}, "value": 1000.0}
    ]


def test_instance_directory() -> None:
    d = InstanceDirectory({"c1": "http://h:1/"}, "http://{instance}.{app}:8080")
    assert d.url("app", "c1") == "http://h:1"
    assert d.url("app", "c2") == "http://c2.app:8080"
    assert d.url("app", "c2/../x") is None  # not an instance id: never put into a URL
    assert InstanceDirectory({}, None).url("app", "c2") is None


def test_parse_instances() -> None:
    assert parse_instances(("c1=http://127.0.0.1:8080",)) == {"c1": "http://127.0.0.1:8080"}
    with pytest.raises(click.BadParameter):
        parse_instances(("c1:8080",))


def test_savepoint_id_from_a_progress_line() -> None:
    assert _savepoint_of("savepoint sp-1: requesting checkpoint 5") == "sp-1"
    assert _savepoint_of("warning: x") is None


SNAPSHOT: dict[str, Any] = {
    "generated": "now",
    "graph": pipeline_graph(REGISTRY).to_json(),
    "apps": [
        {
            "name": "clicks<script>",
            "inputs": ["raw"],
            "outputs": [],
            "internal_outputs": [],
            "key_groups": 2,
            "key_group_rows": [
                {"key_group": 0, "checkpoint": 5, "instance": "c1", "halted": "sp-9"},
                {"key_group": 1, "checkpoint": None},
            ],
            "halted": {"0": "sp-9"},
            "checkpoints": [{"checkpoint": 5, "time": "t", "duration_ms": 3, "records": 4}],
            "lag": [{"topic": "raw", "partition": 0, "committed": 1, "end": 2, "lag": 1}],
            "lag_total": 1,
            "throughput": 2.5,
            "dead_letters": 0,
        }
    ],
    "instances": [{"id": "c1", "app": "clicks<script>", "key_groups": [0], "metrics": {}}],
    "savepoints": {"rows": [{"savepoint": "sp-9", "apps": ["clicks"], "checkpoint": 5}]},
}


def test_live_fragment_escapes_and_shows_the_parts() -> None:
    html = live_fragment(SNAPSHOT, [{"id": "1", "state": "failed", "error": "<b>x</b>"}])
    assert "<script>" not in html and "clicks&lt;script&gt;" in html
    assert "halted at sp-9" in html
    assert 'data-savepoint="sp-9"' in html
    assert 'class="latest-checkpoint" data-app="clicks&lt;script&gt;">5<' in html
    assert "&lt;b&gt;x&lt;/b&gt;" in html
    assert "2.5/s" in html


def test_page_and_savepoint_page() -> None:
    assert 'nonce="abc"' in page("t", "<p>x</p>", "abc")
    body = savepoint_page(
        {"savepoint": "sp-1", "checkpoint": 7, "apps": {"a": {"manifests": [{"key_group": 0}]}}}
    )
    assert 'id="savepoint-id">sp-1<' in body


class _Snaps:
    def snapshot(self) -> dict[str, Any]:
        return SNAPSHOT

    def refresh_savepoints(self) -> None:
        return None


class _Jobs:
    def __init__(self) -> None:
        self.triggered: list[tuple[list[str], str | None, bool]] = []

    def jobs(self) -> list[dict[str, Any]]:
        return []

    def trigger(self, apps: list[str], pipeline: str | None, stop: bool) -> Any:
        self.triggered.append((apps, pipeline, stop))

        class J:
            id = "1"

            def to_json(self) -> dict[str, Any]:
                return {"id": "1"}

        return J()


def _server(token: str | None) -> tuple[ConsoleServer, _Jobs]:
    settings = Settings(bootstrap_servers="127.0.0.1:1", query_token=token)
    jobs = _Jobs()
    server = ConsoleServer(settings, _Snaps(), jobs, "127.0.0.1", 0)  # type: ignore[arg-type]
    return server, jobs


def test_actions_need_the_token() -> None:
    server, jobs = _server("a-secret-token")
    try:
        body = orjson.dumps({"pipeline": "clicks"})
        assert server.post("/api/savepoints", None, body)[0] == 401
        assert server.post("/api/savepoints", "Bearer wrong-token", body)[0] == 401
        code, _, data = server.post("/api/savepoints", "Bearer a-secret-token", body)
        assert code == 202, data
        assert jobs.triggered == [([], "clicks", False)]
        code, _, html = server.get("/", "n1")
        assert code == 200 and b"a-secret-token" not in html
    finally:
        server._server.server_close()


def test_actions_are_off_without_a_token() -> None:
    server, jobs = _server(None)
    try:
        code, _, data = server.post("/api/savepoints", "Bearer x", b"{}")
        assert code == 403 and b"LOCKGATE_QUERY_TOKEN" in data
        assert server.get("/nothing", "n")[0] == 404
        assert orjson.loads(server.get("/api/overview", "n")[2])["generated"] == "now"
    finally:
        server._server.server_close()


class _BrokenOps:
    def registry(self) -> dict[str, Any]:
        raise OpsError("no broker")


class _EmptyOps:
    def registry(self) -> dict[str, Any]:
        return {}


def test_snapshot_reports_a_failure_instead_of_raising() -> None:
    settings = Settings(bootstrap_servers="127.0.0.1:1")
    snaps = Snapshotter(settings, InstanceDirectory({}, None))
    snap = snaps.collect(_BrokenOps())  # type: ignore[arg-type]
    assert snap["error"] == "OpsError: no broker" and snap["apps"] == []
    assert snap["savepoints"]["error"] == "LOCKGATE_SAVEPOINT_DIR is not set"
    empty = snaps.collect(_EmptyOps())  # type: ignore[arg-type]
    assert empty["error"] is None and empty["graph"] == {"nodes": [], "edges": []}
    assert "no app has registered yet" in live_fragment(empty, [])
    assert "no answer from Kafka yet" in live_fragment(snaps.snapshot(), [])
