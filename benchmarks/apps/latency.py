"""End-to-end latency helpers, run as separate processes by the harness.

``produce BOOTSTRAP TOPIC RATE SECONDS KEYS OUT``: produce running-sum inputs at a fixed rate
(seq = index); write the wall-clock send time of every seq to OUT (float64 array).

``read BOOTSTRAP TOPIC PARTITIONS SECONDS OUT``: read the output with read_committed from the
start and write (seq, wall-clock receive time) pairs to OUT; stops after SECONDS or on
SIGTERM.
"""

from __future__ import annotations

import random
import signal
import sys
import time
from array import array

import orjson
from confluent_kafka import Consumer, Producer, TopicPartition

PAD = "x" * 60


def produce(bootstrap: str, topic: str, rate: float, seconds: float, keys: int, out: str) -> None:
    p = Producer(
        {
            "bootstrap.servers": bootstrap,
            "partitioner": "murmur2_random",
            "linger.ms": 1,
            "enable.idempotence": True,
        }
    )
    rng = random.Random(3)
    sent = array("d")
    total = int(rate * seconds)
    start = time.time() + 0.05
    for seq in range(total):
        due = start + seq / rate
        now = time.time()
        if due > now:
            time.sleep(due - now)
        key = b"k%07d" % rng.randrange(keys)
        sent.append(time.time())
        p.produce(topic, orjson.dumps({"v": 1, "seq": seq, "pad": PAD}), key)
        p.poll(0)
    p.flush(30)
    with open(out, "wb") as f:
        sent.tofile(f)


def read(bootstrap: str, topic: str, partitions: int, seconds: float, out: str) -> None:
    stop = [False]
    signal.signal(signal.SIGTERM, lambda *_: stop.__setitem__(0, True))
    c = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"latency-reader-{topic}",
            "enable.auto.commit": False,
            "isolation.level": "read_committed",
            "fetch.wait.max.ms": 5,
            "log_level": 0,
        }
    )
    c.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
    got = array("d")
    deadline = time.time() + seconds
    while not stop[0] and time.time() < deadline:
        for m in c.consume(500, 0.05):
            if m.error() is None:
                now = time.time()
                got.append(orjson.loads(m.value())["seq"])
                got.append(now)
    c.close()
    with open(out, "wb") as f:
        got.tofile(f)


if __name__ == "__main__":
    mode, bootstrap, *args = sys.argv[1:]
    if mode == "produce":
        produce(bootstrap, args[0], float(args[1]), float(args[2]), int(args[3]), args[4])
    else:
        read(bootstrap, args[0], int(args[1]), float(args[2]), args[3])
