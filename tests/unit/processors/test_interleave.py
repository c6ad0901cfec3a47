"""The interleaver of co-partitioned inputs (processors/_task/interleave.py), without Kafka.

Fake consumer messages stand in for confluent_kafka's: records, control records (barriers),
partition-end events (``error().code() == _PARTITION_EOF``) and other consumer errors.
"""

from __future__ import annotations

import itertools
from collections import deque
from typing import Any

import pytest
from confluent_kafka import KafkaError
from hypothesis import given, settings
from hypothesis import strategies as st

from processors._task.interleave import PARTITION_EOF, Interleaver

INF = 1e9  # "effectively infinite" wait


class Err:
    """A consumer error (only ``code()`` is read)."""

    def __init__(self, code: int) -> None:
        self._code = code

    def code(self) -> int:
        return self._code


class Msg:
    """The accessors of a confluent_kafka Message the interleaver and the runtime read."""

    _ids = itertools.count()

    def __init__(
        self,
        topic: str,
        partition: int,
        offset: int,
        ts: int = 0,
        headers: Any = None,
        err: Any = None,
    ) -> None:
        self._topic, self._partition, self._offset = topic, partition, offset
        self._ts, self._headers, self._err = ts, headers, err
        self.id = next(Msg._ids)

    def topic(self) -> str:
        return self._topic

    def partition(self) -> int:
        return self._partition

    def offset(self) -> int:
        return self._offset

    def timestamp(self) -> tuple[int, int]:
        return (1, self._ts)

    def headers(self) -> Any:
        return self._headers

    def error(self) -> Any:
        return self._err

    def key(self) -> bytes:
        return b"k%d" % self._partition

    def value(self) -> bytes:
        return b"v%d" % self._offset

    @property
    def control(self) -> bool:
        return (
            self._err is None
            and self._headers is not None
            and any(n == "lockgate-type" for n, _ in self._headers)
        )

    def __repr__(self) -> str:
        if self._err is not None:
            return f"<{self._topic}[{self._partition}] err {self._err.code()} @{self._offset}>"
        kind = "ctrl" if self.control else "rec"
        return f"<{kind} {self._topic}[{self._partition}]@{self._offset} ts={self._ts}>"


def rec(topic: str, p: int, off: int, ts: int, headers: Any = None) -> Msg:
    return Msg(topic, p, off, ts, headers=headers)


def ctrl(topic: str, p: int, off: int, ts: int = 10**12) -> Msg:
    return Msg(topic, p, off, ts, headers=[("lockgate-type", b"barrier"), ("x", b"y")])


def eof(topic: str, p: int, end: int) -> Msg:
    return Msg(topic, p, end, err=Err(PARTITION_EOF))


def desc(msgs: list[Msg]) -> list[tuple[str, int, int]]:
    return [(m.topic(), m.partition(), m.offset()) for m in msgs]


# ----------------------------------------------------------------------------- unit cases


def test_merges_by_timestamp_ties_by_declared_input_order() -> None:
    il = Interleaver(("a", "b"), idle_s=0, fetch_wait_s=INF)
    msgs = [rec("a", 0, 0, 5), rec("a", 0, 1, 7), rec("b", 0, 0, 5), rec("b", 0, 1, 6)]
    assert il.push([*msgs, eof("a", 0, 2), eof("b", 0, 2)], now=0) == []
    assert len(il) == 4 and il
    assert desc(il.pop(0)) == [("a", 0, 0), ("b", 0, 0), ("b", 0, 1), ("a", 0, 1)]
    assert len(il) == 0 and not il

    # The declared order decides ties, not the topic names.
    il = Interleaver(("b", "a"), idle_s=0, fetch_wait_s=INF)
    msgs = [rec("a", 0, 0, 5), rec("b", 0, 0, 5)]
    il.push([*msgs, eof("a", 0, 1), eof("b", 0, 1)], now=0)
    assert desc(il.pop(0)) == [("b", 0, 0), ("a", 0, 0)]


def test_offset_order_within_a_partition_beats_timestamps() -> None:
    il = Interleaver(("a", "b"), idle_s=0, fetch_wait_s=INF)
    il.push([rec("a", 0, 0, 10), rec("a", 0, 1, 1), rec("b", 0, 0, 5)], now=0)
    il.push([eof("a", 0, 2), eof("b", 0, 1)], now=0)
    # a's head has ts 10: b@0 (ts 5) goes first, then a@0 and a@1 (ts 1, behind a@0).
    assert desc(il.pop(0)) == [("b", 0, 0), ("a", 0, 0), ("a", 0, 1)]


def test_three_inputs() -> None:
    il = Interleaver(("a", "b", "c"), idle_s=0, fetch_wait_s=INF)
    il.push([rec("c", 1, 0, 1), rec("b", 1, 0, 2), rec("a", 1, 0, 3), rec("c", 1, 1, 3)], now=0)
    # c@0 (1), b@0 (2); then b is empty and not at end: a@0 and c@1 wait.
    assert desc(il.pop(0)) == [("c", 1, 0), ("b", 1, 0)]
    il.push([eof("a", 1, 1), eof("b", 1, 1)], now=0)
    # a@0 and c@1 tie at 3: a is declared first; c is not at end but has a head.
    assert desc(il.pop(0)) == [("a", 1, 0), ("c", 1, 1)]
    assert len(il) == 0


def test_nothing_goes_while_an_input_has_nothing_and_is_not_at_end() -> None:
    il = Interleaver(("a", "b"), idle_s=1.0, fetch_wait_s=5.0)
    il.push([rec("a", 0, 0, 1), rec("a", 0, 1, 2)], now=10.0)
    for now in (10.0, 11.0, 14.999):
        assert il.pop(now) == []
    assert len(il) == 2
    # Past fetch_wait_s from the head's arrival the group goes on without b.
    assert desc(il.pop(15.0)) == [("a", 0, 0), ("a", 0, 1)]
    assert len(il) == 0


def test_at_end_input_waits_idle_s_from_the_heads_arrival() -> None:
    il = Interleaver(("a", "b"), idle_s=1.0, fetch_wait_s=5.0)
    il.push([eof("b", 0, 0)], now=0.0)
    il.push([rec("a", 0, 0, 100)], now=0.0)
    il.push([rec("a", 0, 1, 101)], now=0.8)
    assert il.pop(0.999) == []
    assert desc(il.pop(1.0)) == [("a", 0, 0)]  # a@1 arrived at 0.8: waits until 1.8
    assert il.pop(1.79) == []
    assert desc(il.pop(1.8)) == [("a", 0, 1)]


def test_wait_bound_switches_with_the_partition_end() -> None:
    il = Interleaver(("a", "b"), idle_s=1.0, fetch_wait_s=5.0)
    il.push([rec("b", 0, 0, 1), rec("a", 0, 0, 2), rec("a", 0, 1, 3)], now=0.0)
    # b@0 goes (every input has a head); then b is empty, not at end: a waits fetch_wait_s.
    assert desc(il.pop(0.0)) == [("b", 0, 0)]
    assert il.pop(2.0) == []
    il.push([eof("b", 0, 1)], now=2.0)
    # Now b is caught up: idle_s from the oldest head's arrival (0.0) has passed.
    assert desc(il.pop(2.0)) == [("a", 0, 0), ("a", 0, 1)]


def test_a_record_after_the_end_event_clears_at_end() -> None:
    il = Interleaver(("a", "b"), idle_s=1.0, fetch_wait_s=5.0)
    il.push([eof("b", 0, 0), rec("b", 0, 0, 1)], now=0.0)
    il.push([rec("a", 0, 0, 2)], now=0.0)
    assert desc(il.pop(0.0)) == [("b", 0, 0)]
    # b's end was reported before its record: b has unfetched records -> fetch_wait_s.
    assert il.pop(1.0) == []
    assert il.pop(4.9) == []
    assert desc(il.pop(5.0)) == [("a", 0, 0)]


def test_groups_are_independent() -> None:
    il = Interleaver(("a", "b"), idle_s=0, fetch_wait_s=INF)
    il.push([rec("a", 0, 0, 1), rec("a", 1, 0, 1), rec("b", 1, 0, 0), eof("b", 1, 1)], now=0)
    # Group 0 waits for b[0]; group 1 is complete.
    assert desc(il.pop(0)) == [("b", 1, 0), ("a", 1, 0)]
    assert len(il) == 1
    il.push([rec("b", 0, 0, 3)], now=0)
    assert desc(il.pop(0)) == [("a", 0, 0)]  # b[0] is not at end: b@0 waits for more
    il.push([eof("b", 0, 1), eof("a", 0, 1)], now=0)
    assert desc(il.pop(0)) == [("b", 0, 0)]


def test_control_record_at_the_head_goes_at_once() -> None:
    il = Interleaver(("a", "b"), idle_s=INF, fetch_wait_s=INF)
    barrier = ctrl("a", 0, 0)
    il.push([barrier, rec("a", 0, 1, 1)], now=0)
    # b has nothing and is not at end, the barrier's timestamp is huge: it still goes.
    assert il.pop(0) == [barrier]
    assert len(il) == 1  # a@1 is a record: it waits for b


def test_control_record_goes_before_smaller_timestamps_of_other_inputs() -> None:
    il = Interleaver(("a", "b"), idle_s=0, fetch_wait_s=INF)
    il.push([rec("a", 0, 0, 1), rec("b", 0, 0, 50), ctrl("b", 0, 1, ts=100)], now=0)
    il.push([rec("a", 0, 1, 60), eof("a", 0, 2)], now=0)
    out = il.pop(0)
    # a@0 (ts 1), then b@0 (50): the barrier (ts 100) reaches b's head and goes before
    # a@1 (ts 60), which then waits for b (empty, not at end).
    assert desc(out) == [("a", 0, 0), ("b", 0, 0), ("b", 0, 1)]
    assert out[2].control
    il.push([eof("b", 0, 2)], now=0)
    assert desc(il.pop(0)) == [("a", 0, 1)]


def test_control_record_behind_a_record_waits_for_it() -> None:
    il = Interleaver(("a", "b"), idle_s=INF, fetch_wait_s=INF)
    il.push([rec("a", 0, 0, 1), ctrl("a", 0, 1)], now=0)
    assert il.pop(0) == []  # a@0 waits for b; the barrier behind it too
    il.push([rec("b", 0, 0, 0)], now=0)
    assert desc(il.pop(0)) == [("b", 0, 0)]
    il.push([rec("b", 0, 1, 2)], now=0)
    assert desc(il.pop(0)) == [("a", 0, 0), ("a", 0, 1)]
    assert len(il) == 1


def test_control_record_goes_first_whatever_the_other_heads() -> None:
    il = Interleaver(("a", "b", "c"), idle_s=INF, fetch_wait_s=INF)
    barrier = ctrl("b", 0, 0, ts=50)
    il.push([rec("a", 0, 0, 5), barrier, rec("c", 0, 0, 3)], now=0)
    # The barrier at b's head goes before c@0 (ts 3) and a@0 (ts 5), even though a and
    # c come before and after it in the declared order.
    out = il.pop(0)
    assert out[0] is barrier
    assert desc(out) == [("b", 0, 0)]  # then b is empty and not at end: the rest waits


def test_wait_is_measured_from_the_oldest_head() -> None:
    il = Interleaver(("a", "b", "c"), idle_s=1.0, fetch_wait_s=5.0)
    il.push([rec("a", 0, 0, 9)], now=0.0)
    il.push([rec("b", 0, 0, 1)], now=4.0)
    il.push([eof("c", 0, 0), eof("b", 0, 1)], now=4.0)
    # c is caught up and a@0 has waited since 0.0: b@0 (arrived at 4.0) goes at once.
    assert desc(il.pop(4.0)) == [("b", 0, 0), ("a", 0, 0)]


def test_headers_without_the_control_header_are_ordinary_records() -> None:
    il = Interleaver(("a", "b"), idle_s=INF, fetch_wait_s=INF)
    il.push([rec("a", 0, 0, 1, headers=[("trace", b"1")]), rec("b", 0, 0, 0, headers=[])], 0)
    assert desc(il.pop(0)) == [("b", 0, 0)]
    assert il.pop(0) == []


def test_errors_other_than_partition_end_are_returned_not_buffered() -> None:
    il = Interleaver(("a", "b"), idle_s=0, fetch_wait_s=INF)
    boom = Msg("a", 0, -1, err=Err(KafkaError._TRANSPORT))
    foreign_end = eof("other", 0, 3)  # not an input: handed back
    no_topic = Msg("", -1, -1, err=Err(KafkaError._ALL_BROKERS_DOWN))
    real = Msg("b", 0, -1, err=KafkaError(KafkaError._MSG_TIMED_OUT))
    end = eof("b", 0, 0)
    errors = il.push([rec("a", 0, 0, 1), boom, foreign_end, no_topic, end, real], now=0)
    assert errors == [boom, foreign_end, no_topic, real]
    assert len(il) == 1
    # The end event was consumed: b is caught up (idle_s = 0), a@0 goes.
    assert desc(il.pop(0)) == [("a", 0, 0)]


def test_real_kafka_partition_eof_error_marks_the_end() -> None:
    il = Interleaver(("a", "b"), idle_s=0, fetch_wait_s=INF)
    end = Msg("b", 0, 0, err=KafkaError(KafkaError._PARTITION_EOF))
    assert il.push([rec("a", 0, 0, 1), end], now=0) == []
    assert desc(il.pop(0)) == [("a", 0, 0)]


def test_unread_puts_records_back_at_the_front_in_order() -> None:
    il = Interleaver(("a", "b"), idle_s=0, fetch_wait_s=INF)
    il.push([rec("a", 0, i, i) for i in range(4)] + [rec("b", 0, 0, 10), eof("a", 0, 4)], 0)
    out = il.pop(0)
    # a is caught up (idle_s = 0): b@0 goes after a's records.
    assert desc(out) == [("a", 0, i) for i in range(4)] + [("b", 0, 0)]
    assert len(il) == 0
    # The runtime processed a@0, put the rest back (an error among them is skipped).
    il.unread([*out[1:], Msg("a", 0, -1, err=Err(KafkaError._TRANSPORT))], now=0)
    assert len(il) == 4
    # a's end event still holds (the records were fetched before it): b@0 goes again.
    assert il.pop(0) == out[1:]
    assert len(il) == 0


def test_unread_records_go_before_later_fetched_ones() -> None:
    il = Interleaver(("a", "b"), idle_s=0, fetch_wait_s=INF)
    il.push([rec("a", 0, 0, 1), rec("b", 0, 0, 1), eof("b", 0, 1), eof("a", 0, 1)], now=0)
    out = il.pop(0)
    assert desc(out) == [("a", 0, 0), ("b", 0, 0)]
    il.push([rec("a", 0, 1, 0)], now=0)  # a is no longer at end
    il.unread(out, now=0)
    # a@0 (ts 1) ties with b@0 and goes first; a@1 (ts 0) beats b@0; then a is empty and
    # not at end: b@0 waits.
    assert desc(il.pop(0)) == [("a", 0, 0), ("a", 0, 1)]
    il.push([eof("a", 0, 2)], now=0)
    assert desc(il.pop(0)) == [("b", 0, 0)]


def test_unread_records_wait_from_their_new_arrival() -> None:
    il = Interleaver(("a", "b"), idle_s=1.0, fetch_wait_s=INF)
    il.push([rec("a", 0, 0, 1), eof("b", 0, 0)], now=0.0)
    out = il.pop(1.0)
    assert desc(out) == [("a", 0, 0)]
    il.unread(out, now=5.0)
    assert il.pop(5.5) == []
    assert il.pop(6.0) == out


def test_drop_forgets_groups_and_their_end_state() -> None:
    il = Interleaver(("a", "b"), idle_s=0, fetch_wait_s=5.0)
    il.push([rec("a", g, i, i) for g in range(3) for i in range(2)], now=0)
    il.push([rec("b", 1, 0, 9), eof("b", 0, 0), eof("b", 2, 0)], now=0)
    assert len(il) == 7
    il.drop([0, 1, 7])  # 7: never seen
    assert len(il) == 2
    il.drop([1])  # twice: nothing left to forget
    assert len(il) == 2
    # Group 2 is untouched (b[2] caught up): its records go.
    assert desc(il.pop(0)) == [("a", 2, 0), ("a", 2, 1)]
    # Group 0 forgot b[0]'s end: a new a record waits fetch_wait_s (from the first pop
    # that finds b[0] empty).
    il.push([rec("a", 0, 0, 0)], now=10.0)
    assert il.pop(10.0) == []
    assert il.pop(14.0) == []
    assert desc(il.pop(15.0)) == [("a", 0, 0)]
    assert len(il) == 0


def test_drop_partition_forgets_one_input_partition() -> None:
    il = Interleaver(("a", "b"), idle_s=0, fetch_wait_s=5.0)
    il.push([rec("a", 0, 0, 5), rec("b", 0, 0, 1), rec("b", 0, 1, 2), rec("a", 1, 0, 1)], 0)
    il.push([eof("b", 0, 2), eof("a", 0, 1)], now=0)
    il.drop_partition("b", 0)
    il.drop_partition("b", 3)  # nothing buffered there
    assert len(il) == 2
    # b[0] is sought elsewhere: its end no longer holds, a@0 waits fetch_wait_s.
    assert il.pop(0.0) == []
    assert il.pop(4.0) == []
    assert desc(il.pop(5.0)) == [("a", 0, 0), ("a", 1, 0)]
    assert len(il) == 0


def test_pop_of_an_empty_interleaver() -> None:
    il = Interleaver(("a", "b"), idle_s=0, fetch_wait_s=0)
    assert il.pop(0) == [] and len(il) == 0 and not il
    assert il.push([], now=0) == []


# ----------------------------------------------------------------------------- properties

TOPICS = ("a", "b", "c")


@st.composite
def scenarios(draw: st.DrawFn) -> tuple[tuple[str, ...], dict[tuple[str, int], list[Msg]]]:
    """Inputs and every partition's records (offset order, random timestamps, some barriers)."""
    n = draw(st.integers(2, 3))
    order = draw(st.permutations(TOPICS))
    inputs = tuple(order[:n])
    groups = draw(st.integers(1, 3))
    with_control = draw(st.booleans())
    parts: dict[tuple[str, int], list[Msg]] = {}
    for topic in inputs:
        for g in range(groups):
            kinds = draw(
                st.lists(
                    st.integers(0, 6) if not with_control else st.integers(-1, 6),
                    max_size=6,
                )
            )
            parts[(topic, g)] = [
                ctrl(topic, g, off) if k < 0 else rec(topic, g, off, k)
                for off, k in enumerate(kinds)
            ]
    return inputs, parts


def reference_merge(inputs: tuple[str, ...], g: int, parts: dict[Any, list[Msg]]) -> list[int]:
    """Data records of group g: repeatedly the head with the smallest timestamp (ties: input)."""
    queues = [deque(m for m in parts[(t, g)] if not m.control) for t in inputs]
    out: list[int] = []
    while any(queues):
        best = min(
            (i for i, q in enumerate(queues) if q), key=lambda i: (queues[i][0].timestamp()[1], i)
        )
        out.append(queues[best].popleft().id)
    return out


class Model:
    """The interleaver's rules, written plainly (idle_s = 0, fetch_wait_s infinite).

    Per key group, repeatedly: a barrier at a partition's head goes (the first input in
    declared order); otherwise nothing goes while an input has nothing buffered and is not
    at end; otherwise the head with the smallest timestamp goes (ties: declared order).
    """

    def __init__(self, inputs: tuple[str, ...]) -> None:
        self.inputs = inputs
        self.queues: dict[tuple[str, int], deque[Msg]] = {}
        self.at_end: set[tuple[str, int]] = set()

    def push(self, batch: list[Msg]) -> None:
        for m in batch:
            tp = (m.topic(), m.partition())
            if m.error() is None:
                self.queues.setdefault(tp, deque()).append(m)
                self.at_end.discard(tp)
            else:
                self.at_end.add(tp)

    def pop(self, g: int) -> list[Msg]:
        queues = [self.queues.setdefault((t, g), deque()) for t in self.inputs]
        out: list[Msg] = []
        while True:
            heads = [i for i, q in enumerate(queues) if q]
            controls = [i for i in heads if queues[i][0].control]
            if controls:
                out.append(queues[controls[0]].popleft())
                continue
            if not heads:
                return out
            if any(
                not q and (t, g) not in self.at_end
                for t, q in zip(self.inputs, queues, strict=True)
            ):
                return out
            best = min(heads, key=lambda i: (queues[i][0].timestamp()[1], i))
            out.append(queues[best].popleft())


@settings(max_examples=150, deadline=None, database=None)
@given(scenario=scenarios(), data=st.data())
def test_output_is_the_reference_merge_whatever_the_batching(
    scenario: tuple[tuple[str, ...], dict[tuple[str, int], list[Msg]]], data: st.DataObject
) -> None:
    inputs, parts = scenario
    groups = sorted({g for _, g in parts})
    # Every partition's fetch stream: its records, then its end event.
    streams = {tp: deque([*msgs, eof(tp[0], tp[1], len(msgs))]) for tp, msgs in parts.items()}
    # A random cross-partition arrival order (each partition in order), in random batches.
    arrival: list[Msg] = []
    while any(streams.values()):
        live = sorted(tp for tp, q in streams.items() if q)
        tp = data.draw(st.sampled_from(live))
        arrival.append(streams[tp].popleft())
    cuts = sorted(data.draw(st.sets(st.integers(1, max(1, len(arrival) - 1)), max_size=6)))
    batches = [arrival[i:j] for i, j in zip([0, *cuts], [*cuts, len(arrival)], strict=True)]

    il = Interleaver(inputs, idle_s=0, fetch_wait_s=INF)
    model = Model(inputs)
    out: list[Msg] = []
    pushed = 0
    for batch in batches:
        assert il.push(batch, now=0.0) == []
        model.push(batch)
        pushed += sum(m.error() is None for m in batch)
        released = il.pop(0.0)
        out += released
        assert len(il) == pushed - len(out)
        # Every pop: exactly what the model lets go, in the model's order.
        for g in groups:
            assert [m for m in released if m.partition() == g] == model.pop(g)

    # Whatever the batching and arrival order: every record went, each partition in
    # offset order, each group's records in the reference merge order.
    assert len(il) == 0
    assert len(out) == sum(len(v) for v in parts.values())
    for g in groups:
        mine = [m for m in out if m.partition() == g]
        assert [m.id for m in mine if not m.control] == reference_merge(inputs, g, parts)
    for (topic, g), msgs in parts.items():
        assert [m for m in out if m.topic() == topic and m.partition() == g] == msgs


# Operations of the random walk below.
_OPS = st.one_of(
    st.tuples(st.just("fetch"), st.integers(0, 8), st.integers(1, 4), st.booleans()),
    st.tuples(st.just("pop"), st.sampled_from([0.0, 0.3, 1.0, 2.5, 6.0])),
    st.tuples(st.just("unread"), st.integers(0, 5)),
    st.tuples(st.just("drop"), st.lists(st.integers(0, 2), max_size=2)),
    st.tuples(st.just("drop_partition"), st.integers(0, 8)),
)


@settings(max_examples=200, deadline=None, database=None)
@given(
    ops=st.lists(_OPS, max_size=40),
    stamps=st.lists(st.integers(0, 9), min_size=60, max_size=60),
    idle_s=st.sampled_from([0.0, 1.0]),
    fetch_wait_s=st.sampled_from([0.0, 2.0, 5.0]),
)
def test_offset_order_length_and_maximal_release_under_any_operations(
    ops: list[tuple[Any, ...]], stamps: list[int], idle_s: float, fetch_wait_s: float
) -> None:
    """Partition order, ``len`` and "pop lets go of everything allowed" hold throughout.

    Fetches may report a partition's end in the middle (more records come later); pops
    come at increasing times; the runtime's put-backs (a suffix of the last released
    batch), rewinds (drop) and seeks (drop_partition) come in between.
    """
    inputs = ("a", "b", "c")
    tps = [(t, g) for g in range(3) for t in inputs]
    il = Interleaver(inputs, idle_s=idle_s, fetch_wait_s=fetch_wait_s)
    next_off = dict.fromkeys(tps, 0)
    model: dict[tuple[str, int], deque[tuple[float, Msg]]] = {tp: deque() for tp in tps}
    at_end: set[tuple[str, int]] = set()
    clock = 0.0
    last: list[Msg] = []
    stamp = iter(stamps * 10)

    def check_maximal(now: float) -> None:
        # Nothing left could go: no barrier at a head, and an empty input still in its bound.
        for g in range(3):
            qs = [model[(t, g)] for t in inputs]
            if not any(qs):
                continue
            assert not any(q[0][1].control for q in qs if q)
            oldest = min(q[0][0] for q in qs if q)
            # An input known to have unfetched records is waited for from when the group
            # first found it empty (reset when it delivers); a caught-up one from the
            # oldest head's arrival.
            since = il._empty_since  # noqa: SLF001 - the wait clock is internal
            assert any(
                not q
                and (
                    now - oldest < idle_s
                    if (t, g) in at_end
                    else now - since.get((g, i), now) < fetch_wait_s
                )
                for i, (t, q) in enumerate(zip(inputs, qs, strict=True))
            )

    for op in ops:
        kind = op[0]
        if kind == "fetch":
            _, which, count, end = op
            tp = tps[which]
            batch: list[Msg] = []
            for _ in range(count):
                off = next_off[tp]
                next_off[tp] += 1
                ts = next(stamp)
                m = ctrl(tp[0], tp[1], off) if ts == 9 else rec(tp[0], tp[1], off, ts)
                batch.append(m)
                model[tp].append((clock, m))
            at_end.discard(tp)
            if end:
                batch.append(eof(tp[0], tp[1], next_off[tp]))
                at_end.add(tp)
            assert il.push(batch, now=clock) == []
        elif kind == "pop":
            clock += op[1]
            last = il.pop(clock)
            for m in last:
                q = model[(m.topic(), m.partition())]
                assert q and q[0][1] is m, f"{m} released out of offset order"
                q.popleft()
            check_maximal(clock)
        elif kind == "unread":
            back = last[len(last) - op[1] :] if op[1] else []
            il.unread(back, now=clock)
            for m in reversed(back):
                model[(m.topic(), m.partition())].appendleft((clock, m))
            last = []
        elif kind == "drop":
            il.drop(op[1])
            for g in op[1]:
                for t in inputs:
                    model[(t, g)].clear()
                    at_end.discard((t, g))
            last = []
        else:
            tp = tps[op[1]]
            il.drop_partition(*tp)
            model[tp].clear()
            at_end.discard(tp)
            last = []
        assert len(il) == sum(len(q) for q in model.values())

    # Every partition reaches its end: with time, everything goes, in offset order.
    il.push([eof(t, g, next_off[(t, g)]) for t, g in tps], now=clock)
    rest = il.pop(clock + 10.0)
    for m in rest:
        q = model[(m.topic(), m.partition())]
        assert q and q[0][1] is m
        q.popleft()
    assert len(il) == 0 and not any(model.values())


@pytest.mark.parametrize("inputs", [("a", "b"), ("b", "a", "c")])
def test_len_counts_only_records(inputs: tuple[str, ...]) -> None:
    il = Interleaver(inputs, idle_s=0, fetch_wait_s=INF)
    il.push([rec("a", 0, 0, 1), eof("a", 0, 1), ctrl("b", 0, 0)], now=0)
    assert len(il) == 2


def test_a_catch_up_longer_than_the_fetch_wait_keeps_timestamp_order() -> None:
    """The fetch wait counts from when the group found the input empty, reset on delivery.

    a's backlog (timestamps 0..499) arrives in chunks every 0.5 s for 10 s; b's first record
    (timestamp 500) arrived at the start. With fetch_wait_s = 2 s, b@500 still goes only
    after every older a record, because a keeps delivering within the bound.
    """
    il = Interleaver(("a", "b"), idle_s=0, fetch_wait_s=2.0)
    il.push([rec("b", 0, 0, 500)], now=0.0)
    out: list[Any] = []
    for chunk in range(20):
        now = chunk * 0.5
        il.push([rec("a", 0, i, i) for i in range(chunk * 25, chunk * 25 + 25)], now=now)
        out += il.pop(now)
        out += il.pop(now + 0.25)
    assert [m.timestamp()[1] for m in out] == list(range(500))
    # a stops delivering: past the bound b goes without it.
    assert il.pop(9.5 + 1.9) == []
    assert desc(il.pop(9.5 + 2.5)) == [("b", 0, 0)]
