"""Crash injection for chaos tests: ``LOCKGATE_TEST_CRASH_POINTS``.

``LOCKGATE_TEST_CRASH_POINTS="after_commit:0.2,mid_restore:0.5"`` makes the process
SIGKILL itself at the named points with the given probability. The points are the
windows where exactly-once is hardest to get right:

- ``before_send_offsets``: changelog, barriers and outputs produced, offsets not yet sent;
- ``before_commit``: offsets added to the transaction, not yet committed;
- ``after_commit``: the transaction committed, the local RocksDB not yet written;
- ``mid_restore``: part of a changelog partition applied to the local DB;
- ``mid_seed``: part of a savepoint restore committed (``LOCKGATE_TEST_SEED_CHUNK``
  entries per chunk);
- ``after_revoke``: partitions revoked in a rebalance, before the member rejoins.

Checked once per epoch or restore batch (never per record). Unset in production.
"""

from __future__ import annotations

import os
import random
import signal

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
