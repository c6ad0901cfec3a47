"""The Python ceiling: a bare confluent-kafka consume -> JSON decode -> work -> encode -> produce.

Client tuning (the harness's one policy, the same as lockgate's clients): producer
``linger.ms`` 5, ``compression.type`` lz4, idempotent, and ``retry.backoff.ms`` 10 under
exactly-once; consumer ``fetch.wait.max.ms`` 100, ``fetch.queue.backoff.ms`` 20.

At-least-once: every ``BENCH_COMMIT_MS`` flush the producer, then commit the consumer
positions. Exactly-once: a transaction per ``BENCH_COMMIT_MS`` with the input offsets
sent to it. State (running sum, open windows) lives in a dict: no changelog and no
local database, so it is not durable: an upper bound, not a competitor.

``window`` does what lockgate's window operator does, by hand: per key a dict of open
tumbling windows (record timestamp = event time), per partition the newest timestamp
seen and a heap of (window end, key); a window closes, and is emitted, when its
partition's newest timestamp reaches ``end + BENCH_WINDOW_DELAY_MS``; a record whose
window closed already is late and dropped.

Environment: BENCH_BOOTSTRAP, BENCH_INPUT, BENCH_OUTPUT, BENCH_GROUP, BENCH_WORKLOAD
(passthrough | sum | window), BENCH_GUARANTEE (alo | eos), BENCH_COMMIT_MS,
BENCH_WINDOW_MS, BENCH_WINDOW_DELAY_MS.
"""

from __future__ import annotations

import heapq
import os
import signal
import time
from typing import Any

import orjson
from confluent_kafka import Consumer, Producer

ENV = os.environ
BOOTSTRAP = ENV["BENCH_BOOTSTRAP"]
INPUT = ENV["BENCH_INPUT"]
OUTPUT = ENV["BENCH_OUTPUT"]
GROUP = ENV["BENCH_GROUP"]
WORKLOAD = ENV["BENCH_WORKLOAD"]
EOS = ENV.get("BENCH_GUARANTEE", "alo") == "eos"
COMMIT_S = int(ENV.get("BENCH_COMMIT_MS", "1000")) / 1000
WINDOW_MS = int(ENV.get("BENCH_WINDOW_MS", "10000"))
DELAY_MS = int(ENV.get("BENCH_WINDOW_DELAY_MS", "0"))

stop = False


def _stop(*_: object) -> None:
    global stop
    stop = True


def main() -> None:
    signal.signal(signal.SIGTERM, _stop)
    signal.signal(signal.SIGINT, _stop)
    consumer = Consumer(
        {
            "bootstrap.servers": BOOTSTRAP,
            "group.id": GROUP,
            "enable.auto.commit": False,
            "auto.offset.reset": "earliest",
            "isolation.level": "read_committed" if EOS else "read_uncommitted",
            "fetch.wait.max.ms": 100,
            "fetch.queue.backoff.ms": 20,
        }
    )
    pconf = {
        "bootstrap.servers": BOOTSTRAP,
        "partitioner": "murmur2_random",
        "linger.ms": 5,
        "compression.type": "lz4",
        "enable.idempotence": True,
    }
    if EOS:
        pconf["transactional.id"] = f"{GROUP}-raw"
        # The client-tuning policy of the harness (lockgate's producer under exactly-once,
        # processors/_kafka/clients.py): a short first backoff, so a retriable
        # CONCURRENT_TRANSACTIONS right after a commit does not cost librdkafka's 100 ms.
        pconf["retry.backoff.ms"] = 10
    producer = Producer(pconf)
    if EOS:
        producer.init_transactions(60)
        producer.begin_transaction()
    consumer.subscribe([INPUT])
    loads, dumps = orjson.loads, orjson.dumps
    produce, poll = producer.produce, producer.poll
    state: dict[bytes, Any] = {}
    newest: dict[int, int] = {}  # window: partition -> newest timestamp seen
    ends: dict[int, list[tuple[int, bytes]]] = {}  # window: partition -> heap of (end, key)
    late = 0
    next_commit = time.monotonic() + COMMIT_S
    dirty = False

    def emit(key: bytes, value: bytes) -> None:
        while True:
            try:
                produce(OUTPUT, value, key)
                return
            except BufferError:
                poll(0.05)

    while not stop:
        msgs = consumer.consume(1000, 0.1)
        for m in msgs:
            if m.error() is not None:
                continue
            key = m.key()
            value = loads(m.value())
            if WORKLOAD == "passthrough":
                emit(key, dumps(value))
            elif WORKLOAD == "sum":
                t = state.get(key)
                if t is None:
                    t = state[key] = [0, 0]
                t[0] += value["v"]
                t[1] += 1
                emit(key, dumps({"sum": t[0], "count": t[1], "seq": value["seq"]}))
            else:
                p = m.partition()
                ts = m.timestamp()[1]
                start = ts - ts % WINDOW_MS
                top = newest.get(p, -1)
                if start + WINDOW_MS <= top - DELAY_MS:
                    late += 1
                    continue
                wins = state.get(key)
                if wins is None:
                    wins = state[key] = {}
                c = wins.get(start)
                if c is None:
                    wins[start] = 1
                    heapq.heappush(ends.setdefault(p, []), (start + WINDOW_MS, key))
                else:
                    wins[start] = c + 1
                if ts > top:
                    newest[p] = ts
                    heap = ends[p]
                    limit = ts - DELAY_MS
                    while heap and heap[0][0] <= limit:
                        end, k = heapq.heappop(heap)
                        open_ = state[k]
                        start = end - WINDOW_MS
                        emit(k, dumps({"start": start, "count": open_.pop(start)}))
                        if not open_:
                            del state[k]
        if msgs:
            dirty = True
            poll(0)
        now = time.monotonic()
        if now >= next_commit:
            next_commit = now + COMMIT_S
            if dirty:
                commit(consumer, producer)
                dirty = False
    if dirty:
        commit(consumer, producer)
    if late:
        print(f"window: {late} late records dropped", flush=True)
    consumer.close()
    producer.flush(10)


def commit(consumer: Consumer, producer: Producer) -> None:
    positions = [tp for tp in consumer.position(consumer.assignment()) if tp.offset >= 0]
    if EOS:
        producer.send_offsets_to_transaction(positions, consumer.consumer_group_metadata(), 30)
        producer.commit_transaction(30)
        producer.begin_transaction()
    else:
        producer.flush(30)
        if positions:
            consumer.commit(offsets=positions, asynchronous=False)


if __name__ == "__main__":
    main()
