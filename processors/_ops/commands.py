"""Operator commands for an app's topics and data: ``topics``, ``send``, ``dlq``, ``reset``.

Each command is a click command that ``processors/cli.py`` adds to ``lockgate``.
Conventions (as the rest of the CLI): exit 0 on success, 1 on a runtime failure (Kafka),
2 on bad usage, configuration, topic mismatches or a refusal; errors on stderr as
``lockgate: ...``; no message names the value of a secret.

The module has two halves:

* pure functions (unit-tested without Kafka): parsing ``send`` input lines, ``--offsets``
  and ``--to``, the headers of a replayed record, and the topic report's checks;
* the Kafka side: :class:`TopicFacts` gathering, producing, reading the DLQ, the
  transactional replay and the reset.

Exactly-once DLQ replay: a transactional producer (``transactional.id =
<app>.dlq-replay``, stable) writes the re-injected records and, in the same
transaction, the next DLQ offset of each partition as the committed offset of the
consumer group ``<app>.dlq-replay`` (``send_offsets_to_transaction``). A retried command
first fences and aborts whatever an interrupted one left open (``init_transactions``),
then skips every DLQ record below the committed position.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import sys
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import IO, Any, NoReturn

import click
import orjson
from confluent_kafka import (
    Consumer,
    ConsumerGroupTopicPartitions,
    KafkaError,
    KafkaException,
    Producer,
    TopicPartition,
)
from confluent_kafka.admin import (  # type: ignore[attr-defined]  # re-exported in cimpl
    AdminClient,
    AlterConfigOpType,
    ConfigEntry,
    ConfigResource,
    ResourceType,
)

from processors._checkpoint.control_topics import CONTROL_CONFIG, REGISTRY_TOPIC, control_topic
from processors._checkpoint.protocol import (
    ERROR_MESSAGE,
    ERROR_PREFIXES,
    ERROR_STAGE,
    ERROR_TYPE,
    PREFIX,
    REPLAYED_FROM,
    SOURCE_OFFSET,
    SOURCE_PARTITION,
    SOURCE_TIMESTAMP,
    SOURCE_TOPIC,
)
from processors._checkpoint.txn import CommitOutcomeUnknown, TransactionalProducer
from processors._config.log_setup import configure
from processors._config.settings import Settings, StateBackendKind
from processors._dsl.app import App
from processors._kafka.clients import (
    CHANGELOG_CONFIG,
    PARTITION_EOF,
    Admin,
    admin_config,
    producer_config,
    restore_consumer_config,
)
from processors._kafka.errors import AbortEpoch, CallHung, Stopping
from processors._kafka.faults import crash_point
from processors._kafka.group_probe import GroupProbe
from processors._ops.catalog import OpsError, ms_to_iso
from processors._ops.cli_common import (
    app_settings,
    check_app,
    json_out,
    load_app,
    ops_fail,
    ops_settings,
)
from processors.exceptions import FatalKafkaError, LockgateError, TopicError
from state.cache import changelog_topic
from state.codecs import Codec

__all__ = [
    "REPLAYED_FROM",
    "SendRecord",
    "TopicFacts",
    "check_topics",
    "dlq",
    "dlq_topic",
    "parse_offsets",
    "parse_reset_position",
    "parse_send_lines",
    "replay_group",
    "replay_headers",
    "reset",
    "send",
    "topics",
]

#: Records per replay transaction (each commits its DLQ positions).
REPLAY_BATCH = 500
#: Relevant topic configs shown by ``lockgate topics``.
_SHOWN_CONFIGS = ("cleanup.policy", "retention.ms", "min.insync.replicas")
_CLIENT = "lockgate-cli"
_ENVELOPE = frozenset({"key", "value", "headers", "timestamp"})
_PREVIEW = 60


def dlq_topic(app: str) -> str:
    """Return the dead-letter topic of ``app``."""
    return f"{app}.dlq"


def replay_group(app: str) -> str:
    """Return the consumer group (and transactional.id) of ``app``'s DLQ replays."""
    return f"{app}.dlq-replay"


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


def parse_offsets(text: str) -> dict[int, list[int]]:
    """Parse ``--offsets p:o,p:o,...`` into partition -> sorted distinct offsets.

    Raises:
        OpsError: (exit code 2) an item is not ``partition:offset`` of non-negative ints.
    """
    out: dict[int, set[int]] = {}
    for item in filter(None, (s.strip() for s in text.split(","))):
        p, sep, o = item.partition(":")
        if not sep or not p.isdigit() or not o.isdigit():
            raise OpsError(
                f"--offsets: {item!r} is not PARTITION:OFFSET (e.g. 0:17,2:5)", exit_code=2
            )
        out.setdefault(int(p), set()).add(int(o))
    if not out:
        raise OpsError("--offsets: no PARTITION:OFFSET given", exit_code=2)
    return {p: sorted(offs) for p, offs in sorted(out.items())}


def parse_reset_position(text: str) -> str | int:
    """Parse ``--to``: ``"earliest"``, ``"latest"`` or a timestamp in ms.

    A timestamp is an integer (ms since the epoch) or ISO 8601
    (``2026-01-31T12:00:00Z``; without an offset it is UTC).

    Raises:
        OpsError: (exit code 2) none of these.
    """
    value = text.strip().lower()
    if value in ("earliest", "latest"):
        return value
    if value.isdigit():
        return int(value)
    try:
        dt = datetime.fromisoformat(text.strip().replace("Z", "+00:00").replace("z", "+00:00"))
    except ValueError:
        raise OpsError(
            f"--to: {text!r} is not earliest, latest, a time in ms or ISO 8601 "
            "(e.g. 2026-01-31T12:00:00Z)",
            exit_code=2,
        ) from None
    if dt.tzinfo is None:
        dt = dt.replace(tzinfo=UTC)
    return int(dt.timestamp() * 1000)


def _text(value: bytes | str | None) -> str:
    if value is None:
        return ""
    return value.decode(errors="replace") if isinstance(value, bytes) else value


def lockgate_headers(headers: Sequence[tuple[str, bytes | str | None]] | None) -> dict[str, str]:
    """Return the first value of each header of a dead letter, as text."""
    out: dict[str, str] = {}
    for name, value in headers or ():
        if name not in out:
            out[name] = _text(value)
    return out


def replay_headers(
    headers: Sequence[tuple[str, bytes | str | None]] | None, dlq_partition: int, offset: int
) -> list[tuple[str, bytes | str | None]]:
    """Return the headers of a replayed dead letter.

    The record's own headers in order, without the error description
    (``lockgate-error-*``, ``lockgate-source-*``, ``lockgate-timer-*``) and without an
    earlier ``lockgate-replayed-from``, then ``lockgate-replayed-from: <p>:<offset>``.
    """
    kept = [
        (name, value)
        for name, value in headers or ()
        if not name.startswith(ERROR_PREFIXES) and name != REPLAYED_FROM
    ]
    kept.append((REPLAYED_FROM, f"{dlq_partition}:{offset}".encode()))
    return kept


def preview(data: bytes | None, width: int = _PREVIEW) -> str:
    """Return a one-line preview of ``data`` (``null`` for none, ``...`` when cut)."""
    if data is None:
        return "null"
    text = data.decode(errors="replace").replace("\n", "\\n")
    return text if len(text) <= width else text[: width - 3] + "..."


@dataclass
class TopicFacts:
    """What the broker says about one topic (``exists`` False: nothing else is known)."""

    exists: bool
    partitions: int | None = None
    config: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class _Need:
    topic: str
    role: str
    partitions: int | None  # None: any count
    compact: bool | None  # True: must be compacted; False: must not be; None: any
    creatable: bool = True
    strict_partitions: bool = True  # False: a different count is a note, not a problem
    config: Mapping[str, str] = field(default_factory=dict)


def app_needs(app: App, name: str, partitions: int | None) -> list[_Need]:
    """Return what ``lockgate run`` needs of each topic of ``app`` (as ``_setup`` creates them).

    Args:
        app: the app definition.
        name: the app's name (``LOCKGATE_APP_NAME`` or the name in code).
        partitions: P, the inputs' partition count (``None``: unknown, inputs missing).
    """
    needs = [_Need(t, "input", partitions, None, creatable=False) for t in app.input_topics]
    needs += [_Need(t, "global-table", None, None, creatable=False) for t in app.global_tables]
    for topic, spec in app.outputs.items():
        needs.append(
            _Need(
                topic,
                "internal-output" if spec.internal else "output",
                spec.partitions or partitions,
                False if spec.internal else None,
                strict_partitions=spec.internal,
            )
        )
    needs += [
        _Need(changelog_topic(name, s), "changelog", partitions, True, config=CHANGELOG_CONFIG)
        for s in app.stores
    ]
    needs.append(_Need(dlq_topic(name), "dlq", partitions, None, strict_partitions=False))
    needs.append(_Need(control_topic(name), "control", partitions, True, config=CONTROL_CONFIG))
    needs.append(_Need(REGISTRY_TOPIC, "registry", 1, True, config=CONTROL_CONFIG))
    return needs


def check_topics(needs: Sequence[_Need], facts: Mapping[str, TopicFacts]) -> list[dict[str, Any]]:
    """Return one report row per needed topic: facts, expectations, problems and notes.

    A row is ``{"topic", "role", "exists", "partitions", "expected_partitions",
    "config": {cleanup.policy, retention.ms, min.insync.replicas}, "problems": [...],
    "notes": [...]}``. Problems: a missing topic, a wrong partition count where the
    runtime depends on it (inputs co-partitioned, changelogs, control, internal
    outputs, registry), a changelog or control topic that is not compacted, an
    internal output that is.
    """
    counts = {
        facts[n.topic].partitions for n in needs if n.role == "input" and facts[n.topic].exists
    }
    rows: list[dict[str, Any]] = []
    for need in needs:
        fact = facts.get(need.topic, TopicFacts(False))
        problems: list[str] = []
        notes: list[str] = []
        if not fact.exists:
            problems.append(
                "missing: create it (lockgate never creates inputs)"
                if not need.creatable
                else "missing (`lockgate run` or `lockgate topics --create` creates it)"
            )
        else:
            if need.role == "input" and len(counts) > 1:
                problems.append(
                    "inputs are not co-partitioned (partition counts "
                    f"{sorted(c or 0 for c in counts)})"
                )
            if need.partitions is not None and fact.partitions != need.partitions:
                text = f"{fact.partitions} partitions, expected {need.partitions}"
                (problems if need.strict_partitions else notes).append(text)
            policies = fact.config.get("cleanup.policy", "").split(",")
            if need.compact is True and "compact" not in policies:
                problems.append(
                    f"cleanup.policy={fact.config.get('cleanup.policy') or '?'}, must be compact"
                )
            if need.compact is False and "compact" in policies:
                problems.append(
                    f"cleanup.policy={fact.config.get('cleanup.policy')}: an internal output "
                    "must use cleanup.policy=delete"
                )
        rows.append(
            {
                "topic": need.topic,
                "role": need.role,
                "exists": fact.exists,
                "partitions": fact.partitions,
                "expected_partitions": need.partitions,
                "config": {k: fact.config[k] for k in _SHOWN_CONFIGS if k in fact.config},
                "problems": problems,
                "notes": notes,
            }
        )
    return rows


# ------------------------------------------------------------------ CLI plumbing


def _fail(exc: Exception) -> NoReturn:
    """Exit through the CLI's error path; a topic problem is a usage problem (exit 2)."""
    if isinstance(exc, TopicError):
        exc = OpsError(str(exc), exit_code=2)
    ops_fail(exc)
    raise AssertionError("unreachable")  # pragma: no cover


def _load(app_spec: str) -> tuple[App, Settings, str]:
    """Load MODULE:APP and its settings (exit 2 when either is invalid); return the name."""
    app: App = load_app(app_spec)
    settings: Settings = app_settings(app)
    configure(settings.log_level, settings.log_format.value)
    check_app(app)
    return app, settings, settings.app_name or app.name


def _echo_err(line: str) -> None:
    click.echo(line, err=True)


def _members(settings: Settings, group: str, timeout: float = 15.0) -> list[str]:
    """Return a description of every member of ``group`` (empty: none is running).

    Described from a child process (:class:`GroupProbe`): librdkafka can abort the
    process whose DescribeConsumerGroups meets a dropped connection (#4605).

    Raises:
        OpsError: the group cannot be described (exit code 1).
    """
    probe = GroupProbe(admin_config(settings))
    try:
        answer = probe.describe(group, timeout, lambda: None)
    finally:
        probe.close()
    if isinstance(answer, str):
        raise OpsError(f"cannot describe consumer group {group}: {answer}")
    _, members = answer
    return sorted(f"{m} ({probe.clients.get(m, 'client ?')})" for m in members)


def _refuse_if_running(settings: Settings, name: str, what: str) -> None:
    members = _members(settings, name)
    if members:
        raise OpsError(
            f"app {name} is running: its consumer group {name} has {len(members)} member(s): "
            f"{'; '.join(members)}. Stop every instance before {what} (a killed instance with "
            "static membership stays a member until its session times out)",
            exit_code=2,
        )


def _gather(admin: Admin, topics: Iterable[str]) -> dict[str, TopicFacts]:
    wanted = list(dict.fromkeys(topics))
    found = admin.partitions_of(wanted)
    out: dict[str, TopicFacts] = {}
    for topic in wanted:
        if topic not in found:
            out[topic] = TopicFacts(False)
            continue
        out[topic] = TopicFacts(True, found[topic], admin.topic_config(topic))
    return out


def _input_partitions(app: App, facts: Mapping[str, TopicFacts]) -> int | None:
    fact = facts.get(app.subscribed_input)
    return fact.partitions if fact is not None and fact.exists else None


# ------------------------------------------------------------------ lockgate topics


def _topics_report(app: App, name: str, admin: Admin) -> tuple[int | None, list[dict[str, Any]]]:
    probe = app_needs(app, name, None)
    facts = _gather(admin, [n.topic for n in probe])
    p = _input_partitions(app, facts)
    return p, check_topics(app_needs(app, name, p), facts)


def _print_topics(name: str, p: int | None, rows: Sequence[dict[str, Any]]) -> None:
    click.echo(f"app {name}: {p if p is not None else '?'} key groups (input partitions)")
    width = max(len(r["topic"]) for r in rows)
    for r in rows:
        if r["exists"]:
            conf = " ".join(f"{k}={v}" for k, v in r["config"].items())
            state = f"{r['partitions']:>3} partitions  {conf}"
        else:
            state = "MISSING"
        flag = "PROBLEM" if r["problems"] else "ok"
        click.echo(f"  {r['role']:<15} {r['topic']:<{width}}  {state}  {flag}")
        for text in r["problems"]:
            click.echo(f"      problem: {text}")
        for text in r["notes"]:
            click.echo(f"      note: {text}")


@click.group("topics", invoke_without_command=True)
@click.option("--app", "app_spec", metavar="MODULE:APP", help="The app whose topics to check.")
@click.option("--create", is_flag=True, help="Create the missing topics `lockgate run` creates.")
@click.option(
    "--create-inputs",
    is_flag=True,
    help="Create the app's missing input topics too (for development; see --partitions).",
)
@click.option(
    "--partitions",
    type=click.IntRange(1),
    metavar="N",
    help="With --create-inputs: their partition count (default: the existing inputs').",
)
@click.option("--dry-run", is_flag=True, help="With --create: show what would be created.")
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON on stdout.")
@click.pass_context
def topics(
    ctx: click.Context,
    app_spec: str | None,
    create: bool,
    create_inputs: bool,
    partitions: int | None,
    dry_run: bool,
    as_json: bool,
) -> None:
    """Check the topics of MODULE:APP: inputs, outputs, changelogs, DLQ, control, registry.

    For each: whether it exists, its partition count, cleanup.policy, retention.ms and
    min.insync.replicas, and whether it is what the app needs (inputs co-partitioned;
    changelogs and the control topic compacted with the inputs' partition count;
    internal outputs with their partition count and cleanup.policy=delete). --create
    creates the missing topics as `lockgate run` would; --create-inputs creates missing
    inputs as well (`lockgate run` never does). Exit 0 when everything matches, 2 on a
    missing topic or a mismatch. `lockgate topics create` creates any topic.
    """
    if ctx.invoked_subcommand is not None:
        return
    if app_spec is None:
        raise click.UsageError("give --app MODULE:APP (or a subcommand: lockgate topics create)")
    if partitions is not None and not create_inputs:
        raise click.UsageError("--partitions goes with --create-inputs")
    app, settings, name = _load(app_spec)
    try:
        admin = Admin(settings)
        p, rows = _topics_report(app, name, admin)
        created: list[str] = []
        inputs = [r for r in rows if not r["exists"] and r["role"] == "input"]
        if create_inputs and inputs:
            count = p if p is not None else partitions
            if count is None:
                raise OpsError(
                    "--create-inputs: no input exists yet to take the partition count from; "
                    "give --partitions N",
                    exit_code=2,
                )
            if partitions is not None and p is not None and partitions != p:
                raise OpsError(
                    f"--partitions {partitions}: the existing inputs have {p} partitions, and "
                    "inputs must be co-partitioned",
                    exit_code=2,
                )
            specs: dict[str, tuple[int, dict[str, str]]] = {r["topic"]: (count, {}) for r in inputs}
            created += _create(admin, specs, dry_run)
            p, rows = _topics_report(app, name, admin)
        missing = [
            r for r in rows if not r["exists"] and r["role"] not in ("input", "global-table")
        ]
        if (create or create_inputs) and missing:
            if p is None:
                raise OpsError(
                    f"cannot create topics: input {app.subscribed_input} does not exist "
                    "(its partition count decides the others'); create the inputs first "
                    "(--create-inputs --partitions N, or lockgate topics create)",
                    exit_code=2,
                )
            needs = {n.topic: n for n in app_needs(app, name, p)}
            specs = {
                r["topic"]: (needs[r["topic"]].partitions or p, dict(needs[r["topic"]].config))
                for r in missing
            }
            created += _create(admin, specs, dry_run)
            p, rows = _topics_report(app, name, admin)
    except (LockgateError, KafkaException) as exc:
        _fail(exc)
    bad = any(r["problems"] for r in rows)
    if as_json:
        json_out({"app": name, "key_groups": p, "ok": not bad, "created": created, "topics": rows})
    else:
        _print_topics(name, p, rows)
    sys.exit(2 if bad else 0)


def _create(admin: Admin, specs: dict[str, tuple[int, dict[str, str]]], dry_run: bool) -> list[str]:
    """Create ``specs`` (or say what would be created); return the names created."""
    if dry_run:
        for topic, (parts, conf) in specs.items():
            _echo_err(f"would create {topic} ({parts} partitions{_conf_text(conf)})")
        return []
    admin.ensure_topics(specs)
    for topic, (parts, conf) in specs.items():
        _echo_err(f"created {topic} ({parts} partitions{_conf_text(conf)})")
    return sorted(specs)


_TOPIC_NAME = re.compile(r"[A-Za-z0-9._-]{1,249}")


@topics.command("create")
@click.argument("names", nargs=-1, required=True, metavar="TOPIC...")
@click.option("--partitions", type=click.IntRange(1), required=True, metavar="N")
@click.option(
    "--replication",
    type=click.IntRange(1),
    metavar="R",
    help="Replication factor (default: the broker's default.replication.factor).",
)
@click.option("--compact", is_flag=True, help="cleanup.policy=compact (keyed, latest value kept).")
@click.option(
    "--config",
    "configs",
    multiple=True,
    metavar="KEY=VALUE",
    help="A topic config, e.g. retention.ms=86400000 (repeatable).",
)
def create_topics(
    names: tuple[str, ...],
    partitions: int,
    replication: int | None,
    compact: bool,
    configs: tuple[str, ...],
) -> None:
    """Create topics (any topic: inputs included), or check that they exist as asked.

    A topic that exists with the same partition count is left as it is (exit 0); one with
    another count is reported (exit 2: partitions are never changed here). Exit 0 when
    every topic exists as asked at the end.
    """
    conf: dict[str, str] = {}
    for item in configs:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise click.UsageError(f"--config {item!r}: expected KEY=VALUE")
        conf[key.strip()] = value.strip()
    if compact:
        if conf.get("cleanup.policy", "compact") != "compact":
            raise click.UsageError(
                f"--compact and --config cleanup.policy={conf['cleanup.policy']} disagree"
            )
        conf["cleanup.policy"] = "compact"
    bad = [n for n in names if not _TOPIC_NAME.fullmatch(n) or n in (".", "..")]
    if bad:
        raise click.UsageError(
            f"invalid topic name(s) {', '.join(map(repr, bad))}: up to 249 of A-Z a-z 0-9 . _ -"
        )
    settings = ops_settings()
    mismatched = []
    try:
        admin = Admin(settings)
        existing = admin.partitions_of(list(names))
        for name in names:
            if name in existing:
                have = existing[name]
                if have != partitions:
                    mismatched.append(name)
                    _echo_err(f"{name} exists with {have} partitions, not {partitions}: unchanged")
                else:
                    _echo_err(f"{name} exists ({have} partitions): unchanged")
        specs = {n: (partitions, dict(conf)) for n in names if n not in existing}
        if specs:
            admin.ensure_topics(
                specs,
                replication=None if replication is None else dict.fromkeys(specs, replication),
            )
            for name in specs:
                _echo_err(f"created {name} ({partitions} partitions{_conf_text(conf)})")
    except (LockgateError, KafkaException) as exc:
        _fail(exc)
    sys.exit(2 if mismatched else 0)


def _conf_text(conf: Mapping[str, str]) -> str:
    return "".join(f", {k}={v}" for k, v in conf.items())


# ------------------------------------------------------------------ lockgate send


def _codecs_for(app: App, topic: str) -> tuple[Codec, Codec]:
    if topic in app.input_topics:
        return app.input_codecs(topic)
    outputs = app.outputs
    if topic in outputs:
        return outputs[topic].key, outputs[topic].value
    tables = app.global_tables
    if topic in tables:
        return tables[topic].key_codec, tables[topic].value_codec
    known = [*app.input_topics, *tables, *outputs]
    raise OpsError(
        f"{topic} is not an input, output or global table of the app (its topics: "
        f"{', '.join(known)})",
        exit_code=2,
    )


def produce_records(settings: Settings, topic: str, records: Sequence[SendRecord]) -> None:
    """Produce ``records`` to ``topic`` (murmur2 partitioner, idempotent, acks=all).

    Raises:
        OpsError: (exit code 1) a record was not delivered; the line numbers are named.
    """
    conf = producer_config(settings, _CLIENT, None)
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
    app, settings, _name = _load(app_spec)
    try:
        key_codec, value_codec = _codecs_for(app, topic)
        records = parse_send_lines(file, key_codec, value_codec, key_field)
        if dry_run:
            click.echo(f"dry run: {len(records)} valid record(s) for {topic}, nothing produced")
            return
        if topic not in Admin(settings).partitions_of([topic]):
            raise OpsError(f"topic {topic} does not exist", exit_code=2)
        produce_records(settings, topic, records)
    except (LockgateError, KafkaException) as exc:
        _fail(exc)
    click.echo(f"produced {len(records)} record(s) to {topic}")


# ------------------------------------------------------------------ the DLQ


def read_range(
    consumer: Consumer,
    topic: str,
    ranges: Mapping[int, tuple[int, int]],
    stop_after: int | None = None,
    timeout_s: float = 60.0,
) -> list[Any]:
    """Read the committed records of ``topic`` partition ``p`` in ``[start, end)`` for each.

    ``consumer`` is group-less and ``read_committed`` with ``enable.partition.eof``
    (:func:`restore_consumer_config`); ``end`` should be at most the last stable offset.

    Returns:
        The messages, by partition then offset (at most ``stop_after`` of them).

    Raises:
        OpsError: (exit code 1) the ends were not reached within ``timeout_s``, or a
            fatal consumer error.
    """
    out: list[Any] = []
    for p, (start, end) in sorted(ranges.items()):
        if start >= end:
            continue
        consumer.assign([TopicPartition(topic, p, start)])
        position = start
        deadline = time.monotonic() + timeout_s
        try:
            while position < end:
                if stop_after is not None and len(out) >= stop_after:
                    return out
                msgs = consumer.consume(500, 0.2)
                for msg in msgs:
                    err = msg.error()
                    if err is not None:
                        if err.code() == PARTITION_EOF:
                            position = max(position, msg.offset() or 0)
                        elif err.fatal():
                            raise OpsError(f"reading {topic}[{p}]: {err}")
                        continue
                    off = int(msg.offset() or 0)
                    if off >= end:
                        position = end
                        break
                    if stop_after is None or len(out) < stop_after:
                        out.append(msg)
                    position = off + 1
                if not msgs:
                    now_at = consumer.position([TopicPartition(topic, p)])[0].offset
                    position = max(position, now_at)
                if time.monotonic() > deadline:
                    raise OpsError(
                        f"reading {topic}[{p}] stalled at offset {position} of {end} "
                        f"for {timeout_s:.0f}s"
                    )
        finally:
            consumer.unassign()
    return out


def _replay_consumer(settings: Settings, app: str) -> Consumer:
    conf = restore_consumer_config(settings, _CLIENT)
    conf["group.id"] = replay_group(app)  # committed offsets = the replay position
    return Consumer(conf)


def _positions(consumer: Consumer, topic: str, partitions: int) -> dict[int, int]:
    """Return DLQ partition -> the committed replay position (0: none)."""
    tps = consumer.committed([TopicPartition(topic, p) for p in range(partitions)], timeout=30)
    out: dict[int, int] = {}
    for tp in tps:
        if tp.error is not None:
            raise OpsError(f"committed replay offset of {topic}[{tp.partition}]: {tp.error}")
        out[tp.partition] = max(tp.offset, 0)
    return out


def _dlq_bounds(admin: Admin, topic: str) -> tuple[int, dict[int, tuple[int, int]]]:
    parts = admin.partitions_of([topic]).get(topic)
    if parts is None:
        raise OpsError(
            f"no dead-letter topic {topic} (the app has not run, or the name is wrong)",
            exit_code=2,
        )
    tps = [TopicPartition(topic, p) for p in range(parts)]
    lows = admin.start_offsets(tps)
    ends = admin.stable_offsets(tps)
    return parts, {p: (lows[(topic, p)], ends[(topic, p)]) for p in range(parts)}


def describe_dead_letter(msg: Any, position: int | None = None) -> dict[str, Any]:
    """Return the ``dlq list`` row of one dead-lettered record."""
    h = lockgate_headers(msg.headers())
    ts = msg.timestamp()[1]
    row: dict[str, Any] = {
        "partition": msg.partition(),
        "offset": msg.offset(),
        "timestamp": ts,
        "time": ms_to_iso(ts) if ts and ts > 0 else None,
        "error_type": h.get(ERROR_TYPE),
        "error_message": h.get(ERROR_MESSAGE),
        "error_stage": h.get(ERROR_STAGE),
        "source_topic": h.get(SOURCE_TOPIC),
        "source_partition": _int_or_none(h.get(SOURCE_PARTITION)),
        "source_offset": _int_or_none(h.get(SOURCE_OFFSET)),
        "source_timestamp": _int_or_none(h.get(SOURCE_TIMESTAMP)),
        "key": preview(msg.key()),
        "value": preview(msg.value()),
        "headers": {k: v for k, v in h.items() if k.startswith(PREFIX)},
    }
    if position is not None:
        row["replayed"] = msg.offset() < position
    return row


def _int_or_none(text: str | None) -> int | None:
    try:
        return None if text is None else int(text)
    except ValueError:
        return None


@click.group("dlq")
def dlq() -> None:
    """The dead-letter topic <app>.dlq: list and replay dead-lettered records."""


@dlq.command("list")
@click.option("--app", "name", required=True, metavar="NAME", help="The app's name.")
@click.option(
    "--limit", default=50, show_default=True, type=click.IntRange(1), help="At most this many."
)
@click.option("--json", "as_json", is_flag=True, help="Print JSON on stdout.")
def dlq_list(name: str, limit: int, as_json: bool) -> None:
    """List the oldest dead-lettered records of app NAME (committed ones, by partition).

    Each shows its DLQ coordinates, the error (type, stage, message), the source
    coordinates (topic, partition, offset, timestamp), a short key and value preview,
    and whether it is below the replay position of `lockgate dlq replay`.
    """
    settings = ops_settings()
    topic = dlq_topic(name)
    try:
        admin = Admin(settings)
        parts, bounds = _dlq_bounds(admin, topic)
        replay = _replay_consumer(settings, name)
        try:
            positions = _positions(replay, topic, parts)
        finally:
            replay.close()
        reader = Consumer(restore_consumer_config(settings, _CLIENT))
        try:
            msgs = read_range(reader, topic, bounds, stop_after=limit)
        finally:
            reader.close()
    except (LockgateError, KafkaException) as exc:
        _fail(exc)
    rows = [describe_dead_letter(m, positions.get(m.partition(), 0)) for m in msgs]
    summary = {
        "app": name,
        "topic": topic,
        "partitions": {
            str(p): {"start": lo, "end": hi, "replay_position": positions.get(p, 0)}
            for p, (lo, hi) in bounds.items()
        },
        "records": rows,
    }
    if as_json:
        json_out(summary)
        return
    if not rows:
        click.echo(f"{topic}: no dead-lettered records")
        return
    for r in rows:
        click.echo(
            f"{r['partition']}:{r['offset']}  {r['time'] or '-'}  {r['error_type']} in "
            f"{r['error_stage']}: {preview((r['error_message'] or '').encode(), 100)}"
            f"{'  (replayed)' if r.get('replayed') else ''}"
        )
        src = (
            f"{r['source_topic']}[{r['source_partition']}]@{r['source_offset']}"
            if r["source_topic"]
            else "- (not from an input record)"
        )
        click.echo(f"    source {src}  key {r['key']}  value {r['value']}")
    click.echo(f"{len(rows)} record(s) shown (--limit {limit})", err=True)


@dataclass
class ReplayPlan:
    """The DLQ records a replay re-injects, and those it skips.

    Attributes:
        records: the dead letters to re-inject, by partition then offset.
        already: ``p:o`` of selected records below the replay position.
        unreplayable: ``p:o`` of records without ``lockgate-source-topic`` (--all only).
        positions: DLQ partition -> the replay position before the replay.
    """

    records: list[Any]
    already: list[str]
    unreplayable: list[str]
    positions: dict[int, int]


def plan_replay(
    reader: Consumer,
    topic: str,
    bounds: Mapping[int, tuple[int, int]],
    positions: Mapping[int, int],
    selection: Mapping[int, Sequence[int]] | None,
) -> ReplayPlan:
    """Read the DLQ records a replay of ``selection`` (``None``: all) re-injects.

    Raises:
        OpsError: (exit code 2) a selected offset has no committed record in the DLQ
            (out of range, an aborted record or a transaction marker), or a selected
            record names no source topic.
    """
    already: list[str] = []
    ranges: dict[int, tuple[int, int]] = {}
    wanted: dict[int, set[int]] = {}
    if selection is None:
        for p, (lo, hi) in bounds.items():
            ranges[p] = (max(lo, positions.get(p, 0)), hi)
    else:
        for p, offs in selection.items():
            if p not in bounds:
                raise OpsError(f"--offsets: {topic} has no partition {p}", exit_code=2)
            lo, hi = bounds[p]
            pos = positions.get(p, 0)
            already += [f"{p}:{o}" for o in offs if o < pos]
            todo = {o for o in offs if o >= pos}
            outside = sorted(o for o in todo if o < lo or o >= hi)
            if outside:
                raise OpsError(
                    f"--offsets: {topic}[{p}] has committed records in [{lo}, {hi}) only; "
                    f"not: {', '.join(map(str, outside))}",
                    exit_code=2,
                )
            if todo:
                wanted[p] = todo
                ranges[p] = (min(todo), max(todo) + 1)
    msgs = read_range(reader, topic, ranges)
    if selection is not None:
        msgs = [m for m in msgs if m.offset() in wanted.get(m.partition(), set())]
        found = {(m.partition(), m.offset()) for m in msgs}
        absent = [
            f"{p}:{o}" for p, offs in wanted.items() for o in sorted(offs) if (p, o) not in found
        ]
        if absent:
            raise OpsError(
                f"--offsets: no committed record at {', '.join(absent)} in {topic} (an aborted "
                "record or a transaction marker)",
                exit_code=2,
            )
    unreplayable = [
        f"{m.partition()}:{m.offset()}"
        for m in msgs
        if not lockgate_headers(m.headers()).get(SOURCE_TOPIC)
    ]
    if unreplayable and selection is not None:
        raise OpsError(
            f"{', '.join(unreplayable)}: no lockgate-source-topic header (a timer failure, "
            "not an input record): nothing to replay them into",
            exit_code=2,
        )
    return ReplayPlan(msgs, already, unreplayable, dict(positions))


def _target(msg: Any, partitions: Mapping[str, int]) -> tuple[str, int | None, int | None]:
    """Return (source topic, partition or None, timestamp or None) of a dead letter."""
    h = lockgate_headers(msg.headers())
    topic = h[SOURCE_TOPIC]
    part = _int_or_none(h.get(SOURCE_PARTITION))
    if part is not None and not 0 <= part < partitions.get(topic, 0):
        part = None  # the source changed: place it by key (murmur2)
    ts = _int_or_none(h.get(SOURCE_TIMESTAMP))
    if ts is not None and ts <= 0:
        ts = None
    return topic, part, ts


class _Replayer:
    """The transactional producer of one replay (created first: it fences older ones)."""

    def __init__(self, settings: Settings, app: str) -> None:
        conf = producer_config(settings, _CLIENT, replay_group(app))
        conf["client.id"] = f"{_CLIENT}-dlq-replay"
        # The transaction timeout the broker applies (transaction.timeout.ms of the config):
        # a longer wait would take a coordinator timeout-abort for a fence by another replay.
        self.txn = TransactionalProducer(conf, timeout_s=settings.transaction_timeout_ms / 1000)
        # Fences an earlier replay of this app (a retried command) and ends whatever it
        # left open, so the replay positions read next are final.
        try:
            self.txn.start(deadline=time.monotonic() + 120)
        except Stopping as exc:
            raise OpsError(
                "the replay's transactional producer could not initialise within 120 s "
                "(is the cluster reachable?)"
            ) from exc
        self.producer = self.txn.producer

    def _leave(self, text: str) -> NoReturn:
        """Exit 1 with ``text``, without destroying a producer with a call in progress.

        librdkafka may wait in, or abort on, the destruction of a handle whose
        transactional call is still pending: the process exits without destructors.
        """
        click.echo(f"lockgate: {text}", err=True)
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(1)

    def run(
        self,
        group_metadata: Any,
        dlq: str,
        plan: ReplayPlan,
        partitions: Mapping[str, int],
        progress: Callable[[str], None],
    ) -> dict[str, int]:
        """Re-inject ``plan.records`` exactly once; return source topic -> count.

        Transactions of :data:`REPLAY_BATCH` records, each committing the replay group's
        DLQ positions (next offset after its last record per partition) with them.

        Raises:
            OpsError: (exit code 1) a record was not delivered or the transaction failed
                (that batch is aborted: none of its records is visible).
        """
        producer = self.producer
        counts: dict[str, int] = {}
        failures: list[str] = []

        def report(err: KafkaError | None, msg: Any) -> None:
            if err is not None:
                failures.append(f"{msg.topic()}: {err}")

        for i in range(0, len(plan.records), REPLAY_BATCH):
            batch = plan.records[i : i + REPLAY_BATCH]
            failures.clear()
            self.txn.begin()
            try:
                nxt: dict[int, int] = {}
                for m in batch:
                    if not lockgate_headers(m.headers()).get(SOURCE_TOPIC):
                        nxt[m.partition()] = m.offset() + 1  # passed over (reported)
                        continue
                    topic, part, ts = _target(m, partitions)
                    kw: dict[str, Any] = {
                        "headers": replay_headers(m.headers(), m.partition(), m.offset()),
                        "on_delivery": report,
                    }
                    if part is not None:
                        kw["partition"] = part
                    if ts is not None:
                        kw["timestamp"] = ts
                    while True:
                        try:
                            producer.produce(topic, m.value(), m.key(), **kw)
                            break
                        except BufferError:
                            producer.poll(0.1)
                    counts[topic] = counts.get(topic, 0) + 1
                    nxt[m.partition()] = m.offset() + 1
                left = producer.flush(60)
                if failures or left:
                    raise OpsError(
                        "re-injecting failed: "
                        + "; ".join(failures[:5] or [f"{left} record(s) not delivered"])
                    )
                offsets = [TopicPartition(dlq, p, o) for p, o in sorted(nxt.items())]
                self.txn.send_offsets(offsets, group_metadata)
                crash_point("dlq_replay_before_commit")
                self.txn.commit()
            except CommitOutcomeUnknown as exc:
                self._leave(
                    f"the replay's last transaction got no answer in time ({exc}): it may "
                    "have committed. Run the same command again: it fences this one and "
                    "resumes from what committed"
                )
            except BaseException as exc:
                with contextlib.suppress(KafkaException, FatalKafkaError, Stopping):
                    self.txn.abort(deadline=time.monotonic() + 60)
                if self.txn.abandoned:
                    self._leave(f"replay transaction failed (aborted): {exc}")
                if isinstance(exc, (KafkaException, AbortEpoch, CallHung, FatalKafkaError)):
                    raise OpsError(f"replay transaction failed (aborted): {exc}") from exc
                raise
            progress(f"replayed {min(i + REPLAY_BATCH, len(plan.records))}/{len(plan.records)}")
        return counts


@dlq.command("replay")
@click.option("--app", "name", required=True, metavar="NAME", help="The app's name.")
@click.option("--offsets", metavar="P:O,...", help="These DLQ records (partition:offset).")
@click.option("--all", "all_", is_flag=True, help="Every record past the replay position.")
@click.option("--dry-run", is_flag=True, help="Show what would be replayed; change nothing.")
def dlq_replay(name: str, offsets: str | None, all_: bool, dry_run: bool) -> None:
    """Re-inject dead-lettered records of app NAME into their source topics, exactly once.

    Each record goes back to the topic and partition in its lockgate-source-* headers
    with its key, value and own headers (the error headers removed) and a
    `lockgate-replayed-from: <dlq partition>:<offset>` header. The records and the
    replay position (the committed offsets of the group <NAME>.dlq-replay) commit in
    one transaction: a repeated or retried replay never re-injects a record twice;
    records below the position are reported as already replayed. The app may keep
    running: it reads the replayed records like any other.
    """
    if (offsets is None) == (not all_):
        _fail(OpsError("give either --offsets P:O,... or --all", exit_code=2))
    selection = parse_offsets(offsets) if offsets is not None else None
    settings = ops_settings()
    topic = dlq_topic(name)
    replayer: _Replayer | None = None
    try:
        admin = Admin(settings)
        parts, bounds = _dlq_bounds(admin, topic)
        if not dry_run:
            replayer = _Replayer(settings, name)
        group = _replay_consumer(settings, name)
        reader = Consumer(restore_consumer_config(settings, _CLIENT))
        try:
            positions = _positions(group, topic, parts)
            plan = plan_replay(reader, topic, bounds, positions, selection)
            sources = sorted(
                {_text(lockgate_headers(m.headers()).get(SOURCE_TOPIC)) for m in plan.records}
                - {""}
            )
            partitions = admin.partitions_of(sources)
            gone = [t for t in sources if t not in partitions]
            if gone:
                raise OpsError(f"source topic(s) {', '.join(gone)} do not exist", exit_code=2)
            for text in plan.already:
                _echo_err(f"{text}: already replayed (below the replay position)")
            for text in plan.unreplayable:
                _echo_err(f"{text}: not replayable (no lockgate-source-topic), passed over")
            todo = len(plan.records) - len(plan.unreplayable)
            if dry_run:
                for m in plan.records:
                    if f"{m.partition()}:{m.offset()}" in plan.unreplayable:
                        continue
                    t, p, _ts = _target(m, partitions)
                    click.echo(
                        f"would replay {m.partition()}:{m.offset()} -> {t}"
                        f"{'' if p is None else f'[{p}]'}  key {preview(m.key())}"
                    )
                click.echo(f"dry run: {todo} record(s) would be replayed, nothing changed")
                return
            assert replayer is not None
            counts = replayer.run(
                group.consumer_group_metadata(), topic, plan, partitions, _echo_err
            )
        finally:
            reader.close()
            group.close()
    except (LockgateError, KafkaException) as exc:
        _fail(exc)
    per = ", ".join(f"{t}: {n}" for t, n in sorted(counts.items()))
    click.echo(
        f"replayed {sum(counts.values())} record(s) from {topic}"
        + (f" ({per})" if per else "")
        + (f"; {len(plan.already)} already replayed" if plan.already else "")
    )


# ------------------------------------------------------------------ lockgate reset


def _target_offsets(
    admin: Admin, inputs: Sequence[str], partitions: int, to: str | int
) -> dict[tuple[str, int], int]:
    tps = [TopicPartition(t, p) for t in inputs for p in range(partitions)]
    if to == "earliest":
        return admin.start_offsets(tps)
    ends = admin.end_offsets(tps)
    if to == "latest":
        return ends
    assert isinstance(to, int)
    found = admin.offsets_for_time(tps, to)
    return {k: (v if v >= 0 else ends[k]) for k, v in found.items()}


def _set_policy(client: AdminClient, topic: str, policy: str) -> None:
    res = ConfigResource(
        ResourceType.TOPIC,
        topic,
        incremental_configs=[
            ConfigEntry("cleanup.policy", policy, incremental_operation=AlterConfigOpType.SET)
        ],
    )
    client.incremental_alter_configs([res])[res].result(30)


def _delete_records(client: AdminClient, tps: Sequence[TopicPartition]) -> None:
    """``delete_records`` up to each offset, retrying while a policy change propagates."""
    deadline = time.monotonic() + 30
    todo = list(tps)
    while todo:
        failed: list[tuple[TopicPartition, KafkaException]] = []
        for tp, fut in client.delete_records(todo, request_timeout=30).items():
            try:
                fut.result(30)
            except KafkaException as exc:
                failed.append((tp, exc))
        if not failed:
            return
        first, problem = failed[0]
        err = problem.args[0] if problem.args else None
        policy = isinstance(err, KafkaError) and err.code() == KafkaError.POLICY_VIOLATION
        if not policy or time.monotonic() > deadline:
            raise OpsError(f"deleting the records of {first.topic}[{first.partition}]: {problem}")
        todo = [t for t, _ in failed]
        time.sleep(0.5)


def empty_changelogs(client: AdminClient, admin: Admin, tps: Sequence[TopicPartition]) -> None:
    """Delete the records of changelog partitions below the given offsets.

    Kafka refuses ``delete_records`` on a topic whose ``cleanup.policy`` lacks
    ``delete`` (a compacted changelog), so ``delete`` is added to the policy for the
    deletion and the original policy set back afterwards (also when it fails).

    Raises:
        OpsError: (exit code 1) records could not be deleted, or the policy not
            restored (the message gives the command that restores it).
    """
    by_topic: dict[str, list[TopicPartition]] = {}
    for tp in tps:
        by_topic.setdefault(tp.topic, []).append(tp)
    for topic, parts in sorted(by_topic.items()):
        original = admin.topic_config(topic).get("cleanup.policy", "compact")
        policies = original.split(",")
        altered = "delete" not in policies
        if altered:
            _set_policy(client, topic, ",".join([*policies, "delete"]))
        try:
            _delete_records(client, parts)
        finally:
            if altered:
                try:
                    _set_policy(client, topic, original)
                except KafkaException as exc:
                    raise OpsError(
                        f"{topic}: cannot set cleanup.policy back to {original} ({exc}); "
                        "a changelog with cleanup.policy=delete loses state after its "
                        "retention: run kafka-configs.sh --alter --entity-type topics "
                        f"--entity-name {topic} --add-config cleanup.policy={original}"
                    ) from exc


@click.command("reset")
@click.option("--app", "app_spec", required=True, metavar="MODULE:APP", help="The app.")
@click.option(
    "--to",
    "to_text",
    required=True,
    metavar="POS",
    help="earliest, latest, or a time (ms since the epoch or ISO 8601).",
)
@click.option("--dry-run", is_flag=True, help="Print the plan; change nothing.")
@click.option("--yes", is_flag=True, help="Do not ask for confirmation.")
def reset(app_spec: str, to_text: str, dry_run: bool, yes: bool) -> None:
    """Reset a stopped app: its inputs to POS, its state to empty.

    Sets the committed offsets of the app's consumer group on every input partition
    to POS (a time: the first record at or after it, else the end), deletes the
    records of the app's changelogs (delete_records up to their high watermark) and
    removes the app's local state under LOCKGATE_STATE_DIR. The restarted app
    recomputes from POS. Refused (exit 2) while the group has members. Prints the plan
    first; without --yes it asks, and refuses in a non-interactive shell.
    """
    position = parse_reset_position(to_text)
    app, settings, name = _load(app_spec)
    try:
        admin = Admin(settings)
        client = AdminClient(admin_config(settings))
        inputs = list(app.input_topics)
        p = admin.input_partitions(inputs)
        _refuse_if_running(settings, name, "resetting it")
        targets = _target_offsets(admin, inputs, p, position)
        logs = [changelog_topic(name, s) for s in app.stores]
        existing = admin.partitions_of(logs)
        ctps = [TopicPartition(t, g) for t in logs if t in existing for g in range(existing[t])]
        highs = admin.end_offsets(ctps)
        lows = admin.start_offsets(ctps)
        local = Path(settings.state_dir) / name
        has_local = settings.state_backend is StateBackendKind.ROCKSDB and local.exists()
        click.echo(f"reset app {name} (consumer group {name}) to {to_text}:")
        for (t, g), off in sorted(targets.items()):
            click.echo(f"  input {t}[{g}]: committed offset -> {off}")
        for (t, g), hi in sorted(highs.items()):
            if hi > lows[(t, g)]:
                click.echo(f"  changelog {t}[{g}]: delete records {lows[(t, g)]}..{hi - 1}")
        if not any(hi > lows[k] for k, hi in highs.items()):
            click.echo("  changelogs: nothing to delete")
        click.echo(f"  local state {local}: {'remove' if has_local else 'none'}")
        if dry_run:
            click.echo("dry run: nothing changed")
            return
        if not yes:
            if not sys.stdin.isatty():
                raise OpsError(
                    "refusing to reset without --yes in a non-interactive shell", exit_code=2
                )
            if not click.confirm("reset?", default=False):
                raise OpsError("reset cancelled", exit_code=2)
        _refuse_if_running(settings, name, "resetting it")
        offsets = [TopicPartition(t, g, off) for (t, g), off in sorted(targets.items())]
        futs = client.alter_consumer_group_offsets([ConsumerGroupTopicPartitions(name, offsets)])
        for fut in futs.values():
            fut.result(30)
        deletes = [TopicPartition(t, g, hi) for (t, g), hi in highs.items() if hi > lows[(t, g)]]
        empty_changelogs(client, admin, deletes)
        if has_local:
            shutil.rmtree(local)
    except (LockgateError, KafkaException) as exc:
        _fail(exc)
    click.echo(f"reset app {name}: inputs at {to_text}, state empty")
