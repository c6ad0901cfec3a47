"""The workloads on Faust (faust-streaming; runs in .cache/bench/venvs/faust).

Run: ``python -m benchmarks.apps.faust_app worker -l info``.

Environment: BENCH_BOOTSTRAP, BENCH_INPUT, BENCH_OUTPUT, BENCH_GROUP, BENCH_WORKLOAD
(passthrough | sum | window), BENCH_GUARANTEE (alo | eos), BENCH_COMMIT_MS,
BENCH_WINDOW_MS, BENCH_STATE_DIR, BENCH_PARTITIONS.

Tables use the RocksDB store (rocksdict). ``window`` is the same keyed-state handler as
the lockgate app (Faust's windowed tables close windows on a wall-clock timer, not per
key in event time, so they would not produce comparable output).
"""

from __future__ import annotations

import os
from typing import Any

import faust

ENV = os.environ
WORKLOAD = ENV["BENCH_WORKLOAD"]
WINDOW_MS = int(ENV.get("BENCH_WINDOW_MS", "10000"))
PARTITIONS = int(ENV.get("BENCH_PARTITIONS", "8"))

app = faust.App(
    ENV["BENCH_GROUP"],
    broker=f"kafka://{ENV['BENCH_BOOTSTRAP']}",
    store="rocksdb://",
    datadir=ENV["BENCH_STATE_DIR"],
    processing_guarantee=(
        "exactly_once" if ENV.get("BENCH_GUARANTEE") == "eos" else "at_least_once"
    ),
    broker_commit_interval=int(ENV.get("BENCH_COMMIT_MS", "1000")) / 1000,
    consumer_auto_offset_reset="earliest",
    topic_partitions=PARTITIONS,
    web_enabled=False,
    # Same batching and compression as the other systems (Faust's default linger is 0).
    producer_linger=0.005,
    producer_compression_type="lz4",
)
inp = app.topic(ENV["BENCH_INPUT"], key_serializer="raw", value_serializer="json")
out = app.topic(ENV["BENCH_OUTPUT"], key_serializer="raw", value_serializer="json")
table = app.Table("state", default=None, partitions=PARTITIONS)


@app.agent(inp)
async def process(stream: Any) -> None:
    if WORKLOAD == "passthrough":
        async for key, value in stream.items():
            await out.send(key=key, value=value)
    elif WORKLOAD == "sum":
        async for key, value in stream.items():
            t = table.get(key) or [0, 0]
            t = [t[0] + value["v"], t[1] + 1]
            table[key] = t
            await out.send(key=key, value={"sum": t[0], "count": t[1], "seq": value["seq"]})
    else:
        async for event in stream.events():
            key = event.key
            w = round(event.message.timestamp * 1000) // WINDOW_MS
            cur = table.get(key)
            if cur is None:
                table[key] = [w, 1]
            elif cur[0] == w:
                table[key] = [w, cur[1] + 1]
            elif w > cur[0]:
                await out.send(key=key, value={"start": cur[0] * WINDOW_MS, "count": cur[1]})
                table[key] = [w, 1]


if __name__ == "__main__":
    app.main()
