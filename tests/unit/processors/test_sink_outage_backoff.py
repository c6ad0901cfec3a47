"""The wait before replaying an epoch a sink could not take (processors/_runtime/epoch.py)."""

from __future__ import annotations

from processors._runtime.epoch import SINK_OUTAGE_BACKOFF_S, sink_outage_wait_s


def test_the_wait_doubles_from_half_a_second_up_to_ten() -> None:
    assert SINK_OUTAGE_BACKOFF_S == (0.5, 10.0)
    assert [sink_outage_wait_s(n) for n in range(1, 8)] == [0.5, 1, 2, 4, 8, 10, 10]


def test_the_wait_stays_at_the_cap_after_any_number_of_aborts() -> None:
    # An outage of hours: 2 ** 1024 would not convert to a float.
    for n in (17, 1024, 1025, 10**6):
        assert sink_outage_wait_s(n) == 10.0
    assert sink_outage_wait_s(0) == 0.5  # never below the first wait
