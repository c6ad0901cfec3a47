"""``lockgate dlq list|replay``: an app's dead-letter topic ``<app>.dlq``.

``dlq list`` shows the oldest dead-lettered records (the error, the source coordinates,
key and value previews); ``dlq replay`` re-injects the selected records (``--offsets``)
or all of them (``--all``) into their source topics. Pure parts (unit-tested without
Kafka): :func:`parse_offsets`, :func:`lockgate_headers`, :func:`replay_headers`,
:func:`preview`.

Exactly-once DLQ replay: a transactional producer (``transactional.id =
<app>.dlq-replay``, stable) writes the re-injected records and, in the same
transaction, the next DLQ offset of each partition as the committed offset of the
consumer group ``<app>.dlq-replay`` (``send_offsets_to_transaction``). A retried command
first fences and aborts whatever an interrupted one left open (``init_transactions``),
then skips every DLQ record below the committed position.

The click group is added to ``lockgate`` by ``processors/cli.py``; exit codes and errors
follow :mod:`processors._ops.cli_common`.
"""

from __future__ import annotations

import contextlib
import os
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NoReturn

import click
from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition

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
from processors._config.settings import Settings
from processors._kafka.authz import authorization_error
from processors._kafka.clients import PARTITION_EOF, Admin, producer_config, restore_consumer_config
from processors._kafka.errors import AbortEpoch, CallHung, Stopping, cause_code
from processors._kafka.faults import crash_point
from processors._ops.catalog import OpsError
from processors._ops.cli_common import CLI_CLIENT, echo_err, fail, json_out, ops_settings
from processors.exceptions import FatalKafkaError, LockgateError
from state.savepoint import ms_to_iso

__all__ = [
    "REPLAYED_FROM",
    "dlq",
    "dlq_topic",
    "parse_offsets",
    "replay_group",
    "replay_headers",
]

#: Records per replay transaction (each commits its DLQ positions).
REPLAY_BATCH = 500
_PREVIEW = 60


def dlq_topic(app: str) -> str:
    """Return the dead-letter topic of ``app``."""
    return f"{app}.dlq"


def replay_group(app: str) -> str:
    """Return the consumer group (and transactional.id) of ``app``'s DLQ replays."""
    return f"{app}.dlq-replay"


# ------------------------------------------------------------------ pure logic


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
    conf = restore_consumer_config(settings, CLI_CLIENT)
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
        # Without DESCRIBE on the replay group the committed offsets time out after 30 s.
        admin.check_access({topic: ["READ"]}, replay_group(name), group_operation="DESCRIBE")
        parts, bounds = _dlq_bounds(admin, topic)
        replay = _replay_consumer(settings, name)
        try:
            positions = _positions(replay, topic, parts)
        finally:
            replay.close()
        reader = Consumer(restore_consumer_config(settings, CLI_CLIENT))
        try:
            msgs = read_range(reader, topic, bounds, stop_after=limit)
        finally:
            reader.close()
    except (LockgateError, KafkaException) as exc:
        fail(exc)
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
        conf = producer_config(settings, CLI_CLIENT, replay_group(app))
        conf["client.id"] = f"{CLI_CLIENT}-dlq-replay"
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
        except FatalKafkaError as exc:
            if cause_code(exc) != KafkaError.TRANSACTIONAL_ID_AUTHORIZATION_FAILED:
                raise
            user = conf.get("sasl.username")
            raise authorization_error(
                str(user) if user is not None else None,
                "WRITE",
                "TRANSACTIONAL_ID",
                replay_group(app),
                "TRANSACTIONAL_ID_AUTHORIZATION_FAILED",
            ) from None
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
        fail(OpsError("give either --offsets P:O,... or --all", exit_code=2))
    try:
        selection = parse_offsets(offsets) if offsets is not None else None
    except OpsError as exc:
        fail(exc)
    settings = ops_settings()
    topic = dlq_topic(name)
    replayer: _Replayer | None = None
    try:
        admin = Admin(settings)
        # Refused here, naming the ACL (without READ on the replay group the committed
        # offsets time out after 30 s); WRITE on the sources is checked once they are known.
        admin.check_access({topic: ["READ"]}, replay_group(name))
        parts, bounds = _dlq_bounds(admin, topic)
        if not dry_run:
            replayer = _Replayer(settings, name)
        group = _replay_consumer(settings, name)
        reader = Consumer(restore_consumer_config(settings, CLI_CLIENT))
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
            if not dry_run:
                admin.check_access({t: ["WRITE"] for t in sources})
            for text in plan.already:
                echo_err(f"{text}: already replayed (below the replay position)")
            for text in plan.unreplayable:
                echo_err(f"{text}: not replayable (no lockgate-source-topic), passed over")
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
                group.consumer_group_metadata(), topic, plan, partitions, echo_err
            )
        finally:
            reader.close()
            group.close()
    except (LockgateError, KafkaException) as exc:
        fail(exc)
    per = ", ".join(f"{t}: {n}" for t, n in sorted(counts.items()))
    click.echo(
        f"replayed {sum(counts.values())} record(s) from {topic}"
        + (f" ({per})" if per else "")
        + (f"; {len(plan.already)} already replayed" if plan.already else "")
    )
