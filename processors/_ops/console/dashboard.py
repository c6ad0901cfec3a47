"""The chart's Grafana dashboard, drawn by the console itself (no Grafana needed).

The console keeps a bounded history of the instances' ``/metrics``
(:class:`MetricsHistory`: one scrape every ``scrape_s``, the last ``window_s`` seconds,
only the series the dashboard's queries name), evaluates each panel's PromQL with the
subset evaluator (:mod:`processors._ops.console.promql`) over that history and renders
each panel as a server-rendered SVG line chart (``timeseries`` panels) or a table of the
current values (``stat``, ``gauge``, ``bargauge`` and ``table`` panels).

The dashboard is the chart's own JSON (``deploy/helm/lockgate/dashboards/lockgate.json``,
shipped in this package as ``dashboard.json``; a unit test keeps both identical) or one
given with ``lockgate console --dashboard FILE``. Grafana's variables are replaced as with
*All* selected: ``$app`` and ``$pod`` by ``.*`` (``$app`` by the chosen app when the page
is filtered by one), ``$__rate_interval`` by four scrape intervals (Grafana's lower bound
for it). Each instance's series get a ``pod`` label with the instance id, as the
Prometheus operator adds the pod name (on Kubernetes the instance id is the pod name).

A panel whose query is outside the subset, or whose series no instance exports (e.g.
kube-state-metrics' series), says so instead of showing an empty chart.
"""

from __future__ import annotations

import html
import json
import math
import re
import threading
import time
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from processors._ops.console.promql import (
    Labels,
    Query,
    Store,
    Unsupported,
    compile_query,
    metric_names,
)
from state.savepoint import ms_to_iso

__all__ = [
    "DASHBOARD_FILE",
    "MetricsHistory",
    "Panel",
    "Target",
    "dashboard_fragment",
    "load_dashboard",
    "panels_of",
]

#: The chart's dashboard JSON, as shipped in the package.
DASHBOARD_FILE = Path(__file__).with_name("dashboard.json")
#: Points drawn per chart at most (the evaluation step follows from it).
MAX_POINTS = 120
#: Panel types drawn as a table of current values.
TABLE_TYPES = frozenset({"stat", "gauge", "bargauge", "table"})
_COLORS = (
    "#2f6fde", "#e8743b", "#19a979", "#ed4a7b", "#945ecf", "#13a4b4", "#525df4",
    "#bf399e", "#6c8893", "#ee6868",
)  # fmt: skip


def load_dashboard(path: Path | None = None) -> dict[str, Any]:
    """Return a dashboard's JSON (the packaged chart dashboard by default).

    Raises:
        OSError: the file cannot be read.
        ValueError: it is not a dashboard (JSON with a ``panels`` list).
    """
    data = json.loads((path or DASHBOARD_FILE).read_text(encoding="utf-8"))
    if not isinstance(data, dict) or not isinstance(data.get("panels"), list):
        raise ValueError(f"{path or DASHBOARD_FILE}: not a Grafana dashboard (no panels list)")
    return data


@dataclass(frozen=True)
class Target:
    """One query of a panel.

    Attributes:
        expr: the query with the dashboard's variables replaced.
        legend: Grafana's ``legendFormat`` (``{{label}}`` placeholders).
        query: the compiled query, or ``None`` when it is outside the subset.
        error: why it cannot be evaluated (``None`` when it can).
    """

    expr: str
    legend: str
    query: Query | None
    error: str | None


@dataclass(frozen=True)
class Panel:
    """One panel of the dashboard.

    Attributes:
        id: the panel's id.
        title: its title.
        type: Grafana's panel type (``timeseries``, ``stat``, ...).
        unit: Grafana's unit of its values (``rps``, ``s``, ``short``, ...).
        targets: its queries.
    """

    id: int
    title: str
    type: str
    unit: str
    targets: tuple[Target, ...]


def _substitute(expr: str, variables: Mapping[str, str], rate_interval: str) -> str:
    expr = expr.replace("$__rate_interval", rate_interval).replace("${__rate_interval}", "")
    expr = expr.replace("$__interval", rate_interval)

    def var(m: re.Match[str]) -> str:
        name = m.group(1) or m.group(2)
        return variables.get(name, ".*")

    return re.sub(r"\$\{(\w+)\}|\$(\w+)", var, expr)


def panels_of(
    dashboard: Mapping[str, Any], variables: Mapping[str, str], rate_interval_s: float
) -> list[Panel]:
    """Return the dashboard's panels with their queries compiled.

    Args:
        dashboard: the dashboard JSON.
        variables: template variable -> value (a regex; missing ones are ``.*``).
        rate_interval_s: what ``$__rate_interval`` stands for.
    """
    rate_interval = f"{max(1, math.ceil(rate_interval_s))}s"
    out: list[Panel] = []
    for i, p in enumerate(dashboard.get("panels") or ()):
        if not isinstance(p, dict) or p.get("type") == "row":
            continue
        targets: list[Target] = []
        for t in p.get("targets") or ():
            raw = str(t.get("expr") or "")
            expr = _substitute(raw, variables, rate_interval)
            try:
                query: Query | None = compile_query(expr)
                error = None
            except Unsupported as exc:
                query, error = None, f"outside the console's PromQL subset ({exc})"
            targets.append(Target(expr, str(t.get("legendFormat") or ""), query, error))
        unit = str(((p.get("fieldConfig") or {}).get("defaults") or {}).get("unit") or "short")
        out.append(
            Panel(
                int(p.get("id", i)),
                str(p.get("title", "")),
                str(p.get("type")),
                unit,
                tuple(targets),
            )
        )
    return out


class MetricsHistory:
    """A bounded history of the instances' ``/metrics`` for the dashboard (thread-safe).

    Args:
        dashboard: the dashboard whose queries decide which series are kept.
        scrape_s: seconds between two scrapes kept (the console probes more often; the
            others are not kept).
        window_s: how much history is kept (and drawn).
    """

    def __init__(
        self,
        dashboard: Mapping[str, Any] | None = None,
        scrape_s: float = 5.0,
        window_s: float = 900.0,
    ) -> None:
        self.dashboard = dict(dashboard) if dashboard is not None else load_dashboard()
        self.scrape_s = scrape_s
        self.window_s = window_s
        names: set[str] = set()
        for p in self.dashboard.get("panels") or ():
            for t in (p.get("targets") or ()) if isinstance(p, dict) else ():
                names |= metric_names(str(t.get("expr") or ""))
        self.names = frozenset(names)
        self._store = Store(retention_s=window_s, only=self.names)
        self._lock = threading.Lock()
        self._next_at = 0.0
        #: Seconds between the last rounds kept (a busy console keeps them further apart
        #: than ``scrape_s``: ``$__rate_interval`` follows, see :attr:`rate_interval_s`).
        self._gaps: deque[float] = deque(maxlen=5)
        self._last_at: float | None = None
        #: Scrape rounds kept so far.
        self.rounds = 0
        self._panels: dict[str, list[Panel]] = {}
        self._cache: dict[str, tuple[int, str]] = {}

    def due(self, now: float | None = None) -> bool:
        """Whether the next scrape should be kept (``now``: Unix seconds)."""
        return (time.time() if now is None else now) >= self._next_at

    def ingest(self, scrapes: Sequence[tuple[str, str]], at: float | None = None) -> None:
        """Keep one round of scrapes: (instance id, ``/metrics`` text) each.

        Each instance's series get the label ``pod`` = its instance id. A text that is
        not Prometheus' format is skipped.
        """
        now = time.time() if at is None else at
        with self._lock:
            for instance, text in scrapes:
                try:
                    self._store.ingest(text, at=now, pod=instance)
                except ValueError:
                    continue
            self.rounds += 1
            if self._last_at is not None and now > self._last_at:
                self._gaps.append(now - self._last_at)
            self._last_at = now
            self._next_at = now + self.scrape_s * 0.9

    @property
    def rate_interval_s(self) -> float:
        """What ``$__rate_interval`` stands for, in whole seconds.

        Four scrape intervals (Grafana's lower bound), or 2.5 times the longest of the
        last gaps between rounds when the console kept them further apart (under load):
        a ``rate()`` then still finds two samples in its window.
        """
        observed = 2.5 * max(self._gaps, default=0.0)
        return float(math.ceil(max(4 * self.scrape_s, observed)))

    def panels(self, app: str | None) -> list[Panel]:
        """The compiled panels, ``$app`` set to ``app`` (all apps when ``None``)."""
        rate_interval_s = self.rate_interval_s
        key = f"{app or ''}\x00{rate_interval_s:g}"
        found = self._panels.get(key)
        if found is None:
            variables = {"app": re.escape(app)} if app else {}
            found = self._panels[key] = panels_of(self.dashboard, variables, rate_interval_s)
        return found

    def fragment(self, app: str | None, apps: Sequence[str], now: float | None = None) -> str:
        """The dashboard's HTML for ``app`` (cached until the next scrape kept)."""
        with self._lock:
            key = f"{app or ''}\x00{','.join(apps)}"
            version = self.rounds
            cached = self._cache.get(key)
            if cached is not None and cached[0] == version and now is None:
                return cached[1]
            out = dashboard_fragment(
                self.panels(app), self._store, app, apps, self, time.time() if now is None else now
            )
            self._cache = {key: (version, out)}
            return out

    def store_stats(self) -> tuple[int, int]:
        """(scrape rounds, samples held)."""
        with self._lock:
            return self.rounds, self._store.samples()


# -- rendering ---------------------------------------------------------------------------


def _e(value: Any) -> str:
    return html.escape(str(value), quote=True)


def format_value(value: float, unit: str) -> str:
    """Format ``value`` in Grafana's ``unit`` (``rps``, ``ops``, ``s``, ``short``, ...)."""
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "∞" if value > 0 else "-∞"
    if unit == "s":
        a = abs(value)
        if a == 0:
            return "0 s"
        if a < 1e-3:
            return f"{value * 1e6:.0f} µs"
        if a < 1:
            return f"{value * 1e3:.1f} ms"
        if a < 120:
            return f"{value:.2f} s"
        if a < 7200:
            return f"{value / 60:.1f} min"
        return f"{value / 3600:.1f} h"
    suffix = "/s" if unit in ("rps", "ops", "reqps", "wps", "cps") else ""
    a = abs(value)
    for div, mark in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if a >= div:
            return f"{value / div:.2f}{mark}{suffix}"
    text = f"{value:.0f}" if value == int(value) and a < 1e15 else f"{value:.3g}"
    return f"{text}{suffix}"


def _legend(fmt: str, labels: Labels, expr: str) -> str:
    have = dict(labels)
    if not fmt:
        return ", ".join(f"{k}={v}" for k, v in labels) or expr

    def sub(m: re.Match[str]) -> str:
        return have.get(m.group(1), "")

    return re.sub(r"\{\{\s*(\w+)\s*\}\}", sub, fmt)


def _nice_max(value: float) -> float:
    if value <= 0:
        return 1.0
    exp = 10.0 ** math.floor(math.log10(value))
    for m in (1, 2, 2.5, 5, 10):
        if value <= m * exp:
            return m * exp
    return 10 * exp


def _clock(at: float) -> str:
    return time.strftime("%H:%M:%S", time.localtime(at))


def _chart(
    series: Sequence[tuple[str, list[tuple[float, float]]]],
    start: float,
    end: float,
    unit: str,
    panel_id: int,
) -> str:
    width, height, left, right, top, bottom = 560, 170, 64, 8, 8, 20
    plot_w, plot_h = width - left - right, height - top - bottom
    values = [v for _, pts in series for _, v in pts if math.isfinite(v)]
    lo = min(0.0, min(values, default=0.0))
    hi = _nice_max(max(values, default=1.0))
    if hi <= lo:
        hi = lo + 1.0
    span = max(end - start, 1e-9)

    def xy(t: float, v: float) -> str:
        x = left + (t - start) / span * plot_w
        y = top + (1 - (v - lo) / (hi - lo)) * plot_h
        return f"{x:.1f},{y:.1f}"

    parts = [
        f'<svg class="chart" data-panel="{panel_id}" width="{width}" height="{height}" '
        f'viewBox="0 0 {width} {height}" role="img">',
        f'<rect x="{left}" y="{top}" width="{plot_w}" height="{plot_h}" fill="#fbfcfd" '
        'stroke="#d8dce3"/>',
    ]
    for frac in (0.0, 0.5, 1.0):
        y = top + (1 - frac) * plot_h
        parts.append(
            f'<line x1="{left}" y1="{y:.1f}" x2="{left + plot_w}" y2="{y:.1f}" '
            'stroke="#e3e6eb"/>'
            f'<text x="{left - 4}" y="{y + 4:.1f}" text-anchor="end" fill="#6b7280">'
            f"{_e(format_value(lo + frac * (hi - lo), unit))}</text>"
        )
    parts.append(
        f'<text x="{left}" y="{height - 4}" fill="#6b7280">{_e(_clock(start))}</text>'
        f'<text x="{left + plot_w}" y="{height - 4}" text-anchor="end" fill="#6b7280">'
        f"{_e(_clock(end))}</text>"
    )
    for i, (name, pts) in enumerate(series):
        color = _COLORS[i % len(_COLORS)]
        finite = [(t, v) for t, v in pts if math.isfinite(v)]
        if len(finite) == 1:
            cx, cy = xy(*finite[0]).split(",")
            parts.append(
                f'<circle class="series" data-name="{_e(name)}" cx="{cx}" cy="{cy}" r="2.5" '
                f'fill="{color}"/>'
            )
        elif finite:
            points = " ".join(xy(t, v) for t, v in finite)
            parts.append(
                f'<polyline class="series" data-name="{_e(name)}" points="{points}" '
                f'fill="none" stroke="{color}" stroke-width="1.6"/>'
            )
    parts.append("</svg>")
    return "".join(parts)


def _legend_table(series: Sequence[tuple[str, list[tuple[float, float]]]], unit: str) -> str:
    rows = []
    for i, (name, pts) in enumerate(series):
        color = _COLORS[i % len(_COLORS)]
        last = pts[-1][1] if pts else math.nan
        finite = [v for _, v in pts if math.isfinite(v)]
        rows.append(
            f'<tr class="legend-row" data-name="{_e(name)}" data-last="{last!r}">'
            f'<td><span class="swatch" style="background:{color}"></span>{_e(name)}</td>'
            f'<td class="num last">{_e(format_value(last, unit))}</td>'
            f'<td class="num">{_e(format_value(max(finite), unit) if finite else "–")}</td></tr>'
        )
    return (
        '<table class="legend"><thead><tr><th>series</th><th>last</th><th>max</th></tr></thead>'
        f"<tbody>{''.join(rows)}</tbody></table>"
    )


def _panel_html(panel: Panel, store: Store, start: float, end: float, step: float) -> str:
    notes: list[str] = []
    series: list[tuple[str, list[tuple[float, float]]]] = []
    unsupported = 0
    for target in panel.targets:
        if target.query is None:
            unsupported += 1
            notes.append(
                f'<p class="panel-note unsupported">cannot be drawn here: {_e(target.expr)} '
                f"is {_e(target.error)}</p>"
            )
            continue
        missing = sorted(n for n in target.query.names if n not in store.names())
        try:
            result = target.query.range(store, start, end, step)
        except Unsupported as exc:
            unsupported += 1
            notes.append(f'<p class="panel-note unsupported">cannot be drawn here: {_e(exc)}</p>')
            continue
        if not result:
            outside = [n for n in missing if not n.startswith("lockgate_")]
            if outside:
                why = (
                    f"{', '.join(outside)} is not a lockgate series: it comes from outside "
                    "(e.g. kube-state-metrics) and is not on the instances' /metrics"
                )
            elif missing:
                why = (
                    f"no instance exports {', '.join(missing)} now (lockgate exports some "
                    "series only where they apply, e.g. watermarks only with event time)"
                )
            else:
                why = (
                    "the query returns nothing for now (a rate needs two scrapes in its "
                    "window, a quantile needs observations)"
                )
            notes.append(
                f'<p class="panel-note no-data">no data for {_e(target.expr)}: {_e(why)}</p>'
            )
            continue
        for labels, pts in sorted(result.items()):
            series.append((_legend(target.legend, labels, target.expr), pts))
    state = "unsupported" if unsupported == len(panel.targets) else "data" if series else "empty"
    head = (
        f'<section class="card panel" data-panel="{panel.id}" data-title="{_e(panel.title)}" '
        f'data-state="{state}"><h3>{_e(panel.title)}</h3>'
    )
    if panel.type in TABLE_TYPES:
        rows = "".join(
            f'<tr class="legend-row" data-name="{_e(n)}" data-last="{pts[-1][1]!r}"><td>{_e(n)}'
            f'</td><td class="num last">{_e(format_value(pts[-1][1], panel.unit))}</td></tr>'
            for n, pts in series
            if pts
        )
        body = (
            '<table class="legend"><thead><tr><th>series</th><th>now</th></tr></thead>'
            f"<tbody>{rows}</tbody></table>"
            if rows
            else ""
        )
    elif panel.type == "timeseries" or panel.type == "graph":
        body = (
            (_chart(series, start, end, panel.unit, panel.id) + _legend_table(series, panel.unit))
            if series
            else ""
        )
    else:
        body = ""
        notes.append(
            f'<p class="panel-note unsupported">panel type {_e(panel.type)} is not drawn by the '
            "console</p>"
        )
    return head + body + "".join(notes) + "</section>"


def dashboard_fragment(
    panels: Sequence[Panel],
    store: Store,
    app: str | None,
    apps: Sequence[str],
    history: MetricsHistory,
    now: float,
) -> str:
    """Return the dashboard's live HTML: the app filter and every panel.

    Args:
        panels: the compiled panels.
        store: the scraped history (the caller holds its lock).
        app: the app the page is filtered by (``None``: all).
        apps: the apps to offer in the filter.
        history: the history's settings (scrape interval, window).
        now: Unix seconds of the chart's right edge.
    """
    first = store.first_at if store.first_at is not None else now
    start = max(now - history.window_s, first)
    step = max(history.scrape_s, (now - start) / MAX_POINTS)
    links = ['<a href="/dashboard"' + (' class="on"' if not app else "") + ">all apps</a>"]
    links.extend(
        f'<a href="/dashboard?app={_e(a)}"' + (' class="on"' if a == app else "") + f">{_e(a)}</a>"
        for a in apps
    )
    head = (
        f'<p class="muted">updated <span id="generated">{_e(ms_to_iso(int(now * 1000)))}</span>; '
        f"{history.rounds} scrape rounds kept, every {history.scrape_s:g} s, the last "
        f"{history.window_s / 60:g} min; <code>$__rate_interval</code> = "
        f"{history.rate_interval_s:g} s</p>"
        f'<p class="app-filter">app: {" ".join(links)}</p>'
    )
    if not store.scrapes:
        head += (
            '<p class="badge warn">no /metrics scraped yet: the console needs the instances\' '
            "addresses (--instance or --instance-url)</p>"
        )
    body = "".join(_panel_html(p, store, start, now, step) for p in panels)
    return head + f'<div class="panels">{body}</div>'
