"""A backfill's plan: input positions and each key group's offset ranges.

A position (``--from``, ``--until``, ``--live-from``) is ``earliest``, ``now`` (the last
stable offset when the job is planned), a time (ms since the epoch or ISO-8601: the
first offset at or after it) or explicit offsets. :func:`plan_kafka` resolves both
bounds against the broker and checks them: an end beyond the last stable offset, a start
before the first offset still kept, or a start after the end is refused with a
:class:`~processors.exceptions.ConfigError` before any task runs.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from confluent_kafka import TopicPartition

from processors._config.settings import Settings
from processors._dsl.app import App
from processors._kafka.clients import Admin
from processors._spark.backfill_spec import Range
from processors.exceptions import ConfigError

__all__ = ["Position", "parse_position", "plan_kafka", "progress_topic", "resolve_position"]


def progress_topic(app_name: str) -> str:
    """Return the topic that holds an app's backfill plans and task progress."""
    return f"{app_name}.backfill"


@dataclass(frozen=True)
class Position:
    """A bound of the input: ``earliest``, ``now``, a time, or explicit offsets."""

    kind: str
    time_ms: int = 0
    offsets: tuple[tuple[str | None, int, int], ...] = ()


def parse_position(text: str, what: str) -> Position:
    """Parse ``earliest``, ``now``, a time (ms or ISO-8601) or ``offsets:[topic/]p=o,...``.

    Raises:
        ConfigError: the text is none of these (the message names ``what``).
    """
    t = text.strip()
    if t in ("earliest", "now", "latest"):
        return Position("now" if t == "latest" else t)
    if t.startswith("offsets:"):
        parts: list[tuple[str | None, int, int]] = []
        for item in t[len("offsets:") :].split(","):
            where, eq, off = item.strip().partition("=")
            topic, slash, part = where.rpartition("/")
            try:
                if not eq:
                    raise ValueError(item)
                parts.append((topic if slash else None, int(part), int(off)))
            except ValueError:
                raise ConfigError(
                    f"{what}: {item!r} is not <partition>=<offset> (or <topic>/<p>=<offset>)"
                ) from None
        return Position("offsets", offsets=tuple(parts))
    if t.isdigit():
        return Position("time", time_ms=int(t))
    try:
        dt = datetime.fromisoformat(t.replace("Z", "+00:00"))
    except ValueError:
        raise ConfigError(
            f"{what}: {text!r} is not earliest, now, a time (ms since the epoch or "
            "ISO-8601) or offsets:<p>=<o>,..."
        ) from None
    if dt.tzinfo is None:
        raise ConfigError(f"{what}: {text!r} has no time zone (add Z or +00:00)")
    return Position("time", time_ms=int(dt.timestamp() * 1000))


def resolve_position(
    admin: Admin,
    pos: Position,
    inputs: tuple[str, ...],
    partitions: int,
    what: str,
    stable: dict[tuple[str, int], int],
) -> dict[tuple[str, int], int]:
    """Turn a position into an offset per input partition."""
    tps = [TopicPartition(t, p) for t in inputs for p in range(partitions)]
    if pos.kind == "earliest":
        if what == "--until":
            raise ConfigError("--until earliest reads nothing: give now, a time or offsets")
        return admin.start_offsets(tps)
    if pos.kind == "now":
        if what == "--from":
            raise ConfigError("--from now reads nothing: give earliest, a time or offsets")
        return dict(stable)
    if pos.kind == "time":
        found = admin.offsets_for_time(tps, pos.time_ms)
        return {tp: (off if off >= 0 else stable[tp]) for tp, off in found.items()}
    result: dict[tuple[str, int], int] = {}
    for topic, part, off in pos.offsets:
        if topic is None:
            if len(inputs) > 1:
                raise ConfigError(f"{what}: the app has inputs {list(inputs)}: write topic/p=o")
            topic = inputs[0]
        if topic not in inputs or not 0 <= part < partitions:
            raise ConfigError(f"{what}: {topic}/{part} is not an input partition of the app")
        result[(topic, part)] = off
    missing = [f"{t}/{p}" for t in inputs for p in range(partitions) if (t, p) not in result]
    if missing:
        raise ConfigError(f"{what}: no offset for {', '.join(missing)}")
    return result


def plan_kafka(
    settings: Settings,
    app: App,
    from_: Position,
    until: Position,
) -> tuple[int, dict[int, list[Range]]]:
    """Return the key-group count and the offset ranges of every key group.

    Raises:
        ConfigError: a bound is invalid, beyond the last stable offset, or ``from`` is
            after ``until``.
    """
    admin = Admin(settings)
    inputs = app.input_topics
    p = admin.input_partitions(inputs)
    tps = [TopicPartition(t, g) for t in inputs for g in range(p)]
    stable = admin.stable_offsets(tps)
    low = admin.start_offsets(tps)
    start = resolve_position(admin, from_, inputs, p, "--from", stable)
    end = resolve_position(admin, until, inputs, p, "--until", stable)
    ranges: dict[int, list[Range]] = {}
    for g in range(p):
        for t in inputs:
            s, e = start[(t, g)], end[(t, g)]
            if e > stable[(t, g)]:
                raise ConfigError(
                    f"--until: {t}/{g} ends at {e}, beyond its last stable offset {stable[(t, g)]}"
                )
            if s < low[(t, g)]:
                raise ConfigError(
                    f"--from: {t}/{g} starts at {s}, before its first offset {low[(t, g)]} "
                    "(deleted by retention?): use earliest or an archive"
                )
            if s > e:
                raise ConfigError(f"{t}/{g}: --from ({s}) is after --until ({e})")
            ranges.setdefault(g, []).append(Range(t, s, e))
    return p, ranges
