"""The savepoint-request bookkeeping of one instance (processors/_checkpoint/savepoint_requests.py).

The request partition is read through a stand-in consumer that hands out records in
batches (the component's own Kafka reader is exercised by the savepoint integration
tests: tests/integration/test_savepoint_running_sum.py, test_pipeline_savepoint.py).
"""

from __future__ import annotations

import time
from typing import Any

import orjson

from processors._checkpoint.control_topics import cancel_key, request_key
from processors._checkpoint.savepoint_requests import SavepointRequests


class _Msg:
    def __init__(self, key: bytes | None, value: bytes | None) -> None:
        self._key, self._value = key, value

    def key(self) -> bytes | None:
        return self._key

    def value(self) -> bytes | None:
        return self._value

    def error(self) -> None:
        return None


class _Reader:
    """Consumes the batches it was given, one per call."""

    def __init__(self) -> None:
        self.batches: list[list[_Msg]] = []

    def consume(self, n: int, timeout: float) -> list[_Msg]:
        return self.batches.pop(0) if self.batches else []


def _request(sp_id: str, ckpt: int = 100, expires_in_ms: int = 60_000) -> _Msg:
    body = {
        "savepoint": sp_id,
        "checkpoint": ckpt,
        "expires_ms": int(time.time() * 1000) + expires_in_ms,
    }
    return _Msg(request_key(sp_id), orjson.dumps(body))


def _cancel(sp_id: str) -> _Msg:
    return _Msg(cancel_key(sp_id), b"{}")


def _requests(*batches: list[_Msg]) -> SavepointRequests:
    requests = SavepointRequests()
    reader = _Reader()
    reader.batches = list(batches)
    requests._consumer = reader  # the reader `open` would assign
    return requests


def _poll(requests: SavepointRequests) -> tuple[list[str], bool]:
    requests._next_poll = 0.0  # polls are rate-limited to every 250 ms
    return requests.poll()


def test_requests_are_taken_one_at_a_time_in_order_and_once() -> None:
    requests = _requests([_request("a"), _request("b"), _request("a")], [_request("b")])
    assert _poll(requests) == ([], True)
    first = requests.current
    assert first is not None and first["savepoint"] == "a"
    assert _poll(requests) == ([], False)  # "b" waits for "a"; "b" read again is one request
    requests.done({"savepoint": "a"})  # another request object: not the one in progress
    assert requests.current is first
    requests.done(first)
    assert requests.current is None
    assert _poll(requests) == ([], True)
    assert requests.current is not None and requests.current["savepoint"] == "b"
    requests.done(requests.current)
    assert _poll(requests) == ([], False) and requests.current is None


def test_a_cancel_drops_the_request_in_progress_and_queued_ones_for_good() -> None:
    requests = _requests(
        [_request("a"), _request("b"), _request("c")],
        [_cancel("a"), _cancel("b"), _cancel("a"), _request("b")],
    )
    assert _poll(requests) == ([], True)
    cancelled, started = _poll(requests)
    assert cancelled == ["a", "b"]  # each reported once, in the order read
    assert started and requests.current is not None and requests.current["savepoint"] == "c"
    assert requests.cancelled == {"a", "b"}
    requests.done(requests.current)
    assert _poll(requests) == ([], False)


def test_expired_and_malformed_requests_are_never_taken() -> None:
    requests = _requests(
        [_request("old", expires_in_ms=-1), _Msg(request_key("bad"), b"not json"), _Msg(None, b"")]
    )
    assert _poll(requests) == ([], False)
    assert requests.current is None
    late = _requests([_request("late", expires_in_ms=5_000)])
    assert _poll(late) == ([], True)
    assert late.current_unexpired(int(time.time() * 1000) + 10_000) is None
    assert late.current is None


def test_cancels_noted_at_start_are_never_taken() -> None:
    requests = _requests([_request("x"), _request("y")])
    requests.note_cancelled(["x"])
    assert _poll(requests) == ([], True)
    assert requests.current is not None and requests.current["savepoint"] == "y"
    assert not requests.cancel("x")  # already cancelled: no second report


def test_a_key_group_takes_a_savepoint_at_the_first_checkpoint_announced() -> None:
    requests = SavepointRequests()
    assert requests.take_once(0, "s", 10)
    assert requests.take_once(0, "s", 10)  # a replay completes the same id again
    assert not requests.take_once(0, "s", 12)  # announced again at a later id
    assert requests.take_once(1, "s", 12)  # another key group: its own first id


def test_barrier_announcements_give_the_downstream_request() -> None:
    requests = SavepointRequests()
    assert requests.request_for("s") == {"savepoint": "s", "stop": False, "apps": ()}
    requests.announced("s", True, ["up", "down"])
    expected: dict[str, Any] = {"savepoint": "s", "stop": True, "apps": ("up", "down")}
    assert requests.request_for("s") == expected
    assert requests.not_ours("t") and not requests.not_ours("t")
