"""The Grafana dashboard ConfigMap and the alert rules render with the chart; the PromQL
evaluator the live alert tests use (tests/support/promql.py) computes what Prometheus would."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.support.helm import CHART_DIR, manifests, one_manifest, render
from tests.support.promql import (
    AlertEvaluator,
    AlertRule,
    Store,
    Unsupported,
    evaluate,
    metric_names,
)

MINIMAL = Path(__file__).resolve().parent / "values" / "minimal.yaml"
ON = {"metrics.prometheusRule.enabled": True, "metrics.dashboard.enabled": True}
NEW_ALERTS = {"LockgateNoCheckpoint", "LockgateWatermarkLag", "LockgateCrashLooping"}


def _alerts(docs: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    [group] = one_manifest(docs, "PrometheusRule")["spec"]["groups"]
    return {r["alert"]: r for r in group["rules"]}


def dashboard_queries(dashboard: dict[str, Any]) -> list[str]:
    """Every PromQL query of a dashboard: panel targets and query variables."""
    queries = [t["expr"] for p in dashboard["panels"] for t in p.get("targets", [])]
    for var in dashboard["templating"]["list"]:
        if var["type"] == "query":
            queries.append(var["query"]["query"])
    return queries


def test_dashboard_configmap_renders_only_when_enabled() -> None:
    assert not manifests(render(values_files=[MINIMAL]), "ConfigMap")
    docs = render(
        values_files=[MINIMAL],
        set_values={
            "metrics.dashboard.enabled": True,
            "metrics.dashboard.annotations.grafana_folder": "streams",
        },
    )
    cm = one_manifest(docs, "ConfigMap")
    assert cm["metadata"]["name"] == "sums-lockgate-dashboard"
    assert cm["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert cm["metadata"]["annotations"] == {"grafana_folder": "streams"}
    dashboard = json.loads(cm["data"]["lockgate.json"])  # valid JSON
    assert dashboard == json.loads((CHART_DIR / "dashboards" / "lockgate.json").read_text())
    titles = {p["title"] for p in dashboard["panels"]}
    assert {"Records in / s", "Records out / s", "Dead letters / s", "Halted key groups",
            "Watermark lag", "Epoch commit duration", "Barrier alignment time",
            "Key group restores"} <= titles  # fmt: skip
    assert all(p["targets"] and all(t["expr"] for t in p["targets"]) for p in dashboard["panels"])
    ids = [p["id"] for p in dashboard["panels"]]
    assert len(ids) == len(set(ids))


def test_dashboard_label_is_configurable() -> None:
    docs = render(
        values_files=[MINIMAL],
        set_values={
            "metrics.dashboard.enabled": True,
            "metrics.dashboard.labels": {"team-dashboards": "yes"},
            "metrics.dashboard.namespace": "monitoring",
        },
    )
    cm = one_manifest(docs, "ConfigMap")
    assert cm["metadata"]["namespace"] == "monitoring"
    assert cm["metadata"]["labels"]["team-dashboards"] == "yes"


def test_prometheus_rule_has_the_new_alerts() -> None:
    alerts = _alerts(render(values_files=[MINIMAL], set_values=ON))
    assert NEW_ALERTS | {"LockgateKeyGroupsHalted", "LockgateDeadLetters"} <= set(alerts)
    no_ckpt = alerts["LockgateNoCheckpoint"]
    # 60 intervals of the minimal values' checkpoint interval, in seconds.
    assert no_ckpt["expr"] == (
        '(time() - max by (app, pod) (lockgate_last_checkpoint_timestamp_seconds{app="sums"})'
        ' > 60) unless on (app, pod) (max by (app, pod) (lockgate_key_groups_restoring{app="sums"})'
        " > 0)"
    )
    assert no_ckpt["for"] == "5m"
    wm = alerts["LockgateWatermarkLag"]
    assert wm["expr"] == (
        'time() - min by (app, pod) (lockgate_watermark_timestamp_seconds{app="sums"}) > 900'
    )
    assert wm["for"] == "10m"
    crash = alerts["LockgateCrashLooping"]["expr"]
    assert crash == (
        "sum by (namespace, pod) (increase(kube_pod_container_status_restarts_total"
        '{namespace="default", pod=~"sums-lockgate-[0-9]+", container="processor"}[15m])) > 3'
    )
    # The pod name pattern matches the StatefulSet's pods.
    sts = one_manifest(render(values_files=[MINIMAL]), "StatefulSet")
    assert sts["metadata"]["name"] == "sums-lockgate"
    assert sts["spec"]["template"]["spec"]["containers"][0]["name"] == "processor"


def test_alert_thresholds_come_from_values() -> None:
    alerts = _alerts(
        render(
            values_files=[MINIMAL],
            set_values={
                **ON,
                "metrics.prometheusRule.noCheckpointIntervals": 7,
                "processing.checkpointIntervalMs": 1500,
                "metrics.prometheusRule.watermarkLagSeconds": 30,
                "metrics.prometheusRule.watermarkLagFor": "1m",
                "metrics.prometheusRule.crashRestartsPer15m": 1,
                "metrics.prometheusRule.noCheckpointFor": "2m",
            },
        )
    )
    assert "> 11)" in alerts["LockgateNoCheckpoint"]["expr"]  # ceil(7 * 1.5)
    assert alerts["LockgateNoCheckpoint"]["for"] == "2m"
    assert alerts["LockgateWatermarkLag"]["expr"].endswith("> 30")
    assert alerts["LockgateWatermarkLag"]["for"] == "1m"
    assert alerts["LockgateCrashLooping"]["expr"].endswith("> 1")


def test_every_alert_has_a_runbook_section() -> None:
    runbooks = (CHART_DIR.parents[2] / "docs" / "runbooks.md").read_text()
    for name in _alerts(render(values_files=[MINIMAL], set_values=ON)):
        heading = next(
            (
                line
                for line in runbooks.splitlines()
                if line.startswith("## ") and f"`{name}`" in line
            ),
            None,
        )
        assert heading is not None, f"{name}: no runbook section"
        assert f"| {name} | [" in runbooks, f"{name}: not in the runbooks' alert index"


def test_every_alert_expression_is_understood_by_the_evaluator() -> None:
    store = Store()
    for name, rule in _alerts(render(values_files=[MINIMAL], set_values=ON)).items():
        assert evaluate(rule["expr"], store) == {}, name  # no data: nothing fires


# --- the evaluator itself (synthetic scrapes) -------------------------------------------------


def _scrape(store: Store, at: float, **values: float) -> None:
    text = "".join(
        f'# TYPE {n} gauge\n{n}{{app="a",lockgate_instance="i1"}} {v}\n' for n, v in values.items()
    )
    store.ingest(text, at=at, pod="p0")


def test_evaluator_increase_rate_and_counter_resets() -> None:
    s = Store()
    for t, v in [(100, 1), (130, 4), (160, 2), (190, 5)]:  # a reset at 160
        _scrape(s, t, lockgate_dlq_records_total=v)
    inc = evaluate('sum by (app) (increase(lockgate_dlq_records_total{app="a"}[10m]))', s, at=190)
    # Sampled: 3 + 2 + 3 = 8 over 90 s. Prometheus extrapolates towards the window's start
    # by half an interval (15 s) at most, and not past where the counter was zero:
    # 90 * 1/8 = 11.25 s. 8 * (90 + 11.25) / 90 = 9.
    assert inc == {(("app", "a"),): pytest.approx(9.0)}
    rate = evaluate("rate(lockgate_dlq_records_total[1m])", s, at=190)
    # (130, 190]: the samples at 160 (2) and 190 (5): 3 over 30 s, extrapolated 20 s back
    # (to zero: 30 * 2/3; less than 1.1 intervals), 0 forward: 3 * 50/30 over 60 s.
    assert list(rate.values()) == [pytest.approx(5 / 60)]  # type: ignore[union-attr]
    # One sample in the window: no result.
    assert evaluate("increase(lockgate_dlq_records_total[20s])", s, at=190) == {}
    assert evaluate('increase(lockgate_dlq_records_total{app="b"}[10m]) > 0', s, at=190) == {}


def test_evaluator_comparisons_time_and_set_operators() -> None:
    s = Store()
    _scrape(
        s, 1000, lockgate_last_checkpoint_timestamp_seconds=900, lockgate_key_groups_restoring=0
    )
    expr = (
        '(time() - max by (app, pod) (lockgate_last_checkpoint_timestamp_seconds{app="a"}) > 60)'
        ' unless on (app, pod) (max by (app, pod) (lockgate_key_groups_restoring{app="a"}) > 0)'
    )
    assert evaluate(expr, s, at=1000) == {(("app", "a"), ("pod", "p0")): 100}
    assert evaluate(expr, s, at=950) == {}
    _scrape(
        s, 1001, lockgate_last_checkpoint_timestamp_seconds=900, lockgate_key_groups_restoring=2
    )
    assert evaluate(expr, s, at=1001) == {}  # restoring: left out
    assert evaluate(
        "lockgate_key_groups_restoring > 1 and on (pod) lockgate_key_groups_restoring", s, at=1001
    )
    # Stale series (older than the 5 minute lookback) are gone.
    assert evaluate("lockgate_key_groups_restoring", s, at=1400) == {}


@pytest.mark.parametrize(
    "expr",
    ["a or b", "sum(a)", "a offset 5m", "a > bool 1", "avg by (x) (a)", "abs(a)", "a[5m]"],
)
def test_evaluator_refuses_what_it_does_not_implement(expr: str) -> None:
    with pytest.raises(Unsupported):
        evaluate(expr, Store())


def test_metric_names_of_queries() -> None:
    assert metric_names(
        'histogram_quantile(0.99, sum by (le) (rate(lockgate_alignment_seconds_bucket{app=~"$app"}'
        "[$__rate_interval]))) - time() + max by (pod) (lockgate_joined)"
    ) == {"lockgate_alignment_seconds_bucket", "lockgate_joined"}
    assert metric_names('label_values(lockgate_key_groups_assigned{app=~"$app"}, pod)') == {
        "lockgate_key_groups_assigned"
    }


def _pod(ns: str, name: str, restarts: int, container: str = "processor") -> dict[str, Any]:
    return {
        "metadata": {"namespace": ns, "name": name, "uid": f"uid-{name}"},
        "status": {"containerStatuses": [{"name": container, "restartCount": restarts}]},
    }


def test_crash_looping_fires_on_the_restart_series_the_k8s_tier_builds() -> None:
    """The rendered rule over tests/k8s/alerts.py's kube-state-metrics-like series.

    Sampled every second: it fires once the release's processor restarted more than
    ``crashRestartsPer15m`` times (here 1), not at the first restart, and never for
    another release's pods or another container in the namespace.
    """
    from tests.k8s.alerts import restarts_exposition

    docs = render(
        values_files=[MINIMAL],
        set_values={**ON, "metrics.prometheusRule.crashRestartsPer15m": 1},
        namespace="lgk8s",
    )
    rule = _alerts(docs)["LockgateCrashLooping"]
    evaluator = AlertEvaluator([AlertRule.from_rule(rule)])
    store = Store()
    t0 = 1_800_000_000.0
    timeline = [(0, 0), (10, 1), (30, 1), (31, 2), (40, 2)]  # (second, restarts)
    fired_at = None
    for second in range(41):
        restarts = max(r for s, r in timeline if s <= second)
        pods = [
            _pod("lgk8s", "sums-lockgate-0", restarts),
            _pod("lgk8s", "other-lockgate-0", 9 * second),  # another release
            _pod("lgk8s", "kafka-0", 9 * second, container="kafka"),
        ]
        store.ingest(restarts_exposition(pods), at=t0 + second)
        firing = [s for s in evaluator.evaluate(store, t0 + second) if s.state == "firing"]
        if firing and fired_at is None:
            fired_at = second
            assert dict(firing[0].labels) == {"namespace": "lgk8s", "pod": "sums-lockgate-0"}
    assert fired_at == 31, evaluator.transitions
