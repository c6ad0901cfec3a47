"""``lockgate read``: the committed records of a topic, one JSON line each.

Reads ``read_committed`` with a group-less consumer (nothing is committed, no group is
joined), so it shows what downstream consumers see: never a record of an aborted or
open transaction. Each line is ``{"partition", "offset", "timestamp", "key", "value",
"headers"}``. With ``--app`` keys and values are decoded with the app's codecs for the
topic (an input, output or global table of the app; Schema Registry codecs included);
without it a key or value that is JSON is shown as JSON, other bytes as text, or as
``{"base64": ...}`` when they are not UTF-8. lockgate's control records (barriers and
the like: :func:`processors._checkpoint.protocol.is_control_record`) are skipped
unless ``--all``.

Where the read ends (without ``--follow``): at each partition's last stable offset as
it was when the read started (:meth:`Admin.stable_offsets`), not at the first
end-of-partition event. A partition is finished when a record at or past ``end - 1``
was read, or when the consumer's position reached ``end``: the last offsets of a
partition are often transaction markers, which occupy offsets but are never delivered,
so the position (not the last record) says the end was reached. Records that commit
after the start are not shown: a topic an app writes to all the time still ends.

The click command is added to ``lockgate`` by ``processors/cli.py``; exit codes and
errors follow :mod:`processors._ops.cli_common`.
"""

from __future__ import annotations

import base64
import dataclasses
import os
import signal
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from types import FrameType
from typing import Any

import click
import orjson
from confluent_kafka import Consumer, KafkaException, Message, TopicPartition

from processors._checkpoint.protocol import is_control_record
from processors._config.settings import Settings
from processors._dsl.app import App
from processors._kafka.clients import PARTITION_EOF, Admin, restore_consumer_config
from processors._ops.catalog import OpsError
from processors._ops.cli_common import (
    CLI_CLIENT,
    codecs_for,
    load_for_command,
    ops_fail,
    ops_settings,
    parse_time_ms,
)
from processors.exceptions import LockgateError
from state.codecs import Codec

__all__ = ["ReadPlan", "read", "read_topic", "record_json"]

_OFFSET_BEGINNING = -2
_OFFSET_END = -1
#: A consumer error that lasts this long without a record in between ends the read.
_GIVE_UP_S = 30.0
#: Without --follow, a partition whose position does not move towards its end for this
#: long ends the read (exit 1): its leader is gone, or records below its end vanished.
_STALL_S = 60.0


@dataclasses.dataclass(frozen=True)
class ReadPlan:
    """Where each partition's read starts and (without ``--follow``) ends.

    Attributes:
        start: partition -> first offset to read (``-1``: none to read; with
            ``--follow`` the partition is read from its end).
        end: partition -> the offset the read stops before (the last stable offset at
            the start); empty with ``--follow``.
    """

    start: dict[int, int]
    end: dict[int, int]

    def open_partitions(self) -> set[int]:
        """The partitions with records to read: start known and below the end."""
        return {p for p, s in self.start.items() if s >= 0 and s < self.end.get(p, 0)}


def plan_read(
    admin: Admin,
    topic: str,
    partitions: Sequence[int],
    *,
    start_ms: int | None,
    follow: bool,
) -> ReadPlan:
    """Work out each partition's first offset and (without ``follow``) its end.

    The end is the last stable offset now: what ``read_committed`` can reach. The start
    is the log start offset, or the first offset with a timestamp at or after
    ``start_ms`` (``-1`` where there is none).

    Raises:
        FatalKafkaError: the offsets could not be listed within 60 s.
    """
    tps = [TopicPartition(topic, p) for p in partitions]
    if start_ms is None:
        found = admin.start_offsets(tps)
    else:
        found = admin.offsets_for_time(tps, start_ms)
    start = {p: found[(topic, p)] for p in partitions}
    if follow:
        return ReadPlan(start=start, end={})
    ends = admin.stable_offsets(tps)
    return ReadPlan(start=start, end={p: ends[(topic, p)] for p in partitions})


def _plain(data: str | bytes | None) -> Any:
    """Bytes without a codec: JSON if they are JSON, else text, else base64."""
    if data is None or isinstance(data, str):
        return data
    try:
        return orjson.loads(data)
    except orjson.JSONDecodeError:
        pass
    try:
        return data.decode()
    except UnicodeDecodeError:
        return {"base64": base64.b64encode(data).decode()}


def _jsonable(value: Any) -> Any:
    """Orjson's fallback for decoded values (pydantic models, Faust records, bytes, sets)."""
    if isinstance(value, bytes):
        return _plain(value)
    for method in ("model_dump", "asdict", "to_representation", "_asdict"):
        fn = getattr(value, method, None)
        if callable(fn):
            return fn()
    if isinstance(value, set | frozenset):
        return sorted(value, key=repr)
    return str(value)


def record_json(msg: Message, key_codec: Codec | None, value_codec: Codec | None) -> bytes:
    """Return one record as a JSON line (without the newline).

    Keys are ``partition``, ``offset``, ``timestamp`` (ms), ``key``, ``value`` and
    ``headers`` (name -> value; the last of a repeated name). A key or value its codec
    cannot decode is shown undecoded (as without a codec), with ``"key_error"`` or
    ``"value_error"`` saying why: one bad record never stops the read.
    """
    line: dict[str, Any] = {
        "partition": msg.partition(),
        "offset": msg.offset(),
        "timestamp": msg.timestamp()[1],
    }
    for field, data, codec in (
        ("key", msg.key(), key_codec),
        ("value", msg.value(), value_codec),
    ):
        if data is None or codec is None:
            line[field] = _plain(data)
            continue
        try:
            line[field] = codec.decode(data)
        except Exception as exc:  # noqa: BLE001 - shown, not fatal: any codec may raise
            line[field] = _plain(data)
            line[f"{field}_error"] = f"{type(exc).__name__}: {exc}"
    raw = msg.headers() or []
    pairs = raw.items() if isinstance(raw, dict) else raw
    line["headers"] = {name: _plain(value) for name, value in pairs}
    return orjson.dumps(line, default=_jsonable)


def read_topic(
    settings: Settings,
    topic: str,
    plan: ReadPlan,
    *,
    max_records: int | None = None,
    follow: bool = False,
    show_all: bool = False,
    should_stop: Callable[[], bool] = lambda: False,
) -> Iterator[Message]:
    """Yield the committed records of ``topic`` as ``plan`` says, by partition in order.

    Ends when every partition reached its end in ``plan`` (unless ``follow``), after
    ``max_records`` records were yielded, or when ``should_stop()`` (checked at least
    every half second). Control records are skipped unless ``show_all``; they count
    towards ``max_records`` only when shown.

    Raises:
        OpsError: (exit code 1) a consumer error lasted ``_GIVE_UP_S``, a fatal one, or
            (without ``follow``) a partition made no progress for ``_STALL_S``.
    """
    open_parts = set(plan.start) if follow else plan.open_partitions()
    if not follow and not open_parts:
        return
    conf = restore_consumer_config(settings, CLI_CLIENT)
    conf["client.id"] = f"{CLI_CLIENT}-read"
    conf["fetch.wait.max.ms"] = 100
    consumer = Consumer(conf)
    assignment = [
        TopicPartition(topic, p, plan.start[p] if plan.start[p] >= 0 else _OFFSET_END)
        for p in sorted(open_parts)
    ]
    end = plan.end
    progress = dict.fromkeys(open_parts, time.monotonic())
    shown = 0
    failing_since: float | None = None
    try:
        consumer.assign(assignment)
        while follow or open_parts:
            if should_stop():
                return
            msgs = consumer.consume(500, 0.5)
            for msg in msgs:
                p = msg.partition()
                err = msg.error()
                if err is not None:
                    if err.code() == PARTITION_EOF:
                        # The event's offset is the partition's end when it was sent.
                        if not follow and p in open_parts and (msg.offset() or 0) >= end[p]:
                            open_parts.discard(p)
                        continue
                    failing_since = failing_since or time.monotonic()
                    if err.fatal() or time.monotonic() - failing_since >= _GIVE_UP_S:
                        raise OpsError(f"reading {topic}: {err.name()}: {err.str()}")
                    continue  # transient (a leader change, a broker away): librdkafka retries
                failing_since = None
                offset = msg.offset() or 0
                if not follow:
                    if p not in open_parts or offset >= end[p]:
                        open_parts.discard(p)  # committed after the start: not shown
                        continue
                    progress[p] = time.monotonic()
                    if offset >= end[p] - 1:
                        open_parts.discard(p)
                if show_all or not is_control_record(msg.headers()):
                    yield msg
                    shown += 1
                    if max_records is not None and shown >= max_records:
                        return
            if not follow and open_parts and not msgs:
                _check_positions(consumer, topic, open_parts, end, progress)
    except KafkaException as exc:
        raise OpsError(f"reading {topic}: {exc}") from exc
    finally:
        consumer.close()


def _check_positions(
    consumer: Consumer,
    topic: str,
    open_parts: set[int],
    end: dict[int, int],
    progress: dict[int, float],
) -> None:
    """Finish the partitions whose position reached their end (past trailing markers).

    Raises:
        OpsError: (exit code 1) a partition made no progress for ``_STALL_S``.
    """
    now = time.monotonic()
    for tp in consumer.position([TopicPartition(topic, p) for p in sorted(open_parts)]):
        if tp.offset >= end[tp.partition]:
            open_parts.discard(tp.partition)
        elif now - progress[tp.partition] > _STALL_S:
            raise OpsError(
                f"reading {topic}[{tp.partition}] stalled at offset {tp.offset} of "
                f"{end[tp.partition]} for {_STALL_S:.0f} s"
            )


class _StopSignals:
    """SIGINT and SIGTERM set a flag instead of interrupting: the read ends cleanly.

    Used as a context manager; the previous handlers are put back on exit.
    """

    def __init__(self) -> None:
        self.stopped = False
        self._saved: dict[int, Any] = {}

    def _handle(self, _signum: int, _frame: FrameType | None) -> None:
        self.stopped = True

    def __enter__(self) -> _StopSignals:
        for sig in (signal.SIGINT, signal.SIGTERM):
            self._saved[sig] = signal.signal(sig, self._handle)
        return self

    def __exit__(self, *_exc: object) -> None:
        for sig, handler in self._saved.items():
            signal.signal(sig, handler)


@click.command("read")
@click.argument("topic")
@click.option("--app", "app_spec", metavar="MODULE:APP", help="Decode with this app's codecs.")
@click.option("--from-beginning", is_flag=True, help="From the first record (the default).")
@click.option(
    "--from", "start", metavar="TIME", help="From the first record at or after TIME (ms or ISO)."
)
@click.option("--follow", "-f", is_flag=True, help="Keep printing records as they commit.")
@click.option("--max", "max_records", type=click.IntRange(min=1), help="Stop after N records.")
@click.option(
    "--partition", "-p", "partition", type=int, multiple=True, help="Only this partition."
)
@click.option("--all", "show_all", is_flag=True, help="Show lockgate's control records too.")
def read(
    topic: str,
    app_spec: str | None,
    from_beginning: bool,
    start: str | None,
    follow: bool,
    max_records: int | None,
    partition: tuple[int, ...],
    show_all: bool,
) -> None:
    """Print TOPIC's committed records, one JSON line each.

    Lines are {"partition", "offset", "timestamp", "key", "value", "headers"}, read
    read_committed (never a record of an aborted or open transaction). With --app, keys
    and values are decoded with the app's codecs for TOPIC. Control records (barriers)
    are skipped unless --all. Without --follow it stops at what was committed when it
    started and exits 0; --follow runs until Ctrl-C or SIGTERM (exit 0). --partition
    may be given more than once. A missing topic or partition is exit 2.
    """
    if from_beginning and start is not None:
        ops_fail(OpsError("--from-beginning and --from exclude each other", exit_code=2))
    key_codec: Codec | None = None
    value_codec: Codec | None = None
    app: App | None = None
    if app_spec is not None:
        app, settings, _name = load_for_command(app_spec)
    else:
        settings = ops_settings()
    try:
        if app is not None:
            key_codec, value_codec = codecs_for(app, topic)
        start_ms = parse_time_ms(start, "--from") if start is not None else None
        admin = Admin(settings)
        count = admin.partitions_of_each([topic]).get(topic)
        if count is None:
            raise OpsError(f"topic {topic} does not exist", exit_code=2)
        wrong = sorted({p for p in partition if not 0 <= p < count})
        if wrong:
            raise OpsError(f"{topic} has partitions 0..{count - 1}, not {wrong}", exit_code=2)
        parts = sorted(set(partition)) or list(range(count))
        plan = plan_read(admin, topic, parts, start_ms=start_ms, follow=follow)
        with _StopSignals() as signals:
            records = read_topic(
                settings,
                topic,
                plan,
                max_records=max_records,
                follow=follow,
                show_all=show_all,
                should_stop=lambda: signals.stopped,
            )
            _print(records, key_codec, value_codec, flush_each=follow)
    except (LockgateError, KafkaException) as exc:
        ops_fail(exc)


def _print(
    records: Iterator[Message],
    key_codec: Codec | None,
    value_codec: Codec | None,
    *,
    flush_each: bool,
) -> None:
    """Write each record's JSON line to stdout; a closed pipe (``| head``) ends quietly."""
    out = sys.stdout
    try:
        for msg in records:
            out.write(record_json(msg, key_codec, value_codec).decode() + "\n")
            if flush_each:
                out.flush()
        out.flush()
    except BrokenPipeError:
        # The reader of the pipe is gone: no more output, and none at exit either.
        sys.stdout = open(os.devnull, "w")  # noqa: SIM115 - replaces stdout until exit
    finally:
        close = getattr(records, "close", None)
        if callable(close):
            close()  # the consumer is closed now, not at garbage collection
