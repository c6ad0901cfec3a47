"""The workloads on Quix Streams (runs in .cache/bench/venvs/quix).

Environment: BENCH_BOOTSTRAP, BENCH_INPUT, BENCH_OUTPUT, BENCH_GROUP, BENCH_WORKLOAD
(passthrough | sum | window), BENCH_GUARANTEE (alo | eos), BENCH_COMMIT_MS,
BENCH_WINDOW_MS, BENCH_WINDOW_DELAY_MS, BENCH_STATE_DIR.

``window`` uses Quix's own tumbling window on the record timestamps (Quix's default
event time): ``tumbling_window(duration_ms=BENCH_WINDOW_MS,
grace_ms=BENCH_WINDOW_DELAY_MS).count().final(closing_strategy="partition")``. With
the ``partition`` closing strategy a window closes once the highest timestamp seen on
its partition (any key) passes its end + grace, which is lockgate's watermark
semantics with ``Watermarks.bounded(BENCH_WINDOW_DELAY_MS)``: the same windows close,
with the same counts. (Quix's default strategy, ``key``, closes a key's windows only
on that key's own records: other windows, another model.)
"""

from __future__ import annotations

import os
from typing import Any

from quixstreams import Application

ENV = os.environ
WORKLOAD = ENV["BENCH_WORKLOAD"]
WINDOW_MS = int(ENV.get("BENCH_WINDOW_MS", "10000"))
DELAY_MS = int(ENV.get("BENCH_WINDOW_DELAY_MS", "0"))


def add(value: dict[str, Any], state: Any) -> dict[str, Any]:
    t = state.get("t") or [0, 0]
    t = [t[0] + value["v"], t[1] + 1]
    state.set("t", t)
    return {"sum": t[0], "count": t[1], "seq": value["seq"]}


def main() -> None:
    app = Application(
        broker_address=ENV["BENCH_BOOTSTRAP"],
        consumer_group=ENV["BENCH_GROUP"],
        auto_offset_reset="earliest",
        processing_guarantee=(
            "exactly-once" if ENV.get("BENCH_GUARANTEE") == "eos" else "at-least-once"
        ),
        commit_interval=int(ENV.get("BENCH_COMMIT_MS", "1000")) / 1000,
        state_dir=ENV["BENCH_STATE_DIR"],
        loglevel="WARNING",
    )
    inp = app.topic(ENV["BENCH_INPUT"], key_deserializer="str", value_deserializer="json")
    out = app.topic(ENV["BENCH_OUTPUT"], key_serializer="str", value_serializer="json")
    sdf = app.dataframe(inp)
    if WORKLOAD == "sum":
        sdf = sdf.apply(add, stateful=True)
    elif WORKLOAD == "window":
        window = sdf.tumbling_window(duration_ms=WINDOW_MS, grace_ms=DELAY_MS).count()
        sdf = window.final(closing_strategy="partition")
        sdf = sdf.apply(lambda w: {"start": w["start"], "count": w["value"]})
    sdf.to_topic(out)
    app.run()


if __name__ == "__main__":
    main()
