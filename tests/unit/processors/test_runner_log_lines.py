"""Runner log lines a first-day user reads (issue 27): routine events at DEBUG, times as times.

At every start the rebalance callback seeks the assigned partitions while ``consume()``
is collecting a batch; the batch's records of those partitions are discarded and read
again. An INFO line ``dropped records ... records=1000`` on every normal start read as
data loss. The ``stopped`` line printed ``last_checkpoint=1795775868000``.
"""

from __future__ import annotations

import logging
from types import SimpleNamespace
from typing import Any

import pytest

from processors._checkpoint.alignment import Mode
from processors._checkpoint.input_positions import InputPositions
from processors._runtime.runner import Runner


class _Msg:
    def __init__(self, partition: int) -> None:
        self._p = partition

    def topic(self) -> str:
        return "in"

    def partition(self) -> int:
        return self._p


def test_drop_stale_discards_rewound_partitions_quietly(caplog: pytest.LogCaptureFixture) -> None:
    sought: list[tuple[str, int, int]] = []
    positions = InputPositions(("in",), Mode.ALIGNED, 60, 1000, grouped=False, cancelled=set())
    positions.assign(("in", 0), 7)
    positions.assign(("in", 1), 3)
    positions.start_fetching([("in", 0)])  # rewound by the assignment
    fake: Any = SimpleNamespace(
        _positions=positions,
        _kgs={0: object(), 1: object()},
        _seek=lambda topic, part, offset: sought.append((topic, part, offset)),
    )
    msgs = [_Msg(0), _Msg(1), _Msg(0)]
    with caplog.at_level(logging.DEBUG, logger="lockgate.runtime"):
        kept = Runner._drop_stale(fake, msgs)
    assert [m.partition() for m in kept] == [1]
    assert sought == [("in", 0, 7)]  # read again from the tracked position
    assert positions.rewound == set()
    records = [r for r in caplog.records if "rewound" in r.getMessage()]
    assert len(records) == 1 and records[0].levelno == logging.DEBUG
    assert "dropped" not in records[0].getMessage()
    assert "no record is skipped" in records[0].getMessage()


def test_the_stopped_line_shows_the_last_checkpoint_as_a_time() -> None:
    from processors._runtime.runner import stopped_fields

    assert stopped_fields(1795775868000) == {
        "last_checkpoint": "2026-11-27T10:37:48.000Z",
        "checkpoint_id": 1795775868000,
    }
    assert stopped_fields(0) == {"last_checkpoint": "none", "checkpoint_id": 0}
