"""The Nexmark queries Quix Streams can express, as Quix apps (run in the ``quix`` venv).

``python -m benchmarks.nexmark.quix_apps QUERY`` with ``BENCH_BOOTSTRAP``, ``BENCH_INPUT``,
``BENCH_OUTPUT``, ``BENCH_GROUP``, ``BENCH_STATE_DIR``, ``NEXMARK_DELAY_MS`` and
``NEXMARK_PARTITIONS`` set by the harness (benchmarks/nexmark/harness.py). Quix Streams and
the stdlib only (plus the generator's constants): this file runs in the Quix venv.

Every app: ``processing_guarantee="exactly-once"``, ``commit_interval=1`` s, the input's
event time from the value (``timestamp_extractor``: the event's ``dateTime``, the end
markers' ``end``), Quix's defaults otherwise (RocksDB state with changelog topics). The
output rows are those of lockgate's apps (benchmarks/nexmark/apps.py) and Flink's SQL.

- q0, q1, q2: ``filter`` + ``apply``.
- q3: one stateful ``apply`` keyed by the input's key (person id = seller): the same
  handler as lockgate's app (Quix's ``join_*`` operators cannot join a topic with itself,
  and persons and auctions share one topic).
- q8: Quix's ``tumbling_window(10 s, grace_ms=NEXMARK_DELAY_MS).reduce(...)`` per key
  (person id = seller) with ``final(closing_strategy="partition")``: a window closes when
  the highest event time seen on its partition passes its end + grace, which on this
  input is lockgate's watermark (``Watermarks.bounded``) per key group. The end markers
  go through the window (ignored by the reducer) to close the last windows.
- q7: ``group_by`` one key (a repartition topic: all bids in one partition, like
  lockgate's ``key_by``), then the tumbling window (max price, ties kept). Quix's
  partition closing is the highest time seen on the one partition, which mixes the input
  partitions as the consumer read them: the window's grace is ``MERGE_GRACE_MS`` (20 s,
  covering that skew), and a partition's end marker must not pass before the other
  partitions' bids: a stateful ``filter`` lets the markers through only once all
  ``NEXMARK_PARTITIONS`` have arrived (the end-of-input watermark, a minimum over the
  inputs, that lockgate and Flink have and Quix does not).
- q5: per auction, ``hopping_window(10 s, 2 s)`` counts (partition closing), each result
  timestamped ``end - 1``; the end markers join the results (``concat`` of a branch);
  ``group_by`` one key, the same marker gate, then ``tumbling_window(2 s,
  grace_ms=MERGE_GRACE_MS)`` keeping the auctions at the maximum count, ties included.
"""

from __future__ import annotations

import os
import sys
from typing import Any

from quixstreams import Application  # type: ignore[import-not-found,unused-ignore]

from benchmarks.nexmark.generator import AUCTION, BID, END, PERSON, event_time
from benchmarks.nexmark.rows import q0_row, q1_row

ENV = os.environ
DELAY_MS = int(ENV.get("NEXMARK_DELAY_MS", "4000"))
PARTITIONS = int(ENV.get("NEXMARK_PARTITIONS", "4"))
Q5_SIZE_MS, Q5_SLIDE_MS = 10_000, 2_000
Q7_SIZE_MS = 10_000
Q8_SIZE_MS = 10_000
Q3_STATES = frozenset({"OR", "ID", "CA"})
#: the grace of the windows after ``group_by`` (q5's second stage, q7): the repartition
#: topic holds the input partitions interleaved as Quix's consumer fetched them (we saw
#: more than 4 s of event time between partitions), and Quix closes by the highest time
#: seen there (no minimum over the inputs), so the grace covers that skew
MERGE_GRACE_MS = int(ENV.get("NEXMARK_QUIX_MERGE_GRACE_MS", "20000"))

#: the queries this module has (the others: benchmarks/nexmark/harness.py QUIX_CANNOT)
QUERIES = ("q0", "q1", "q2", "q3", "q5", "q7", "q8")


def _extract(value: Any, _headers: Any, _ts: int, _type: Any) -> int:
    return event_time(value)


def _q3(value: dict[str, Any], state: Any) -> list[dict[str, Any]]:
    """Persons in OR/ID/CA ⋈ their category-10 auctions (whichever comes second emits)."""
    t = value["event_type"]
    if t == PERSON:
        p = value["person"]
        if p["state"] not in Q3_STATES:
            return []
        row = [p["name"], p["city"], p["state"]]
        state.set("person", row)
        pending = state.get("pending") or []
        if pending:
            state.set("pending", [])
        return [{"name": row[0], "city": row[1], "state": row[2], "id": a} for a in pending]
    if t == AUCTION:
        a = value["auction"]
        if a["category"] != 10:
            return []
        row = state.get("person")
        if row is not None:
            return [{"name": row[0], "city": row[1], "state": row[2], "id": a["id"]}]
        pending = state.get("pending") or []
        pending.append(a["id"])
        state.set("pending", pending)
    return []


def _end_gate(value: dict[str, Any], state: Any) -> bool:
    """Pass every record but the end markers; the last partition's marker passes."""
    if value.get("event_type") != END:
        return True
    seen = (state.get("markers") or 0) + 1
    state.set("markers", seen)
    return bool(seen == PARTITIONS)


# --- q7: the bids at each tumbling window's highest price


def _q7_init(v: dict[str, Any]) -> list[Any]:
    return [-1, []] if v.get("event_type") == END else [v["price"], [v]]


def _q7_reduce(acc: list[Any], v: dict[str, Any]) -> list[Any]:
    if v.get("event_type") == END:
        return acc
    if v["price"] > acc[0]:
        return [v["price"], [v]]
    if v["price"] == acc[0]:
        acc[1].append(v)
    return acc


# --- q8: persons who opened an auction in the window they registered in


def _q8_init(v: dict[str, Any]) -> list[Any]:
    return _q8_reduce([None, False], v)


def _q8_reduce(acc: list[Any], v: dict[str, Any]) -> list[Any]:
    t = v["event_type"]
    if t == PERSON:
        acc[0] = [v["person"]["id"], v["person"]["name"]]
    elif t == AUCTION:
        acc[1] = True
    return acc


def _q8_rows(w: dict[str, Any]) -> list[dict[str, Any]]:
    person, auction = w["value"]
    if person is None or not auction:
        return []
    return [{"id": person[0], "name": person[1], "starttime": w["start"]}]


# --- q5: per hop window, the auctions with the most bids


def _q5_init(v: dict[str, Any]) -> list[int]:
    return [v["bid"]["auction"], 1] if v["event_type"] == BID else [0, 0]


def _q5_reduce(acc: list[int], v: dict[str, Any]) -> list[int]:
    if v["event_type"] == BID:
        return [v["bid"]["auction"], acc[1] + 1]
    return acc


def _q5_max_init(v: dict[str, Any]) -> list[Any]:
    return _q5_max_reduce([-1, []], v)


def _q5_max_reduce(acc: list[Any], v: dict[str, Any]) -> list[Any]:
    if v.get("event_type") == END:
        return acc
    if v["num"] > acc[0]:
        return [v["num"], [v["auction"]]]
    if v["num"] == acc[0]:
        acc[1].append(v["auction"])
    return acc


def build(query: str) -> Application:
    """The app of ``query``."""
    app = Application(
        broker_address=ENV["BENCH_BOOTSTRAP"],
        consumer_group=ENV["BENCH_GROUP"],
        auto_offset_reset="earliest",
        processing_guarantee="exactly-once",
        commit_interval=1.0,
        state_dir=ENV["BENCH_STATE_DIR"],
        loglevel="WARNING",
    )
    inp = app.topic(
        ENV["BENCH_INPUT"],
        key_deserializer="str",
        value_deserializer="json",
        timestamp_extractor=_extract,
    )
    out = app.topic(ENV["BENCH_OUTPUT"], key_serializer="str", value_serializer="json")
    sdf = app.dataframe(inp)
    if query == "q0":
        sdf = sdf.filter(lambda v: v["event_type"] == BID).apply(q0_row)
    elif query == "q1":
        sdf = sdf.filter(lambda v: v["event_type"] == BID).apply(q1_row)
    elif query == "q2":
        sdf = sdf.filter(lambda v: v["event_type"] == BID and v["bid"]["auction"] % 123 == 0)
        sdf = sdf.apply(lambda v: {"auction": v["bid"]["auction"], "price": v["bid"]["price"]})
    elif query == "q3":
        sdf = sdf.filter(lambda v: v["event_type"] in (PERSON, AUCTION))
        sdf = sdf.apply(_q3, stateful=True, expand=True)
    elif query == "q8":
        sdf = sdf.filter(lambda v: v["event_type"] != BID)
        win = sdf.tumbling_window(Q8_SIZE_MS, grace_ms=DELAY_MS)
        sdf = win.reduce(_q8_reduce, _q8_init).final(closing_strategy="partition")
        sdf = sdf.apply(_q8_rows, expand=True)
    elif query == "q7":
        sdf = sdf.filter(lambda v: v["event_type"] in (BID, END))
        sdf = sdf.apply(lambda v: q0_row(v) if v["event_type"] == BID else v)
        sdf = sdf.group_by(lambda v: "all", name="all")
        sdf = sdf.filter(_end_gate, stateful=True)
        win = sdf.tumbling_window(Q7_SIZE_MS, grace_ms=MERGE_GRACE_MS)
        sdf = win.reduce(_q7_reduce, _q7_init).final(closing_strategy="partition")
        sdf = sdf.apply(lambda w: w["value"][1], expand=True)
    elif query == "q5":
        sdf = sdf.filter(lambda v: v["event_type"] in (BID, END))
        win = sdf.hopping_window(Q5_SIZE_MS, Q5_SLIDE_MS, grace_ms=DELAY_MS)
        counts = win.reduce(_q5_reduce, _q5_init).final(closing_strategy="partition")
        counts = counts.filter(lambda w: w["value"][1] > 0)
        counts = counts.apply(
            lambda w: {"auction": w["value"][0], "num": w["value"][1], "end": w["end"]}
        )
        counts = counts.set_timestamp(lambda v, _k, _t, _h: v["end"] - 1)
        markers = sdf.filter(lambda v: v["event_type"] == END)
        sdf = counts.concat(markers)
        sdf = sdf.group_by(lambda v: "all", name="all")
        sdf = sdf.filter(_end_gate, stateful=True)
        win = sdf.tumbling_window(Q5_SLIDE_MS, grace_ms=MERGE_GRACE_MS)
        sdf = win.reduce(_q5_max_reduce, _q5_max_init).final(closing_strategy="partition")
        sdf = sdf.apply(
            lambda w: [{"auction": a, "num": w["value"][0]} for a in w["value"][1]], expand=True
        )
    else:
        raise SystemExit(f"quix_apps: no query {query}")
    sdf.to_topic(out)
    return app


def main() -> None:
    """Run the query of ``argv[1]`` until stopped."""
    build(sys.argv[1]).run()


if __name__ == "__main__":
    main()
