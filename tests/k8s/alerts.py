"""The chart's alerts evaluated over the pods' own /metrics on the cluster.

There is no Prometheus in the tier: :func:`chart_rules` renders the release's PrometheusRule
(``helm template`` with the release's own values plus ``metrics.prometheusRule.enabled``; the
cluster has no Prometheus-operator CRDs), and :class:`PodScraper` scrapes every pod of the
release every 0.5 s into a :class:`tests.support.promql.Store` with the ``pod`` and
``namespace`` target labels the Prometheus operator adds. The expressions are evaluated by
tests/support/promql.py (``for:`` durations are not waited for: the expression itself is
asserted, as in tests/integration/test_alerts_live.py).
"""

from __future__ import annotations

import threading
import time
from typing import Any

import yaml

from tests.k8s.pipeline import Pipeline
from tests.support.promql import Store, evaluate, metric_names

#: Series from outside lockgate (kube-state-metrics): not on the pods' /metrics.
EXTERNAL = {"kube_pod_container_status_restarts_total"}


def chart_rules(p: Pipeline, install: list[str], *overrides: str) -> dict[str, str]:
    """The rendered alerts of the release (name -> expression), lockgate's own series only.

    Args:
        p: the release.
        install: the release's ``helm install`` arguments (release, chart, values).
        overrides: more ``--set`` arguments (thresholds for the test).
    """
    out = p.cluster.helm(
        "template", *install, "--set", "metrics.prometheusRule.enabled=true", *overrides
    )
    [rule] = [d for d in yaml.safe_load_all(out) if d and d.get("kind") == "PrometheusRule"]
    [group] = rule["spec"]["groups"]
    rules = {r["alert"]: r["expr"] for r in group["rules"]}
    return {n: e for n, e in rules.items() if not (metric_names(e) & EXTERNAL)}


class PodScraper(threading.Thread):
    """Scrapes every pod of a release every 0.5 s (``with PodScraper(p) as s: ...``)."""

    def __init__(self, p: Pipeline) -> None:
        super().__init__(daemon=True)
        self.p = p
        self.store = Store()
        self.lock = threading.Lock()
        self.halt = threading.Event()
        self.scrapes: dict[str, int] = {}

    def run(self) -> None:
        while not self.halt.is_set():
            try:
                pods = self.p.pods()
            except (RuntimeError, OSError, ValueError):
                pods = {}
            for name, pod in pods.items():
                code, text = self.p.http(pod, "/metrics")
                if code == 200:
                    with self.lock:
                        self.store.ingest(text, pod=name, namespace=self.p.ns)
                        self.scrapes[name] = self.scrapes.get(name, 0) + 1
            self.halt.wait(0.5)

    def __enter__(self) -> PodScraper:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.halt.set()
        self.join(30)

    def value(self, expr: str) -> dict[Any, float]:
        """The expression's value now: an instant vector (empty: the alert does not fire)."""
        with self.lock:
            value = evaluate(expr, self.store)
        assert isinstance(value, dict), expr
        return value

    def firing(self, rules: dict[str, str]) -> set[str]:
        """The alerts whose expression is non-empty now."""
        return {name for name, expr in rules.items() if self.value(expr)}

    def wait_scrapes(self, pods: int, n: int = 3, timeout: float = 60) -> None:
        """Wait until ``n`` more scrapes of each of ``pods`` pods were taken."""
        with self.lock:
            start = dict(self.scrapes)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with self.lock:
                done = [k for k, v in self.scrapes.items() if v - start.get(k, 0) >= n]
            if len(done) >= pods:
                return
            time.sleep(0.2)
        raise AssertionError(f"fewer than {n} scrapes of {pods} pods in {timeout}s: {self.scrapes}")

    def wait_firing(self, rules: dict[str, str], want: set[str], timeout: float = 90) -> set[str]:
        """Wait until every alert of ``want`` fires; return all that fire then."""
        deadline = time.monotonic() + timeout
        fired: set[str] = set()
        while time.monotonic() < deadline:
            fired = self.firing(rules)
            if want <= fired:
                return fired
            time.sleep(0.5)
        raise AssertionError(f"{sorted(want - fired)} did not fire in {timeout}s (fired: {fired})")
