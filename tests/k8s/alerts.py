"""The chart's alerts evaluated over the pods' own /metrics on the cluster.

There is no Prometheus in the tier: :func:`chart_rules` renders the release's PrometheusRule
(``helm template`` with the release's own values plus ``metrics.prometheusRule.enabled``; the
cluster has no Prometheus-operator CRDs), and :class:`PodScraper` scrapes every pod of the
release every 0.5 s into a :class:`tests.support.promql.Store` with the ``pod`` and
``namespace`` target labels the Prometheus operator adds. The expressions are evaluated by
tests/support/promql.py (``for:`` durations are not waited for: the expression itself is
asserted, as in tests/integration/test_alerts_live.py).

``LockgateCrashLooping`` reads kube-state-metrics' ``kube_pod_container_status_restarts_total``,
and kube-state-metrics is not on this cluster (no image for it): :class:`RestartSampler` builds
that series itself from the Kubernetes API, every second, the way kube-state-metrics exports it
(each container's ``status.containerStatuses[].restartCount``, labelled ``namespace``, ``pod``,
``uid`` and ``container``), and :func:`chart_rule` gives the rendered rule (with its ``for:``)
for :class:`tests.support.promql.AlertEvaluator`.
"""

from __future__ import annotations

import threading
import time
from typing import Any

import yaml

from tests.k8s.pipeline import Pipeline
from tests.support.promql import AlertEvaluator, AlertRule, Store, evaluate, metric_names

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


def chart_rule(p: Pipeline, install: list[str], alert: str, *overrides: str) -> dict[str, Any]:
    """One rendered rule of the release's PrometheusRule (``alert``, ``expr``, ``for``, ...).

    Args:
        p: a release of the cluster (its ``helm``).
        install: the release's ``helm install`` arguments (release, chart, namespace, values).
        alert: the rule's name.
        overrides: more ``--set`` arguments (thresholds for the test).
    """
    out = p.cluster.helm(
        "template", *install, "--set", "metrics.prometheusRule.enabled=true", *overrides
    )
    [rule] = [d for d in yaml.safe_load_all(out) if d and d.get("kind") == "PrometheusRule"]
    [group] = rule["spec"]["groups"]
    [found] = [r for r in group["rules"] if r["alert"] == alert]
    return dict(found)


#: kube-state-metrics' restart counter, built from the API by :class:`RestartSampler`.
RESTARTS = "kube_pod_container_status_restarts_total"


def restarts_exposition(pods: list[dict[str, Any]]) -> str:
    """``kube_pod_container_status_restarts_total`` of ``pods`` in the Prometheus text format.

    One sample per container of each pod (its ``restartCount``), labelled as
    kube-state-metrics labels it: ``namespace``, ``pod``, ``uid``, ``container``.
    """
    lines = [f"# TYPE {RESTARTS} counter"]
    for pod in pods:
        meta = pod["metadata"]
        for cs in pod.get("status", {}).get("containerStatuses") or []:
            labels = (
                f'namespace="{meta["namespace"]}",pod="{meta["name"]}",'
                f'uid="{meta["uid"]}",container="{cs["name"]}"'
            )
            lines.append(f"{RESTARTS}{{{labels}}} {int(cs.get('restartCount', 0))}")
    return "\n".join(lines) + "\n"


class RestartSampler(threading.Thread):
    """Samples every pod's container restarts in a namespace every second from the API.

    Each sample goes into :attr:`store` as kube-state-metrics' series (kube-state-metrics is
    not on this cluster), and after each sample every evaluator of :attr:`evaluators`
    (a name of the caller's choice, e.g. the release -> an :class:`AlertEvaluator` of one
    rule) is evaluated, so that their ``for:`` states and
    transitions are those a Prometheus scraping kube-state-metrics every second would have.
    ``with RestartSampler(p, {"sums": rule}) as s: ...`` (``p``: any release of the namespace).
    """

    def __init__(self, p: Pipeline, rules: dict[str, dict[str, Any]]) -> None:
        super().__init__(daemon=True)
        self.p = p
        self.store = Store(only={RESTARTS})
        self.evaluators = {
            name: AlertEvaluator([AlertRule.from_rule(rule)]) for name, rule in rules.items()
        }
        self.lock = threading.Lock()
        self.halt = threading.Event()
        self.samples = 0
        self.errors: list[str] = []

    def run(self) -> None:
        while not self.halt.is_set():
            try:
                pods = self.p.cluster.get(self.p.ns, "pods")["items"]
            except (RuntimeError, OSError, ValueError) as e:
                self.errors.append(str(e))
                pods = None
            if pods is not None:
                with self.lock:
                    now = time.time()
                    self.store.ingest(restarts_exposition(pods), at=now)
                    for evaluator in self.evaluators.values():
                        evaluator.evaluate(self.store, now)
                    self.samples += 1
            self.halt.wait(1.0)

    def __enter__(self) -> RestartSampler:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.halt.set()
        self.join(30)

    def transitions(self, name: str) -> list[tuple[float, str, Any, str]]:
        """Every state change of the evaluator ``name`` so far."""
        with self.lock:
            return list(self.evaluators[name].transitions)

    def firing(self, name: str) -> list[Any]:
        """The firing series of the evaluator ``name``'s rule as of the last sample."""
        with self.lock:
            evaluator = self.evaluators[name]
            states = evaluator.states(evaluator.rules[0].name)
            return [s for s in states if s.state == "firing"]

    def wait_firing(self, name: str, timeout: float) -> list[Any]:
        """Wait until the evaluator ``name``'s rule fires; return its firing series."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            fired = self.firing(name)
            if fired:
                return fired
            time.sleep(0.5)
        raise AssertionError(
            f"{name} did not fire in {timeout}s ({self.samples} samples; transitions "
            f"{self.transitions(name)}; API errors {self.errors[-3:]})"
        )


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
