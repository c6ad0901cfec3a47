"""Free ports for the tests' brokers, proxies and HTTP servers.

Ports come from ``LOCKGATE_TEST_PORT_RANGE`` (``lo-hi``, default 26000-28999): below
Linux's default ephemeral range (32768-60999), so no outgoing connection (hundreds are
made while brokers restart and clients reconnect) takes a port between its pick and its
bind, or while the process that owns it restarts. ``make test`` gives each parallel lane a
range of its own, so two lanes never pick the same port. Within one process a port is
handed out once (until the range is used up), so two picks before either is bound differ.
"""

from __future__ import annotations

import os
import random

from processors.pytest_plugin import _port_free, _port_range

DEFAULT_RANGE = "26000-28999"
_given: set[int] = set()


def free_port(count: int = 1) -> int:
    """Return a port p such that p .. p+count-1 are free on 127.0.0.1 and not handed out yet.

    A port is only free when it is checked: start its user soon (the broker helpers retry
    on a bind failure).

    Raises:
        RuntimeError: no ``count`` consecutive free ports in the range.
    """
    lo, hi = _port_range(os.environ.get("LOCKGATE_TEST_PORT_RANGE", DEFAULT_RANGE))
    candidates = list(range(lo, hi - count + 2))
    random.shuffle(candidates)
    for attempt in range(2):
        for port in candidates:
            span = range(port, port + count)
            if any(p in _given for p in span) or not all(_port_free(p) for p in span):
                continue
            _given.update(span)
            return port
        if attempt == 0:
            _given.clear()  # the range is used up: ports handed out long ago are reused
    raise RuntimeError(f"no {count} consecutive free ports in {lo}-{hi} (LOCKGATE_TEST_PORT_RANGE)")
