"""An app's Prometheus ``/metrics``: scrape the text, read a counter or a histogram."""

from __future__ import annotations

import re
import urllib.request
from typing import Any


def scrape(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
        return str(r.read().decode())


_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})?\s+(\S+)")


def histogram(text: str, name: str) -> dict[str, Any]:
    """Cumulative buckets (le -> count), sum and count of histogram ``name``."""
    buckets: dict[float, float] = {}
    total = count = 0.0
    for line in text.splitlines():
        m = _SAMPLE.match(line)
        if not m:
            continue
        metric, labels, value = m.group(1), m.group(2) or "", float(m.group(3))
        if metric == f"{name}_bucket":
            le = re.search(r'le="([^"]+)"', labels)
            if le:
                bound = float("inf") if le.group(1) == "+Inf" else float(le.group(1))
                buckets[bound] = buckets.get(bound, 0) + value
        elif metric == f"{name}_sum":
            total += value
        elif metric == f"{name}_count":
            count += value
    return {"buckets": sorted(buckets.items()), "sum": total, "count": count}


def metric(text: str, name: str) -> float | None:
    for line in text.splitlines():
        m = _SAMPLE.match(line)
        if m and m.group(1) == name:
            return float(m.group(3))
    return None


def quantile(q: float, buckets: list[tuple[float, float]]) -> float | None:
    """Prometheus-style ``histogram_quantile``: linear interpolation inside the bucket."""
    if not buckets or buckets[-1][1] <= 0:
        return None
    rank = q * buckets[-1][1]
    lower, below = 0.0, 0.0
    for bound, cum in buckets:
        if cum >= rank:
            if bound == float("inf"):
                return lower  # beyond the last finite bound: report that bound
            if cum == below:
                return bound
            return lower + (bound - lower) * (rank - below) / (cum - below)
        lower, below = bound, cum
    return lower
