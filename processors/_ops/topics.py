"""``lockgate topics`` and ``lockgate topics create``: an app's topics against its needs.

``lockgate topics --app MODULE:APP`` reports every topic the app uses (inputs, global
tables, outputs, changelogs, DLQ, control, registry): whether it exists, its partition
count and relevant configs, and whether it is what ``lockgate run`` needs. ``--create``
creates the missing topics as ``lockgate run`` would (``--create-inputs``: the inputs
too); ``lockgate topics create`` creates any topic. Exit 0 when everything matches, 2 on
a missing topic or a mismatch.

The pure part (unit-tested without Kafka): :func:`app_needs` (what the runtime needs of
each topic) and :func:`check_topics` (the report rows, from :class:`TopicFacts`). The
click group is added to ``lockgate`` by ``processors/cli.py``; exit codes and errors
follow :mod:`processors._ops.cli_common`.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import click
from confluent_kafka import KafkaException

from processors._checkpoint.control_topics import CONTROL_CONFIG, REGISTRY_TOPIC, control_topic
from processors._dsl.app import App
from processors._kafka.clients import CHANGELOG_CONFIG, Admin
from processors._ops.catalog import OpsError
from processors._ops.cli_common import echo_err, fail, json_out, load_for_command, ops_settings
from processors._ops.dlq import dlq_topic
from processors.exceptions import LockgateError
from state.cache import changelog_topic

__all__ = [
    "TopicFacts",
    "check_topics",
    "topics",
]

#: Relevant topic configs shown by ``lockgate topics``.
_SHOWN_CONFIGS = ("cleanup.policy", "retention.ms", "min.insync.replicas")

# ------------------------------------------------------------------ pure logic


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


# ------------------------------------------------------------------ lockgate topics


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
    app, settings, name = load_for_command(app_spec)
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
        fail(exc)
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
            echo_err(f"would create {topic} ({parts} partitions{_conf_text(conf)})")
        return []
    admin.ensure_topics(specs)
    for topic, (parts, conf) in specs.items():
        echo_err(f"created {topic} ({parts} partitions{_conf_text(conf)})")
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
                    echo_err(f"{name} exists with {have} partitions, not {partitions}: unchanged")
                else:
                    echo_err(f"{name} exists ({have} partitions): unchanged")
        specs = {n: (partitions, dict(conf)) for n in names if n not in existing}
        if specs:
            admin.ensure_topics(
                specs,
                replication=None if replication is None else dict.fromkeys(specs, replication),
            )
            for name in specs:
                echo_err(f"created {name} ({partitions} partitions{_conf_text(conf)})")
    except (LockgateError, KafkaException) as exc:
        fail(exc)
    sys.exit(2 if mismatched else 0)


def _conf_text(conf: Mapping[str, str]) -> str:
    return "".join(f", {k}={v}" for k, v in conf.items())
