"""Alert rules over scraped samples, with Prometheus' ``for:`` states.

A rule whose expression (:mod:`processors._ops.console.promql`) returns a series is
*pending* from the first evaluation that returned it and *firing* once it has returned
it for ``for:`` without a gap (at once when ``for:`` is 0); a series that is no longer
returned is resolved, and its clock starts over (as Prometheus' rule manager, evaluated
every time :meth:`AlertEvaluator.evaluate` is called). The live alert tests fire the
chart's ``PrometheusRule`` with it.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from processors._ops.console.promql import Unsupported, compile_query, parse_duration
from processors._ops.console.samples import Labels, Store, strip_name

__all__ = ["AlertEvaluator", "AlertRule", "AlertState"]


@dataclass(frozen=True)
class AlertRule:
    """One alerting rule of a ``PrometheusRule`` group.

    Attributes:
        name: the ``alert`` name.
        expr: the expression.
        for_s: the rule's ``for:`` in seconds (0: fires at the first evaluation).
    """

    name: str
    expr: str
    for_s: float = 0.0

    @classmethod
    def from_rule(cls, rule: Mapping[str, object]) -> AlertRule:
        """Build from a rendered rule (``alert``, ``expr``, optional ``for``).

        Raises:
            Unsupported: ``for`` is not a duration.
        """
        for_ = rule.get("for")
        return cls(
            str(rule["alert"]), str(rule["expr"]), parse_duration(str(for_)) if for_ else 0.0
        )


@dataclass
class AlertState:
    """One series of one rule that the rule's expression returns.

    Attributes:
        rule: the rule's name.
        labels: the series' labels (metric name dropped).
        value: the expression's value at the last evaluation.
        active_since: Unix seconds of the first evaluation that returned the series
            without a gap since.
        state: ``pending`` (returned for less than ``for:``) or ``firing``.
        fired_at: Unix seconds of the evaluation that made it ``firing`` (else ``None``).
    """

    rule: str
    labels: Labels
    value: float
    active_since: float
    state: str = "pending"
    fired_at: float | None = None


class AlertEvaluator:
    """Evaluates alert rules repeatedly, keeping each series' pending/firing state.

    Args:
        rules: the rules (expressions are compiled once).

    Raises:
        Unsupported: a rule's expression is outside the subset.
    """

    def __init__(self, rules: Sequence[AlertRule]) -> None:
        self.rules = list(rules)
        self._queries = {r.name: compile_query(r.expr) for r in self.rules}
        self._active: dict[tuple[str, Labels], AlertState] = {}
        #: Every state change: (Unix seconds, rule, labels, "pending"|"firing"|"resolved").
        self.transitions: list[tuple[float, str, Labels, str]] = []

    def evaluate(self, store: Store, at: float | None = None) -> list[AlertState]:
        """Evaluate every rule at ``at`` (now by default); return the active series.

        Raises:
            Unsupported: an expression's value is outside the subset (a scalar result).
        """
        now = time.time() if at is None else at
        seen: set[tuple[str, Labels]] = set()
        for rule in self.rules:
            value = self._queries[rule.name].at(store, now)
            if not isinstance(value, dict):
                raise Unsupported(f"{rule.name}: the expression is a scalar, not a vector")
            for labels, v in value.items():
                key = (rule.name, strip_name(labels))
                seen.add(key)
                st = self._active.get(key)
                if st is None:
                    st = self._active[key] = AlertState(rule.name, key[1], v, now)
                    self.transitions.append((now, rule.name, key[1], "pending"))
                st.value = v
                if st.state == "pending" and now - st.active_since >= rule.for_s:
                    st.state, st.fired_at = "firing", now
                    self.transitions.append((now, rule.name, key[1], "firing"))
        for key in list(self._active):
            if key not in seen:
                del self._active[key]
                self.transitions.append((now, key[0], key[1], "resolved"))
        return list(self._active.values())

    def states(self, rule: str) -> list[AlertState]:
        """The active series of ``rule`` as of the last evaluation."""
        return [s for (name, _), s in self._active.items() if name == rule]
