"""Host ports for the plugin's host-network containers and the apps' HTTP servers.

Owns ``LOCKGATE_TEST_PLUGIN_PORTS`` (the range) and :func:`free_port`, which never hands
out the same port twice in a process while the range has others.
"""

from __future__ import annotations

import os
import random
import socket

from processors._testing.choice import BrokerUnavailableError

#: Host ports for host-network containers (local broker, processor containers), ``lo-hi``.
ENV_PORTS = "LOCKGATE_TEST_PLUGIN_PORTS"
#: Below Linux's default ephemeral range (32768-60999): no outgoing connection takes a
#: picked port before the broker or app binds it, or while a restarted broker is down.
DEFAULT_PORTS = "21000-25999"


def _port_range(spec: str | None = None) -> tuple[int, int]:
    lo, _, hi = (spec or os.environ.get(ENV_PORTS, DEFAULT_PORTS)).partition("-")
    return int(lo), int(hi)


def _port_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


#: Ports this process handed out: two picks before either is bound never return the same
#: port (``lockgate_app(..., wait_ready=False)`` twice in a row), until the range is used up.
_handed_out: set[int] = set()


def free_port(count: int = 1, ports: str | None = None) -> int:
    """Return a port p such that p .. p+count-1 are free on 127.0.0.1 right now.

    Ports come from ``ports`` (``lo-hi``), else ``LOCKGATE_TEST_PLUGIN_PORTS`` (default
    21000-25999, below Linux's default ephemeral ports, so no outgoing connection takes
    it). A port is picked at random among the free ones (suites sharing the machine with
    the same range rarely pick the same), checked by binding it, and not handed out twice
    by this process while the range has others. A port another process binds between the
    pick and its use is a bind failure, which the broker start retries on another port.

    Raises:
        BrokerUnavailableError: no ``count`` consecutive free ports in the range.
    """
    lo, hi = _port_range(ports)
    candidates = list(range(lo, hi - count + 2))
    random.shuffle(candidates)
    for fresh_only in (True, False):
        tried = 0
        for port in candidates:
            span = range(port, port + count)
            if fresh_only and any(p in _handed_out for p in span):
                continue
            tried += 1
            if tried > 500:
                break
            if all(_port_free(p) for p in span):
                _handed_out.update(span)
                return port
    raise BrokerUnavailableError(f"no {count} consecutive free ports in {lo}-{hi} ({ENV_PORTS})")
