"""The console's dashboard page, the PromQL subset's histogram_quantile and alert ``for:``
states, and per-key-group watermarks (instance exposition, gauges, console), without Kafka.

The metrics come from the runtime's own exposition (:class:`Metrics` through
``metrics_registry``), so the panels are drawn from what an instance really exports."""

from __future__ import annotations

import math
import re
import time
from types import SimpleNamespace
from typing import Any

import pytest
from prometheus_client import generate_latest

from processors._config.settings import Settings
from processors._ops.console.alert_rules import AlertEvaluator, AlertRule
from processors._ops.console.dashboard import (
    DASHBOARD_FILE,
    MetricsHistory,
    format_value,
    load_dashboard,
)
from processors._ops.console.pages import live_fragment
from processors._ops.console.promql import Store, evaluate
from processors._ops.console.server import ConsoleServer
from processors._runtime.gauges import ProgressGauges
from processors._runtime.health import Metrics, metrics_registry
from processors._task.time import NO_WATERMARK, TIME_STORE
from tests.support.helm import CHART_DIR


def test_the_packaged_dashboard_is_the_charts() -> None:
    chart = (CHART_DIR / "dashboards" / "lockgate.json").read_bytes()
    assert DASHBOARD_FILE.read_bytes() == chart, "copy the chart's dashboard into the package"


def _history(seconds: int = 30, **kw: Any) -> tuple[MetricsHistory, float]:
    m = Metrics("clicks", "c1")
    reg = metrics_registry(m)
    history = MetricsHistory(scrape_s=1.0, **kw)
    t0 = time.time() - seconds
    for k in range(seconds):
        m.records_in += 100
        m.records_out += 50
        m.epochs_committed += 2
        m.observe_commit(0.02)
        m.partition_lag = {("raw", 0): 7, ("raw", 1): 3}
        m.consumer_lag = 10
        m.watermark_ms = int((t0 + k - 5) * 1000)
        history.ingest([("c1", generate_latest(reg).decode())], at=t0 + k)
    return history, t0 + seconds - 1


def _panel(html: str, title: str) -> str:
    m = re.search(
        rf'<section class="card panel"[^>]*data-title="{re.escape(title)}".*?</section>', html
    )
    assert m, f"no panel {title!r}"
    return m.group(0)


def _lasts(panel: str) -> dict[str, float]:
    return {
        n: float(v)
        for n, v in re.findall(r'class="legend-row" data-name="([^"]*)" data-last="([^"]*)"', panel)
    }


def test_dashboard_draws_the_charts_panels_from_the_metrics_history() -> None:
    history, now = _history()
    html = history.fragment(None, ["clicks"], now=now)
    states = dict(re.findall(r'data-title="([^"]*)" data-state="(\w+)"', html))
    assert len(states) == len(load_dashboard()["panels"])
    assert set(states.values()) == {"data"}, states
    records = _panel(html, "Records in / s")
    assert _lasts(records) == {"c1": pytest.approx(100.0)}  # 100 per 1 s scrape
    assert "<polyline" in records and "100/s" in records
    assert _lasts(_panel(html, "Records out / s")) == {"c1": pytest.approx(50.0)}
    lag = _lasts(_panel(html, "Consumer lag per input partition"))
    assert lag == {"raw/0": 7, "raw/1": 3, "total c1": 10}
    commit = _lasts(_panel(html, "Epoch commit duration"))
    assert 0.01 < commit["p50"] <= 0.025 and commit["max c1"] == pytest.approx(0.02)
    assert _lasts(_panel(html, "Watermark lag")) == {"c1": pytest.approx(5.0, abs=0.01)}
    # Filtered by another app: the same panels, no series.
    other = history.fragment("regions", ["clicks", "regions"], now=now)
    assert 'data-state="data"' not in other
    assert 'href="/dashboard?app=regions" class="on"' in other


def test_panels_outside_the_subset_or_without_series_say_so() -> None:
    dashboard = {
        "panels": [
            {"id": 1, "type": "timeseries", "title": "restarts",
             "targets": [{"expr": "sum by (pod) (increase(kube_pod_container_status_restarts_total"
                                  "[$__rate_interval]))"}]},
            {"id": 2, "type": "timeseries", "title": "avg",
             "targets": [{"expr": "avg(lockgate_records_in_total)"}]},
            {"id": 3, "type": "stat", "title": "halted",
             "targets": [{"expr": "sum by (pod) (lockgate_key_groups_halted)",
                          "legendFormat": "{{pod}}"}]},
        ]
    }  # fmt: skip
    base, now = _history(5)
    history = MetricsHistory(dashboard, scrape_s=1.0)
    m = Metrics("clicks", "c1")
    for k in range(3):
        history.ingest([("c1", generate_latest(metrics_registry(m)).decode())], at=now - 3 + k)
    html = history.fragment(None, [], now=now)
    restarts = _panel(html, "restarts")
    assert 'data-state="empty"' in restarts
    assert "kube_pod_container_status_restarts_total is not a lockgate series" in restarts
    avg = _panel(html, "avg")
    assert 'data-state="unsupported"' in avg and "outside the console&#x27;s PromQL subset" in avg
    halted = _panel(html, "halted")
    assert 'data-state="data"' in halted and _lasts(halted) == {"c1": 0}
    assert "<svg" not in halted  # a stat panel is a table
    # Only the dashboard's series are kept.
    assert {"kube_pod_container_status_restarts_total", "lockgate_records_in_total",
            "lockgate_key_groups_halted"} <= history.names  # fmt: skip
    assert "lockgate_records_out_total" not in history.names
    assert base.store_stats()[1] > 0


def test_history_is_bounded() -> None:
    history, _ = _history(40, window_s=10.0)
    rounds, samples = history.store_stats()
    series = samples / 11  # (t - 10, t] and the sample at t - 10 itself
    assert rounds == 40 and series == int(series), samples


def test_dashboard_routes() -> None:
    history, _ = _history(5)

    class Snaps:
        def snapshot(self) -> dict[str, Any]:
            return {"apps": [{"name": "clicks"}]}

    server = ConsoleServer(
        Settings(bootstrap_servers="127.0.0.1:1"),
        Snaps(),
        object(),
        "127.0.0.1",
        0,
        history,  # type: ignore[arg-type]
    )
    try:
        code, ctype, body = server.get("/dashboard?app=clicks", "n1")
        assert code == 200 and ctype.startswith("text/html")
        text = body.decode()
        assert 'data-src="/partial/dashboard?app=clicks"' in text and 'nonce="n1"' in text
        assert "Records in / s" in text
        code, _, part = server.get("/partial/dashboard", "n2")
        assert code == 200 and b"<html" not in part and b"Records in / s" in part
    finally:
        server._server.server_close()


def test_format_value() -> None:
    assert format_value(0.0123, "s") == "12.3 ms"
    assert format_value(1500, "rps") == "1.50k/s"
    assert format_value(3, "short") == "3"
    assert format_value(math.nan, "s") == "NaN"


# -- the evaluator: histogram_quantile and alert for: ----------------------------------------


def _scrape(store: Store, at: float, text: str) -> None:
    store.ingest(text, at=at, pod="p0")


def test_histogram_quantile_interpolates_as_prometheus() -> None:
    s = Store()
    text = (
        "# TYPE h histogram\n"
        'h_bucket{le="0.1"} 5\nh_bucket{le="0.5"} 10\nh_bucket{le="+Inf"} 20\n'
        "h_count 20\nh_sum 3\n"
    )
    _scrape(s, 100, text)

    def q(phi: float) -> float:
        value = evaluate(f"histogram_quantile({phi}, sum by (le) (h_bucket))", s, at=100)
        assert isinstance(value, dict)
        return value[()]

    assert q(0.25) == pytest.approx(0.1)  # rank 5: the top of the first bucket
    assert q(0.125) == pytest.approx(0.05)  # rank 2.5: half of (0, 0.1]
    assert q(0.375) == pytest.approx(0.3)  # rank 7.5: half of (0.1, 0.5]
    assert q(0.9) == pytest.approx(0.5)  # in +Inf: the highest finite bound


def test_alert_for_is_pending_then_firing_and_starts_over() -> None:
    s = Store()
    ev = AlertEvaluator([AlertRule.from_rule({"alert": "Halted", "expr": "g > 0", "for": "30s"})])
    assert ev.rules[0].for_s == 30
    for t, v in [(100, 1), (120, 1), (130, 1), (140, 0), (150, 1)]:
        _scrape(s, t, f"# TYPE g gauge\ng {v}\n")
        ev.evaluate(s, at=t)
        if t == 100:
            assert [x.state for x in ev.states("Halted")] == ["pending"]
        if t == 120:
            assert [x.state for x in ev.states("Halted")] == ["pending"]  # 20 s < 30 s
        if t == 130:
            assert [(x.state, x.fired_at) for x in ev.states("Halted")] == [("firing", 130)]
        if t == 140:
            assert ev.states("Halted") == []
        if t == 150:
            assert [x.state for x in ev.states("Halted")] == ["pending"]  # the clock restarts
    assert [(t, what) for t, _, _, what in ev.transitions] == [
        (100, "pending"), (130, "firing"), (140, "resolved"), (150, "pending"),
    ]  # fmt: skip
    # for: 0 fires at once.
    now = AlertEvaluator([AlertRule("Now", "g > 0")])
    assert [x.state for x in now.evaluate(s, at=150)] == ["firing"]


# -- per-key-group watermarks ------------------------------------------------------------------


def _exposition(m: Metrics) -> str:
    return generate_latest(metrics_registry(m)).decode()


def test_each_key_groups_watermark_is_exported_from_the_gauges() -> None:
    marks = {0: (1_700_000_000_000, False), 2: (1_700_000_005_500, True), 3: (NO_WATERMARK, False)}

    class Svc:
        strategies = ["event-time"]

        def announce(self, cache: int) -> tuple[int, bool]:
            return marks[cache]

    kgs = {g: SimpleNamespace(caches={TIME_STORE: g}) for g in marks}
    m = Metrics("clicks", "c1")
    ProgressGauges(m, Svc(), lambda: None, {}, {}, kgs).watermark()  # type: ignore[arg-type]
    assert m.watermark_ms == 1_700_000_000_000  # the idle key group left out
    assert m.key_group_watermarks == {0: (1_700_000_000_000, False), 2: (1_700_000_005_500, True)}
    text = _exposition(m)
    assert (
        'lockgate_key_group_watermark_timestamp_seconds{app="clicks",key_group="0",'
        'lockgate_instance="c1"} 1.7e+09' in text
    )
    store = Store()
    store.ingest(text, at=time.time())
    per_group = evaluate("lockgate_key_group_watermark_timestamp_seconds", store)
    idle = evaluate("lockgate_key_group_idle", store)
    assert isinstance(per_group, dict) and isinstance(idle, dict)
    assert {dict(k)["key_group"]: v for k, v in per_group.items()} == {
        "0": 1_700_000_000.0, "2": 1_700_000_005.5,
    }  # fmt: skip
    assert {dict(k)["key_group"]: v for k, v in idle.items()} == {"0": 0, "2": 1}


def test_console_shows_each_key_groups_watermark() -> None:
    from processors._ops.console.instances import parse_metrics

    m = Metrics("clicks", "c1")
    m.key_group_watermarks = {0: (1_700_000_000_000, False), 1: (1_700_000_001_000, True)}
    m.watermark_ms = 1_700_000_000_000
    _, watermarks = parse_metrics(_exposition(m))
    snapshot = {
        "generated_ms": 1_700_000_010_000,
        "apps": [
            {
                "name": "clicks",
                "key_groups": 3,
                "key_group_rows": [
                    {"key_group": g, "instance": "c1", "checkpoint": 5} for g in range(3)
                ],
            }
        ],
        "instances": [{"id": "c1", "app": "clicks", "metrics": {}, "watermarks": watermarks}],
    }
    html = live_fragment(snapshot, [])
    cells = dict(re.findall(r'data-watermark-of="(\d)"[^>]*>(.*?)</td>', html))
    assert cells["0"].startswith("2023-11-14T22:13:20") and "(10.0 s behind)" in cells["0"]
    assert "(9.0 s behind)" in cells["1"] and ">idle<" in cells["1"]
    assert cells["2"] == "–"  # no watermark yet
    assert 'data-watermark-ms="1700000000000"' in html
    # The instance minimum stays in the watermarks table; per key group rows do not.
    table = re.search(r'<table class="watermarks">.*?</table>', html)
    assert table and "lockgate_watermark_timestamp_seconds" in table.group(0)
    assert "key_group" not in table.group(0)


def test_rate_interval_follows_rounds_kept_further_apart_than_asked() -> None:
    """A busy console keeps rounds further apart: rate() must still see two samples."""
    history = MetricsHistory(scrape_s=1.0)
    assert history.rate_interval_s == 4.0  # four scrape intervals before any gap is seen
    now = time.time()
    m = Metrics("clicks", "c1")
    reg = metrics_registry(m)
    for k, at in enumerate((now - 24, now - 16, now - 8, now)):
        m.records_in += 100
        history.ingest([("c1", generate_latest(reg).decode())], at=at)
        if k == 0:
            assert history.rate_interval_s == 4.0
    assert history.rate_interval_s == 20.0  # 2.5 x the 8 s gaps
    html = history.fragment(None, [], now=now)
    records_in = _panel(html, "Records in / s")
    assert 'data-state="data"' in records_in, records_in[:500]
