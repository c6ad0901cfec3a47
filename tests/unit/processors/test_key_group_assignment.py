"""KeyGroupAssignment: the rebalance callbacks' contracts, without a broker.

librdkafka swallows an exception raised in a rebalance callback, so a failure must be
handed to the runner (``failed``) and never leave the callback; the partitions of every
input are assigned and unassigned together (key group ``g`` is partition ``g`` of each);
a revoke commits or aborts before letting go; a loss releases first and never commits.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
from confluent_kafka import TopicPartition

from processors._checkpoint.alignment import Mode
from processors._checkpoint.input_positions import InputPositions
from processors._checkpoint.keygroup_state import KeyGroupCheckpoints
from processors._kafka.errors import AbortEpoch
from processors._runtime.health import Metrics
from processors._runtime.open_epoch import OpenEpoch
from processors._runtime.rebalance import KeyGroupAssignment
from processors._sinks.errors import SinkUnavailable
from processors._task.failures import ReplayPoison
from processors.exceptions import ConfigError, FatalKafkaError

INPUTS = ("orders", "customers")


class _Consumer:
    def __init__(self) -> None:
        self.calls: list[tuple[str, list[tuple[str, int]]]] = []

    def _note(self, what: str, tps: list[TopicPartition]) -> None:
        self.calls.append((what, [(tp.topic, tp.partition) for tp in tps]))

    def incremental_assign(self, tps: list[TopicPartition]) -> None:
        self._note("assign", tps)

    def incremental_unassign(self, tps: list[TopicPartition]) -> None:
        self._note("unassign", tps)

    def resume(self, tps: list[TopicPartition]) -> None:
        self._note("resume", tps)

    def committed(self, tps: list[TopicPartition], timeout: float) -> list[TopicPartition]:
        raise AssertionError("read through the runner's bounded call only")


class _KeyGroup:
    def __init__(self) -> None:
        self.closed = False

    def close(self) -> None:
        self.closed = True


class _Harness:
    """The component with recording callbacks, the way the runner wires it."""

    def __init__(self, inputs: tuple[str, ...] = INPUTS) -> None:
        self.events: list[str] = []
        self.failures: list[BaseException] = []
        self.callback_failed = False
        self.uncommitted = False
        self.end_error: BaseException | None = None
        self.abort_error: BaseException | None = None
        self.aborts: list[tuple[str, dict[str, bool]]] = []
        self.committed_error: BaseException | None = None
        self.consumer = _Consumer()
        self.kgs: dict[int, Any] = {}
        self.marks = KeyGroupCheckpoints()
        self.poison: ReplayPoison[tuple[str, int, int]] = ReplayPoison()
        self.positions = InputPositions(
            inputs, Mode.ALIGNED, 60, 1000, grouped=True, cancelled=set()
        )
        checkpoints: Any = SimpleNamespace(forget=lambda: self.events.append("forget"))
        sinks: Any = SimpleNamespace(settle=lambda committed: None)
        global_tables: Any = SimpleNamespace()  # not reached: no test here reads records
        read_cache: Any = object()
        self.assignment = KeyGroupAssignment(
            inputs,
            {},
            self.kgs,
            self.positions,
            self.marks,
            OpenEpoch(),
            checkpoints,
            sinks,
            global_tables,
            None,
            None,
            read_cache,
            self.poison,
            set(),
            "app.control",
            Metrics("app", "i0"),
            10.0,
            consumer=lambda: self.consumer,
            control_reader=lambda: None,
            call=self._call,
            should_stop=lambda: False,
            end_epoch=self._end_epoch,
            abort_epoch=self._abort_epoch,
            seed_from_savepoint=lambda g: False,
            reset_epoch_deadline=lambda: None,
            uncommitted=lambda: self.uncommitted,
            callback_failed=lambda: self.callback_failed,
            failed=self.failures.append,
        )
        admin: Any = SimpleNamespace(partitions_of=lambda topics: dict.fromkeys(topics, 4))
        restorer: Any = SimpleNamespace(read_budget=None)
        self.assignment.start(admin, 4, restorer, None)

    def _call(self, fn: Any, *args: Any, what: str, timeout_s: float | None = None) -> Any:
        self.events.append(what)
        if self.committed_error is not None:
            raise self.committed_error
        return []

    def _end_epoch(self) -> None:
        self.events.append(f"end epoch, open: {sorted(self.kgs)}")
        if self.end_error is not None:
            raise self.end_error

    def _abort_epoch(
        self, reason: str, *, sink_outage: bool = False, back_off: bool = True
    ) -> None:
        self.events.append(f"abort, open: {sorted(self.kgs)}")
        self.aborts.append((reason, {"sink_outage": sink_outage, "back_off": back_off}))
        if self.abort_error is not None:
            raise self.abort_error


def _tps(*groups: int) -> list[TopicPartition]:
    return [TopicPartition(INPUTS[0], g) for g in groups]


@pytest.mark.parametrize("why", ["callback failed", "leaving"])
def test_assign_takes_nothing_over_after_a_failure_or_during_the_leave(why: str) -> None:
    h = _Harness()
    if why == "leaving":
        h.assignment.leave()
    else:
        h.callback_failed = True
    h.assignment.on_assign(h.consumer, _tps(1, 0))
    # Every input's partition of each key group, assigned; nothing restored or committed.
    assert h.consumer.calls == [
        ("assign", [("orders", 0), ("customers", 0), ("orders", 1), ("customers", 1)])
    ]
    assert h.events == [] and h.kgs == {} and h.failures == []


def test_a_failed_takeover_goes_to_the_runner_never_out_of_the_callback() -> None:
    h = _Harness()
    h.committed_error = AbortEpoch("coordinator not available")
    h.assignment.on_assign(h.consumer, _tps(2))  # does not raise
    assert h.events == ["forget", "end epoch, open: []", "committed offsets"]
    [failure] = h.failures
    assert isinstance(failure, FatalKafkaError)  # never fetched without key groups
    assert "taking over" in str(failure) and "coordinator not available" in str(failure)
    assert h.consumer.calls == []  # confluent-kafka assigns them: the loop stops first


def test_partitions_beyond_the_key_groups_stop_the_app() -> None:
    h = _Harness(inputs=INPUTS[:1])
    h.assignment.on_assign(h.consumer, _tps(4))
    [failure] = h.failures
    assert isinstance(failure, ConfigError) and "appeared after start" in str(failure)
    assert h.events == ["forget"]  # refused before committing or reading anything


def test_the_open_epoch_commits_before_a_takeover_and_aborts_when_it_cannot() -> None:
    h = _Harness()
    h.end_error = AbortEpoch("fenced epoch")
    h.committed_error = AbortEpoch("stop here")
    h.assignment.on_assign(h.consumer, _tps(0))
    assert h.events[:3] == ["forget", "end epoch, open: []", "abort, open: []"]
    assert h.aborts == [("fenced epoch", {"sink_outage": False, "back_off": True})]
    [failure] = h.failures  # the stand-in's stop, not an assertion the callback swallowed
    assert isinstance(failure, FatalKafkaError) and "stop here" in str(failure)


def test_revoke_ends_the_epoch_then_releases_every_input() -> None:
    h = _Harness()
    kg0, kg1 = _KeyGroup(), _KeyGroup()
    h.kgs.update({0: kg0, 1: kg1})
    h.marks.halt(0, "sp-1")
    h.poison.mark(("orders", 0, 5), ValueError("bad"), "user")
    h.poison.mark(("orders", 1, 7), ValueError("bad"), "user")
    h.assignment.on_revoke(h.consumer, _tps(0))
    assert h.events == ["end epoch, open: [0, 1]"]  # committed while still owned
    assert kg0.closed and not kg1.closed and list(h.kgs) == [1]
    assert h.consumer.calls == [
        ("resume", [("orders", 0), ("customers", 0)]),  # a pause would outlive it
        ("unassign", [("orders", 0), ("customers", 0)]),
    ]
    assert 0 not in h.marks.halted
    assert list(h.poison.entries) == [("orders", 1, 7)]
    assert h.failures == []


def test_revoke_aborts_a_sink_outage_without_waiting_and_hands_failures_on() -> None:
    h = _Harness()
    h.kgs[3] = _KeyGroup()
    h.end_error = SinkUnavailable("database away")
    h.abort_error = FatalKafkaError("fenced")
    h.assignment.on_revoke(h.consumer, _tps(3))  # does not raise
    assert h.aborts == [("database away", {"sink_outage": True, "back_off": False})]
    assert [str(f) for f in h.failures] == ["fenced"]
    assert h.kgs == {}  # released and unassigned all the same
    assert h.consumer.calls == [("unassign", [("orders", 3), ("customers", 3)])]


@pytest.mark.parametrize("uncommitted", [True, False])
def test_lost_releases_first_and_never_commits(uncommitted: bool) -> None:
    h = _Harness()
    h.kgs.update({0: _KeyGroup(), 1: _KeyGroup()})
    h.uncommitted = uncommitted
    h.abort_error = FatalKafkaError("fenced")
    h.assignment.on_lost(h.consumer, _tps(1))  # does not raise
    # The abort's rewind must not touch the lost key group: released before it.
    assert h.events == (["abort, open: [0]"] if uncommitted else [])
    assert [str(f) for f in h.failures] == (["fenced"] if uncommitted else [])
    assert list(h.kgs) == [0]
    assert h.consumer.calls == [("unassign", [("orders", 1), ("customers", 1)])]


def test_restore_progress_shows_on_the_metrics() -> None:
    h = _Harness()
    metrics = h.assignment._metrics  # noqa: SLF001 - the instance's metrics, as given
    h.assignment.restore_progress(100, 900)
    h.assignment.restore_progress(50, 850)
    assert metrics.restore_records == 150
    assert metrics.restore_remaining == 850
