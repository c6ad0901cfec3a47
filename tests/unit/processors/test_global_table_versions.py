"""Versioned global tables: as-of lookups by record timestamp, bounded history."""

from __future__ import annotations

import orjson
import pytest

from processors import ConfigError
from processors.joins import GlobalTable


def _apply(table: GlobalTable, key: str, value: object, ts: int) -> None:
    table.apply(key.encode(), None if value is None else orjson.dumps(value), ts)


def test_as_of_lookups_follow_record_timestamps_not_arrival_order() -> None:
    t = GlobalTable("customers", retention_ms=1000)
    assert t.versioned
    _apply(t, "c", {"tier": "gold"}, 200)
    _apply(t, "c", {"tier": "silver"}, 100)  # late, older
    assert t.get("c") == {"tier": "gold"}  # the newest by timestamp
    assert t.get_as_of("c", 99) is None and t.get_as_of("c", 99, "none") == "none"
    assert t.get_as_of("c", 150) == {"tier": "silver"}
    assert t.get_as_of("c", 200) == {"tier": "gold"}
    _apply(t, "c", None, 300)  # deleted from 300 on
    assert t.get("c") is None and "c" not in t and len(t) == 0
    assert t.get_as_of("c", 250) == {"tier": "gold"}
    assert t.get_as_of("c", 300) is None
    _apply(t, "d", {"tier": "x"}, 0)
    assert "d" in t and t.items() == [("d", {"tier": "x"})]


def test_history_is_bounded_per_key() -> None:
    t = GlobalTable("customers", retention_ms=60)
    for ts in (0, 10, 20, 100):
        _apply(t, "c", {"v": ts}, ts)
    # Newest 100, cutoff 40: the newest version at or before it (20) is kept for lookups
    # between 20 and 100; 0 and 10 are gone.
    assert t.get_as_of("c", 30) == {"v": 20}
    assert t.get_as_of("c", 15) is None
    assert t.get_as_of("c", 100) == {"v": 100}


def test_a_plain_global_table_has_no_as_of_lookup() -> None:
    t = GlobalTable("rates")
    _apply(t, "c", {"rate": 2}, 5)
    _apply(t, "c", {"rate": 3}, 1)  # plain: the last record read wins, whatever its time
    assert t.get("c") == {"rate": 3} and not t.versioned
    with pytest.raises(ConfigError, match="retention_ms"):
        t.get_as_of("c", 5)
    with pytest.raises(ValueError, match="retention_ms"):
        GlobalTable("x", retention_ms=-1)
