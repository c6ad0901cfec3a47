"""`make run`: produce demo input, run examples/running_sum.py, print what it produced.

Uses fresh topic names on every run, runs the app as a real subprocess (the way
Kubernetes runs it), reads the output with read_committed and stops the app with
SIGTERM. Plain text on purpose: the demo needs nothing beyond lockgate's own
dependencies.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import orjson
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

RECORDS = [("alice", 5), ("bob", 3), ("alice", 7), ("carol", 1), ("bob", 4), ("alice", -2),
           ("carol", 10), ("bob", 8), ("alice", 1), ("carol", 2)]  # fmt: skip


def say(text: str) -> None:
    """Progress and errors go to stderr; the table goes to stdout."""
    print(text, file=sys.stderr, flush=True)


def table(title: str, header: list[str], rows: list[list[str]]) -> str:
    """A boxed text table: data rows separated by │, the header row by ┃."""
    widths = [max(len(c) for c in col) for col in zip(header, *rows, strict=True)]

    def line(cells: list[str], bar: str) -> str:
        return bar + bar.join(f" {c:<{w}} " for c, w in zip(cells, widths, strict=True)) + bar

    rule = "─" * (sum(widths) + 3 * len(widths) + 1)
    return "\n".join([title, rule, line(header, "┃"), rule, *(line(r, "│") for r in rows), rule])


def main() -> int:
    bootstrap = os.environ.get("LOCKGATE_BOOTSTRAP_SERVERS", "127.0.0.1:9092")
    run_id = uuid.uuid4().hex[:6]
    inp, outp, app = f"demo-numbers-{run_id}", f"demo-sums-{run_id}", f"demo-running-sum-{run_id}"
    admin = AdminClient({"bootstrap.servers": bootstrap})
    for fut in admin.create_topics([NewTopic(inp, 2, 1)]).values():
        fut.result(30)
    producer = Producer({"bootstrap.servers": bootstrap, "partitioner": "murmur2_random"})
    for seq, (key, v) in enumerate(RECORDS):
        producer.produce(inp, orjson.dumps({"v": v, "seq": seq}), key.encode())
    producer.flush(30)
    say(f"produced {len(RECORDS)} records to {inp} on {bootstrap}")

    state_dir = tempfile.mkdtemp(prefix="lockgate-demo-")
    env = {
        **os.environ,
        "LOCKGATE_BOOTSTRAP_SERVERS": bootstrap,
        "LOCKGATE_APP_NAME": app,
        "LOCKGATE_INPUT_TOPIC": inp,
        "LOCKGATE_OUTPUT_TOPIC": outp,
        "LOCKGATE_STATE_DIR": state_dir,
        "LOCKGATE_INSTANCE_ID": "demo-0",
        "LOCKGATE_HTTP_PORT": "0",
        "LOCKGATE_LOG_FORMAT": "console",
    }
    lockgate = Path(sys.executable).parent / "lockgate"
    say(f"running lockgate run examples.running_sum:app (app {app})")
    proc = subprocess.Popen([str(lockgate), "run", "examples.running_sum:app"], env=env)
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"demo-reader-{run_id}",
            "isolation.level": "read_committed",
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
        }
    )
    got = []
    deadline = time.monotonic() + 90
    try:
        while len(got) < len(RECORDS) and time.monotonic() < deadline:
            if proc.poll() is not None:
                say(f"the app exited with code {proc.returncode}")
                return 1
            md = consumer.list_topics(outp, timeout=5).topics[outp]
            if md.error is None and md.partitions and not consumer.assignment():
                consumer.assign([TopicPartition(outp, p, 0) for p in md.partitions])
            for msg in consumer.consume(100, 0.5):
                if msg.error() is None:
                    got.append(msg)
    finally:
        consumer.close()
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(60)
    rows = []
    for m in sorted(got, key=lambda m: orjson.loads(m.value())["seq"]):
        v = orjson.loads(m.value())
        rows.append([str(m.partition()), str(m.offset()), m.key().decode(),
                     str(v["sum"]), str(v["count"]), str(v["seq"])])  # fmt: skip
    header = ["partition", "offset", "key", "sum", "count", "seq"]
    print(table(f"committed output of {outp} (read_committed)", header, rows), flush=True)
    say(f"app stopped with exit code {code}")
    if len(got) != len(RECORDS):
        say(f"expected {len(RECORDS)} output records, got {len(got)}")
        return 1
    return code


if __name__ == "__main__":
    sys.exit(main())
