"""Chart of the sweeps (runs in .cache/bench/venvs/plot: ``python benchmarks/plot.py IN OUT``).

IN is the harness's results.json, OUT the PNG to write.
"""

from __future__ import annotations

import json
import sys
from collections import defaultdict

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

COLORS = {"raw": "#888888", "lockgate": "#1f77b4", "quix": "#2ca02c", "faust": "#d62728"}


def _mean(xs: list[float]) -> float:
    return sum(xs) / len(xs) if xs else 0.0


def _label_order(label: str) -> tuple[int, int]:
    digits = "".join(c for c in label if c.isdigit())
    return (0, 0) if "least" in label else (1, int(digits or 0))


def main(src: str, dst: str) -> None:
    res = json.load(open(src))
    wsweep = [r for r in res.get("window_sweep", []) if r.get("rate") and r.get("ok")]
    if wsweep:
        fig, axes = plt.subplots(3, 2, figsize=(13, 13))
        (ax_m, ax_s), (ax_r, ax_l), (ax_w, ax_x) = axes
        _window_sweep(ax_w, wsweep)
        ax_x.axis("off")
    else:
        fig, axes = plt.subplots(2, 2, figsize=(13, 9))
        (ax_m, ax_s), (ax_r, ax_l) = axes

    # 1. matrix: records/s per workload and system (log scale)
    rates: dict[tuple[str, str], list[float]] = defaultdict(list)
    for row in res.get("matrix", []):
        if row.get("rate") and row.get("ok"):
            rates[(row["workload"], row["system"])].append(row["rate"])
    workloads = list(dict.fromkeys(r["workload"] for r in res.get("matrix", [])))
    systems = list(dict.fromkeys(r["system"] for r in res.get("matrix", [])))
    width = 0.8 / max(1, len(systems))
    for j, system in enumerate(systems):
        xs = [i + j * width for i in range(len(workloads))]
        ys = [_mean(rates.get((w, system), [])) for w in workloads]
        ax_m.bar(xs, ys, width, label=system, color=COLORS.get(system))
        for i, w in enumerate(workloads):
            ax_m.scatter(
                [xs[i]] * len(rates.get((w, system), [])),
                rates.get((w, system), []),
                color="black",
                s=8,
                zorder=3,
            )
    ax_m.set_xticks([i + width * (len(systems) - 1) / 2 for i in range(len(workloads))])
    ax_m.set_xticklabels(workloads)
    ax_m.set_yscale("log")
    ax_m.set_ylabel("records/s (log)")
    ax_m.set_title("Throughput per workload (bars: mean, dots: runs)")
    if systems:
        ax_m.legend(loc="upper center", ncol=len(systems), fontsize=8, bbox_to_anchor=(0.5, -0.08))

    # 2. sweep: lockgate running sum by guarantee / checkpoint interval
    sweep: dict[str, list[float]] = defaultdict(list)
    cpu: dict[str, list[float]] = defaultdict(list)
    for row in res.get("sweep", []):
        if row.get("rate") and row.get("ok"):
            sweep[row["label"]].append(row["rate"])
            cpu[row["label"]].append(row.get("cpu_s_per_m") or 0)
    labels = sorted(sweep, key=_label_order)
    ax_s.bar(range(len(labels)), [_mean(sweep[k]) for k in labels], color="#1f77b4")
    for i, k in enumerate(labels):
        ax_s.scatter([i] * len(sweep[k]), sweep[k], color="black", s=8, zorder=3)
        ax_s.annotate(
            f"{_mean(cpu[k]):.0f} CPU s/M",
            (i, _mean(sweep[k])),
            ha="center",
            va="bottom",
            fontsize=8,
        )
    ax_s.set_xticks(range(len(labels)))
    ax_s.set_xticklabels([k.replace("exactly-once", "EOS") for k in labels])
    ax_s.set_ylabel("records/s")
    ax_s.set_title("lockgate running sum: checkpoint interval")

    # 3. recovery
    rec = res.get("recovery", [])
    keys = [r["keys"] for r in rec if "local" in r]
    for mode, style in (("local", "o-"), ("changelog", "s--")):
        ys = [r[mode]["seconds"] for r in rec if mode in r]
        if ys:
            ax_r.plot(
                keys[: len(ys)],
                ys,
                style,
                label=f"{mode} state" if mode == "local" else "changelog only (state dir wiped)",
            )
    ax_r.set_xscale("log")
    ax_r.set_xlabel("keys in state")
    ax_r.set_ylabel("seconds from restart to committed output")
    ax_r.set_title("Recovery after kill -9")
    ax_r.legend()

    # 4. latency
    lat = res.get("latency", [])
    names = [r["label"] for r in lat]
    xs = range(len(names))
    ax_l.bar([x - 0.2 for x in xs], [r["p50_ms"] for r in lat], 0.4, label="p50")
    ax_l.bar([x + 0.2 for x in xs], [r["p99_ms"] for r in lat], 0.4, label="p99")
    ax_l.set_xticks(list(xs))
    ax_l.set_xticklabels([n.replace("exactly-once", "EOS") for n in names], fontsize=8)
    ax_l.set_ylabel("end-to-end latency, ms")
    rate = lat[0]["rate"] if lat else 0
    ax_l.set_title(f"lockgate latency at {rate:,} records/s offered")
    ax_l.legend()

    fig.suptitle(f"lockgate benchmarks ({res.get('started', '')})")
    fig.tight_layout()
    fig.savefig(dst, dpi=110)


def _window_sweep(ax: plt.Axes, rows: list[dict]) -> None:
    """lockgate's window operator: records/s vs open windows per key group."""
    points: dict[int, list[dict]] = defaultdict(list)
    for r in rows:
        points[r.get("point", 0)].append(r)
    xy = []
    for rs in points.values():
        ds = rs[0].get("dataset", {})
        x = ds.get("open_per_kg_mean") or 1
        ys = [r["rate"] for r in rs]
        xy.append((x, _mean(ys)))
        ax.scatter([x] * len(ys), ys, color="black", s=8, zorder=3)
        ax.annotate(
            f"{ds.get('keys', 0):,} keys, {ds.get('window_ms', 0) / 1000:g} s windows,\n"
            f"delay {ds.get('delay_ms', 0) / 1000:g} s: {ds.get('open_per_key_mean', 0):.1f} "
            "open per key",
            (x, _mean(ys)),
            textcoords="offset points",
            xytext=(0, 8),
            ha="center",
            fontsize=7,
        )
    xy.sort()
    ax.plot([x for x, _ in xy], [y for _, y in xy], "o-", color="#1f77b4")
    ax.set_xscale("log")
    ax.set_ylim(0, max(y for _, y in xy) * 1.3)
    ax.set_xlabel("windows open per key group (mean, log)")
    ax.set_ylabel("input records/s (mean, dots: runs)")
    ax.set_title("lockgate window operator: open windows (state size) vs throughput")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
