"""py-spy's raw (collapsed) stacks: where the time goes, by function or by library."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

from benchmarks.paths import ROOT


def analyze_profile(path: Path) -> dict[str, Any]:
    """Self and inclusive time per function from py-spy's raw (collapsed) output."""
    if not path.exists():
        return {"samples": 0, "self": [], "total": []}
    own: Counter[str] = Counter()
    incl: Counter[str] = Counter()
    total = 0
    for line in path.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        n = int(count)
        total += n
        frames = [_short(f) for f in stack.split(";")]
        own[frames[-1]] += n
        for f in set(frames):
            incl[f] += n
    skip = ("<module>", "_run_module_as_main", "_run_code", "main", "invoke", "run")

    def rows(c: Counter[str], k: int) -> list[dict[str, Any]]:
        return [
            {"function": f, "pct": round(100 * n / total, 1), "samples": n}
            for f, n in c.most_common()
            if f.split(" ")[0].split(".")[-1] not in skip
        ][:k]

    return {"samples": total, "self": rows(own, 20), "total": rows(incl, 25)}


def analyze_native(path: Path) -> dict[str, Any]:
    """Where the CPU goes by library (py-spy --native): leaf frames grouped by their binary."""
    if not path.exists():
        return {"samples": 0, "by_library": []}
    libs: Counter[str] = Counter()
    leaves: Counter[str] = Counter()
    total = gc_samples = 0
    for line in path.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        n = int(count)
        total += n
        frames = stack.split(";")
        if any("gc_collect" in f for f in frames):
            gc_samples += n
        fn, _, where = frames[-1].partition(" (")
        where = where.rstrip(")")
        if ".py" in where:
            lib = "Python bytecode (lockgate, app, stdlib frames)"
        elif "rocksdict" in where:
            lib = "rocksdict / RocksDB"
        elif "librdkafka" in where:
            lib = "librdkafka"
        elif "cimpl" in where:
            lib = "confluent-kafka binding (cimpl)"
        elif "orjson" in where:
            lib = "orjson"
        elif "libpython" in where:
            lib = "CPython runtime (gc, alloc, builtins)"
        elif "libc." in where:
            lib = "libc (malloc, memcpy, locks)"
        else:
            lib = "other native"
        libs[lib] += n
        leaves[f"{fn[:70]} [{where.rsplit('/', 1)[-1][:40]}]"] += n

    def pct(n: int) -> float:
        return round(100 * n / total, 1) if total else 0.0

    return {
        "samples": total,
        "gc_pct": pct(gc_samples),
        "by_library": [{"function": k, "pct": pct(n)} for k, n in libs.most_common()],
        "leaves": [{"function": k, "pct": pct(n)} for k, n in leaves.most_common(15)],
    }


def _short(frame: str) -> str:
    """``fn (/long/path/site-packages/pkg/mod.py)`` -> ``fn (pkg/mod.py)``."""
    fn, _, where = frame.partition(" (")
    where = where.rstrip(")")
    for marker in ("site-packages/", f"{ROOT}/", "lib/python3.11/"):
        if marker in where:
            where = where.split(marker, 1)[1]
            break
    return f"{fn} ({where})" if where else fn
