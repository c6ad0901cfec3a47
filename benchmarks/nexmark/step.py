"""``make bench``'s ``nexmark`` step: every query, lockgate vs Flink, at parallelism 1 and 2.

:func:`bench_step` runs the harness (benchmarks/nexmark/harness.py) once per parallelism,
one after the other: each half writes its input once, then runs every query on every
system, the systems interleaved, :data:`STEP_REPEAT` times, and checks every run's output
against the query's first. Flink runs all of a half's queries in one PyFlink process (one
warm JVM, as a production Flink job has). Parallelism 1 runs on ``make bench``'s broker;
parallelism 2 on a broker of its own that this step starts and stops (see
:func:`bench_step`). :func:`markdown_section` renders the results for RESULTS.md: per
parallelism, lockgate / Flink rate ratio and both systems' CPU per event, then the
harness's full table.
"""

from __future__ import annotations

import gc
import json
import os
import re
import shutil
import socket
import time
from pathlib import Path
from statistics import median
from typing import Any

from benchmarks import broker
from benchmarks.admin import Admin
from benchmarks.config import Config
from benchmarks.nexmark.harness import (
    GROUP_JOIN_DELAY_MS,
    QUERIES,
    SYSTEMS,
    TITLES,
    Harness,
    Settings,
    body,
    delete_best_effort,
    med_range,
    ok_rates,
    pid_listening,
)
from benchmarks.progress import say

#: ``make bench``'s step defaults (``BENCH_NEXMARK_*`` override them): every query, on
#: lockgate and Flink, three interleaved runs, at parallelism 1 and 2. 1.5M events, not
#: the 2M of the long form: measured alone at 2M the step took 47.7 min at load 2-8,
#: about 29 min quiet by its per-run figures, over the ~25 min make bench has for it;
#: 1.5M: about 25 min quiet (docs/benchmarks.md, "Time budget")
STEP_EVENTS = 1_500_000
STEP_REPEAT = 3
STEP_QUERIES = list(QUERIES)
STEP_SYSTEMS = ["lockgate", "flink"]
STEP_PARALLELISMS = [1, 2]
#: the parallelism-2 broker's port is the first free pair (client, controller) from
#: ``make bench``'s port plus this
OWN_BROKER_PORT_OFFSET = 10


def bench_step(cfg: Config, admin: Admin, out_dir: Path, run_id: str) -> dict[str, Any]:
    """The ``nexmark`` step of ``make bench``.

    Runs the harness once per parallelism of ``BENCH_NEXMARK_PARALLELISMS`` (default
    :data:`STEP_PARALLELISMS`; each between 1 and the input's 4 partitions), one after the
    other, with ``BENCH_NEXMARK_EVENTS`` events (default :data:`STEP_EVENTS`),
    ``BENCH_NEXMARK_REPEAT`` interleaved runs per system and query (default
    :data:`STEP_REPEAT`), the queries ``BENCH_NEXMARK_QUERIES`` (default all) on
    ``BENCH_NEXMARK_SYSTEMS`` (default lockgate, flink; Quix Streams only at parallelism
    1). Flink runs every query of one parallelism in one PyFlink process
    (``BENCH_NEXMARK_FLINK_SHARED_JVM=0``: a fresh one per run).

    Parallelism 1 runs on ``make bench``'s broker (``cfg.bootstrap``, join delay 0) and
    deletes its topics there. Above 1 the step starts a broker of its own, with
    ``group.initial.rebalance.delay.ms`` :data:`GROUP_JOIN_DELAY_MS` so every lockgate
    instance is in its group's first assignment (``make bench``'s broker keeps 0 for the
    other steps): on the first free port pair from ``cfg.kafka_port +``
    :data:`OWN_BROKER_PORT_OFFSET`, its data in ``out_dir/nexmark/p<N>/kafka-<port>``; it
    is stopped and its data deleted (its server.log kept) before the next half or the
    return, whatever happened.

    Never raises: a failed setup, broker, query or run is a line of ``errors`` (a run that
    is not ok, e.g. ``late group``, too). Returns JSON-serialisable results:
    ``by_parallelism`` maps ``"1"``, ``"2"`` to the harness's results of that half,
    rendered by :func:`markdown_section`; also written to ``out_dir/nexmark/nexmark.json``.
    """
    t0 = time.monotonic()
    step_dir = out_dir / "nexmark"
    step_dir.mkdir(parents=True, exist_ok=True)
    run_name = f"step-{re.sub(r'[^A-Za-z0-9]', '', run_id)[-6:] or 'run'}"
    res: dict[str, Any] = {"by_parallelism": {}, "errors": []}
    try:
        parallelisms = _parallelisms()
    except ValueError as exc:
        res["errors"].append(f"BENCH_NEXMARK_PARALLELISMS: {exc}")
        parallelisms = []
    base = _settings(cfg, 1)
    unknown = sorted(
        set(_env_list("BENCH_NEXMARK_QUERIES", STEP_QUERIES)) - set(QUERIES)
        | set(_env_list("BENCH_NEXMARK_SYSTEMS", STEP_SYSTEMS)) - set(SYSTEMS)
    )
    if unknown:
        res["errors"].append(f"BENCH_NEXMARK_QUERIES / _SYSTEMS: unknown {unknown}, not run")
    res.update(
        {
            "queries": base.queries,
            "systems": base.systems,
            "events": base.events,
            "repeat": base.repeat,
            "parallelisms": parallelisms,
        }
    )
    for p in parallelisms:
        t = time.monotonic()
        say(f"nexmark step: parallelism {p}")
        try:
            half = _half(cfg, admin, step_dir / f"p{p}", run_name, p)
        except Exception as exc:  # noqa: BLE001 - the step never raises
            half = {"errors": [f"step: {exc!r}"], "runs": []}
        half["minutes"] = round((time.monotonic() - t) / 60, 2)
        res["by_parallelism"][str(p)] = half
        res["errors"] += [f"parallelism {p}: {e}" for e in half.get("errors", [])]
        for r in half.get("runs", []):
            if not r.get("ok"):
                res["errors"].append(
                    f"parallelism {p}: {r['query']} {r['system']} {r['tag']}: "
                    f"{r.get('status')}, {r.get('check')}"
                )
    res["step_minutes"] = round((time.monotonic() - t0) / 60, 2)
    try:
        (step_dir / "nexmark.json").write_text(json.dumps(res, indent=1, default=str))
    except OSError as exc:
        res["errors"].append(f"writing nexmark.json: {exc!r}")
    return json.loads(json.dumps(res, default=str))  # type: ignore[no-any-return]


def _half(cfg: Config, admin: Admin, out: Path, run_name: str, p: int) -> dict[str, Any]:
    """One parallelism's harness run: its results (``errors`` holds what failed)."""
    s = _settings(cfg, p)
    if p == 1:
        if cfg.external_broker:
            pid = pid_listening(int(cfg.external_broker.rsplit(":", 1)[1]))
            where = f"the existing broker at {cfg.bootstrap}"
        else:
            pid = broker.broker_pid(cfg.kafka_port)
            where = f"make bench's broker on {cfg.bootstrap}"
        res = _run_harness(s, admin, out, pid, run_name)
        res["broker"] = f"{where} (group.initial.rebalance.delay.ms 0)"
        return res
    port = _free_port_pair(cfg.kafka_port + OWN_BROKER_PORT_OFFSET)
    data = broker.data_dir(port, out)
    res = {"errors": [], "runs": []}
    own: Admin | None = None
    try:
        bootstrap = broker.up(port, group_join_delay_ms=GROUP_JOIN_DELAY_MS, under=out)
        own = Admin(bootstrap)
        res = _run_harness(s, own, out, broker.broker_pid(port, out), run_name)
        res["broker"] = (
            f"a broker of the step's own on {bootstrap} "
            f"(group.initial.rebalance.delay.ms {GROUP_JOIN_DELAY_MS})"
        )
    except Exception as exc:  # noqa: BLE001 - reported; the broker still goes down below
        res["errors"].append(f"the step's broker on port {port}: {exc!r}")
    finally:
        own = None  # its connections would complain once the broker is gone
        gc.collect()
        broker.down(port, under=out)
        _drop_data(data, out / "logs")
    return res


def _run_harness(
    s: Settings, admin: Admin, out: Path, pid: int | None, run_name: str
) -> dict[str, Any]:
    """Run the harness on ``admin``'s broker; delete its topics there afterwards."""
    harness = Harness(s, admin, out, pid, run_name=run_name)
    try:
        harness.run()
    except Exception as exc:  # noqa: BLE001 - recorded, the step goes on
        say(f"  !! nexmark step: {exc!r}")
        harness.results["errors"].append(f"harness: {exc!r}")
    finally:
        try:
            _delete_topics(admin, run_name)
        except Exception as exc:  # noqa: BLE001 - best effort
            harness.results["errors"].append(f"topic cleanup: {exc!r}")
    res = harness.results
    res["systems"] = s.systems
    return res


def _settings(cfg: Config, p: int) -> Settings:
    """The harness settings of one half (``BENCH_NEXMARK_*`` over the step defaults)."""
    s = Settings()
    s.events = _env_int("BENCH_NEXMARK_EVENTS", STEP_EVENTS)
    s.repeat = _env_int("BENCH_NEXMARK_REPEAT", STEP_REPEAT)
    s.queries = [q for q in _env_list("BENCH_NEXMARK_QUERIES", STEP_QUERIES) if q in QUERIES]
    s.systems = [x for x in _env_list("BENCH_NEXMARK_SYSTEMS", STEP_SYSTEMS) if x in SYSTEMS]
    # (unknown names are dropped here, and reported by bench_step)
    if p > 1:  # Quix Streams runs one process only
        s.systems = [x for x in s.systems if x != "quix"]
    s.run_timeout = max(cfg.run_timeout, 300)
    s.flink_shared_jvm = os.environ.get("BENCH_NEXMARK_FLINK_SHARED_JVM", "1") != "0"
    s.parallelism = p
    s.kafka_port = cfg.kafka_port
    s.external_broker = cfg.external_broker
    return s


def _parallelisms() -> list[int]:
    """``BENCH_NEXMARK_PARALLELISMS`` (default :data:`STEP_PARALLELISMS`), checked."""
    raw = _env_list("BENCH_NEXMARK_PARALLELISMS", [str(p) for p in STEP_PARALLELISMS])
    got = [int(x) for x in raw]
    partitions = Settings().partitions
    bad = [p for p in got if not 1 <= p <= partitions]
    if bad:
        raise ValueError(f"{bad}: each must be between 1 and {partitions} (the partitions)")
    return got


def _free_port_pair(start: int, tries: int = 50) -> int:
    """The first port from ``start`` that is free on 127.0.0.1, its next one too."""
    for port in range(start, start + 2 * tries, 2):
        if _free(port) and _free(port + 1):
            return port
    raise RuntimeError(f"no free port pair in {start}-{start + 2 * tries}")


def _free(port: int) -> bool:
    with socket.socket() as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def _drop_data(data: Path, logs: Path) -> None:
    """Delete a stopped broker's data dir (and lock file), keeping its server.log."""
    log = data / "server.log"
    if log.exists():
        logs.mkdir(parents=True, exist_ok=True)
        shutil.move(log, logs / f"broker-{data.name}.log")
    shutil.rmtree(data, ignore_errors=True)
    data.with_name(data.name + ".lock").unlink(missing_ok=True)


def _env_int(name: str, default: int) -> int:
    raw = os.environ.get(name, "").replace("_", "")
    return int(raw) if raw else default


def _env_list(name: str, default: list[str]) -> list[str]:
    raw = os.environ.get(name, "")
    return [x.strip() for x in raw.split(",") if x.strip()] if raw else list(default)


def _delete_topics(admin: Admin, run_name: str) -> None:
    """Delete the topics of this run (every one holds ``nexmark`` and its short name)."""
    short = run_name[-6:]
    delete_best_effort(admin, [t for t in admin.topics() if "nexmark" in t and short in t])


# --------------------------------------------------------------------------- report


def markdown_section(results: dict[str, Any]) -> list[str]:
    """The "## Nexmark: lockgate, Flink SQL and Quix Streams" section of RESULTS.md.

    ``results``: :func:`bench_step`'s. Per parallelism: a table of lockgate / Flink
    rate ratio and each system's CPU per million events, with ranges, then the harness's
    own sentences and table (benchmarks/nexmark/harness.py ``body``). Results of the step
    before it ran both parallelisms (the harness's results, no ``by_parallelism``) render
    as one parallelism-1 half.
    """
    halves = results.get("by_parallelism")
    if halves is None:
        halves = {"1": results}
    pars = ", ".join(halves) or "none"
    lines = [
        "## Nexmark: lockgate, Flink SQL and Quix Streams",
        "",
        f"Step `nexmark` of `make bench` ({results.get('step_minutes', 0):.1f} min): the "
        f"queries {', '.join(results.get('queries', QUERIES))} on "
        f"{', '.join(results.get('systems', SYSTEMS))} at parallelism {pars}, "
        f"{results.get('repeat', '?')} interleaved runs each "
        "(`python -m benchmarks.nexmark --systems lockgate,flink --flink-shared-jvm "
        "[--parallelism 2]` runs one half alone, into benchmarks/RESULTS-nexmark.md; "
        'method: docs/benchmarks.md, "Nexmark and Flink").',
        "",
    ]
    for p, half in halves.items():
        took = f", {half['minutes']:.1f} min" if half.get("minutes") is not None else ""
        lines += [f"### Parallelism {p}", ""]
        if half.get("broker"):
            lines += [f"On {half['broker']}{took}.", ""]
        lines += comparison_table(half.get("runs", []))
        lines += body(half)
    return lines


def comparison_table(runs: list[dict[str, Any]]) -> list[str]:
    """lockgate against Flink per query, from one parallelism's runs (ok runs only).

    Rate ratio: lockgate's median rate / Flink's; its range runs from lockgate's slowest
    run over Flink's fastest to lockgate's fastest over Flink's slowest. CPU: seconds per
    million input events, median (range). "both": the ratio of medians at least 1.0 and
    lockgate's median CPU below Flink's. No line for a query missing either system's ok
    runs; no table (an empty list) when no query has both.
    """
    rows = []
    for query in QUERIES:
        lg, fl = ok_rates(runs, query, "lockgate"), ok_rates(runs, query, "flink")
        if not lg or not fl:
            continue
        ratio = median(lg) / median(fl)
        lg_cpu, fl_cpu = _ok_cpu(runs, query, "lockgate"), _ok_cpu(runs, query, "flink")
        less_cpu = bool(lg_cpu and fl_cpu and median(lg_cpu) < median(fl_cpu))
        rows.append(
            f"| {query} {TITLES[query]} | {ratio:.2f}× ({min(lg) / max(fl):.2f}–"
            f"{max(lg) / min(fl):.2f}) | {med_range(lg)} | {med_range(fl)} | "
            f"{med_range(lg_cpu)} | {med_range(fl_cpu)} | "
            f"{'yes' if ratio >= 1.0 and less_cpu else 'no'} |"
        )
    if not rows:
        return []
    return [
        "lockgate / Flink: rate ratio of the medians (range: lockgate's slowest run over "
        "Flink's fastest to its fastest over Flink's slowest); CPU s per million input "
        "events; medians (ranges) of the runs that were ok. both: ratio ≥ 1.0 and "
        "lockgate's median CPU below Flink's.",
        "",
        "| query | lockgate / Flink rate | lockgate events/s | Flink events/s | "
        "lockgate CPU s / M | Flink CPU s / M | both |",
        "|---|---|---|---|---|---|---|",
        *rows,
        "",
    ]


def _ok_cpu(runs: list[dict[str, Any]], query: str, system: str) -> list[float]:
    """The CPU s per million events of the ok runs of ``system`` on ``query``."""
    return [
        r["cpu_s_per_m"]
        for r in runs
        if r["query"] == query
        and r["system"] == system
        and r.get("ok")
        and r.get("cpu_s_per_m") is not None
    ]
