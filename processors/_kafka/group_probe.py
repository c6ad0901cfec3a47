"""Describe the consumer group from a helper process, so a librdkafka abort cannot kill us.

librdkafka (2.16 and earlier; confluentinc/librdkafka#4605, fix proposed in #5397) can
abort the whole process (``rd_kafka_enq_once_del_source_return: Assertion
eonce->refcnt > 0``) when a coordinator-targeted Admin request — DescribeConsumerGroups —
meets a dropped connection. The runtime describes its group at start-up (the
subscription check) and every few seconds to heal stranded partitions
(``GroupWatch.stranded_heal``, processors/_runtime/membership.py), so under network
faults an in-process AdminClient took instances down (seen in the network-fault chaos
test). The probe runs that AdminClient in a child process: if librdkafka aborts there,
the child dies, the instance logs it and starts another child later. No
coordinator-targeted admin request runs in the processing process.

Use: :meth:`GroupProbe.request` (never blocks), then :meth:`GroupProbe.result` on later
loop iterations until it returns something.
"""

from __future__ import annotations

import json
import logging
import os
import select
import subprocess
import sys
import time
from collections.abc import Callable
from typing import IO, Any

log = logging.getLogger("lockgate.runtime")

#: (state name, {member: {(topic, partition)}}) or an error text.
Description = tuple[str, dict[str, set[tuple[str, int]]]]

_RESTART_AFTER_S = 10.0
#: A child that has not answered a request by then is killed and replaced.
_ANSWER_WITHIN_S = 60.0


def _serve(stdin: IO[str], stdout: IO[str]) -> None:  # pragma: no cover - runs in the child
    """The child: the client config on the first line, then one group per line."""
    from confluent_kafka import KafkaError, KafkaException  # noqa: PLC0415 - only in the child
    from confluent_kafka.admin import AdminClient  # noqa: PLC0415 - only in the child

    admin = AdminClient(json.loads(stdin.readline()))
    for line in stdin:
        group, timeout = json.loads(line)
        try:
            fut = admin.describe_consumer_groups(
                [group], request_timeout=timeout, include_authorized_operations=True
            )[group]
            desc = fut.result(timeout=timeout + 5)
            members = {
                (m.group_instance_id or m.member_id): [
                    [tp.topic, tp.partition]
                    for tp in (m.assignment.topic_partitions if m.assignment else [])
                ]
                for m in desc.members
            }
            clients = {
                (m.group_instance_id or m.member_id): f"client {m.client_id}, host {m.host}"
                for m in desc.members
            }
            ops = [op.name for op in desc.authorized_operations or ()]
            answer: Any = ["ok", str(desc.state).rsplit(".", 1)[-1], members, clients, ops]
        except KafkaException as exc:
            err = exc.args[0] if exc.args else None
            if isinstance(err, KafkaError) and err.code() == KafkaError.GROUP_ID_NOT_FOUND:
                answer = ["ok", "DEAD", {}, {}, []]  # no such group: nobody is in it
            elif (
                isinstance(err, KafkaError) and err.code() == KafkaError.GROUP_AUTHORIZATION_FAILED
            ):
                answer = ["denied", f"{err.name()}: {err.str()}", None, None, None]
            else:
                answer = ["error", f"KafkaException: {exc}", None, None, None]
        except Exception as exc:  # noqa: BLE001 - reported to the parent
            answer = ["error", f"{type(exc).__name__}: {exc}", None, None, None]
        stdout.write(json.dumps(answer) + "\n")
        stdout.flush()


class GroupProbe:
    """A child process that describes consumer groups (see the module docs).

    The client configuration (it may hold credentials) goes to the child on its stdin,
    never on its command line.
    """

    def __init__(self, conf: dict[str, Any]) -> None:
        self._conf = {k: v for k, v in conf.items() if isinstance(v, (str, int, float, bool))}
        self._proc: subprocess.Popen[str] | None = None
        self._pending = False
        self._down_since: float | None = None
        self._buf = ""
        self._sent_at = 0.0
        self.crashes = 0
        #: Per member of the last description: ``client <client id>, host <host>``.
        self.clients: dict[str, str] = {}
        #: What the principal may do on the group, as the last description said (KIP-430;
        #: empty: the broker did not say).
        self.authorized_operations: set[str] = set()
        #: The last answer was GROUP_AUTHORIZATION_FAILED (not even Describe is allowed).
        self.denied = False

    def _start(self) -> bool:
        now = time.monotonic()
        if self._down_since is not None and now - self._down_since < _RESTART_AFTER_S:
            return False
        self._proc = subprocess.Popen(  # noqa: S603 - our own interpreter and module
            [sys.executable, "-m", "processors._kafka.group_probe"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )
        self._buf = ""
        self._down_since = None
        return self._send(self._conf)

    def _send(self, obj: Any) -> bool:
        assert self._proc is not None and self._proc.stdin is not None
        try:
            self._proc.stdin.write(json.dumps(obj) + "\n")
            self._proc.stdin.flush()
        except (BrokenPipeError, OSError) as exc:
            self._died(str(exc))
            return False
        return True

    def _died(self, why: str) -> None:
        self.crashes += 1
        code = None if self._proc is None else self._proc.poll()
        log.warning(
            "the group probe process died; starting another one later",
            extra={"reason": why, "exitcode": code},
        )
        self.close()
        self._down_since = time.monotonic()

    def request(self, group: str, timeout_s: float = 10.0) -> bool:
        """Ask for a description of ``group`` (no-op while one is pending).

        Returns whether a request is pending now.
        """
        if self._pending:
            return True
        if (self._proc is None or self._proc.poll() is not None) and not self._start():
            return False
        if not self._send([group, timeout_s]):
            return False
        self._pending = True
        self._sent_at = time.monotonic()
        return True

    def result(self) -> Description | str | None:
        """The answer to the pending request when it arrived (an error text on failure).

        ``None``: not there yet (or nothing pending). Never blocks.
        """
        proc = self._proc
        if not self._pending or proc is None or proc.stdout is None:
            return None
        if time.monotonic() - self._sent_at > _ANSWER_WITHIN_S:
            self._pending = False
            self._died("no answer in time")
            return "the probe process did not answer"
        fd = proc.stdout.fileno()
        while "\n" not in self._buf:
            ready, _, _ = select.select([fd], [], [], 0)
            if not ready:
                if proc.poll() is not None:
                    self._pending = False
                    self._died(f"exit code {proc.returncode}")
                    return "the probe process died"
                return None
            chunk = os.read(fd, 65536).decode()
            if not chunk:
                self._pending = False
                self._died(f"exit code {proc.poll()}")
                return "the probe process died"
            self._buf += chunk
        line, self._buf = self._buf.split("\n", 1)
        self._pending = False
        try:
            kind, first, members, clients, ops = json.loads(line)
            self.denied = kind == "denied"
            if kind != "ok":
                return str(first)
            self.clients = {str(m): str(c) for m, c in clients.items()}
            self.authorized_operations = {str(op) for op in ops}
            return first, {m: {(t, p) for t, p in parts} for m, parts in members.items()}
        except (ValueError, TypeError) as exc:  # not our answer: treat the child as broken
            self._died(f"unreadable answer: {exc}")
            return "the probe process answered garbage"

    def describe(self, group: str, timeout_s: float, wait: Callable[[], None]) -> Description | str:
        """Describe ``group`` and wait for the answer (at most ``timeout_s`` + 10 s).

        For start-up checks that must have an answer before going on. ``wait`` is called
        every 0.1 s while waiting (it may raise, e.g. on a stop request).

        Returns:
            The description, or an error text (the child failed or did not answer).
        """
        deadline = time.monotonic() + timeout_s + 10
        if not self.request(group, timeout_s):
            return "the probe process could not be started"
        while True:
            answer = self.result()
            if answer is not None:
                return answer
            if time.monotonic() > deadline:
                self._pending = False
                self._died("no answer in time")
                return "the probe process did not answer in time"
            wait()
            time.sleep(0.1)

    def close(self) -> None:
        """Stop the child (idempotent)."""
        self._pending = False
        proc, self._proc = self._proc, None
        if proc is not None:
            if proc.poll() is None:
                proc.kill()
                proc.wait(5)
            for stream in (proc.stdin, proc.stdout):
                if stream is not None:
                    try:
                        stream.close()
                    except OSError:
                        pass


if __name__ == "__main__":  # pragma: no cover - the child
    _serve(sys.stdin, sys.stdout)
