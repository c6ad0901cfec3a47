"""``lockgate read``: committed records of a topic, one JSON line each.

Reads ``read_committed`` with a group-less consumer (nothing is committed, no group is
joined), so it shows what downstream consumers see: never a record of an aborted or
open transaction. Each line is ``{"partition", "offset", "timestamp", "key", "value",
"headers"}``. With ``--app`` keys and values are decoded with the app's codecs for the
topic (an input, output or global table of the app; Schema Registry codecs included);
without it a value that is JSON is shown as JSON, other bytes as text, or as
``{"base64": ...}`` when they are not UTF-8. lockgate's own control records (barriers
and the like, header ``lockgate-type``) are skipped unless ``--all``.

Without ``--follow`` the command stops at the end of what is committed when it reaches
each partition (the last stable offset) and exits 0; with ``--max N`` after N records.
"""

from __future__ import annotations

import base64
import dataclasses
import sys
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from typing import Any

import click
import orjson
from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition

from processors._config.log_setup import configure
from processors._config.settings import Settings
from processors._kafka.clients import Admin, restore_consumer_config
from processors._ops.catalog import OpsError
from processors._ops.cli_common import app_settings, check_app, load_app, ops_fail, ops_settings
from processors._ops.commands import codecs_for
from processors.exceptions import LockgateError
from state.codecs import Codec

__all__ = ["parse_start", "read", "read_topic", "record_json"]

CONTROL_HEADER = "lockgate-type"
_OFFSET_BEGINNING = -2
#: A consumer error that lasts this long without a record in between ends the read.
_GIVE_UP_S = 30.0


def parse_start(text: str) -> int:
    """Milliseconds since the epoch from ``text``: an integer, or an ISO-8601 time.

    A time without a zone is UTC.

    Raises:
        OpsError: (exit code 2) neither.
    """
    if text.isdigit():
        return int(text)
    try:
        when = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise OpsError(
            f"--from {text!r}: give milliseconds since the epoch or an ISO-8601 time "
            "(e.g. 2026-11-27T10:00:00Z)",
            exit_code=2,
        ) from None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return int(when.timestamp() * 1000)


def _plain(data: bytes | None) -> Any:
    """Bytes without a codec: JSON if they are JSON, else text, else base64."""
    if data is None:
        return None
    try:
        return orjson.loads(data)
    except orjson.JSONDecodeError:
        pass
    try:
        return data.decode()
    except UnicodeDecodeError:
        return {"base64": base64.b64encode(data).decode()}


def _jsonable(value: Any) -> Any:
    """Orjson's fallback for decoded values (models, bytes, sets)."""
    if isinstance(value, bytes):
        return _plain(value)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return dataclasses.asdict(value)
    for method in ("model_dump", "asdict", "to_representation", "_asdict"):
        fn = getattr(value, method, None)
        if callable(fn):
            return fn()
    if isinstance(value, (set, frozenset)):
        return sorted(value, key=repr)
    return str(value)


def record_json(msg: Any, key_codec: Codec | None, value_codec: Codec | None) -> bytes:
    """One record as a JSON line (without the newline).

    A key or value its codec cannot decode is shown undecoded, with ``"key_error"`` or
    ``"value_error"`` saying why: the reader never stops on one bad record.
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
    line["headers"] = {
        name: _plain(value) if value is not None else None for name, value in msg.headers() or []
    }
    return orjson.dumps(line, default=_jsonable)


def read_topic(
    settings: Settings,
    topic: str,
    partitions: list[int],
    *,
    start_ms: int | None = None,
    max_records: int | None = None,
    follow: bool = False,
    show_all: bool = False,
    should_stop: Callable[[], bool] = lambda: False,
) -> Iterator[Any]:
    """Yield the committed records of ``topic``'s ``partitions`` (messages).

    From the beginning, or from the first record at or after ``start_ms``. Ends at the
    end of each partition (unless ``follow``), after ``max_records`` records, or when
    ``should_stop()``.

    Raises:
        OpsError: (exit code 1) a consumer error other than a partition's end.
    """
    conf = restore_consumer_config(settings, "lockgate-read")
    conf["client.id"] = "lockgate-read"
    conf["fetch.wait.max.ms"] = 100
    consumer = Consumer(conf)
    try:
        start = [TopicPartition(topic, p, _OFFSET_BEGINNING) for p in partitions]
        if start_ms is not None:
            wanted = [TopicPartition(topic, p, start_ms) for p in partitions]
            found = consumer.offsets_for_times(wanted, timeout=30)
            # -1: no record at or after the time (start at the end: nothing to show).
            start = [
                TopicPartition(topic, tp.partition, tp.offset if tp.offset >= 0 else -1)
                for tp in found
            ]
        consumer.assign(start)
        open_parts = set(partitions)
        shown = 0
        failing_since: float | None = None
        while follow or open_parts:
            if should_stop():
                return
            for msg in consumer.consume(500, 0.5):
                err = msg.error()
                if err is not None:
                    if err.code() == KafkaError._PARTITION_EOF:  # noqa: SLF001 - public code
                        open_parts.discard(msg.partition())
                        continue
                    failing_since = failing_since or time.monotonic()
                    if not err.fatal() and time.monotonic() - failing_since < _GIVE_UP_S:
                        time.sleep(0.1)  # transient (a leader change, a broker away)
                        continue
                    raise OpsError(f"reading {topic}: {err.name()}: {err.str()}")
                failing_since = None
                headers = msg.headers()
                if not show_all and headers and any(h[0] == CONTROL_HEADER for h in headers):
                    continue
                yield msg
                shown += 1
                if max_records is not None and shown >= max_records:
                    return
    except KafkaException as exc:
        raise OpsError(f"reading {topic}: {exc}") from exc
    finally:
        consumer.close()


@click.command("read")
@click.argument("topic")
@click.option("--app", "app_spec", metavar="MODULE:APP", help="Decode with this app's codecs.")
@click.option("--from-beginning", is_flag=True, help="From the first record (the default).")
@click.option("--from", "start", metavar="TIME", help="From this time (ms or ISO-8601; UTC).")
@click.option("--follow", "-f", is_flag=True, help="Keep reading new records (Ctrl-C stops).")
@click.option("--max", "max_records", type=click.IntRange(min=1), help="Stop after N records.")
@click.option("--partition", "-p", "partition", type=int, multiple=True, help="Only these.")
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
    are skipped unless --all. Without --follow it stops at the end of each partition.
    """
    if from_beginning and start is not None:
        ops_fail(OpsError("--from-beginning and --from exclude each other", exit_code=2))
    try:
        key_codec: Codec | None = None
        value_codec: Codec | None = None
        if app_spec is not None:
            app = load_app(app_spec)
            settings = app_settings(app)
            configure(settings.log_level, settings.log_format.value)
            check_app(app)
            key_codec, value_codec = codecs_for(app, topic)
        else:
            settings = ops_settings()
        counts = Admin(settings).partitions_of([topic])
        if topic not in counts:
            raise OpsError(f"topic {topic} does not exist", exit_code=2)
        wrong = sorted(p for p in partition if not 0 <= p < counts[topic])
        if wrong:
            raise OpsError(
                f"{topic} has partitions 0..{counts[topic] - 1}, not {wrong}", exit_code=2
            )
        start_ms = parse_start(start) if start is not None else None
        out = sys.stdout
        for msg in read_topic(
            settings,
            topic,
            sorted(partition) or list(range(counts[topic])),
            start_ms=start_ms,
            max_records=max_records,
            follow=follow,
            show_all=show_all,
        ):
            out.write(record_json(msg, key_codec, value_codec).decode() + "\n")
            if follow:
                out.flush()
    except (LockgateError, KafkaException) as exc:
        ops_fail(exc)
