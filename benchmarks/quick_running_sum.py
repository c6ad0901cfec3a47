"""Quick throughput of examples/running_sum.py, one instance (the spine issue's "simple script").

Usage: .venv/bin/python -m benchmarks.quick_running_sum BOOTSTRAP RECORDS GUARANTEE

Pre-produces RECORDS inputs (8 partitions, 100k keys), starts `lockgate run`, reads the
output with read_committed and reports records/s between the first and the last output
record's timestamp (startup excluded). `make bench` is the real benchmark.
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
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

ROOT = Path(__file__).resolve().parent.parent


def run_and_time(
    bs: str, env: dict[str, str], out: str, n: int, spec: str = "examples.running_sum:app"
) -> tuple[int, int | None, int | None]:
    """Run ``lockgate run SPEC`` until ``n`` outputs are committed.

    Returns (outputs read, first output timestamp, last output timestamp); stops the app.
    """
    lockgate = Path(sys.executable).parent / "lockgate"
    proc = subprocess.Popen(
        [str(lockgate), "run", spec], env=env, cwd=ROOT,
        stderr=subprocess.DEVNULL,
    )  # fmt: skip
    c = Consumer(
        {
            "bootstrap.servers": bs,
            "group.id": f"quick-reader-{uuid.uuid4().hex[:6]}",
            "isolation.level": "read_committed",
            "auto.offset.reset": "earliest",
        }
    )
    while True:
        md = c.list_topics(out, timeout=10).topics[out]
        if md.error is None and md.partitions:
            break
        time.sleep(0.2)
    c.assign([TopicPartition(out, q, 0) for q in md.partitions])
    got, first, last = 0, None, None
    deadline = time.monotonic() + 600
    while got < n and time.monotonic() < deadline and proc.poll() is None:
        for m in c.consume(10000, 1.0):
            if m.error():
                continue
            ts = m.timestamp()[1]
            first = ts if first is None else min(first, ts)
            last = ts if last is None else max(last, ts)
            got += 1
    proc.terminate()
    proc.wait(60)
    c.close()
    return got, first, last


def main() -> int:
    if len(sys.argv) != 4:
        print(__doc__, file=sys.stderr)
        return 2
    bs, n, guarantee = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    rid = uuid.uuid4().hex[:6]
    inp, out = f"quick-in-{rid}", f"quick-out-{rid}"
    admin = AdminClient({"bootstrap.servers": bs})
    for fut in admin.create_topics([NewTopic(inp, 8, 1)]).values():
        fut.result(30)
    p = Producer({"bootstrap.servers": bs, "partitioner": "murmur2_random", "linger.ms": 50})
    for i in range(n):
        while True:
            try:
                p.produce(inp, orjson.dumps({"v": i % 13, "seq": i}), f"key-{i % 100000}".encode())
                break
            except BufferError:
                p.poll(0.1)
    p.flush()
    print(f"produced {n} records to {inp}", file=sys.stderr)
    env = {
        **os.environ,
        "LOCKGATE_BOOTSTRAP_SERVERS": bs,
        "LOCKGATE_APP_NAME": f"quick-{rid}",
        "LOCKGATE_INPUT_TOPIC": inp,
        "LOCKGATE_OUTPUT_TOPIC": out,
        "LOCKGATE_STATE_DIR": tempfile.mkdtemp(prefix="lockgate-quick-"),
        "LOCKGATE_GUARANTEE": guarantee,
        "LOCKGATE_HTTP_PORT": "0",
        "LOCKGATE_LOG_FORMAT": "console",
    }
    got, first, last = run_and_time(bs, env, out, n)
    if got < n or first is None or last is None:
        print(f"only {got}/{n} outputs arrived", file=sys.stderr)
        return 1
    span = (last - first) / 1000
    print(f"{guarantee}: {n} records, {span:.2f}s first->last output, {n / span:,.0f} records/s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
