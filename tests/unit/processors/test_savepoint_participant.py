"""The runtime's side of savepoints (``SavepointParticipant``), without a broker.

Halts pause a key group's partitions, a committed stop-with-savepoint halts the key
groups whose export succeeded, a cancel lifts its halts by a rewind raised after the whole
poll, and a seeding chunk commits an epoch. Drives the component with its real
collaborators (``KeyGroupCheckpoints``, ``InputPositions``, ``OpenEpoch``,
``SavepointRequests``); the consumer records pauses and resumes. The Kafka side is in
tests/integration/test_savepoint_requests.py and test_savepoint_running_sum.py.
"""

from __future__ import annotations

from typing import Any

import pytest
from confluent_kafka import TopicPartition

from processors._checkpoint.alignment import Mode
from processors._checkpoint.input_positions import InputPositions
from processors._checkpoint.keygroup_state import KeyGroupCheckpoints
from processors._checkpoint.savepoint_requests import SavepointRequests
from processors._config.settings import Settings
from processors._kafka.errors import AbortEpoch
from processors._runtime.open_epoch import OpenEpoch
from processors._runtime.savepoints import SavepointParticipant

SP1 = "sp-20261128T010203Z-0a1b2c"
SP2 = "sp-20261128T020304Z-3d4e5f"


class _Consumer:
    def __init__(self, assigned: bool = True) -> None:
        self.assigned = assigned
        self.paused: list[tuple[str, int]] = []
        self.resumed: list[tuple[str, int]] = []

    def pause(self, parts: list[TopicPartition]) -> None:
        if not self.assigned:
            raise RuntimeError("not assigned")  # librdkafka refuses unassigned partitions
        self.paused += [(tp.topic, tp.partition) for tp in parts]

    def resume(self, parts: list[TopicPartition]) -> None:
        self.resumed += [(tp.topic, tp.partition) for tp in parts]


class _Requests(SavepointRequests):
    """Savepoint requests whose next poll returns what the test says."""

    def __init__(self) -> None:
        super().__init__()
        self.next_poll: tuple[list[str], bool] = ([], False)

    def poll(self) -> tuple[list[str], bool]:
        polled, self.next_poll = self.next_poll, ([], False)
        return polled


class _Instance:
    def __init__(self, consumer: _Consumer | None = None) -> None:
        self.consumer = consumer or _Consumer()
        self.marks = KeyGroupCheckpoints()
        self.requests = _Requests()
        self.positions = InputPositions(
            ("a", "b"), Mode.ALIGNED, 10.0, 1000, grouped=True, cancelled=self.requests.cancelled
        )
        self.open = OpenEpoch()
        self.calls: list[str] = []
        self.savepoints = SavepointParticipant(
            Settings(),
            "app",
            "app.control",
            ("a", "b"),
            self.requests,
            None,  # type: ignore[arg-type] - no seeding in these tests
            self.marks,
            self.positions,
            self.open,
            {},
            lambda: 4,
            lambda: self.consumer,
            self._call,
            lambda: self.calls.append(f"end_epoch active={self.open.active}"),
            lambda: self.calls.append("beat"),
        )

    def _call(self, fn: Any, *args: Any, what: str, timeout_s: float | None = None) -> Any:
        return fn(*args)


def test_a_halt_pauses_every_input_partition_of_the_key_group() -> None:
    run = _Instance()
    run.savepoints.halt(2, SP1)
    assert run.marks.halted == {2: SP1}
    assert run.consumer.paused == [("a", 2), ("b", 2)]


def test_a_halt_before_the_assignment_is_kept_for_the_assign_to_pause() -> None:
    run = _Instance(_Consumer(assigned=False))
    run.savepoints.halt(1, SP1)
    assert run.marks.halted == {1: SP1}  # the assign pauses halted key groups


def test_a_committed_stop_savepoint_halts_where_the_export_succeeded() -> None:
    run = _Instance()
    request = {"savepoint": SP1, "checkpoint": 100, "stop": True}
    run.requests.current = request
    run.savepoints.committed(request, {0: {"error": None}, 1: {"error": "disk full"}})
    assert run.requests.current is None  # the next request may start
    assert run.marks.halted == {0: SP1}


def test_a_committed_savepoint_without_stop_halts_nothing() -> None:
    run = _Instance()
    request = {"savepoint": SP1, "checkpoint": 100, "stop": False}
    run.requests.current = request
    run.savepoints.committed(request, {0: {"error": None}})
    assert run.requests.current is None and run.marks.halted == {}


def test_a_started_request_ends_the_epoch_soon() -> None:
    run = _Instance()
    run.requests.next_poll = ([], True)
    run.savepoints.poll_requests()
    assert run.open.commit_now


def test_a_cancel_lifts_its_halts_by_a_rewind() -> None:
    run = _Instance()
    run.savepoints.halt(0, SP1)
    run.savepoints.halt(1, SP2)
    run.requests.next_poll = ([SP2, SP1], False)
    with pytest.raises(AbortEpoch, match="resuming halted key groups"):
        run.savepoints.poll_requests()
    assert run.marks.halted == {}
    assert sorted(run.consumer.resumed) == [("a", 0), ("a", 1), ("b", 0), ("b", 1)]
    assert run.open.active  # the next commit records that they are not halted


def test_a_cancel_of_a_savepoint_nobody_halted_at_rewinds_nothing() -> None:
    run = _Instance()
    run.savepoints.halt(0, SP1)
    run.requests.next_poll = ([SP2], False)
    run.savepoints.poll_requests()
    assert run.marks.halted == {0: SP1} and run.consumer.resumed == []


def test_a_seeding_chunk_commits_an_epoch() -> None:
    run = _Instance()
    run.savepoints.commit_seed_chunk()
    assert run.calls == ["end_epoch active=True", "beat"]
