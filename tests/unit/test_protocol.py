"""The lockgate-* headers: barriers round-trip, malformed ones are refused, controls are seen."""

from __future__ import annotations

import orjson

from processors._checkpoint.protocol import (
    Barrier,
    is_control_record,
    lockgate_headers,
    read_barrier,
    timer_error_headers,
    writer_header,
)


def _as_read(headers: list[tuple[str, bytes | str]]) -> dict[str, str]:
    """Headers as a consumer returns them (bytes), decoded the way the runtime decodes them."""
    wire = [(k, v.encode() if isinstance(v, str) else v) for k, v in headers]
    return lockgate_headers(wire)


def test_barriers_round_trip_through_their_headers() -> None:
    for barrier in (
        Barrier(7, "clicks/3", 4),
        Barrier(8, "clicks/0", 4, 1_700_000_000_000, event_time=True),
        Barrier(9, "clicks/1", 2, 5, event_time=True, idle=True, savepoint="sp-1", stop=True),
        Barrier(10, "clicks/1", 2, savepoint="sp-2"),
        Barrier(11, "clicks/1", 2, savepoint="sp-3", stop=True, apps=("clicks", "totals")),
    ):
        value, headers = barrier.encode()
        assert read_barrier(_as_read(headers)) == barrier
        body = orjson.loads(value)
        assert (body["type"], body["ckpt"], body["writer"]) == (
            "barrier",
            barrier.checkpoint,
            barrier.writer,
        )
        assert is_control_record(headers)


def test_malformed_barriers_are_refused_and_a_bad_watermark_is_flagged() -> None:
    _, headers = Barrier(3, "a/0", 1, 42, event_time=True).encode()
    read = _as_read(headers)
    assert read_barrier({**read, "lockgate-ckpt": "x"}) is None
    assert read_barrier({k: v for k, v in read.items() if k != "lockgate-writer"}) is None
    assert read_barrier({**read, "lockgate-type": "other"}) is None
    bad_wm = read_barrier({**read, "lockgate-wm": "soon"})
    assert bad_wm is not None and bad_wm.watermark is None and bad_wm.checkpoint == 3


def test_only_records_with_the_type_header_are_control_records() -> None:
    assert not is_control_record(None)
    assert not is_control_record([])
    assert not is_control_record(writer_header("app", 2))
    assert not is_control_record(timer_error_headers(ValueError("x"), 5, "t"))
    assert is_control_record({"lockgate-type": b"barrier"})
    assert lockgate_headers(
        [("lockgate-writer", b"a/1"), ("lockgate-writer", b"b/2"), ("x", b"y")]
    ) == {"lockgate-writer": "a/1"}


def test_a_savepoint_is_taken_only_by_the_apps_it_names() -> None:
    named = Barrier(5, "up/0", 2, savepoint="sp-9", stop=True, apps=("up", "down"))
    assert named.for_app("down") == "sp-9"
    assert named.for_app("other") is None
    assert Barrier(5, "up/0", 2, savepoint="sp-9").for_app("anyone") == "sp-9"  # older barriers
    assert Barrier(5, "up/0", 2).for_app("down") is None
