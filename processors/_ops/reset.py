"""``lockgate reset``: a stopped app back to an input position, with empty state.

Sets the committed offsets of the app's consumer group on every input partition to
``--to`` (:func:`parse_reset_position`, pure: earliest, latest or a time), empties the
app's changelogs (:func:`empty_changelogs`) and removes its local state. Refused (exit 2)
while the app's consumer group has members (described from a child process,
:class:`~processors._kafka.group_probe.GroupProbe`). The click command is added to
``lockgate`` by ``processors/cli.py``; exit codes and errors follow
:mod:`processors._ops.cli_common`.
"""

from __future__ import annotations

import shutil
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import click
from confluent_kafka import ConsumerGroupTopicPartitions, KafkaError, KafkaException, TopicPartition
from confluent_kafka.admin import (  # type: ignore[attr-defined]  # re-exported in cimpl
    AdminClient,
    AlterConfigOpType,
    ConfigEntry,
    ConfigResource,
    ResourceType,
)

from processors._config.settings import Settings, StateBackendKind
from processors._kafka.clients import Admin, admin_config
from processors._kafka.group_probe import GroupProbe
from processors._ops.catalog import OpsError
from processors._ops.cli_common import fail, load_for_command, parse_time_ms
from processors.exceptions import LockgateError
from state.cache import changelog_topic
from state.rocksdb.snapshots import SnapshotError, SnapshotStore

__all__ = [
    "parse_reset_position",
    "reset",
]

# ------------------------------------------------------------------ pure logic


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
    try:
        return parse_time_ms(text, "--to")
    except OpsError:
        raise OpsError(
            f"--to: {text!r} is not earliest, latest, a time in ms or ISO 8601 "
            "(e.g. 2026-01-31T12:00:00Z)",
            exit_code=2,
        ) from None


# ------------------------------------------------------------------ lockgate reset


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


def _access_needed(inputs: Sequence[str], changelogs: Sequence[str]) -> dict[str, list[str]]:
    """The ACL operations ``reset`` needs on each topic (docs/security.md).

    Committing the group's offsets needs READ on the inputs (and on the group); emptying a
    changelog reads its policy, adds ``delete`` to it and deletes its records.
    """
    needs: dict[str, list[str]] = {t: ["READ"] for t in inputs}
    for t in changelogs:
        needs[t] = ["DESCRIBE_CONFIGS", "ALTER_CONFIGS", "DELETE"]
    return needs


def _refuse_if_running(settings: Settings, name: str, what: str) -> None:
    members = _members(settings, name)
    if members:
        raise OpsError(
            f"app {name} is running: its consumer group {name} has {len(members)} member(s): "
            f"{'; '.join(members)}. Stop every instance before {what} (a killed instance with "
            "static membership stays a member until its session times out)",
            exit_code=2,
        )


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
    removes the app's local state under LOCKGATE_STATE_DIR (and its state snapshots under
    LOCKGATE_STATE_SNAPSHOT_DIR, when set). The restarted app
    recomputes from POS. Refused (exit 2) while the group has members. Prints the plan
    first; without --yes it asks, and refuses in a non-interactive shell.
    """
    try:
        position = parse_reset_position(to_text)
    except OpsError as exc:
        fail(exc)
    app, settings, name = load_for_command(app_spec)
    try:
        admin = Admin(settings)
        client = AdminClient(admin_config(settings))
        inputs = list(app.input_topics)
        p = admin.input_partitions(inputs)
        # READ on the group: describing it (is the app running?) and committing its offsets.
        admin.check_access({}, group=name)
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
        snapshots = settings.state_snapshot_dir
        if snapshots:
            click.echo(f"  state snapshots {snapshots}: remove those of {name}")
        if dry_run:
            click.echo("dry run: nothing changed")
            return
        # Refused before anything changes (not after the offsets moved), naming the ACL.
        admin.check_access(
            _access_needed(inputs, [t for (t, g), hi in highs.items() if hi > lows[(t, g)]]),
            group=name,
        )
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
        if snapshots:  # a snapshot older than the reset would bring the old state back
            try:
                SnapshotStore(snapshots, name).remove_all()
            except (SnapshotError, OSError) as exc:
                raise OpsError(
                    f"removing the state snapshots in {snapshots} failed: {exc}; delete "
                    f"{snapshots}/{name} by hand before starting the app"
                ) from exc
    except (LockgateError, KafkaException) as exc:
        fail(exc)
    click.echo(f"reset app {name}: inputs at {to_text}, state empty")
