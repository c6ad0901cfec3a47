"""The workloads on Quix Streams (runs in .cache/bench/venvs/quix).

Environment: BENCH_BOOTSTRAP, BENCH_INPUT, BENCH_OUTPUT, BENCH_GROUP, BENCH_WORKLOAD
(passthrough | sum | window), BENCH_GUARANTEE (alo | eos), BENCH_COMMIT_MS,
BENCH_WINDOW_MS, BENCH_WINDOW_DELAY_MS, BENCH_STATE_DIR, BENCH_QUIX_WINDOW (native |
handler, default native).

Client tuning (the harness's one policy, the same as lockgate's clients), through
``producer_extra_config`` / ``consumer_extra_config``: producer ``linger.ms`` 5,
``compression.type`` lz4, ``retry.backoff.ms`` 10 under exactly-once; consumer
``fetch.wait.max.ms`` 100, ``fetch.queue.backoff.ms`` 20.

``window`` with BENCH_QUIX_WINDOW=native uses Quix's own tumbling window on the record
timestamps (Quix's default event time): ``tumbling_window(duration_ms=BENCH_WINDOW_MS,
grace_ms=BENCH_WINDOW_DELAY_MS).count().final(closing_strategy="partition")``. With
the ``partition`` closing strategy a window closes once the highest timestamp seen on
its partition (any key) passes its end + grace, which is lockgate's watermark
semantics with ``Watermarks.bounded(BENCH_WINDOW_DELAY_MS)``: the same windows close,
with the same counts. (Quix's default strategy, ``key``, closes a key's windows only
on that key's own records: other windows, another model.)

With BENCH_QUIX_WINDOW=handler it runs the same per-record handler as the raw loop and
Faust (``sdf.apply(stateful=True)``): per key a state entry with its open windows (Quix
RocksDB state + changelog), per partition the newest record timestamp and a heap of
(window end, key) in memory (not durable, as in the Faust app: enough for a run without
restarts); a window is emitted (``{"start", "count"}`` keyed by its key) and removed when
its partition's newest timestamp reaches ``end + BENCH_WINDOW_DELAY_MS``. Other keys'
entries are reached through the partition's state transaction (``as_state(prefix=key)``,
what Quix itself does per record).
"""

from __future__ import annotations

import heapq
import os
from typing import Any

from quixstreams import Application, message_context

ENV = os.environ
WORKLOAD = ENV["BENCH_WORKLOAD"]
EOS = ENV.get("BENCH_GUARANTEE") == "eos"
WINDOW_MS = int(ENV.get("BENCH_WINDOW_MS", "10000"))
DELAY_MS = int(ENV.get("BENCH_WINDOW_DELAY_MS", "0"))
QUIX_WINDOW = ENV.get("BENCH_QUIX_WINDOW", "native")


def add(value: dict[str, Any], state: Any) -> dict[str, Any]:
    t = state.get("t") or [0, 0]
    t = [t[0] + value["v"], t[1] + 1]
    state.set("t", t)
    return {"sum": t[0], "count": t[1], "seq": value["seq"]}


NEWEST: dict[int, int] = {}  # partition -> newest timestamp seen
ENDS: dict[int, list[tuple[int, str]]] = {}  # partition -> heap of (window end, key)


def window_handler(
    value: Any, key: str, timestamp: int, headers: Any, state: Any
) -> list[dict[str, Any]]:
    """The raw loop's / Faust's window logic on Quix state; returns the closed windows."""
    p = message_context().partition
    start = timestamp - timestamp % WINDOW_MS
    top = NEWEST.get(p, -1)
    if start + WINDOW_MS <= top - DELAY_MS:
        return []  # late (the input has none)
    wins = state.get("w") or {}
    c = wins.get(str(start))
    if c is None:
        heapq.heappush(ENDS.setdefault(p, []), (start + WINDOW_MS, key))
    wins[str(start)] = (c or 0) + 1
    state.set("w", wins)
    out: list[dict[str, Any]] = []
    if timestamp > top:
        NEWEST[p] = timestamp
        heap = ENDS[p]
        limit = timestamp - DELAY_MS
        while heap and heap[0][0] <= limit:
            end, k = heapq.heappop(heap)
            st = state if k == key else state._transaction.as_state(prefix=k)  # noqa: SLF001
            open_ = st.get("w")
            s = end - WINDOW_MS
            count = open_.pop(str(s))
            if open_:
                st.set("w", open_)
            else:
                st.delete("w")
            out.append({"key": k, "start": s, "count": count})
    return out


def main() -> None:
    producer_extra: dict[str, Any] = {"linger.ms": 5, "compression.type": "lz4"}
    if EOS:
        producer_extra["retry.backoff.ms"] = 10
    app = Application(
        broker_address=ENV["BENCH_BOOTSTRAP"],
        consumer_group=ENV["BENCH_GROUP"],
        auto_offset_reset="earliest",
        processing_guarantee="exactly-once" if EOS else "at-least-once",
        commit_interval=int(ENV.get("BENCH_COMMIT_MS", "1000")) / 1000,
        state_dir=ENV["BENCH_STATE_DIR"],
        loglevel="WARNING",
        producer_extra_config=producer_extra,
        consumer_extra_config={"fetch.wait.max.ms": 100, "fetch.queue.backoff.ms": 20},
    )
    inp = app.topic(ENV["BENCH_INPUT"], key_deserializer="str", value_deserializer="json")
    out = app.topic(ENV["BENCH_OUTPUT"], key_serializer="str", value_serializer="json")
    sdf = app.dataframe(inp)
    if WORKLOAD == "sum":
        sdf = sdf.apply(add, stateful=True)
    elif WORKLOAD == "window" and QUIX_WINDOW == "handler":
        sdf = sdf.apply(window_handler, stateful=True, metadata=True, expand=True)
        # the window's key, taken out of the value before it is serialized
        sdf.to_topic(out, key=lambda v: v.pop("key"))
        app.run()
        return
    elif WORKLOAD == "window":
        window = sdf.tumbling_window(duration_ms=WINDOW_MS, grace_ms=DELAY_MS).count()
        sdf = window.final(closing_strategy="partition")
        sdf = sdf.apply(lambda w: {"start": w["start"], "count": w["value"]})
    sdf.to_topic(out)
    app.run()


if __name__ == "__main__":
    main()
