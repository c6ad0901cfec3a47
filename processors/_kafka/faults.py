"""Crash injection for chaos tests: ``LOCKGATE_TEST_CRASH_POINTS``.

``LOCKGATE_TEST_CRASH_POINTS="after_commit:0.2,mid_restore:0.5"`` makes the process
SIGKILL itself at the named points with the given probability. The points are the
windows where exactly-once is hardest to get right:

- ``before_send_offsets``: changelog, barriers and outputs produced, offsets not yet sent;
- ``before_commit``: offsets added to the transaction, not yet committed;
- ``after_export``: an epoch carrying savepoint manifests, not committed (at-least-once:
  its records, the manifests among them, delivered and visible; offsets not committed);
- ``before_sink_commit``: the transaction committed, the sinks' prepared rows not yet
  committed (apps with a Postgres or Iceberg output, processors/_sinks);
- ``after_sink_table_commit``: an Iceberg output's files appended to the table, their
  prepare markers not yet deleted;
- ``after_commit``: the transaction committed, the local RocksDB not yet written;
- ``mid_restore``: part of a changelog partition applied to the local DB;
- ``mid_seed``: part of a savepoint restore committed (``LOCKGATE_TEST_SEED_CHUNK``
  entries per chunk);
- ``after_revoke``: partitions revoked in a rebalance, before the member rejoins.

Checked once per epoch or restore batch (never per record). Unset in production.

``LOCKGATE_TEST_LATE_COMMIT="0.3:12"`` makes a ``commit_transaction`` that committed on
the broker answer late, with probability 0.3: the client keeps reporting the retriable
``_TIMED_OUT`` ("retry call to resume") for 12 s before it reports the success, as when
the link to the coordinator stalls after EndTxn reached it. Past the runtime's budget,
the commit's outcome is unknown to the runtime (``processors._checkpoint.txn``). With a ``stop:``
prefix (``"stop:1:12"``) only the final commit after a stop request is affected.

``LOCKGATE_TEST_UNSENT_COMMIT="0.1"`` makes a ``commit_transaction`` never reach the
coordinator, with probability 0.1: the client reports the retriable ``_TIMED_OUT`` on
every call and never sends EndTxn, as when the link to the coordinator is down. The
transaction stays open until a new producer's ``init_transactions`` aborts it.

``LOCKGATE_TEST_FAULT_SEED`` seeds which commits these two faults pick (a test prints
the seed it gave, so a run can be repeated).
"""

from __future__ import annotations

import os
import random
import signal
import time
from collections.abc import Callable
from typing import Any

from confluent_kafka import KafkaError, KafkaException

_POINTS: dict[str, float] = {}
for _item in filter(None, os.environ.get("LOCKGATE_TEST_CRASH_POINTS", "").split(",")):
    _name, _, _prob = _item.partition(":")
    _POINTS[_name.strip()] = float(_prob or 1.0)


def crash_point(name: str) -> None:
    """SIGKILL this process at ``name`` when configured (probabilistically)."""
    prob = _POINTS.get(name)
    if prob is not None and random.random() < prob:  # noqa: S311 - test-only chaos
        os.write(2, f"lockgate: crash point {name}: SIGKILL\n".encode())
        os.kill(os.getpid(), signal.SIGKILL)


def _timed_out(why: str) -> KafkaException:
    """What librdkafka raises when a resumable commit is still in progress at its timeout."""
    return KafkaException(
        KafkaError(
            KafkaError._TIMED_OUT,  # noqa: SLF001 - public code, underscored name
            f"Transactional API operation (commit_transaction) timed out: retry call to "
            f"resume ({why})",
            retriable=True,
        )
    )


def _late_commit_setting() -> tuple[bool, float, float] | None:
    raw = os.environ.get("LOCKGATE_TEST_LATE_COMMIT", "").strip()
    if not raw:
        return None
    final_only = raw.startswith("stop:")
    prob, _, delay = raw.removeprefix("stop:").partition(":")
    return final_only, float(prob), float(delay or 10.0)


_LATE_COMMIT = _late_commit_setting()
#: Which commits the commit faults pick (seeded by LOCKGATE_TEST_FAULT_SEED when set).
_FAULT_RNG = random.Random(os.environ.get("LOCKGATE_TEST_FAULT_SEED"))  # noqa: S311 - test-only


def late_commit(commit: Callable[[float], Any], final: bool) -> Callable[[float], Any]:
    """``commit`` itself, or (``LOCKGATE_TEST_LATE_COMMIT``) one whose answer comes late.

    ``final`` says whether this is the final commit after a stop request.

    The returned call commits on its first invocation; when chosen, it then raises a
    retriable ``_TIMED_OUT`` on every call (each waiting its timeout) until the delay
    has passed, and returns the success after that, like a resumed call would.
    """
    if _LATE_COMMIT is None or (_LATE_COMMIT[0] and not final):
        return commit
    _, prob, delay = _LATE_COMMIT
    answer_at: list[float] = []

    def call(timeout: float) -> Any:
        if not answer_at:
            result = commit(timeout)
            if _FAULT_RNG.random() >= prob:
                return result
            answer_at.append(time.monotonic() + delay)
            os.write(2, f"lockgate: late commit: answering in {delay:.0f}s\n".encode())
        left = answer_at[0] - time.monotonic()
        if left <= 0:
            return None
        time.sleep(min(timeout, left))
        raise _timed_out("injected")

    return call


def _unsent_probability() -> float:
    raw = os.environ.get("LOCKGATE_TEST_UNSENT_COMMIT", "").strip()
    return float(raw) if raw else 0.0


_UNSENT = _unsent_probability()


def unsent_commit(commit: Callable[[float], Any]) -> Callable[[float], Any]:
    """``commit`` itself, or (``LOCKGATE_TEST_UNSENT_COMMIT``) one that never sends EndTxn.

    When chosen (once per returned call), every invocation waits its timeout and raises
    the retriable ``_TIMED_OUT`` without calling ``commit``.
    """
    if not _UNSENT:
        return commit
    chosen = _FAULT_RNG.random() < _UNSENT
    announced: list[bool] = []

    def call(timeout: float) -> Any:
        if not chosen:
            return commit(timeout)
        if not announced:
            announced.append(True)
            os.write(2, b"lockgate: unsent commit: EndTxn never sent\n")
        time.sleep(timeout)
        raise _timed_out("injected: never sent")

    return call
