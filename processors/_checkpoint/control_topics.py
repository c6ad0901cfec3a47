"""Control topics: app registrations, the checkpoint catalog, savepoint requests.

Two kinds of topic, both compacted (docs/architecture.md, "Control topics"):

* ``lockgate.registry`` — one partition, one record per app (key ``app/<name>``):
  inputs, outputs, internal outputs, key-group count, stores and a state version.
  Written when an instance starts (not per epoch), read by downstream apps to learn
  which writers to expect on an internal topic, and by the CLI for a pipeline view.
* ``<app>.control`` — per app, ``P`` partitions, partition ``g`` ↔ key group ``g``:

  - ``ckpt/<g>`` — written by the owner of key group ``g`` in **every** epoch
    transaction: the key group's completed checkpoint, the committed input offsets,
    the alignment snapshot of each input partition, the savepoint the key group's
    state descends from (``origin``) and whether a stop-with-savepoint halted it.
    Only the committed transaction makes it visible (``read_committed``), so the
    catalog never lies, and the new owner of a key group restores its alignment from
    the last one;
  - ``savepoint/<id>/<g>`` — the key group's savepoint manifest, in the transaction of
    the epoch that exported it;
  - ``savepoint-request/<id>`` (partition 0) — written by ``lockgate savepoint trigger``.

An epoch of an instance touches only the control partitions of the key groups it owns
(the partitions its changelog records go to anyway), so a checkpoint's cost does not
grow with the number of apps or instances in the cluster, and no partition is written
by every transaction of the cluster.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from typing import Any

import orjson
from confluent_kafka import Consumer, TopicPartition

from processors._kafka.clients import PARTITION_EOF
from processors._kafka.errors import Stopping
from processors.exceptions import FatalKafkaError

__all__ = [
    "CANCEL_PREFIX",
    "REQUEST_PREFIX",
    "REGISTRY_TOPIC",
    "REQUEST_PARTITION",
    "cancel_key",
    "checkpoint_key",
    "control_topic",
    "latest_records",
    "manifest_key",
    "read_partition",
    "read_registry",
    "read_registry_and_cancels",
    "registry_key",
    "request_key",
    "writers_of",
]

REGISTRY_TOPIC = "lockgate.registry"
#: Savepoint requests go to partition 0 of ``<app>.control``.
REQUEST_PARTITION = 0
#: Key prefixes of savepoint requests and cancels (followed by the savepoint id).
REQUEST_PREFIX = b"savepoint-request/"
CANCEL_PREFIX = b"savepoint-cancel/"
#: Configuration of the control topics.
CONTROL_CONFIG = {"cleanup.policy": "compact"}


def control_topic(app: str) -> str:
    """Return the name of ``app``'s control topic."""
    return f"{app}.control"


def registry_key(app: str) -> bytes:
    """Key of ``app``'s registration in :data:`REGISTRY_TOPIC`."""
    return f"app/{app}".encode()


def checkpoint_key(key_group: int) -> bytes:
    """Key of key group ``key_group``'s checkpoint record in its control partition."""
    return f"ckpt/{key_group}".encode()


def manifest_key(savepoint: str, key_group: int) -> bytes:
    """Key of a key group's savepoint manifest in its control partition."""
    return f"savepoint/{savepoint}/{key_group}".encode()


def request_key(savepoint: str) -> bytes:
    """Key of a savepoint request (partition :data:`REQUEST_PARTITION`)."""
    return REQUEST_PREFIX + savepoint.encode()


def cancel_key(savepoint: str) -> bytes:
    """Key of a savepoint cancel (partition :data:`REQUEST_PARTITION`).

    Key groups halted by that stop-with-savepoint resume, and none takes it any more.
    """
    return CANCEL_PREFIX + savepoint.encode()


def read_partition(
    consumer: Consumer,
    topic: str,
    partition: int,
    start: int,
    end: int,
    timeout_s: float = 60.0,
    should_stop: Callable[[], bool] = lambda: False,
) -> list[tuple[bytes | None, Any, int]]:
    """Read ``topic[partition]`` from ``start`` up to ``end`` (exclusive).

    ``consumer`` is a group-less consumer; with ``read_committed`` aborted records and
    transaction markers are skipped (the position passes them). Values are decoded as
    JSON (tombstones and undecodable values give ``None``).

    Returns:
        (key, value, offset) of every record read, in offset order.

    Raises:
        FatalKafkaError: the end was not reached within ``timeout_s`` (an open
            transaction there lasts at most its timeout), or a fatal consumer error.
    """
    out: list[tuple[bytes | None, Any, int]] = []
    if start >= end:
        return out
    tp = TopicPartition(topic, partition, start)
    consumer.assign([tp])
    deadline = time.monotonic() + timeout_s
    position = start
    try:
        while position < end:
            if should_stop():
                raise Stopping(f"reading {topic}[{partition}]")
            for msg in consumer.consume(1000, 0.1):
                err = msg.error()
                if err is not None:
                    if err.code() == PARTITION_EOF:
                        # The end as the consumer sees it: past trailing transaction
                        # markers, which position() may not report as passed.
                        eof = msg.offset()
                        if eof is not None and eof > position:
                            position = eof
                        continue
                    if err.fatal():
                        raise FatalKafkaError(f"reading {topic}[{partition}]: {err}")
                    continue
                off = msg.offset()
                assert off is not None  # data records always have one
                if off >= end:
                    position = end
                    break
                raw = msg.value()
                try:
                    value = None if raw is None else orjson.loads(raw)
                except orjson.JSONDecodeError:
                    value = None
                out.append((msg.key(), value, off))
                position = off + 1
            else:
                # Markers and aborted records are skipped: the position passes them.
                now_at = consumer.position([TopicPartition(topic, partition)])[0].offset
                position = max(position, now_at)
            if time.monotonic() > deadline:
                raise FatalKafkaError(
                    f"reading {topic}[{partition}] stalled at offset {position} of {end} for "
                    f"{timeout_s:.0f}s (an open transaction there, or the broker is away)"
                )
    finally:
        consumer.unassign()
    return out


def latest_records(
    consumer: Consumer,
    topic: str,
    partition: int,
    low: int,
    high: int,
    prefix: bytes,
    timeout_s: float = 60.0,
    should_stop: Callable[[], bool] = lambda: False,
) -> dict[bytes, Any]:
    """Return the last value of every key starting with ``prefix`` near the end.

    Reads backwards in growing windows from ``high`` until at least one record with
    the prefix is found (or ``low`` is reached), then returns the latest value per key
    in the window read. Meant for "the last checkpoint record of key group g".
    """
    window = 64
    start = high
    while True:
        start = max(low, start - window)
        records = read_partition(consumer, topic, partition, start, high, timeout_s, should_stop)
        found = {k: v for k, v, _ in records if k is not None and k.startswith(prefix)}
        if found or start <= low:
            return found
        window *= 4


def read_registry(
    consumer: Consumer,
    end_offsets: Callable[[list[TopicPartition]], dict[tuple[str, int], int]],
    timeout_s: float = 60.0,
) -> dict[str, dict[str, Any]]:
    """Return every app's registration (app name -> record) from the registry topic.

    Raises:
        FatalKafkaError: not read within ``timeout_s`` (see :func:`read_partition`).
    """
    return read_registry_and_cancels(consumer, end_offsets, timeout_s)[0]


def read_registry_and_cancels(
    consumer: Consumer,
    end_offsets: Callable[[list[TopicPartition]], dict[tuple[str, int], int]],
    timeout_s: float = 60.0,
) -> tuple[dict[str, dict[str, Any]], set[str]]:
    """Return the registrations and the ids of every cancelled savepoint.

    Cancels (key ``savepoint-cancel/<id>``) are kept in the registry topic — small,
    compacted, read whole at every start — so an instance started long after a
    cancel still knows it; the copy in each app's control partition 0 tells running
    instances at once.

    Raises:
        FatalKafkaError: not read within ``timeout_s`` (see :func:`read_partition`).
    """
    ends = end_offsets([TopicPartition(REGISTRY_TOPIC, 0)])
    high = ends.get((REGISTRY_TOPIC, 0), 0)
    apps: dict[str, dict[str, Any]] = {}
    cancelled: set[str] = set()
    for key, value, _ in read_partition(consumer, REGISTRY_TOPIC, 0, 0, high, timeout_s):
        if key is None:
            continue
        if key.startswith(CANCEL_PREFIX):
            cancelled.add(key[len(CANCEL_PREFIX) :].decode(errors="replace"))
            continue
        if not key.startswith(b"app/"):
            continue
        name = key[4:].decode(errors="replace")
        if value is None:
            apps.pop(name, None)
        elif isinstance(value, dict):
            apps[name] = value
    return apps, cancelled


def writers_of(registry: dict[str, dict[str, Any]], topics: Iterable[str]) -> list[str]:
    """Return the writers (``<app>/<key group>``) that registered ``topics`` as internal outputs."""
    wanted = set(topics)
    writers: list[str] = []
    for name, reg in sorted(registry.items()):
        if wanted & set(reg.get("internal_outputs", ())):
            n = int(reg.get("key_groups", 0))
            writers.extend(f"{name}/{g}" for g in range(n))
    return writers
