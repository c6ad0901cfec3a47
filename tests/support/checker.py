"""Independent exactly-once checker for examples/running_sum.py.

The model is computed from the input records alone: for key ``k`` with inputs
``(v_1, seq_1), (v_2, seq_2), ...`` in partition order, the output must be exactly
``{"sum": v_1 + ... + v_i, "count": i, "seq": seq_i}`` for every ``i``, in that
order: no loss, no duplicate, no reordering.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from typing import Any

import orjson


def model(inputs: Iterable[tuple[str, int, int]]) -> dict[str, list[dict[str, int]]]:
    """Return the expected outputs per key for inputs ``(key, v, seq)`` in input order."""
    out: dict[str, list[dict[str, int]]] = defaultdict(list)
    sums: dict[str, int] = defaultdict(int)
    for key, v, seq in inputs:
        sums[key] += v
        out[key].append({"sum": sums[key], "count": len(out[key]) + 1, "seq": seq})
    return dict(out)


def check(expected: dict[str, list[dict[str, int]]], messages: Iterable[Any]) -> list[str]:
    """Compare committed output messages with the model; return a list of problems."""
    got: dict[str, list[dict[str, int]]] = defaultdict(list)
    for m in messages:
        headers = dict(m.headers() or [])
        if "lockgate-type" in headers:
            continue
        got[m.key().decode()].append(orjson.loads(m.value()))
    problems = []
    for key in sorted(set(expected) | set(got)):
        e, g = expected.get(key, []), got.get(key, [])
        if e == g:
            continue
        seqs = [r["seq"] for r in g]
        dups = len(seqs) - len(set(seqs))
        missing = len({r["seq"] for r in e} - set(seqs))
        first_bad = next((i for i, (a, b) in enumerate(zip(e, g, strict=False)) if a != b), None)
        problems.append(
            f"key {key}: expected {len(e)} records, got {len(g)} "
            f"(duplicates {dups}, missing {missing}, first mismatch at {first_bad}: "
            f"{e[first_bad] if first_bad is not None else None} vs "
            f"{g[first_bad] if first_bad is not None else None})"
        )
    return problems
