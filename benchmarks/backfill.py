"""Backfill throughput against one live instance, on the same input.

Usage: .venv/bin/python -m benchmarks.backfill BOOTSTRAP RECORDS [MASTER]

Pre-produces RECORDS inputs of examples/running_sum.py (2 partitions, 10k keys), then

1. one live instance (``lockgate run``, exactly once) from the start: records/s between the
   first and the last output record's timestamp (start-up excluded);
2. ``lockgate backfill`` on MASTER (default ``local[2]``, one task per key group): records/s
   over the job's tasks (records / the slowest task's seconds: Spark start-up excluded) and
   over the whole command's wall time.

Prints one line per measurement; ``make bench`` does not run it (it needs Spark and takes
about a minute for 200k records).
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import orjson
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic

from benchmarks.quick_running_sum import run_and_time

ROOT = Path(__file__).resolve().parent.parent
PARTITIONS = 2


def _produce(bs: str, topic: str, n: int) -> None:
    p = Producer({"bootstrap.servers": bs, "partitioner": "murmur2_random", "linger.ms": 50})
    for i in range(n):
        while True:
            try:
                p.produce(topic, orjson.dumps({"v": i % 13, "seq": i}), f"key-{i % 10000}".encode())
                break
            except BufferError:
                p.poll(0.1)
    p.flush()


def _live(bs: str, env: dict[str, str], out: str, n: int) -> float:
    got, first, last = run_and_time(bs, env, out, n)
    if got < n or first is None or last is None:
        raise SystemExit(f"live: only {got}/{n} outputs arrived")
    return n / ((last - first) / 1000)


def main() -> int:
    if len(sys.argv) not in (3, 4):
        print(__doc__, file=sys.stderr)
        return 2
    bs, n = sys.argv[1], int(sys.argv[2])
    master = sys.argv[3] if len(sys.argv) == 4 else "local[2]"
    rid = uuid.uuid4().hex[:6]
    inp = f"bf-bench-in-{rid}"
    admin = AdminClient({"bootstrap.servers": bs})
    for fut in admin.create_topics([NewTopic(inp, PARTITIONS, 1)]).values():
        fut.result(30)
    _produce(bs, inp, n)
    print(f"produced {n} records to {inp} ({PARTITIONS} partitions)", file=sys.stderr)
    base = {
        **os.environ,
        "LOCKGATE_BOOTSTRAP_SERVERS": bs,
        "LOCKGATE_INPUT_TOPIC": inp,
        "LOCKGATE_LOG_LEVEL": "WARNING",
        "LOCKGATE_SAVEPOINT_DIR": tempfile.mkdtemp(prefix="lockgate-bf-sp-"),
    }
    live_out = f"bf-bench-live-{rid}"
    live_env = {
        **base,
        "LOCKGATE_APP_NAME": f"bf-bench-live-{rid}",
        "LOCKGATE_OUTPUT_TOPIC": live_out,
        "LOCKGATE_STATE_DIR": tempfile.mkdtemp(prefix="lockgate-bf-live-"),
        "LOCKGATE_HTTP_PORT": "0",
    }
    live_rate = _live(bs, live_env, live_out, n)
    print(f"live, one instance: {n} records, {live_rate:,.0f} records/s")
    bf_env = {
        **base,
        "LOCKGATE_APP_NAME": f"bf-bench-bf-{rid}",
        "LOCKGATE_OUTPUT_TOPIC": f"bf-bench-bf-{rid}",
    }
    lockgate = Path(sys.executable).parent / "lockgate"
    started = time.monotonic()
    done = subprocess.run(
        [str(lockgate), "backfill", "examples.running_sum:app", "--master", master, "--json"],
        env=bf_env, cwd=ROOT, capture_output=True, text=True, check=False,
    )  # fmt: skip
    wall = time.monotonic() - started
    if done.returncode != 0:
        print(done.stderr[-3000:], file=sys.stderr)
        return 1
    out = done.stdout.strip()
    summary = orjson.loads(out[: out.rindex("\n")])
    slowest = max(t["seconds"] for t in summary["tasks"])
    records = summary["records"]
    print(
        f"backfill {master}: {records} records, tasks {records / slowest:,.0f} records/s "
        f"(slowest task {slowest:.1f}s, {len(summary['tasks'])} tasks), whole command "
        f"{records / wall:,.0f} records/s ({wall:.1f}s incl. Spark start-up); "
        f"tasks / live = {records / slowest / live_rate:.2f}x"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
