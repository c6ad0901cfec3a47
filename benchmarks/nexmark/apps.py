"""The Nexmark queries as lockgate apps (``lockgate run benchmarks.nexmark.apps:<name>``).

Input: the events topic of benchmarks/nexmark/generator.py (``BENCH_INPUT``): JSON
``{"event_type", "person", "auction", "bid"}``, keyed by the event's join key (a person's
id, an auction's seller, a bid's auction), end markers (``event_type`` 3) last. Output:
``BENCH_OUTPUT``. Event time is the event's ``dateTime`` with bounded out-of-orderness
``NEXMARK_DELAY_MS`` (the harness sets it to at least the generator's disorder bound).
Two-stage queries (q5, q7) re-key through ``NEXMARK_STAGE_TOPIC``: ``<query>_a`` writes
it, ``<query>_b`` reads it (two processes, like any lockgate pipeline).

The semantics are the Nexmark Flink suite's SQL (benchmarks/nexmark/flink_job.py), written
from the semantics rather than translated; each app's docstring says what it emits.
"""

from __future__ import annotations

import os
from typing import Any

from benchmarks.nexmark.generator import AUCTION, BID, PERSON, event_time
from benchmarks.nexmark.rows import q0_row, q1_row
from processors import App, Context, Sliding, Tumbling, Watermarks, WindowResult

INPUT = os.environ.get("BENCH_INPUT", "nexmark-events")
OUTPUT = os.environ.get("BENCH_OUTPUT", "nexmark-out")
STAGE = os.environ.get("NEXMARK_STAGE_TOPIC", "nexmark-stage")
DELAY_MS = int(os.environ.get("NEXMARK_DELAY_MS", "4000"))

#: window sizes of the Nexmark Flink SQL
Q5_SIZE_MS, Q5_SLIDE_MS = 10_000, 2_000
Q7_SIZE_MS = 10_000
Q8_SIZE_MS = 10_000


def _is_bid(v: dict[str, Any]) -> bool:
    return v["event_type"] == BID  # type: ignore[no-any-return]


# --- q0: pass-through -------------------------------------------------------------------


q0 = App("nexmark-q0")
q0.stream(INPUT).filter(_is_bid).map(q0_row).to(OUTPUT)


# --- q1: currency conversion ------------------------------------------------------------


q1 = App("nexmark-q1")
q1.stream(INPUT).filter(_is_bid).map(q1_row).to(OUTPUT)


# --- q2: selection ----------------------------------------------------------------------


def _q2_match(v: dict[str, Any]) -> bool:
    return v["event_type"] == BID and v["bid"]["auction"] % 123 == 0  # type: ignore[no-any-return]


q2 = App("nexmark-q2")
(
    q2.stream(INPUT)
    .filter(_q2_match)
    .map(lambda v: {"auction": v["bid"]["auction"], "price": v["bid"]["price"]})
    .to(OUTPUT)
)


# --- q3: local item suggestion (persons ⋈ auctions, unwindowed) -------------------------
#
# The events are keyed by the join key (person id = auction seller), so a person and
# their auctions meet in one key's state: the person (when in OR, ID or CA) and the ids
# of category-10 auctions seen before the person. Whichever side comes second emits.

q3 = App("nexmark-q3")
q3_person: Any = q3.value_state("person")  # [name, city, state]
q3_pending: Any = q3.value_state("pending")  # auction ids waiting for their seller

Q3_STATES = frozenset({"OR", "ID", "CA"})


@q3.process(INPUT, outputs=[OUTPUT])
def _q3(key: str, value: dict[str, Any], ctx: Context) -> None:
    t = value["event_type"]
    if t == PERSON:
        p = value["person"]
        if p["state"] not in Q3_STATES:
            return
        row = [p["name"], p["city"], p["state"]]
        q3_person.update(row)
        for aid in q3_pending.value() or ():
            ctx.emit(OUTPUT, key, {"name": row[0], "city": row[1], "state": row[2], "id": aid})
        q3_pending.update([])
    elif t == AUCTION:
        a = value["auction"]
        if a["category"] != 10:
            return
        row = q3_person.value()
        if row is not None:
            ctx.emit(OUTPUT, key, {"name": row[0], "city": row[1], "state": row[2], "id": a["id"]})
        else:
            pending = q3_pending.value() or []
            pending.append(a["id"])
            q3_pending.update(pending)


# --- q5: hot items (sliding windows, two stages) ----------------------------------------


class AuctionCount:
    """Bids of one auction in a window: ``[auction, count]``."""

    def create_accumulator(self) -> list[int]:
        """No bid yet."""
        return [0, 0]

    def add(self, value: dict[str, Any], acc: list[int]) -> list[int]:
        """One more bid."""
        acc[0] = value["bid"]["auction"]
        acc[1] += 1
        return acc

    def get_result(self, acc: list[int]) -> list[int]:
        """``[auction, count]``."""
        return acc

    def merge(self, a: list[int], b: list[int]) -> list[int]:
        """Two slices of one auction's bids: the counts add (so the sliding window keeps
        one accumulator per 2 s slice, as Flink's hop windows share slices)."""
        if b[1]:
            a[0] = b[0]
        a[1] += b[1]
        return a


class MaxCount:
    """The auctions with the highest count of one window: ``[max, [auction, ...]]``."""

    def create_accumulator(self) -> list[Any]:
        """Nothing yet."""
        return [-1, []]

    def add(self, value: dict[str, Any], acc: list[Any]) -> list[Any]:
        """One auction's count."""
        if value["num"] > acc[0]:
            acc[0], acc[1] = value["num"], [value["auction"]]
        elif value["num"] == acc[0]:
            acc[1].append(value["auction"])
        return acc

    def get_result(self, acc: list[Any]) -> list[Any]:
        """``[max, auctions]``."""
        return acc


def _q5_count_row(w: WindowResult[list[int]]) -> dict[str, int]:
    return {"auction": w.value[0], "num": w.value[1], "start": w.start}


def _q5_hot_rows(w: WindowResult[list[Any]]) -> list[dict[str, int]]:
    n, auctions = w.value
    return [{"auction": a, "num": n} for a in auctions]


# Stage a: bids per auction per hop window (the input is keyed by auction), re-keyed by
# the window start. Stage b: per window (each hop window's results carry the event time
# end - 1, so they fall in one tumbling bin of the slide), the auctions at the maximum.
q5_a = App("nexmark-q5-a")
(
    q5_a.stream(INPUT, timestamp=event_time, watermarks=Watermarks.bounded(DELAY_MS))
    .filter(_is_bid)
    .window(Sliding(Q5_SIZE_MS, Q5_SLIDE_MS))
    .aggregate(AuctionCount())
    .map(_q5_count_row)
    .key_by(lambda v: str(v["start"]), STAGE)
)
q5_b = App("nexmark-q5-b")
(
    q5_b.stream(STAGE, watermarks=Watermarks.bounded(0))
    .window(Tumbling(Q5_SLIDE_MS))
    .aggregate(MaxCount())
    .flat_map(_q5_hot_rows)
    .to(OUTPUT)
)


# --- q7: highest bid per tumbling window (two stages) -----------------------------------


class MaxBids:
    """The bids at the highest price of one window: ``[max price, [bid, ...]]``."""

    def create_accumulator(self) -> list[Any]:
        """Nothing yet."""
        return [-1, []]

    def add(self, value: dict[str, Any], acc: list[Any]) -> list[Any]:
        """One more bid."""
        if value["price"] > acc[0]:
            acc[0], acc[1] = value["price"], [value]
        elif value["price"] == acc[0]:
            acc[1].append(value)
        return acc

    def get_result(self, acc: list[Any]) -> list[Any]:
        """``[max price, bids at it]``."""
        return acc


def _q7_rows(w: WindowResult[list[Any]]) -> list[dict[str, Any]]:
    return w.value[1]  # type: ignore[no-any-return]


# Stage a: the bids (their q0 row) re-keyed to one key; stage b: per tumbling window,
# the bids at the window's maximum price. (Flink's SQL also matches a bid whose time is
# exactly the window's end to that window's maximum; see docs/benchmarks.md.)
q7_a = App("nexmark-q7-a")
(
    q7_a.stream(INPUT, timestamp=event_time, watermarks=Watermarks.bounded(DELAY_MS))
    .filter(_is_bid)
    .map(q0_row)
    .key_by(lambda v: "all", STAGE)
)
q7_b = App("nexmark-q7-b")
(
    q7_b.stream(STAGE, timestamp=lambda v: v["dateTime"], watermarks=Watermarks.bounded(0))
    .window(Tumbling(Q7_SIZE_MS))
    .aggregate(MaxBids())
    .flat_map(_q7_rows)
    .to(OUTPUT)
)


# --- q8: new users (persons and auctions in the same tumbling window) -------------------


class NewUser:
    """Per person id and window: ``[name or None, saw an auction]``."""

    def create_accumulator(self) -> list[Any]:
        """Nothing yet."""
        return [None, False]

    def add(self, value: dict[str, Any], acc: list[Any]) -> list[Any]:
        """A person registering, or an auction of this seller."""
        if value["event_type"] == PERSON:
            acc[0] = [value["person"]["id"], value["person"]["name"]]
        else:
            acc[1] = True
        return acc

    def get_result(self, acc: list[Any]) -> list[Any]:
        """``[[id, name] or None, saw an auction]``."""
        return acc


def _q8_rows(w: WindowResult[list[Any]]) -> list[dict[str, Any]]:
    person, auction = w.value
    if person is None or not auction:
        return []
    return [{"id": person[0], "name": person[1], "starttime": w.start}]


def _q8_input(v: dict[str, Any]) -> bool:
    return v["event_type"] in (PERSON, AUCTION)


q8 = App("nexmark-q8")
(
    q8.stream(INPUT, timestamp=event_time, watermarks=Watermarks.bounded(DELAY_MS))
    .filter(_q8_input)
    .window(Tumbling(Q8_SIZE_MS))
    .aggregate(NewUser())
    .flat_map(_q8_rows)
    .to(OUTPUT)
)
