"""``lockgate send``: produce test records to an app's topic, encoded with its codecs.

:func:`parse_send_lines` (pure, unit-tested without Kafka) validates and encodes every
JSON input line first, all or nothing: a bad line is an error naming its line number and
nothing is produced (exit 2). :func:`produce_records` then produces them (murmur2
partitioner, idempotent, acks=all). The click command is added to ``lockgate`` by
``processors/cli.py``; exit codes and errors follow :mod:`processors._ops.cli_common`.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import IO, Any

import click
import orjson
from confluent_kafka import KafkaError, KafkaException, Producer

from processors._config.settings import Settings
from processors._kafka.clients import Admin, producer_config
from processors._ops.catalog import OpsError
from processors._ops.cli_common import CLI_CLIENT, codecs_for, fail, load_for_command
from processors.exceptions import LockgateError
from state.codecs import Codec

__all__ = [
    "SendRecord",
    "parse_send_lines",
    "send",
]

_ENVELOPE = frozenset({"key", "value", "headers", "timestamp"})

# ------------------------------------------------------------------ pure logic


@dataclass(frozen=True)
class SendRecord:
    """One encoded record of ``lockgate send``.

    Attributes:
        line: its 1-based line number in the input.
        key: encoded key (``None``: keyless, a random partition).
        value: encoded value (``None``: a tombstone).
        headers: header name -> value.
        timestamp: ms since the epoch (``None``: now).
    """

    line: int
    key: bytes | None
    value: bytes | None
    headers: list[tuple[str, bytes]] = field(default_factory=list)
    timestamp: int | None = None


def _encode(codec: Codec, value: Any, what: str) -> bytes:
    try:
        return codec.encode(value)
    except Exception as exc:  # noqa: BLE001 - any codec failure is the line's error
        raise ValueError(f"{what} cannot be encoded with the {codec.name} codec: {exc}") from exc


def _parse_line(
    text: str, number: int, key_codec: Codec, value_codec: Codec, key_field: str | None
) -> SendRecord:
    try:
        obj = orjson.loads(text)
    except orjson.JSONDecodeError as exc:
        raise ValueError(f"not JSON ({exc})") from exc
    if not isinstance(obj, dict):
        raise ValueError(f"expected a JSON object, got {type(obj).__name__}")
    unknown = sorted(set(obj) - _ENVELOPE)
    if unknown:
        raise ValueError(
            f"unknown field(s) {', '.join(unknown)} (a line is "
            '{"key": ..., "value": ..., "headers": {...}, "timestamp": ms})'
        )
    if "value" not in obj:
        raise ValueError('no "value" (use "value": null for a tombstone)')
    value = obj["value"]
    key = obj.get("key")
    if "key" not in obj and key_field is not None:
        if not isinstance(value, dict) or key_field not in value:
            raise ValueError(f"no key, and the value has no field {key_field!r} (--key-field)")
        key = value[key_field]
    headers: list[tuple[str, bytes]] = []
    raw_headers = obj.get("headers")
    if raw_headers is not None:
        if not isinstance(raw_headers, dict):
            raise ValueError('"headers" must be an object of strings')
        for name, hv in raw_headers.items():
            if not isinstance(hv, str):
                raise ValueError(f"header {name!r} must be a string")
            headers.append((name, hv.encode()))
    ts = obj.get("timestamp")
    if ts is not None and (isinstance(ts, bool) or not isinstance(ts, int) or ts < 0):
        raise ValueError('"timestamp" must be a non-negative integer (ms since the epoch)')
    return SendRecord(
        line=number,
        key=None if key is None else _encode(key_codec, key, "the key"),
        value=None if value is None else _encode(value_codec, value, "the value"),
        headers=headers,
        timestamp=ts,
    )


def parse_send_lines(
    lines: Iterable[str],
    key_codec: Codec,
    value_codec: Codec,
    key_field: str | None = None,
    max_errors: int = 10,
) -> list[SendRecord]:
    """Parse and encode every JSON line of ``lockgate send``; all or nothing.

    A line is ``{"key": k, "value": v, "headers": {name: str}, "timestamp": ms}``; only
    ``value`` is required (``null``: a tombstone). With ``key_field`` a line without a
    key takes ``value[key_field]`` as its key. Blank lines are skipped.

    Args:
        lines: the input lines (with or without their newline).
        key_codec: encodes the keys (the topic's key codec in the app).
        value_codec: encodes the values.
        key_field: the value field that is the key of lines without one.
        max_errors: at most this many bad lines are named in the error.

    Returns:
        The encoded records in input order.

    Raises:
        OpsError: (exit code 2) some line is not valid; the message names each bad
            line's number and what is wrong with it.
    """
    records: list[SendRecord] = []
    errors: list[str] = []
    bad = 0
    for number, text in enumerate(lines, start=1):
        if not text.strip():
            continue
        try:
            records.append(_parse_line(text, number, key_codec, value_codec, key_field))
        except ValueError as exc:
            bad += 1
            if len(errors) < max_errors:
                errors.append(f"line {number}: {exc}")
    if bad:
        more = f"\n  ... and {bad - len(errors)} more" if bad > len(errors) else ""
        raise OpsError(
            f"{bad} bad line(s), nothing was produced:\n  " + "\n  ".join(errors) + more,
            exit_code=2,
        )
    return records


# ------------------------------------------------------------------ lockgate send


def produce_records(settings: Settings, topic: str, records: Sequence[SendRecord]) -> None:
    """Produce ``records`` to ``topic`` (murmur2 partitioner, idempotent, acks=all).

    Raises:
        OpsError: (exit code 1) a record was not delivered; the line numbers are named.
    """
    conf = producer_config(settings, CLI_CLIENT, None)
    conf["acks"] = "all"
    producer = Producer(conf)
    failures: list[str] = []
    for rec in records:

        def report(err: KafkaError | None, _msg: Any, line: int = rec.line) -> None:
            if err is not None:
                failures.append(f"line {line}: {err}")

        kw: dict[str, Any] = {"on_delivery": report, "headers": rec.headers or None}
        if rec.timestamp is not None:
            kw["timestamp"] = rec.timestamp
        while True:
            try:
                producer.produce(topic, rec.value, rec.key, **kw)
                break
            except BufferError:
                producer.poll(0.1)
        producer.poll(0)
    left = producer.flush(60)
    if left:
        failures.append(f"{left} record(s) not delivered within 60 s")
    if failures:
        raise OpsError(f"producing to {topic} failed: " + "; ".join(failures[:10]))


@click.command("send")
@click.argument("topic")
@click.option("--app", "app_spec", required=True, metavar="MODULE:APP", help="The app.")
@click.option(
    "--file",
    "file",
    type=click.File("r"),
    default="-",
    show_default=True,
    help="JSON lines to produce (- for stdin).",
)
@click.option("--key-field", metavar="K", help="Key of lines without one: the value's field K.")
@click.option("--dry-run", is_flag=True, help="Validate and encode, produce nothing.")
def send(topic: str, app_spec: str, file: IO[str], key_field: str | None, dry_run: bool) -> None:
    """Produce test records to TOPIC, an input or output of MODULE:APP.

    Each line is a JSON object {"key": ..., "value": ..., "headers": {"name": "text"},
    "timestamp": ms}; only "value" is required. Keys and values are encoded with the
    app's codecs for TOPIC; records are placed by key with the murmur2 partitioner
    (as Kafka's Java clients do). Every line is validated first: a bad line is an error
    naming its line number and nothing is produced (exit 2). Prints the count.
    """
    app, settings, _name = load_for_command(app_spec)
    try:
        key_codec, value_codec = codecs_for(app, topic)
        records = parse_send_lines(file, key_codec, value_codec, key_field)
        if dry_run:
            click.echo(f"dry run: {len(records)} valid record(s) for {topic}, nothing produced")
            return
        if topic not in Admin(settings).partitions_of([topic]):
            raise OpsError(f"topic {topic} does not exist", exit_code=2)
        produce_records(settings, topic, records)
    except (LockgateError, KafkaException) as exc:
        fail(exc)
    click.echo(f"produced {len(records)} record(s) to {topic}")
