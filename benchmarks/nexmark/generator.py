"""A seeded generator of the Nexmark data model (persons, auctions, bids), written to Kafka.

The algorithm follows Beam's Nexmark generator (notes: ../shared/reference/nexmark.md §1),
with one ``random.Random(seed)`` for the whole stream instead of Beam's per-event seeds,
so a run is reproducible from ``(seed, events, rate, disorder)``:

- event id ``n`` (from 0, like Beam): ``n % 50 == 0`` a person, ``1..3`` an auction,
  ``4..49`` a bid (1:3:46); person id ``1000 + n // 50``, auction id
  ``1000 + (n // 50) * 3 + rem - 1``;
- ``seller``: 3/4 the hot seller ``(lastPerson // 100) * 100``, else uniform over the last
  1000 persons plus 10 not created yet; ``bid.auction``: 1/2 the hot auction
  ``(lastAuction // 100) * 100``, else uniform on ``[max(last - 100, 0), last + 10]``;
  ``bidder``: 3/4 ``(lastPerson // 100) * 100 + 1``, else like a seller;
- ``price``/``initialBid`` log-uniform ``round(10 ** (6U) * 100)`` cents, ``reserve =
  initialBid + price``; ``category`` 10..14; ``state`` from AZ CA ID OR WA WY; ``extra``
  pads persons/auctions/bids to about 200/500/100 bytes;
- event time ``BASE_TIME + floor(n * 1e6 / rate) / 1000`` ms (Beam's fixed base time,
  2015-07-15T00:00:00Z, one generator);
- bounded disorder: Beam's ``outOfOrderGroupSize`` g — within each group of g events,
  event ``n`` takes the content and timestamp of ``base + (n * 953) % g`` — so no event is
  more than ``disorder_ms(g, rate)`` older than one before it. g = 1 is in order.

Wire format (the ``ddl_kafka.sql`` shape of the Nexmark Flink suite, one topic): a JSON
object ``{"event_type": 0|1|2, "person": {...}|null, "auction": {...}|null,
"bid": {...}|null}``; ``dateTime`` and ``expires`` are epoch milliseconds (numbers, so
neither system parses text timestamps). The record key is the event's join key, as a
producer of these events would set it: a person's ``id``, an auction's ``seller``, a
bid's ``auction`` (UTF-8 decimal), placed by the murmur2 partitioner
(``partitioner=murmur2_random``), so persons and their auctions share a partition.

After the events, one end marker per partition, ``{"event_type": 3, "end": <ms>}`` with a
time past every window: it moves each partition's watermark past the last windows
(lockgate has no end-of-input watermark; Flink's bounded source has one anyway). Every
query ignores event type 3.
"""

from __future__ import annotations

import math
import random
import string
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

BASE_TIME = 1_436_918_400_000  # 2015-07-15T00:00:00Z, Beam's NexmarkUtils.BASE_TIME
FIRST_PERSON_ID = 1000
FIRST_AUCTION_ID = 1000
FIRST_CATEGORY_ID = 10
NUM_CATEGORIES = 5
PROPORTION_DENOMINATOR = 50  # 1 person + 3 auctions + 46 bids
PERSON_PROPORTION = 1
AUCTION_PROPORTION = 3
HOT_AUCTION_RATIO = 2
HOT_SELLER_RATIO = 4
HOT_BIDDER_RATIO = 4
NUM_IN_FLIGHT_AUCTIONS = 100
NUM_ACTIVE_PEOPLE = 1000
PERSON_ID_LEAD = 10
AUCTION_ID_LEAD = 10
#: average sizes the ``extra`` field pads to (Beam's avg{Person,Auction,Bid}ByteSize)
AVG_PERSON_BYTES = 200
AVG_AUCTION_BYTES = 500
AVG_BID_BYTES = 100
#: how far past the last event the end markers are (ms): past every window of the queries
END_MARKER_LEAD_MS = 60_000

US_STATES = ["AZ", "CA", "ID", "OR", "WA", "WY"]
US_CITIES = [
    "Phoenix",
    "Los Angeles",
    "San Francisco",
    "Boise",
    "Portland",
    "Bend",
    "Redmond",
    "Seattle",
    "Kent",
    "Cheyenne",
]
FIRST_NAMES = "Peter Paul Luke John Saul Vicky Kate Julie Sarah Deiter Walter".split()
LAST_NAMES = "Shultz Abrams Spencer White Bartels Walton Smith Jones Noris".split()
CHANNELS = ["Google", "Facebook", "Baidu", "Apple"]

PERSON, AUCTION, BID, END = 0, 1, 2, 3


@dataclass(frozen=True)
class GenConfig:
    """What a generated stream depends on (same config: same events, byte for byte)."""

    events: int = 100_000
    #: events per second of event time (Beam's default first rate)
    rate: int = 10_000
    seed: int = 42
    #: Beam's outOfOrderGroupSize: 1 = in order
    disorder_group: int = 1

    @property
    def delay_us(self) -> float:
        """Event-time microseconds between consecutive events."""
        return 1e6 / self.rate

    def timestamp(self, n: int) -> int:
        """Event time (epoch ms) of event number ``n``."""
        return BASE_TIME + math.floor(n * self.delay_us) // 1000

    def disorder_ms(self) -> int:
        """Upper bound on how much older an event can be than any event before it."""
        if self.disorder_group <= 1:
            return 0
        return math.ceil(self.disorder_group * self.delay_us / 1000) + 1

    def last_timestamp(self) -> int:
        """The newest event time of the stream."""
        return self.timestamp(self.events - 1) if self.events else BASE_TIME

    def end_time(self) -> int:
        """The end markers' time."""
        return self.last_timestamp() + END_MARKER_LEAD_MS


def event_number(n: int, group: int) -> int:
    """Beam's ``nextAdjustedEventNumber``: the permuted number of the ``n``-th event."""
    if group <= 1:
        return n
    base = (n // group) * group
    offset = (n * 953) % group
    return base + offset


def _last_base0_person_id(event_id: int) -> int:
    return event_id // PROPORTION_DENOMINATOR


def _last_base0_auction_id(event_id: int) -> int:
    epoch = event_id // PROPORTION_DENOMINATOR
    offset = event_id % PROPORTION_DENOMINATOR
    if offset < PERSON_PROPORTION:
        epoch -= 1
        offset = AUCTION_PROPORTION - 1
    elif offset >= PERSON_PROPORTION + AUCTION_PROPORTION:
        offset = AUCTION_PROPORTION - 1
    else:
        offset -= PERSON_PROPORTION
    return epoch * AUCTION_PROPORTION + offset


class Generator:
    """Iterates the events of one :class:`GenConfig` as ``(key, value dict)``."""

    def __init__(self, cfg: GenConfig) -> None:
        self.cfg = cfg
        self.rnd = random.Random(cfg.seed)
        # A pool of random letters to cut strings from (cheap and seeded).
        pool_rnd = random.Random(cfg.seed ^ 0x5EED)
        self._pool = "".join(pool_rnd.choices(string.ascii_lowercase, k=1 << 16))

    def _string(self, n: int) -> str:
        off = self.rnd.randrange(len(self._pool) - n)
        return self._pool[off : off + n]

    def _extra(self, current: int, desired: int) -> str:
        if current >= desired:
            return ""
        desired += self.rnd.randint(-desired // 5, desired // 5)  # ±20 %, like Beam
        return self._string(max(0, desired - current))

    def _price(self) -> int:
        return int(round(10.0 ** (self.rnd.random() * 6.0) * 100.0))

    def _next_base0_person_id(self, event_id: int) -> int:
        num_people = _last_base0_person_id(event_id) + 1
        active = min(num_people, NUM_ACTIVE_PEOPLE)
        n = self.rnd.randrange(active + PERSON_ID_LEAD)
        return num_people - active + n

    def _next_base0_auction_id(self, event_id: int) -> int:
        max_auction = _last_base0_auction_id(event_id)
        min_auction = max(max_auction - NUM_IN_FLIGHT_AUCTIONS, 0)
        return min_auction + self.rnd.randrange(max_auction - min_auction + 1 + AUCTION_ID_LEAD)

    def person(self, event_id: int, ts: int) -> dict[str, Any]:
        """The person of event ``event_id``."""
        rnd = self.rnd
        pid = FIRST_PERSON_ID + _last_base0_person_id(event_id)
        name = f"{rnd.choice(FIRST_NAMES)} {rnd.choice(LAST_NAMES)}"
        email = f"{self._string(7)}@{self._string(5)}.com"
        card = " ".join(f"{rnd.randrange(10000):04d}" for _ in range(4))
        city, state = rnd.choice(US_CITIES), rnd.choice(US_STATES)
        size = 8 + len(name) + len(email) + len(card) + len(city) + len(state) + 8
        return {
            "id": pid,
            "name": name,
            "emailAddress": email,
            "creditCard": card,
            "city": city,
            "state": state,
            "dateTime": ts,
            "extra": self._extra(size, AVG_PERSON_BYTES),
        }

    def auction(self, event_id: int, ts: int) -> dict[str, Any]:
        """The auction of event ``event_id``."""
        rnd = self.rnd
        aid = FIRST_AUCTION_ID + _last_base0_auction_id(event_id)
        if rnd.randrange(HOT_SELLER_RATIO) > 0:
            seller = (_last_base0_person_id(event_id) // 100) * 100
        else:
            seller = self._next_base0_person_id(event_id)
        seller += FIRST_PERSON_ID
        category = FIRST_CATEGORY_ID + rnd.randrange(NUM_CATEGORIES)
        initial = self._price()
        expires = ts + 10_000 + rnd.randrange(100_000)
        item, desc = self._string(20), self._string(100)
        size = 8 + len(item) + len(desc) + 8 + 8 + 8 + 8 + 8
        return {
            "id": aid,
            "itemName": item,
            "description": desc,
            "initialBid": initial,
            "reserve": initial + self._price(),
            "dateTime": ts,
            "expires": expires,
            "seller": seller,
            "category": category,
            "extra": self._extra(size, AVG_AUCTION_BYTES),
        }

    def bid(self, event_id: int, ts: int) -> dict[str, Any]:
        """The bid of event ``event_id``."""
        rnd = self.rnd
        if rnd.randrange(HOT_AUCTION_RATIO) > 0:
            auction = (_last_base0_auction_id(event_id) // 100) * 100
        else:
            auction = self._next_base0_auction_id(event_id)
        auction += FIRST_AUCTION_ID
        if rnd.randrange(HOT_BIDDER_RATIO) > 0:
            bidder = (_last_base0_person_id(event_id) // 100) * 100 + 1
        else:
            bidder = self._next_base0_person_id(event_id)
        bidder += FIRST_PERSON_ID
        price = self._price()
        if rnd.randrange(2) == 0:
            channel = rnd.choice(CHANNELS)
        else:
            channel = f"channel-{rnd.randrange(10000)}"
        url = f"https://www.nexmark.com/{self._string(5)}/item.htm?query=1"
        return {
            "auction": auction,
            "bidder": bidder,
            "price": price,
            "channel": channel,
            "url": url,
            "dateTime": ts,
            "extra": self._extra(8 + 8 + 8 + 8, AVG_BID_BYTES),
        }

    def events(self) -> Iterator[tuple[str, dict[str, Any]]]:
        """Every event of the stream, in stream order: ``(key, value)``."""
        cfg = self.cfg
        for i in range(cfg.events):
            n = event_number(i, cfg.disorder_group)
            ts = cfg.timestamp(n)
            rem = n % PROPORTION_DENOMINATOR
            if rem < PERSON_PROPORTION:
                p = self.person(n, ts)
                yield (
                    str(p["id"]),
                    {"event_type": PERSON, "person": p, "auction": None, "bid": None},
                )
            elif rem < PERSON_PROPORTION + AUCTION_PROPORTION:
                a = self.auction(n, ts)
                yield (
                    str(a["seller"]),
                    {"event_type": AUCTION, "person": None, "auction": a, "bid": None},
                )
            else:
                b = self.bid(n, ts)
                yield (
                    str(b["auction"]),
                    {"event_type": BID, "person": None, "auction": None, "bid": b},
                )


def end_marker(cfg: GenConfig) -> dict[str, Any]:
    """The value of the end marker written to every partition after the events."""
    return {"event_type": END, "person": None, "auction": None, "bid": None, "end": cfg.end_time()}


def event_time(value: dict[str, Any]) -> int:
    """The event time (epoch ms) of an event value, end markers included."""
    t = value["event_type"]
    if t == BID:
        return int(value["bid"]["dateTime"])
    if t == AUCTION:
        return int(value["auction"]["dateTime"])
    if t == PERSON:
        return int(value["person"]["dateTime"])
    return int(value["end"])


def produce(bootstrap: str, topic: str, partitions: int, cfg: GenConfig) -> int:
    """Write the stream of ``cfg`` and one end marker per partition to ``topic``; return
    the number of records written (events + markers)."""
    import orjson
    from confluent_kafka import Producer

    producer = Producer(
        {
            "bootstrap.servers": bootstrap,
            "partitioner": "murmur2_random",
            "linger.ms": 50,
            "batch.size": 1_000_000,
            "compression.type": "lz4",
            "enable.idempotence": True,
            "queue.buffering.max.messages": 500_000,
        }
    )
    errors: list[str] = []

    def on_delivery(err: Any, _msg: Any) -> None:
        if err is not None:
            errors.append(str(err))

    count = 0
    dumps = orjson.dumps
    for key, value in Generator(cfg).events():
        while True:
            try:
                producer.produce(topic, dumps(value), key.encode(), on_delivery=on_delivery)
                break
            except BufferError:
                producer.poll(0.05)
        count += 1
        if count % 10_000 == 0:
            producer.poll(0)
    marker = dumps(end_marker(cfg))
    for p in range(partitions):
        producer.produce(topic, marker, b"end", partition=p, on_delivery=on_delivery)
        count += 1
    producer.flush(120)
    if errors:
        raise RuntimeError(f"{len(errors)} events not written: {errors[0]}")
    return count
