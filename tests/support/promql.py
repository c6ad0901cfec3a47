"""A small PromQL evaluator over scraped /metrics texts, for the chart's alert expressions.

There is no Prometheus in the test environment. This evaluates exactly the expression forms
the chart's PrometheusRule uses, against samples scraped from a live instance, and refuses
anything else (:class:`Unsupported`) rather than guess.

Supported:

* instant selectors ``name``, ``name{l="v", l!="v", l=~"re", l!~"re"}`` (the latest sample
  of each series scraped within the 5 minute lookback, as Prometheus);
* range selectors ``name{...}[5m]`` (units s, m, h) as the argument of ``rate()`` and
  ``increase()``: the samples scraped within the window. ``increase`` is the sum of the
  increases between consecutive samples (a decrease counts as a counter reset: the new
  value is the increase), without Prometheus' extrapolation to the window's edges;
  ``rate`` is that divided by the window's seconds. Fewer than two samples: no result
  (as Prometheus);
* ``time()`` and number literals;
* aggregations ``sum|max|min|count by (labels) (expr)`` (``by`` before the argument);
* comparisons ``== != > < >= <=`` between a vector and a scalar (a filter keeping the
  vector's samples, as without ``bool``; ``bool`` is not supported);
* arithmetic ``+ - * /`` between scalars, a scalar and a vector, or two vectors matched
  one-to-one on all their labels (the metric name dropped);
* ``and`` / ``unless`` with ``on (labels)`` or without (all labels matched);
* parentheses. Precedence as PromQL: ``* /`` over ``+ -`` over comparisons over
  ``and unless``; all left-associative.

Not supported: ``for:`` (the caller decides how long a condition must hold), ``offset``,
``@``, ``without``, ``group_left/right``, ``or``, other functions and aggregations,
staleness markers.
"""

from __future__ import annotations

import math
import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from prometheus_client.parser import text_string_to_metric_families

Labels = tuple[tuple[str, str], ...]
LOOKBACK_S = 300.0


class Unsupported(ValueError):
    """The expression uses a form this evaluator does not implement."""


@dataclass
class Store:
    """Scraped samples: per series (name and labels), the (time, value) pairs in order."""

    series: dict[tuple[str, Labels], list[tuple[float, float]]] = field(default_factory=dict)

    def ingest(self, text: str, at: float | None = None, **target: str) -> None:
        """Add one scrape of a /metrics ``text`` taken at ``at`` (now by default).

        ``target`` labels are added to every series, as Prometheus adds its target
        labels (the Prometheus operator: ``pod``, ``namespace``, ...).
        """
        t = time.time() if at is None else at
        for family in text_string_to_metric_families(text):
            for s in family.samples:
                labels = tuple(sorted({**s.labels, **target}.items()))
                self.series.setdefault((s.name, labels), []).append((t, float(s.value)))

    def names(self) -> set[str]:
        """Every series name scraped."""
        return {name for name, _ in self.series}


Vector = dict[Labels, float]
Value = float | Vector


@dataclass
class _Range:
    name: str
    matchers: list[tuple[str, str, str]]
    seconds: float


_TOKEN = re.compile(
    r"\s*(?:(?P<num>\d+(?:\.\d+)?)(?P<unit>[smh])?(?![A-Za-z_])|(?P<id>[A-Za-z_:][A-Za-z0-9_:]*)"
    r'|(?P<str>"(?:[^"\\]|\\.)*")|(?P<op>==|!=|>=|<=|=~|!~|[-+*/><=(){}\[\],]))'
)
_CMP = {
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
    "sum": sum,
    "max": max,
    "min": min,
    "count": lambda v: float(len(v)),
}


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


def _duration(tok: str) -> float:
    m = re.fullmatch(r"(\d+)([smh])", tok)
    if m is None:
        raise Unsupported(f"duration {tok!r}")
    return int(m.group(1)) * {"s": 1, "m": 60, "h": 3600}[m.group(2)]


def _strip_name(labels: Labels) -> Labels:
    return tuple((k, v) for k, v in labels if k != "__name__")


class _Eval:
    def __init__(self, store: Store, at: float, expr: str) -> None:
        self.store, self.at, self.toks, self.i = store, at, _tokens(expr), 0

    # -- tokens -----------------------------------------------------------------------

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

    # -- grammar (lowest precedence first) --------------------------------------------

    def run(self) -> Value:
        value = self.set_ops()
        if self.peek() is not None:
            raise Unsupported(f"unexpected {self.peek()!r}")
        return value

    def set_ops(self) -> Value:
        left = self.comparison()
        while self.peek() in ("and", "unless"):
            op = self.take()
            on: list[str] | None = None
            if self.peek() == "on":
                self.take()
                on = self.label_list()
            right = self.comparison()
            if not isinstance(left, dict) or not isinstance(right, dict):
                raise Unsupported(f"{op} needs two vectors")

            def key(labels: Labels, on: list[str] | None = on) -> Labels:
                if on is None:
                    return _strip_name(labels)
                return tuple((k, v) for k, v in labels if k in on)

            keys = {key(lb) for lb in right}
            want = op == "and"
            left = {lb: v for lb, v in left.items() if (key(lb) in keys) == want}
        return left

    def comparison(self) -> Value:
        left = self.additive()
        while self.peek() in _CMP:
            op = self.take()
            if self.peek() == "bool":
                raise Unsupported("bool modifier")
            right = self.additive()
            cmp = _CMP[op]
            if isinstance(left, dict) and not isinstance(right, dict):
                left = {lb: v for lb, v in left.items() if cmp(v, right)}
            elif isinstance(right, dict) and not isinstance(left, dict):
                left = {lb: v for lb, v in right.items() if cmp(left, v)}
            else:
                raise Unsupported(f"{op} between {type(left).__name__} and {type(right).__name__}")
        return left

    def additive(self) -> Value:
        left = self.multiplicative()
        while self.peek() in ("+", "-"):
            op = self.take()
            left = self.arith(op, left, self.multiplicative())
        return left

    def multiplicative(self) -> Value:
        left = self.unary()
        while self.peek() in ("*", "/"):
            op = self.take()
            left = self.arith(op, left, self.unary())
        return left

    def arith(self, op: str, a: Value, b: Value) -> Value:
        f = _ARITH[op]
        if not isinstance(a, dict) and not isinstance(b, dict):
            return f(a, b)
        if isinstance(a, dict) and not isinstance(b, dict):
            return {_strip_name(lb): f(v, b) for lb, v in a.items()}
        if isinstance(b, dict) and not isinstance(a, dict):
            return {_strip_name(lb): f(a, v) for lb, v in b.items()}
        assert isinstance(a, dict) and isinstance(b, dict)
        rb = {_strip_name(lb): v for lb, v in b.items()}
        return {
            _strip_name(lb): f(v, rb[_strip_name(lb)])
            for lb, v in a.items()
            if _strip_name(lb) in rb
        }

    def unary(self) -> Value:
        tok = self.peek()
        if tok == "(":
            self.take("(")
            value = self.set_ops()
            self.take(")")
            return value
        if tok is not None and re.fullmatch(r"\d+(\.\d+)?", tok):
            self.take()
            return float(tok)
        if tok in _AGG:
            return self.aggregation()
        if tok == "time":
            self.take()
            self.take("(")
            self.take(")")
            return self.at
        if tok in ("rate", "increase"):
            return self.counter_function()
        sel = self.selector()
        if isinstance(sel, _Range):
            raise Unsupported("a range selector outside rate()/increase()")
        return sel

    def aggregation(self) -> Vector:
        op = self.take()
        if self.peek() != "by":
            raise Unsupported(f"{op} without `by (...)` before its argument")
        self.take("by")
        by = self.label_list()
        self.take("(")
        inner = self.set_ops()
        self.take(")")
        if not isinstance(inner, dict):
            raise Unsupported(f"{op} of a scalar")
        groups: dict[Labels, list[float]] = {}
        for lb, v in inner.items():
            groups.setdefault(tuple((k, val) for k, val in lb if k in by), []).append(v)
        return {g: _AGG[op](vs) for g, vs in groups.items()}

    def counter_function(self) -> Vector:
        fn = self.take()
        self.take("(")
        rng = self.selector()
        self.take(")")
        if not isinstance(rng, _Range):
            raise Unsupported(f"{fn}() of an instant vector")
        out: Vector = {}
        for (name, labels), points in self.store.series.items():
            if name != rng.name or not _matches(labels, rng.matchers):
                continue
            window = [v for t, v in points if self.at - rng.seconds < t <= self.at]
            if len(window) < 2:
                continue
            inc = 0.0
            for prev, cur in zip(window, window[1:], strict=False):
                inc += cur - prev if cur >= prev else cur
            out[labels] = inc / rng.seconds if fn == "rate" else inc
        return out

    def selector(self) -> Vector | _Range:
        name = self.take()
        if not re.fullmatch(r"[A-Za-z_:][A-Za-z0-9_:]*", name):
            raise Unsupported(f"expected a metric name, got {name!r}")
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
            seconds = _duration(self.take())
            self.take("]")
            return _Range(name, matchers, seconds)
        out: Vector = {}
        for (sname, labels), points in self.store.series.items():
            if sname != name or not _matches(labels, matchers):
                continue
            recent = [(t, v) for t, v in points if self.at - LOOKBACK_S < t <= self.at]
            if recent:
                out[(("__name__", name), *labels)] = recent[-1][1]
        return out


def _matches(labels: Labels, matchers: list[tuple[str, str, str]]) -> bool:
    have = dict(labels)
    for label, op, want in matchers:
        value = have.get(label, "")
        ok = {
            "=": value == want,
            "!=": value != want,
            "=~": re.fullmatch(want, value) is not None,
            "!~": re.fullmatch(want, value) is None,
        }[op]
        if not ok:
            return False
    return True


def evaluate(expr: str, store: Store, at: float | None = None) -> Value:
    """Evaluate ``expr`` at ``at`` (now by default): a scalar or {labels: value}.

    Raises:
        Unsupported: the expression uses a form outside the documented subset.
    """
    return _Eval(store, time.time() if at is None else at, expr).run()


def metric_names(expr: str) -> set[str]:
    """The series names an expression (or a Grafana query variable) selects.

    Every identifier outside label matchers, grouping clauses and range brackets that is
    not a function, aggregation or keyword; in ``label_values(selector, label)`` the
    label is left out.
    """
    words = {"sum", "max", "min", "count", "by", "on", "and", "unless", "or", "rate",
             "increase", "time", "histogram_quantile", "bool", "without", "le"}  # fmt: skip
    names: set[str] = set()
    no_labels = re.sub(r"\{[^}]*\}", "{}", expr)  # label names and values out
    no_labels = re.sub(r"\b(?:by|on|without)\s*\([^)]*\)", "", no_labels)  # grouping labels
    no_labels = re.sub(r"\[[^\]]*\]", "[]", no_labels)
    # Grafana's label_values(selector, label) in query variables: the label is no series.
    no_labels = re.sub(r"\blabel_values\(([^,()]*),\s*\w+\s*\)", r"(\1)", no_labels)
    for m in re.finditer(r"[A-Za-z_:][A-Za-z0-9_:]*", no_labels):
        if m.group(0) not in words:
            names.add(m.group(0))
    return names
