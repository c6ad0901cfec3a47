"""The seeded Nexmark generator (benchmarks/nexmark/generator.py): no broker."""

from collections import Counter

from benchmarks.nexmark.generator import (
    AUCTION,
    BASE_TIME,
    BID,
    PERSON,
    GenConfig,
    Generator,
    end_marker,
    event_time,
)


def _events(cfg: GenConfig) -> list[tuple[str, dict]]:
    return list(Generator(cfg).events())


def test_proportions_ids_and_keys() -> None:
    events = _events(GenConfig(events=5_000))
    kinds = Counter(v["event_type"] for _, v in events)
    assert (kinds[PERSON], kinds[AUCTION], kinds[BID]) == (100, 300, 4_600)  # 1:3:46
    # event 0 is person 1000, events 1-3 auctions 1000-1002 (Beam's layout)
    assert events[0][1]["person"]["id"] == 1000
    assert [v["auction"]["id"] for _, v in events[1:4]] == [1000, 1001, 1002]
    for key, v in events:
        t = v["event_type"]
        join_key = (
            v["person"]["id"] if t == PERSON else v["auction"]["seller"] if t == AUCTION
            else v["bid"]["auction"]
        )  # fmt: skip
        assert key == str(join_key)
    bids = [v["bid"] for _, v in events if v["event_type"] == BID]
    assert all(100 <= b["price"] <= 100_000_000 for b in bids)
    assert {a["auction"]["category"] for _, a in events if a["event_type"] == AUCTION} <= set(
        range(10, 15)
    )


def test_seeded_and_in_order() -> None:
    a, b = _events(GenConfig(events=2_000, seed=7)), _events(GenConfig(events=2_000, seed=7))
    assert a == b
    assert a != _events(GenConfig(events=2_000, seed=8))
    times = [event_time(v) for _, v in a]
    assert times == sorted(times)
    assert times[0] == BASE_TIME and times[-1] == BASE_TIME + 1999 // 10  # 10k events/s


def test_bounded_disorder() -> None:
    cfg = GenConfig(events=5_000, disorder_group=50, rate=1_000)
    times = [event_time(v) for _, v in _events(cfg)]
    assert times != sorted(times)
    newest = 0
    for t in times:
        assert newest - t <= cfg.disorder_ms()
        newest = max(newest, t)
    assert sorted(times) == [cfg.timestamp(n) for n in range(5_000)]  # a permutation


def test_end_marker_is_past_every_event() -> None:
    cfg = GenConfig(events=1_000)
    marker = end_marker(cfg)
    assert marker["event_type"] == 3 and event_time(marker) > cfg.last_timestamp() + 10_000
