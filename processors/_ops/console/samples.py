"""Scraped ``/metrics`` samples, per series in time order (what the PromQL subset reads).

:class:`Store` ingests Prometheus text-format scrapes (adding target labels as
Prometheus does), keeps each series' (time, value) pairs in order for bisection, and
drops samples older than its retention. It is not thread-safe: the console's scraper
and renderer share one under a lock.
"""

from __future__ import annotations

import bisect
import time
from collections.abc import Collection, Iterator
from dataclasses import dataclass, field

from prometheus_client.parser import text_string_to_metric_families

__all__ = ["Labels", "Series", "Store", "strip_name"]

#: A series' labels, sorted by name (``__name__`` first where a selector keeps it).
Labels = tuple[tuple[str, str], ...]


@dataclass
class Series:
    """One series' samples in time order (two parallel lists, for bisection)."""

    times: list[float] = field(default_factory=list)
    values: list[float] = field(default_factory=list)

    def add(self, at: float, value: float) -> None:
        if self.times and at < self.times[-1]:
            i = bisect.bisect_right(self.times, at)
            self.times.insert(i, at)
            self.values.insert(i, value)
            return
        self.times.append(at)
        self.values.append(value)

    def drop_before(self, at: float) -> None:
        i = bisect.bisect_left(self.times, at)
        if i:
            del self.times[:i]
            del self.values[:i]

    def latest(self, start: float, end: float) -> float | None:
        """The last value sampled in ``(start, end]``, or ``None``."""
        hi = bisect.bisect_right(self.times, end)
        if hi == 0 or self.times[hi - 1] <= start:
            return None
        return self.values[hi - 1]

    def window(self, start: float, end: float) -> tuple[list[float], list[float]]:
        """The (times, values) sampled in ``(start, end]``."""
        lo = bisect.bisect_right(self.times, start)
        hi = bisect.bisect_right(self.times, end)
        return self.times[lo:hi], self.values[lo:hi]


class Store:
    """Scraped samples: per series (name and labels), the (time, value) pairs in order.

    Not thread-safe: callers that scrape and evaluate on different threads hold a lock.

    Args:
        retention_s: samples older than this (relative to the newest ingest) are dropped
            at each ingest; ``None`` keeps everything.
        only: keep only series with these names (``None``: every series).
    """

    def __init__(
        self, retention_s: float | None = None, only: Collection[str] | None = None
    ) -> None:
        self._retention_s = retention_s
        self._only = None if only is None else frozenset(only)
        self._by_name: dict[str, dict[Labels, Series]] = {}
        self.scrapes = 0
        self.first_at: float | None = None
        self.last_at: float | None = None

    def ingest(self, text: str, at: float | None = None, **target: str) -> None:
        """Add one scrape of a /metrics ``text`` taken at ``at`` (now by default).

        Args:
            text: Prometheus text format.
            at: Unix seconds of the scrape.
            **target: labels added to every series, as Prometheus adds its target labels
                (the Prometheus operator: ``pod``, ``namespace``, ...).
        """
        t = time.time() if at is None else at
        for family in text_string_to_metric_families(text):
            for s in family.samples:
                if self._only is not None and s.name not in self._only:
                    continue
                labels = tuple(sorted({**s.labels, **target}.items()))
                by_labels = self._by_name.setdefault(s.name, {})
                series = by_labels.get(labels)
                if series is None:
                    series = by_labels[labels] = Series()
                series.add(t, float(s.value))
        self.scrapes += 1
        self.first_at = t if self.first_at is None else min(self.first_at, t)
        self.last_at = t if self.last_at is None else max(self.last_at, t)
        if self._retention_s is not None:
            self.drop_before(self.last_at - self._retention_s)

    def drop_before(self, at: float) -> None:
        """Drop the samples taken before ``at`` (and series left without any)."""
        for name in list(self._by_name):
            by_labels = self._by_name[name]
            for labels in list(by_labels):
                series = by_labels[labels]
                series.drop_before(at)
                if not series.times:
                    del by_labels[labels]
            if not by_labels:
                del self._by_name[name]
        if self.first_at is not None and self.first_at < at:
            self.first_at = at

    def names(self) -> set[str]:
        """Every series name held."""
        return set(self._by_name)

    def samples(self) -> int:
        """The number of samples held (all series)."""
        return sum(len(s.times) for by in self._by_name.values() for s in by.values())

    def series_of(self, name: str) -> Iterator[tuple[Labels, Series]]:
        """The series named ``name``: (labels, samples)."""
        yield from self._by_name.get(name, {}).items()


def strip_name(labels: Labels) -> Labels:
    """``labels`` without the metric name (what arithmetic and alert states keep)."""
    return tuple((k, v) for k, v in labels if k != "__name__")
