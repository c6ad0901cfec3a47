"""The workloads on Faust (faust-streaming; runs in .cache/bench/venvs/faust).

Run: ``python -m benchmarks.apps.faust_app --loop=uvloop worker -l info``.

Tuned as its expert users would (the harness's client-tuning policy where Faust has the
knob): the uvloop event loop (``--loop=uvloop``, read by ``import faust``),
``stream_buffer_maxsize`` 16384 (default 4096), lz4, ``producer_linger`` 5 ms
at-least-once and 50 ms exactly-once (a longer batch per transaction), and at-least-once
outputs with ``send_soon`` (buffered, no await per record) instead of ``await send``.
Faust has no setting for the producer's retry backoff (aiokafka's 100 ms default stays).

Environment: BENCH_BOOTSTRAP, BENCH_INPUT, BENCH_OUTPUT, BENCH_GROUP, BENCH_WORKLOAD
(passthrough | sum | window), BENCH_GUARANTEE (alo | eos), BENCH_COMMIT_MS,
BENCH_WINDOW_MS, BENCH_WINDOW_DELAY_MS, BENCH_STATE_DIR, BENCH_PARTITIONS.

Tables use the RocksDB store (rocksdict). ``window`` is lockgate's window operator
written by hand (Faust's windowed tables close windows on a wall-clock timer, not in
event time, so they would not produce comparable output): per key a table entry with
its open tumbling windows, per partition the newest record timestamp and a heap of
(window end, key) in memory (not durable: enough for a run without restarts); a
window is emitted and purged when its partition's newest timestamp reaches
``end + BENCH_WINDOW_DELAY_MS``.
"""

from __future__ import annotations

import heapq
import os
from typing import Any

import faust

ENV = os.environ
WORKLOAD = ENV["BENCH_WORKLOAD"]
WINDOW_MS = int(ENV.get("BENCH_WINDOW_MS", "10000"))
DELAY_MS = int(ENV.get("BENCH_WINDOW_DELAY_MS", "0"))
PARTITIONS = int(ENV.get("BENCH_PARTITIONS", "8"))

EOS = ENV.get("BENCH_GUARANTEE") == "eos"

app = faust.App(
    ENV["BENCH_GROUP"],
    broker=f"kafka://{ENV['BENCH_BOOTSTRAP']}",
    store="rocksdb://",
    datadir=ENV["BENCH_STATE_DIR"],
    processing_guarantee="exactly_once" if EOS else "at_least_once",
    broker_commit_interval=int(ENV.get("BENCH_COMMIT_MS", "1000")) / 1000,
    consumer_auto_offset_reset="earliest",
    topic_partitions=PARTITIONS,
    web_enabled=False,
    # Batching and compression (Faust's default linger is 0): 5 ms as the other systems,
    # 50 ms under exactly-once (one transaction per commit interval).
    producer_linger=0.05 if EOS else 0.005,
    producer_compression_type="lz4",
    stream_buffer_maxsize=16384,
)
inp = app.topic(ENV["BENCH_INPUT"], key_serializer="raw", value_serializer="json")
out = app.topic(ENV["BENCH_OUTPUT"], key_serializer="raw", value_serializer="json")
table = app.Table("state", default=None, partitions=PARTITIONS)


@app.agent(inp)
async def process(stream: Any) -> None:
    if WORKLOAD == "passthrough":
        async for key, value in stream.items():
            out.send_soon(key=key, value=value)
    elif WORKLOAD == "sum":
        async for key, value in stream.items():
            t = table.get(key) or [0, 0]
            t = [t[0] + value["v"], t[1] + 1]
            table[key] = t
            result = {"sum": t[0], "count": t[1], "seq": value["seq"]}
            if EOS:
                await out.send(key=key, value=result)
            else:
                out.send_soon(key=key, value=result)
    else:
        newest: dict[int, int] = {}  # partition -> newest timestamp seen
        ends: dict[int, list[tuple[int, bytes]]] = {}  # partition -> heap of (end, key)
        async for event in stream.events():
            key = event.key
            p = event.message.partition
            ts = round(event.message.timestamp * 1000)
            start = ts - ts % WINDOW_MS
            top = newest.get(p, -1)
            if start + WINDOW_MS <= top - DELAY_MS:
                continue  # late
            wins = table.get(key) or {}
            c = wins.get(str(start))
            if c is None:
                heapq.heappush(ends.setdefault(p, []), (start + WINDOW_MS, key))
            wins[str(start)] = (c or 0) + 1
            table[key] = wins
            if ts > top:
                newest[p] = ts
                heap = ends[p]
                while heap and heap[0][0] <= ts - DELAY_MS:
                    end, k = heapq.heappop(heap)
                    wins = table[k]
                    count = wins.pop(str(end - WINDOW_MS))
                    if wins:
                        table[k] = wins
                    else:
                        del table[k]
                    await out.send(key=k, value={"start": end - WINDOW_MS, "count": count})


if __name__ == "__main__":
    app.main()
