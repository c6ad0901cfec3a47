"""Bounded runs' pure parts: parsing ``--until`` and deciding that an instance is done."""

from __future__ import annotations

from typing import Any

import pytest
from confluent_kafka import KafkaError

from processors._runtime.bounded import BoundedRun, parse_until
from processors.exceptions import ConfigError


class _Msg:
    def __init__(self, topic: str, partition: int, offset: int, eof: bool = False) -> None:
        self._t, self._p, self._o, self._eof = topic, partition, offset, eof

    def topic(self) -> str:
        return self._t

    def partition(self) -> int:
        return self._p

    def offset(self) -> int:
        return self._o

    def error(self) -> Any:
        return KafkaError(KafkaError._PARTITION_EOF) if self._eof else None  # noqa: SLF001


def test_parse_until() -> None:
    assert parse_until("now").time_ms is None and not parse_until("now").offsets
    assert parse_until("1700000000000").time_ms == 1_700_000_000_000
    assert parse_until("2023-11-14T22:13:20Z").time_ms == 1_700_000_000_000
    assert parse_until("2023-11-14T22:13:20").time_ms == 1_700_000_000_000  # UTC
    assert parse_until("offsets:orders:0=5,1=7;customers:0=2").offsets == {
        ("orders", 0): 5,
        ("orders", 1): 7,
        ("customers", 0): 2,
    }
    assert parse_until("offsets:a.b:c:0=1").offsets == {("a.b:c", 0): 1}


@pytest.mark.parametrize(
    "text", ["yesterday", "offsets:", "offsets:orders", "offsets:orders:0=x", "offsets::0=1"]
)
def test_malformed_bounds_are_refused(text: str) -> None:
    with pytest.raises(ConfigError, match="--until"):
        parse_until(text)


def test_trim_drops_records_at_or_past_the_end() -> None:
    run = BoundedRun(parse_until("now"), {("t", 0): 10, ("t", 1): 0})
    msgs = [_Msg("t", 0, 8), _Msg("t", 0, 9), _Msg("t", 0, 10), _Msg("t", 1, 0)]
    assert [(m.partition(), m.offset()) for m in run.trim(msgs)] == [(0, 8), (0, 9)]


def test_done_when_every_owned_partition_reached_its_end() -> None:
    run = BoundedRun(parse_until("now"), {("t", 0): 10, ("t", 1): 4})
    owned = [("t", 0), ("t", 1)]
    assert not run.reached(owned, {("t", 0): 10, ("t", 1): 3}, {})
    assert run.reached(owned, {("t", 0): 10, ("t", 1): 4}, {})
    assert run.reached([("t", 0)], {("t", 0): 12}, {})  # past it (a restored position)


def test_a_trailing_transaction_marker_is_reached_through_the_evidence() -> None:
    # Records 0..8, then the commit marker at 9: the end (last stable offset) is 10 and
    # the next record to process stays 9. The partition-end event at 10 proves it.
    run = BoundedRun(parse_until("now"), {("t", 0): 10})
    run.trim([_Msg("t", 0, 7), _Msg("t", 0, 8)])
    assert not run.reached([("t", 0)], {("t", 0): 9}, {})  # no evidence yet
    run.trim([_Msg("t", 0, 10, eof=True)])
    assert not run.reached([("t", 0)], {("t", 0): 8}, {})  # record 8 not processed yet
    assert not run.reached([("t", 0)], {("t", 0): 9}, {("t", 0): 1})  # still buffered
    assert run.reached([("t", 0)], {("t", 0): 9}, {})


def test_a_record_past_the_end_is_evidence_too() -> None:
    run = BoundedRun(parse_until("1"), {("t", 0): 5})
    kept = run.trim([_Msg("t", 0, 3), _Msg("t", 0, 6)])
    assert [m.offset() for m in kept] == [3]
    assert run.reached([("t", 0)], {("t", 0): 4}, {})  # offsets 4..5 hold no record
    assert not run.reached([("t", 0)], {("t", 0): 3}, {})
