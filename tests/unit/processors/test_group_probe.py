"""The group probe runs its AdminClient in a child process: the child dying is survived.

(librdkafka can abort a process whose DescribeConsumerGroups meets a dropped connection:
confluentinc/librdkafka#4605.) No broker: the child answers with an error, or is killed.
"""

from __future__ import annotations

import time

from processors._kafka.group_probe import GroupProbe


def _wait(probe: GroupProbe, seconds: float) -> object:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        answer = probe.result()
        if answer is not None:
            return answer
        time.sleep(0.05)
    raise AssertionError("no answer")


def test_an_unreachable_broker_is_an_error_answer_not_a_hang() -> None:
    probe = GroupProbe({"bootstrap.servers": "127.0.0.1:9", "socket.timeout.ms": 1000})
    try:
        assert probe.request("some-group", 1.0)
        assert probe.request("some-group", 1.0)  # pending: no second request
        answer = _wait(probe, 30)
        assert isinstance(answer, str) and answer, answer
        assert probe.crashes == 0
    finally:
        probe.close()


def test_a_dead_child_is_reported_and_replaced_later() -> None:
    probe = GroupProbe({"bootstrap.servers": "127.0.0.1:9"})
    try:
        assert probe.request("some-group", 5.0)
        assert probe._proc is not None  # noqa: SLF001 - kill the child as librdkafka would
        probe._proc.kill()  # noqa: SLF001
        assert _wait(probe, 10) == "the probe process died"
        assert probe.crashes == 1
        assert probe.request("some-group", 5.0) is False  # restarts only after a pause
        probe._down_since = time.monotonic() - 60  # noqa: SLF001 - skip the pause
        assert probe.request("some-group", 5.0) is True
    finally:
        probe.close()
