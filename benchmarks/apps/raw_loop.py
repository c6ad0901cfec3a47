"""The Python ceiling: a bare confluent-kafka consume -> JSON decode -> work -> encode -> produce.

At-least-once: every ``BENCH_COMMIT_MS`` flush the producer, then commit the consumer
positions. Exactly-once: a transaction per ``BENCH_COMMIT_MS`` with the input offsets
sent to it. State (running sum, open windows) lives in a dict: no changelog and no
local database, so it is not durable: an upper bound, not a competitor.

Environment: BENCH_BOOTSTRAP, BENCH_INPUT, BENCH_OUTPUT, BENCH_GROUP, BENCH_WORKLOAD
(passthrough | sum | window), BENCH_GUARANTEE (alo | eos), BENCH_COMMIT_MS,
BENCH_WINDOW_MS.
"""

from __future__ import annotations

import os
import signal
import time

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
    producer = Producer(pconf)
    if EOS:
        producer.init_transactions(60)
        producer.begin_transaction()
    consumer.subscribe([INPUT])
    loads, dumps = orjson.loads, orjson.dumps
    produce, poll = producer.produce, producer.poll
    state: dict[bytes, list[int]] = {}
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
                w = m.timestamp()[1] // WINDOW_MS
                t = state.get(key)
                if t is None:
                    state[key] = [w, 1]
                elif t[0] == w:
                    t[1] += 1
                elif w > t[0]:
                    emit(key, dumps({"start": t[0] * WINDOW_MS, "count": t[1]}))
                    state[key] = [w, 1]
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
