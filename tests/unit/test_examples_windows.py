"""examples/sessions.py and examples/top_pages.py under the TestDriver (no broker).

One key group (``partitions=1``), so every record moves the same watermark: newest ``ts``
minus the example's max delay minus 1. Event times are small numbers (ms from 0). The
examples are imported with their defaults (no ``LOCKGATE_*`` variables set here).
"""

from __future__ import annotations

from typing import Any

from examples import sessions, top_pages
from processors.testing import Emitted, TestDriver

GAP = sessions.SESSION_GAP_MS
S_DELAY = sessions.MAX_DELAY_MS
SIZE, SLIDE, TOP_N = top_pages.WINDOW_MS, top_pages.SLIDE_MS, top_pages.TOP_N
T_DELAY = top_pages.MAX_DELAY_MS


def click(driver: TestDriver, user: str, ts: int, page: str, **kw: Any) -> list[Emitted]:
    return driver.send(user, {"ts": ts, "page": page}, **kw)


def values(emitted: list[Emitted], topic: str) -> list[Any]:
    return [(e.key, e.value) for e in emitted if e.topic == topic]


# ----------------------------------------------------------------------------- sessions


def test_a_session_fires_once_the_watermark_reaches_its_last_ms() -> None:
    d = TestDriver(sessions.app, partitions=1)
    assert click(d, "u", 1000, "/home") == []
    assert click(d, "u", 2000, "/cart") == []
    assert click(d, "u", 2500, "/home") == []
    # the session is [1000, 2500 + GAP); another user's clicks move the watermark
    end = 2500 + GAP
    assert click(d, "v", end - 1 + S_DELAY, "/x") == []  # watermark end - 2
    fired = click(d, "v", end + S_DELAY, "/x")  # watermark end - 1
    assert values(fired, "sessions") == [
        ("u", {"start": 1000, "end": end, "clicks": 3, "pages": ["/home", "/cart"]})
    ]
    assert values(d.emitted, "sessions") == values(fired, "sessions")  # once


def test_pages_are_ordered_by_first_visit_in_event_time_not_arrival() -> None:
    d = TestDriver(sessions.app, partitions=1)
    click(d, "u", 5000, "/b")
    click(d, "u", 4000, "/c")  # out of order, within the bound: first visit of /c
    click(d, "u", 6000, "/a")
    click(d, "u", 4000, "/a2")  # same first-visit time as /c: by name
    out = d.advance_watermark(6000 + GAP)
    assert values(out, "sessions") == [
        ("u", {"start": 4000, "end": 6000 + GAP, "clicks": 4, "pages": ["/a2", "/c", "/b", "/a"]})
    ]


def test_the_defaults_are_the_documented_ones() -> None:
    assert (GAP, S_DELAY) == (30_000, 5000)
    assert (SIZE, SLIDE, TOP_N, T_DELAY) == (60_000, 10_000, 3, 5000)
    assert (sessions.app.name, top_pages.app.name) == ("sessions", "top-pages")


def test_a_click_between_two_open_sessions_merges_them_even_beyond_the_bound() -> None:
    d = TestDriver(sessions.app, partitions=1)
    click(d, "u", 10_000, "/a")  # [10 000, 40 000)
    click(d, "u", 41_000, "/b")  # [41 000, 71 000): apart; watermark 35 999
    # 16 s older than the newest click (beyond the 5 s bound), but its window
    # [25 000, 55 000) overlaps both open sessions: merged, not late
    assert click(d, "u", 25_000, "/c") == []
    assert d.advance_watermark(70_998) == []
    out = d.advance_watermark(70_999)
    assert values(out, "sessions") == [
        ("u", {"start": 10_000, "end": 71_000, "clicks": 3, "pages": ["/a", "/c", "/b"]})
    ]


def test_clicks_exactly_a_gap_apart_are_two_sessions() -> None:
    d = TestDriver(sessions.app, partitions=1)
    click(d, "u", 0, "/a")
    click(d, "u", GAP, "/a")  # [0, GAP) and [GAP, 2 GAP) touch: no overlap
    out = d.advance_watermark(10**9)
    assert values(out, "sessions") == [
        ("u", {"start": 0, "end": GAP, "clicks": 1, "pages": ["/a"]}),
        ("u", {"start": GAP, "end": 2 * GAP, "clicks": 1, "pages": ["/a"]}),
    ]


def test_a_late_click_goes_unchanged_to_the_late_topic() -> None:
    d = TestDriver(sessions.app, partitions=1)
    click(d, "u", 100_000, "/a")
    fired = click(d, "v", 100_000 + GAP + S_DELAY, "/b")  # watermark = u's end - 1
    assert [e.value["clicks"] for e in fired] == [1]
    wm = d.watermark(0)
    late_ts = wm - GAP + 1  # its own session [late_ts, wm + 1) ends at the watermark
    out = click(d, "u", late_ts, "/c", headers=[("trace", b"t1")])
    assert out == [
        Emitted(
            "sessions.late",
            b"u",
            b'{"ts":%d,"page":"/c"}' % late_ts,
            [
                ("lockgate-late-window", f"{late_ts}-{late_ts + GAP}"),
                ("lockgate-late-watermark", str(wm)),
                ("lockgate-late-event-time", str(late_ts)),
                ("trace", b"t1"),
            ],
        )
    ]
    # 1 ms younger is on time: a new session (the fired one is gone)
    assert click(d, "u", late_ts + 1, "/d") == []
    out = d.advance_watermark(10**9)
    assert ("u", {"start": late_ts + 1, "end": late_ts + 1 + GAP, "clicks": 1,
                  "pages": ["/d"]}) in values(out, "sessions")  # fmt: skip


def test_sessions_survive_a_crash_exactly_once() -> None:
    d = TestDriver(sessions.app, partitions=1)
    click(d, "u", 1000, "/a")
    click(d, "u", 2000, "/b")
    d.commit()
    click(d, "u", 3000, "/c")
    d.advance_watermark(10**9)  # fires, uncommitted
    d.crash()
    assert values(d.emitted, "sessions") == []
    click(d, "u", 3000, "/c")  # the input again after the restart
    d.advance_watermark(10**9)
    d.commit()
    assert values(d.emitted, "sessions") == [
        ("u", {"start": 1000, "end": 3000 + GAP, "clicks": 3, "pages": ["/a", "/b", "/c"]})
    ]


def test_session_merge_is_order_independent() -> None:
    agg = sessions.SessionAggregator()
    a = agg.add({"ts": 5, "page": "/x"}, agg.add({"ts": 9, "page": "/y"}, agg.create_accumulator()))
    b = agg.add({"ts": 3, "page": "/y"}, agg.create_accumulator())
    assert agg.get_result(agg.merge(a, b)) == agg.get_result(agg.merge(b, a))
    assert agg.get_result(agg.merge(a, b)) == {"clicks": 3, "pages": ["/y", "/x"]}


# ----------------------------------------------------------------------------- top pages


def test_top_orders_by_views_then_name_and_cuts_at_n() -> None:
    assert top_pages.top({"/b": 2, "/a": 2, "/c": 5, "/d": 1}, 3) == [
        ["/c", 5],
        ["/a", 2],
        ["/b", 2],
    ]
    assert top_pages.top({"/z": 1}, 3) == [["/z", 1]]
    assert top_pages.top({}, 3) == []


def test_every_sliding_window_of_a_view_fires_with_its_counts() -> None:
    d = TestDriver(top_pages.app, partitions=1)
    t = 10 * SIZE + 1  # in SIZE / SLIDE windows
    for page in ["/a", "/b", "/b", "/c", "/d", "/d", "/d"]:
        d.send("site", {"ts": t, "page": page})
    out = d.advance_watermark(10**9)
    starts = [t - t % SLIDE - k * SLIDE for k in range(SIZE // SLIDE)][::-1]
    top = [["/d", 3], ["/b", 2], ["/a", 1]][:TOP_N]
    assert values(out, "top-pages") == [
        ("site", {"start": s, "end": s + SIZE, "top": top}) for s in starts
    ]


def test_windows_keep_counts_per_page_not_views() -> None:
    d = TestDriver(top_pages.app, partitions=1)
    for _ in range(50):
        d.send("site", {"ts": 1000, "page": "/a"})
    [store] = [name for name in top_pages.app.stores if name.startswith("window-")]
    stored = d.state(store, "site")
    # one slice of SLIDE ms holds the counts (the aggregator merges): a view updates it
    # alone, not each of the SIZE // SLIDE windows containing it
    assert stored == {f"s{1000 - 1000 % SLIDE}": [1000 - 1000 % SLIDE + SLIDE, {"/a": 50}]}


def test_a_partly_late_view_counts_only_in_windows_still_open() -> None:
    d = TestDriver(top_pages.app, partitions=1)
    d.send("s", {"ts": 600_000, "page": "/a"})  # windows starting 550 000 .. 600 000
    # watermark 609 999: [550 000, 610 000) fires, the other five are open
    fired = d.send("other", {"ts": 615_000, "page": "/x"})
    assert values(fired, "top-pages") == [
        ("s", {"start": 550_000, "end": 610_000, "top": [["/a", 1]]})
    ]
    assert d.send("s", {"ts": 600_000, "page": "/b"}) == []  # not late: 5 windows open
    out = d.advance_watermark(10**9)
    got = {v["start"]: v["top"] for k, v in values(out, "top-pages") if k == "s"}
    assert got == {s: [["/a", 1], ["/b", 1]] for s in range(560_000, 600_001, 10_000)}


def test_a_view_whose_every_window_fired_is_late() -> None:
    d = TestDriver(top_pages.app, partitions=1)
    d.send("s", {"ts": 605_000, "page": "/a"})
    assert d.watermark(0) == 599_999  # the last ms of [540 000, 600 000)
    # 549 999: its newest window is [540 000, 600 000), fired: late
    out = d.send("s", {"ts": 549_999, "page": "/late"}, headers=[("h", b"1")])
    starts = range(490_000, 540_001, 10_000)
    assert out == [
        Emitted(
            "top-pages.late",
            b"s",
            b'{"ts":549999,"page":"/late"}',
            [
                ("lockgate-late-window", ",".join(f"{s}-{s + 60_000}" for s in starts)),
                ("lockgate-late-watermark", "599999"),
                ("lockgate-late-event-time", "549999"),
                ("h", b"1"),
            ],
        )
    ]
    # 1 ms younger: in the open window [550 000, 610 000) only
    assert d.send("s", {"ts": 550_000, "page": "/b"}) == []
    out = d.advance_watermark(10**9)
    got = {v["start"]: v["top"] for _, v in values(out, "top-pages")}
    assert got[550_000] == [["/a", 1], ["/b", 1]]
    assert got[600_000] == [["/a", 1]]
