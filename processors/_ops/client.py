"""The Kafka side of the operator commands: :class:`Ops`, one command's clients.

A group-less ``read_committed`` consumer (so nothing of an aborted transaction is ever
read) and an admin client over the control topics
(:mod:`processors._checkpoint.control_topics`): the registry, the checkpoint history,
writing savepoint requests and cancels, and waiting for the savepoint manifests.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import orjson
from confluent_kafka import Consumer, KafkaError, Producer, TopicPartition

from processors._checkpoint.control_topics import (
    REGISTRY_TOPIC,
    REQUEST_PARTITION,
    checkpoint_key,
    control_topic,
    latest_records,
    read_partition,
    read_registry,
    request_key,
)
from processors._config.settings import Settings
from processors._kafka.clients import PARTITION_EOF, Admin, producer_config, restore_consumer_config
from processors._ops.errors import OpsError
from processors._ops.savepoint_requests import (
    _ranges,
    manifest_problems,
    missing_key_groups,
    progress_text,
)

#: Progress lines on stderr at most this often while waiting for manifests.
PROGRESS_EVERY_S = 2.0

_CLIENT = "lockgate-cli"


class Ops:
    """The Kafka clients of one operator command (a group-less read_committed reader).

    Args:
        settings: the lockgate settings (bootstrap servers, security, savepoint dir).
    """

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.admin = Admin(settings)
        self._consumer: Consumer | None = None

    @property
    def consumer(self) -> Consumer:
        """The group-less ``read_committed`` consumer (created on first use)."""
        if self._consumer is None:
            self._consumer = Consumer(restore_consumer_config(self.settings, _CLIENT))
        return self._consumer

    def close(self) -> None:
        """Close the consumer."""
        if self._consumer is not None:
            self._consumer.close()
            self._consumer = None

    def registry(self) -> dict[str, dict[str, Any]]:
        """Return every app's registration (empty when the registry topic is missing)."""
        if not self.admin.partitions_of([REGISTRY_TOPIC]):
            return {}
        return read_registry(self.consumer, self.admin.end_offsets)

    def key_groups(self, app: str, registration: Mapping[str, Any] | None) -> int:
        """Return P of ``app``: its control topic's partition count, else the registry's.

        Raises:
            OpsError: neither exists (exit code 2).
        """
        found = self.admin.partitions_of([control_topic(app)])
        if control_topic(app) in found:
            return found[control_topic(app)]
        if registration is not None and int(registration.get("key_groups") or 0) > 0:
            return int(registration["key_groups"])
        raise OpsError(
            f"app {app!r} has neither a registration nor a control topic "
            f"({control_topic(app)}): has it run?",
            exit_code=2,
        )

    def _bounds(self, app: str, key_groups: int) -> dict[int, tuple[int, int]]:
        topic = control_topic(app)
        if topic not in self.admin.partitions_of([topic]):
            return {}
        tps = [TopicPartition(topic, g) for g in range(key_groups)]
        lows = self.admin.start_offsets(tps)
        highs = self.admin.end_offsets(tps)
        return {g: (lows[(topic, g)], highs[(topic, g)]) for g in range(key_groups)}

    def latest_checkpoints(self, app: str, key_groups: int) -> dict[int, dict[str, Any]]:
        """Return key group -> its latest committed ``ckpt/<g>`` record (if it has one)."""
        topic = control_topic(app)
        out: dict[int, dict[str, Any]] = {}
        for g, (low, high) in self._bounds(app, key_groups).items():
            found = latest_records(self.consumer, topic, g, low, high, checkpoint_key(g))
            value = found.get(checkpoint_key(g))
            if isinstance(value, dict):
                out[g] = value
        return out

    def checkpoint_history(
        self, app: str, key_groups: int, at_most: Callable[[int], int | None], limit: int
    ) -> dict[int, list[dict[str, Any]]]:
        """Return key group -> committed ``ckpt/<g>`` records read back from the end.

        Reads each partition backwards in growing windows until it has ``limit``
        records whose checkpoint is at most ``at_most(g)`` (``None``: no bound), or
        the partition's start.
        """
        topic = control_topic(app)
        out: dict[int, list[dict[str, Any]]] = {}
        for g, (low, high) in self._bounds(app, key_groups).items():
            key = checkpoint_key(g)
            bound = at_most(g)
            recs: list[dict[str, Any]] = []
            end = high
            window = 256
            while end > low:
                start = max(low, end - window)
                chunk = [
                    v
                    for k, v, _ in read_partition(self.consumer, topic, g, start, end)
                    if k == key and isinstance(v, dict) and isinstance(v.get("checkpoint"), int)
                ]
                recs = chunk + recs
                end = start
                window *= 4
                wanted = [r for r in recs if bound is None or r["checkpoint"] <= bound]
                if len(wanted) >= limit:
                    break
            out[g] = recs
        return out

    def end_offsets(self, apps: Mapping[str, int]) -> dict[tuple[str, int], int]:
        """Return the end offset of every control partition of ``apps`` (app -> P)."""
        tps = [TopicPartition(control_topic(a), g) for a, p in apps.items() for g in range(p)]
        return self.admin.end_offsets(tps)

    def write_records(
        self, targets: Iterable[tuple[str, int]], value: Mapping[str, Any], key: bytes
    ) -> None:
        """Write one record to each (topic, partition) of ``targets`` (acks=all, checked).

        Raises:
            OpsError: a record was not delivered (exit code 1).
        """
        conf = producer_config(self.settings, _CLIENT, None)
        conf["acks"] = "all"
        producer = Producer(conf)
        failures: list[str] = []

        def report(err: KafkaError | None, msg: Any) -> None:
            if err is not None:
                failures.append(f"{msg.topic()}: {err}")

        data = orjson.dumps(dict(value))
        for topic, partition in targets:
            producer.produce(topic, data, key, partition=partition, on_delivery=report)
        left = producer.flush(30)
        if left:
            failures.append(f"{left} record(s) not delivered within 30 s")
        if failures:
            raise OpsError(f"cannot write {key.decode(errors='replace')}: " + "; ".join(failures))

    def write_requests(
        self, apps: Iterable[str], request: Mapping[str, Any], key: bytes | None = None
    ) -> None:
        """Write ``request`` to partition 0 of each app's control topic (acks=all).

        ``key`` defaults to the request key of ``request["savepoint"]``.

        Raises:
            OpsError: a record was not delivered (exit code 1).
        """
        self.write_records(
            [(control_topic(app), REQUEST_PARTITION) for app in apps],
            request,
            key or request_key(str(request["savepoint"])),
        )

    def wait_for_manifests(
        self,
        savepoint_id: str,
        start: Mapping[tuple[str, int], int],
        totals: Mapping[str, int],
        timeout_s: float,
        progress: Callable[[str], None],
        seen: Callable[[str, int], None] | None = None,
        caught_up: Callable[[], None] | None = None,
    ) -> dict[str, dict[int, dict[str, Any]]]:
        """Read the control partitions from ``start`` until every key group has a manifest.

        Args:
            savepoint_id: the savepoint.
            start: (control topic, partition) -> the offset to read from (the end
                before the request was written).
            totals: app -> P, in the order to report.
            timeout_s: give up after this long.
            progress: called with a progress line at most every 2 s (and at the end).
            seen: called with (app, key group) for every manifest read (a key group
                exported twice, e.g. by a new owner, keeps the last manifest read).
            caught_up: called once, when every partition read has reached its end once
                (every manifest committed before then has been passed to ``seen``).

        Returns:
            app -> key group -> manifest record.

        Raises:
            OpsError: (exit code 1) a manifest reports an error (every error seen is
                named), or the timeout passed (the missing key groups are named).
        """
        prefix = f"savepoint/{savepoint_id}/".encode()
        apps_by_topic = {control_topic(a): a for a in totals}
        manifests: dict[str, dict[int, dict[str, Any]]] = {a: {} for a in totals}
        consumer = self.consumer
        consumer.assign([TopicPartition(t, p, off) for (t, p), off in start.items()])
        deadline = time.monotonic() + timeout_s
        last_progress = 0.0
        shown = ""
        at_end: set[tuple[str, int]] = set()
        try:
            while True:
                for msg in consumer.consume(500, 0.2):
                    err = msg.error()
                    if err is not None:
                        if err.code() == PARTITION_EOF and caught_up is not None:
                            at_end.add((str(msg.topic()), msg.partition() or 0))
                            if len(at_end) == len(start):
                                caught_up()
                                caught_up = None
                        elif err.fatal():
                            raise OpsError(f"reading the control topics: {err}")
                        continue
                    key = msg.key()
                    if key is None or not key.startswith(prefix):
                        continue
                    try:
                        value = orjson.loads(msg.value() or b"null")
                    except orjson.JSONDecodeError:
                        continue
                    app = apps_by_topic.get(str(msg.topic()))
                    if app is None or not isinstance(value, dict):
                        continue
                    try:
                        g = int(key[len(prefix) :])
                    except ValueError:
                        continue
                    if 0 <= g < totals[app]:
                        manifests[app][g] = value
                        if seen is not None:
                            seen(app, g)
                errors = manifest_problems(manifests)
                done = {a: len(m) for a, m in manifests.items()}
                text = progress_text(savepoint_id, done, totals)
                complete = not missing_key_groups(manifests, totals)
                now = time.monotonic()
                if text != shown and (now - last_progress >= PROGRESS_EVERY_S or complete):
                    progress(text)
                    shown, last_progress = text, now
                if errors:
                    raise OpsError(f"savepoint {savepoint_id} failed:\n  " + "\n  ".join(errors))
                if complete:
                    return manifests
                if now > deadline:
                    missing = missing_key_groups(manifests, totals)
                    parts = [f"{a} key group(s) {_ranges(gs)}" for a, gs in missing.items()]
                    raise OpsError(
                        f"savepoint {savepoint_id} timed out after {timeout_s:g}s ({text}); "
                        f"no manifest from: {'; '.join(parts)}. Are the apps running? "
                        "(an unfinished savepoint is ignored; trigger a new one)"
                    )
        finally:
            consumer.unassign()
