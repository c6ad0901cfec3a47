"""The PromQL subset evaluator the tests fire the chart's alert rules with.

It is production code: :mod:`processors._ops.console.promql` and
:mod:`processors._ops.console.alert_rules` (the console draws the
chart's dashboard with it). This module re-exports it so that the tests keep one import
path; see that module for the supported subset and for alert ``for:`` states.
"""

from __future__ import annotations

from processors._ops.console.alert_rules import AlertEvaluator, AlertRule, AlertState
from processors._ops.console.promql import (
    LOOKBACK_S,
    Labels,
    Query,
    Store,
    Unsupported,
    Value,
    Vector,
    compile_query,
    evaluate,
    metric_names,
    parse_duration,
)

__all__ = [
    "LOOKBACK_S",
    "AlertEvaluator",
    "AlertRule",
    "AlertState",
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
