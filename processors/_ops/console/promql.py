"""A small PromQL evaluator over scraped ``/metrics`` texts, and alert ``for:`` states.

There is no Prometheus next to the console (nor in the test environment). This module
evaluates exactly the expression forms the chart's dashboard (``dashboards/lockgate.json``)
and ``PrometheusRule`` use, against samples scraped from the instances, and refuses
anything else (:class:`Unsupported`) rather than guess. The console draws the dashboard's
panels with it (:mod:`processors._ops.console.dashboard`); the live alert tests fire the
chart's alert rules with it.

Supported:

* instant selectors ``name``, ``name{l="v", l!="v", l=~"re", l!~"re"}`` (the latest sample
  of each series scraped within the :data:`LOOKBACK_S` lookback, as Prometheus);
* range selectors ``name{...}[5m]`` (units ms, s, m, h, d; compound as ``1h30m``) as the
  argument of ``rate()`` and ``increase()``: the samples scraped within the window
  (left-open). ``increase`` is the sum of the increases between consecutive samples (a
  decrease counts as a counter reset: the new value is the increase), extrapolated to the
  window's edges as Prometheus does (by at most half a scrape interval where the samples
  stop short of an edge, and not below zero); ``rate`` is that divided by the window's
  seconds. Fewer than two samples: no result (as Prometheus);
* ``histogram_quantile(φ, v)`` over ``le``-labelled bucket series (Prometheus' linear
  interpolation inside the bucket; the ``+Inf`` bucket answers the next lower bound);
* ``time()`` and number literals;
* aggregations ``sum|max|min|count by (labels) (expr)`` (``by`` before the argument);
* comparisons ``== != > < >= <=`` between a vector and a scalar (a filter keeping the
  vector's samples, as without ``bool``; ``bool`` is not supported);
* arithmetic ``+ - * /`` between scalars, a scalar and a vector, or two vectors matched
  one-to-one on all their labels (the metric name dropped);
* ``and`` / ``unless`` with ``on (labels)`` or without (all labels matched);
* parentheses. Precedence as PromQL: ``* /`` over ``+ -`` over comparisons over
  ``and unless``; all left-associative.

Not supported: ``offset``, ``@``, ``without``, ``group_left/right``, ``or``, other
functions and aggregations, staleness markers.

The samples it reads are held by :class:`~processors._ops.console.samples.Store`; alert
rules and their ``for:`` states are in :mod:`processors._ops.console.alert_rules`.
"""

from __future__ import annotations

import bisect
import math
import re
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from processors._ops.console.samples import Labels, Store, strip_name

__all__ = [
    "LOOKBACK_S",
    "Labels",
    "Query",
    "Store",
    "Unsupported",
    "Value",
    "Vector",
    "compile_query",
    "evaluate",
    "metric_names",
    "parse_duration",
]

#: An instant vector: labels -> value.
Vector = dict[Labels, float]
#: What an expression evaluates to: a scalar or an instant vector.
Value = float | Vector

#: How far back an instant selector looks for a series' latest sample (as Prometheus).
LOOKBACK_S = 300.0


class Unsupported(ValueError):
    """The expression uses a form this evaluator does not implement."""


_DURATION_PART = re.compile(r"(\d+)(ms|s|m|h|d|w)")
_UNIT_S = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, "w": 604800.0}


def parse_duration(text: str) -> float:
    """Return the seconds of a Prometheus duration (``30s``, ``5m``, ``1h30m``, ``0``).

    Args:
        text: the duration, as in a range selector or an alert rule's ``for:``.

    Raises:
        Unsupported: not a duration.
    """
    text = str(text).strip()
    if not text:
        raise Unsupported("an empty duration")
    if text == "0":
        return 0.0
    pos, total = 0, 0.0
    while pos < len(text):
        m = _DURATION_PART.match(text, pos)
        if m is None:
            raise Unsupported(f"duration {text!r}")
        total += int(m.group(1)) * _UNIT_S[m.group(2)]
        pos = m.end()
    return total


@dataclass(frozen=True)
class _Range:
    name: str
    matchers: tuple[tuple[str, str, str], ...]
    seconds: float


#: A compiled expression: evaluates against a store at a time.
_Fn = Callable[[Store, float], Value]

_TOKEN = re.compile(
    r"\s*(?:(?P<num>\d+(?:\.\d+)?)(?P<unit>ms|[smhdw])?(?![A-Za-z_])"
    r"|(?P<id>[A-Za-z_:][A-Za-z0-9_:]*)"
    r'|(?P<str>"(?:[^"\\]|\\.)*")|(?P<op>==|!=|>=|<=|=~|!~|[-+*/><=(){}\[\],]))'
)
_CMP: dict[str, Callable[[float, float], bool]] = {
    "==": lambda a, b: a == b,
    "!=": lambda a, b: a != b,
    ">": lambda a, b: a > b,
    "<": lambda a, b: a < b,
    ">=": lambda a, b: a >= b,
    "<=": lambda a, b: a <= b,
}
_ARITH: dict[str, Callable[[float, float], float]] = {
    "+": lambda a, b: a + b,
    "-": lambda a, b: a - b,
    "*": lambda a, b: a * b,
    "/": lambda a, b: a / b if b else math.nan,
}
_AGG: dict[str, Callable[[list[float]], float]] = {
    "sum": lambda v: float(sum(v)),
    "max": max,
    "min": min,
    "count": lambda v: float(len(v)),
}
_NAME = re.compile(r"[A-Za-z_:][A-Za-z0-9_:]*")
_NUMBER = re.compile(r"\d+(\.\d+)?")


def _tokens(expr: str) -> list[str]:
    out: list[str] = []
    pos = 0
    expr = expr.rstrip()
    while pos < len(expr):
        m = _TOKEN.match(expr, pos)
        if m is None or m.end() == pos:
            raise Unsupported(f"cannot read {expr[pos:]!r}")
        out.append(m.group(0).strip())
        pos = m.end()
    return out


def _matches(labels: Labels, matchers: Sequence[tuple[str, str, str]]) -> bool:
    have = dict(labels)
    for label, op, want in matchers:
        value = have.get(label, "")
        if op == "=":
            ok = value == want
        elif op == "!=":
            ok = value != want
        elif op == "=~":
            ok = re.fullmatch(want, value) is not None
        else:
            ok = re.fullmatch(want, value) is None
        if not ok:
            return False
    return True


def _arith(op: str, a: Value, b: Value) -> Value:
    f = _ARITH[op]
    if not isinstance(a, dict) and not isinstance(b, dict):
        return f(a, b)
    if isinstance(a, dict) and not isinstance(b, dict):
        return {strip_name(lb): f(v, b) for lb, v in a.items()}
    if isinstance(b, dict) and not isinstance(a, dict):
        return {strip_name(lb): f(a, v) for lb, v in b.items()}
    assert isinstance(a, dict) and isinstance(b, dict)  # noqa: S101 - narrowed above
    rb = {strip_name(lb): v for lb, v in b.items()}
    return {strip_name(lb): f(v, rb[strip_name(lb)]) for lb, v in a.items() if strip_name(lb) in rb}


def _quantile(q: float, buckets: list[tuple[float, float]]) -> float:
    """Prometheus' ``histogram_quantile`` of one histogram's (upper bound, count) buckets."""
    if q < 0:
        return -math.inf
    if q > 1:
        return math.inf
    buckets.sort()
    if len(buckets) < 2 or not math.isinf(buckets[-1][0]):
        return math.nan
    counts: list[float] = []
    for _, c in buckets:
        counts.append(max(c, counts[-1]) if counts else c)  # monotonic, as Prometheus
    total = counts[-1]
    if total <= 0 or math.isnan(total):
        return math.nan
    rank = q * total
    b = bisect.bisect_left(counts, rank)
    if b >= len(buckets) - 1:
        return buckets[-2][0]
    upper = buckets[b][0]
    if b == 0 and upper <= 0:
        return upper
    lower = 0.0 if b == 0 else buckets[b - 1][0]
    below = 0.0 if b == 0 else counts[b - 1]
    in_bucket = counts[b] - below
    if in_bucket <= 0:
        return upper
    return lower + (upper - lower) * (rank - below) / in_bucket


def _extrapolated_increase(
    times: Sequence[float], values: Sequence[float], start: float, end: float
) -> float:
    """A counter's increase over ``(start, end]`` from its samples there (two at least).

    Prometheus' ``extrapolatedRate`` for counters: resets counted, the sampled increase
    extrapolated to each edge of the window when the samples come within 1.1 average
    intervals of it, else by half an interval; towards the start never past the point
    where the counter would have been zero.
    """
    inc = 0.0
    for prev, cur in zip(values, values[1:], strict=False):
        inc += cur - prev if cur >= prev else cur
    sampled = times[-1] - times[0]
    if sampled <= 0:
        return inc
    average = sampled / (len(times) - 1)
    to_start, to_end = times[0] - start, end - times[-1]
    if inc > 0 and values[0] >= 0:
        to_start = min(to_start, sampled * (values[0] / inc))
    threshold = average * 1.1
    interval = sampled
    interval += to_start if to_start < threshold else average / 2
    interval += to_end if to_end < threshold else average / 2
    return inc * interval / sampled


class _Parser:
    """Recursive descent over the tokens; each rule returns a function of (store, at)."""

    def __init__(self, expr: str) -> None:
        self.toks = _tokens(expr)
        self.i = 0
        self.names: set[str] = set()

    def peek(self) -> str | None:
        return self.toks[self.i] if self.i < len(self.toks) else None

    def take(self, want: str | None = None) -> str:
        tok = self.peek()
        if tok is None or (want is not None and tok != want):
            raise Unsupported(f"expected {want or 'a token'}, got {tok!r}")
        self.i += 1
        return tok

    def label_list(self) -> list[str]:
        self.take("(")
        names: list[str] = []
        while self.peek() != ")":
            names.append(self.take())
            if self.peek() == ",":
                self.take(",")
        self.take(")")
        return names

    # -- grammar (lowest precedence first) ------------------------------------------------

    def run(self) -> _Fn:
        fn = self.set_ops()
        if self.peek() is not None:
            raise Unsupported(f"unexpected {self.peek()!r}")
        return fn

    def set_ops(self) -> _Fn:
        left = self.comparison()
        while self.peek() in ("and", "unless"):
            op = self.take()
            on: list[str] | None = None
            if self.peek() == "on":
                self.take()
                on = self.label_list()
            right = self.comparison()
            left = self._set_op(op, on, left, right)
        return left

    @staticmethod
    def _set_op(op: str, on: list[str] | None, left: _Fn, right: _Fn) -> _Fn:
        want = op == "and"

        def key(labels: Labels) -> Labels:
            if on is None:
                return strip_name(labels)
            return tuple((k, v) for k, v in labels if k in on)

        def fn(store: Store, at: float) -> Value:
            a, b = left(store, at), right(store, at)
            if not isinstance(a, dict) or not isinstance(b, dict):
                raise Unsupported(f"{op} needs two vectors")
            keys = {key(lb) for lb in b}
            return {lb: v for lb, v in a.items() if (key(lb) in keys) == want}

        return fn

    def comparison(self) -> _Fn:
        left = self.additive()
        while self.peek() in _CMP:
            op = self.take()
            if self.peek() == "bool":
                raise Unsupported("bool modifier")
            left = self._compare(op, left, self.additive())
        return left

    @staticmethod
    def _compare(op: str, left: _Fn, right: _Fn) -> _Fn:
        cmp = _CMP[op]

        def fn(store: Store, at: float) -> Value:
            a, b = left(store, at), right(store, at)
            if isinstance(a, dict) and not isinstance(b, dict):
                return {lb: v for lb, v in a.items() if cmp(v, b)}
            if isinstance(b, dict) and not isinstance(a, dict):
                return {lb: v for lb, v in b.items() if cmp(a, v)}
            raise Unsupported(f"{op} between {type(a).__name__} and {type(b).__name__}")

        return fn

    def additive(self) -> _Fn:
        left = self.multiplicative()
        while self.peek() in ("+", "-"):
            op = self.take()
            left = self._arith(op, left, self.multiplicative())
        return left

    def multiplicative(self) -> _Fn:
        left = self.unary()
        while self.peek() in ("*", "/"):
            op = self.take()
            left = self._arith(op, left, self.unary())
        return left

    @staticmethod
    def _arith(op: str, left: _Fn, right: _Fn) -> _Fn:
        return lambda store, at: _arith(op, left(store, at), right(store, at))

    def unary(self) -> _Fn:
        tok = self.peek()
        if tok == "(":
            self.take("(")
            inner = self.set_ops()
            self.take(")")
            return inner
        if tok is not None and _NUMBER.fullmatch(tok):
            self.take()
            number = float(tok)
            return lambda _store, _at: number
        if tok in _AGG:
            return self.aggregation()
        if tok == "time":
            self.take()
            self.take("(")
            self.take(")")
            return lambda _store, at: at
        if tok in ("rate", "increase"):
            return self.counter_function()
        if tok == "histogram_quantile":
            return self.histogram_quantile()
        sel = self.selector()
        if isinstance(sel, _Range):
            raise Unsupported("a range selector outside rate()/increase()")
        return sel

    def aggregation(self) -> _Fn:
        op = self.take()
        if self.peek() != "by":
            raise Unsupported(f"{op} without `by (...)` before its argument")
        self.take("by")
        by = self.label_list()
        self.take("(")
        inner = self.set_ops()
        self.take(")")
        agg = _AGG[op]

        def fn(store: Store, at: float) -> Value:
            value = inner(store, at)
            if not isinstance(value, dict):
                raise Unsupported(f"{op} of a scalar")
            groups: dict[Labels, list[float]] = {}
            for lb, v in value.items():
                groups.setdefault(tuple((k, val) for k, val in lb if k in by), []).append(v)
            return {g: agg(vs) for g, vs in groups.items()}

        return fn

    def histogram_quantile(self) -> _Fn:
        self.take()
        self.take("(")
        phi = self.set_ops()
        self.take(",")
        inner = self.set_ops()
        self.take(")")

        def fn(store: Store, at: float) -> Value:
            q, value = phi(store, at), inner(store, at)
            if isinstance(q, dict) or not isinstance(value, dict):
                raise Unsupported("histogram_quantile(scalar, vector)")
            groups: dict[Labels, list[tuple[float, float]]] = {}
            for lb, v in value.items():
                le = dict(lb).get("le")
                if le is None:
                    continue
                rest = tuple((k, val) for k, val in lb if k not in ("le", "__name__"))
                groups.setdefault(rest, []).append((float(le), v))
            return {g: _quantile(q, bs) for g, bs in groups.items()}

        return fn

    def counter_function(self) -> _Fn:
        fname = self.take()
        self.take("(")
        rng = self.selector()
        self.take(")")
        if not isinstance(rng, _Range):
            raise Unsupported(f"{fname}() of an instant vector")
        is_rate = fname == "rate"

        def fn(store: Store, at: float) -> Value:
            out: Vector = {}
            for labels, series in store.series_of(rng.name):
                if not _matches(labels, rng.matchers):
                    continue
                times, values = series.window(at - rng.seconds, at)
                if len(values) < 2:
                    continue
                inc = _extrapolated_increase(times, values, at - rng.seconds, at)
                out[labels] = inc / rng.seconds if is_rate else inc
            return out

        return fn

    def selector(self) -> _Fn | _Range:
        name = self.take()
        if not _NAME.fullmatch(name):
            raise Unsupported(f"expected a metric name, got {name!r}")
        self.names.add(name)
        matchers: list[tuple[str, str, str]] = []
        if self.peek() == "{":
            self.take("{")
            while self.peek() != "}":
                label = self.take()
                op = self.take()
                if op not in ("=", "!=", "=~", "!~"):
                    raise Unsupported(f"label matcher {op!r}")
                raw = self.take()
                if not raw.startswith('"'):
                    raise Unsupported(f"label value {raw!r}")
                matchers.append((label, op, raw[1:-1].encode().decode("unicode_escape")))
                if self.peek() == ",":
                    self.take(",")
            self.take("}")
        if self.peek() == "[":
            self.take("[")
            parts: list[str] = []
            while self.peek() not in ("]", None):
                parts.append(self.take())
            self.take("]")
            return _Range(name, tuple(matchers), parse_duration("".join(parts)))
        frozen = tuple(matchers)

        def fn(store: Store, at: float) -> Value:
            out: Vector = {}
            for labels, series in store.series_of(name):
                if not _matches(labels, frozen):
                    continue
                recent = series.latest(at - LOOKBACK_S, at)
                if recent is not None:
                    out[(("__name__", name), *labels)] = recent
            return out

        return fn


@dataclass(frozen=True)
class Query:
    """A compiled expression (see :func:`compile_query`).

    Attributes:
        expr: the expression's text.
        names: the metric names its selectors name.
    """

    expr: str
    names: frozenset[str]
    _fn: _Fn = field(repr=False, compare=False)

    def at(self, store: Store, at: float | None = None) -> Value:
        """Evaluate at ``at`` (Unix seconds; now by default): a scalar or {labels: value}.

        Raises:
            Unsupported: the expression combines values in a way the subset leaves out
                (e.g. a comparison between two vectors).
        """
        return self._fn(store, time.time() if at is None else at)

    def range(
        self, store: Store, start: float, end: float, step: float
    ) -> dict[Labels, list[tuple[float, float]]]:
        """Evaluate at ``start``, ``start + step``, ... up to ``end``: labels -> points.

        A scalar result is returned under the empty labels; NaN values are left out.

        Raises:
            Unsupported: as :meth:`at`.
            ValueError: ``step`` is not positive.
        """
        if step <= 0:
            raise ValueError("step must be positive")
        out: dict[Labels, list[tuple[float, float]]] = {}
        n = int((end - start) // step)
        for k in range(n + 1):
            t = start + k * step
            value = self._fn(store, t)
            items = value.items() if isinstance(value, dict) else (((), value),)
            for labels, v in items:
                if not math.isnan(v):
                    out.setdefault(strip_name(labels), []).append((t, v))
        return out


def compile_query(expr: str) -> Query:
    """Parse ``expr`` once, to evaluate it many times.

    Raises:
        Unsupported: the expression uses a form outside the documented subset.
    """
    parser = _Parser(expr)
    fn = parser.run()
    return Query(expr, frozenset(parser.names), fn)


def evaluate(expr: str, store: Store, at: float | None = None) -> Value:
    """Evaluate ``expr`` at ``at`` (now by default): a scalar or {labels: value}.

    Raises:
        Unsupported: the expression uses a form outside the documented subset.
    """
    return compile_query(expr).at(store, at)


def metric_names(expr: str) -> set[str]:
    """The series names an expression (or a Grafana query variable) selects.

    Every identifier outside label matchers, grouping clauses and range brackets that is
    not a function, aggregation or keyword; in ``label_values(selector, label)`` the
    label is left out. Works on expressions outside the subset too.
    """
    words = {"sum", "max", "min", "count", "by", "on", "and", "unless", "or", "rate",
             "increase", "time", "histogram_quantile", "bool", "without", "le"}  # fmt: skip
    names: set[str] = set()
    no_labels = re.sub(r"\{[^}]*\}", "{}", expr)  # label names and values out
    no_labels = re.sub(r"\b(?:by|on|without)\s*\([^)]*\)", "", no_labels)  # grouping labels
    no_labels = re.sub(r"\[[^\]]*\]", "[]", no_labels)
    # Grafana's label_values(selector, label) in query variables: the label is no series.
    no_labels = re.sub(r"\blabel_values\(([^,()]*),\s*\w+\s*\)", r"(\1)", no_labels)
    for m in _NAME.finditer(no_labels):
        if m.group(0) not in words:
            names.add(m.group(0))
    return names
