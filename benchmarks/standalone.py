"""One section of the harness run on its own (``python -m benchmarks.pipeline`` ...)."""

from __future__ import annotations

import json
import os
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from benchmarks import broker
from benchmarks.admin import Admin
from benchmarks.config import Config
from benchmarks.machine import machine, uptime
from benchmarks.paths import BENCH_DIR
from benchmarks.progress import elapsed, say
from benchmarks.revision import revision


class Bench(Protocol):
    """What :func:`run_standalone` drives: ``run()`` returns the section's results;
    ``results`` holds them so far (kept when the run is interrupted)."""

    results: dict[str, Any]

    def run(self) -> dict[str, Any]: ...


@dataclass
class Standalone:
    """The outcome of :func:`run_standalone`."""

    out_dir: Path
    meta: dict[str, Any]
    results: dict[str, Any]
    code: int
    #: the JSON written to ``out_dir`` (``{"meta": ..., <section>: ...}``)
    doc: str


def run_standalone(
    cfg: Config,
    section: str,
    json_name: str,
    command: str,
    title: str,
    make_bench: Callable[[Admin, Path, str], Bench],
    *,
    keep_errors: bool = False,
) -> Standalone:
    """Run one section of the harness on its own: a fresh ``benchmarks/out/<timestamp>/``,
    the run's meta data, the harness's own broker (or ``BENCH_BROKER``'s, neither started
    nor stopped), the bench (Ctrl-C keeps the partial results, exit code 130; with
    ``keep_errors`` any other exception too, added to ``errors``), then
    ``out_dir/<json_name>`` with ``{"meta": ..., <section>: results}``.

    ``command`` is the command line for the meta data (``BENCH_BROKER=...`` is prepended
    when set), ``title`` starts the first progress line, ``make_bench(admin, out_dir,
    run_id)`` builds the bench.
    """
    stamp = time.strftime("%Y%m%d-%H%M%S")
    out_dir = BENCH_DIR / "out" / stamp
    out_dir.mkdir(parents=True, exist_ok=True)
    external = os.environ.get("BENCH_BROKER", "")
    meta: dict[str, Any] = {
        "started": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
        "command": (f"BENCH_BROKER={external} " if external else "") + command,
        "machine": machine(),
        "uptime_before": uptime(),
        "git": revision(),
    }
    say(f"{title}; output {out_dir}")
    res: dict[str, Any] = {}
    code = 0
    if external:
        bootstrap = external
        meta["broker"] = f"existing broker at {external} (not started or stopped by the harness)"
    else:
        bootstrap = broker.up(cfg.kafka_port)
        meta["broker"] = f"Kafka {broker.kafka_version()} started by the harness on {bootstrap}"
    try:
        admin = Admin(bootstrap)
        bench = make_bench(admin, out_dir, stamp[-6:])
        try:
            res = bench.run()
        except KeyboardInterrupt:
            code = 130
            res = bench.results
        except Exception as exc:
            if not keep_errors:
                raise
            say(f"harness error: {exc!r}")
            res = bench.results
            res["errors"].append(traceback.format_exc())
    finally:
        if not external:
            broker.down(cfg.kafka_port)
    meta["uptime_after"] = uptime()
    meta["git_after"] = revision()
    meta["total_minutes"] = elapsed() / 60
    doc = json.dumps({"meta": meta, section: res}, indent=1)
    (out_dir / json_name).write_text(doc)
    return Standalone(out_dir, meta, res, code, doc)
