"""What an instance checks and creates before it joins its group: topics and access.

:func:`prepare_topics` waits for the inputs, checks the principal's access (one clear
error naming a missing ACL, docs/security.md), creates the app's own topics (outputs,
changelogs, dead letters, control topic, the shared registry), and checks what cannot
work (changelogs without compaction, compacted internal outputs). It returns what the
runtime needs to know of the topics as a :class:`Topology`. Nothing here keeps state.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

from processors._checkpoint.control_topics import CONTROL_CONFIG, REGISTRY_TOPIC
from processors._dsl.app import App
from processors._dsl.topics import check_output_topics, output_topic_configs, output_topic_specs
from processors._kafka.clients import CHANGELOG_CONFIG, Admin
from processors._runtime.output import OutputWriter
from processors.exceptions import ConfigError
from state.cache import changelog_topic

log = logging.getLogger("lockgate.runtime")


@dataclass(frozen=True)
class Topology:
    """What start-up learned of the app's topics.

    Attributes:
        partitions: the key-group count (partitions of every input).
        changelog_retention_ms: the shortest ``delete.retention.ms`` of the changelogs
            (how long their tombstones are kept), ``None`` without state.
        internal_partitions: partitions of each internal output (barriers go to all).
        compacted: outputs with ``cleanup.policy=compact`` (keyless records refused).
    """

    partitions: int
    changelog_retention_ms: int | None
    internal_partitions: dict[str, int]
    compacted: frozenset[str]


def access_needed(
    inputs: Iterable[str],
    outputs: Iterable[str],
    changelogs: Iterable[str],
    dlq: str,
    control: str,
) -> dict[str, list[str]]:
    """The ACL operations the app needs on each topic (docs/security.md).

    Inputs are read; outputs written, and their configuration read (cleanup policy);
    changelogs restored, written and their configuration read (compaction, tombstone
    retention); the DLQ written; the control topic and the registry read and written.
    """
    needs: dict[str, list[str]] = {t: ["READ"] for t in inputs}
    for t in outputs:
        needs.setdefault(t, []).extend(["WRITE", "DESCRIBE_CONFIGS"])
    for t in changelogs:
        needs[t] = ["READ", "WRITE", "DESCRIBE_CONFIGS"]
    needs[dlq] = ["WRITE"]
    needs[control] = ["READ", "WRITE"]
    needs[REGISTRY_TOPIC] = ["READ", "WRITE"]
    return needs


def wait_for_inputs(
    admin: Admin, inputs: Sequence[str], wait_ms: int, waiting: Callable[[], None]
) -> int:
    """Wait (``LOCKGATE_INPUT_WAIT_MS``) for missing inputs; return their partition count.

    In a pipeline deployed at once the downstream may start before the upstream
    created its internal output. Logged once; ``waiting`` is called about every 0.1 s
    (it stops on a stop request and shows liveness).

    Raises:
        TopicError: inputs still missing at the deadline, or not co-partitioned.
        Stopping: a stop was requested while waiting (raised by ``waiting``).
    """
    deadline = time.monotonic() + wait_ms / 1000
    logged = False
    while True:
        found = admin.partitions_of(inputs)
        missing = [t for t in inputs if t not in found]
        # A topic the principal may not describe looks missing: say so at once.
        admin.check_access({t: ["READ"] for t in missing})
        if not missing or time.monotonic() >= deadline:
            return admin.input_partitions(inputs)
        if not logged:
            logged = True
            log.warning(
                "waiting for input topics to be created (an upstream app creates its "
                "internal outputs when it starts; `lockgate topics create` makes others)",
                extra={"missing": missing, "wait_ms": wait_ms},
            )
        until = min(deadline, time.monotonic() + 1.0)
        while time.monotonic() < until:
            waiting()
            time.sleep(0.1)


def prepare_topics(
    admin: Admin,
    app: App,
    name: str,
    out: OutputWriter,
    control: str,
    input_wait_ms: int,
    waiting: Callable[[], None],
) -> Topology:
    """Wait for the inputs, check access, create the app's topics and check their configs.

    Args:
        admin: a connected admin client.
        app: the app (inputs, outputs, stores).
        name: the name the app runs under (its topics' prefix and group).
        out: the output writer (output codecs, internal outputs, the DLQ's name).
        control: the app's control topic.
        input_wait_ms: how long missing inputs are waited for.
        waiting: called while waiting (stop requests, liveness).

    Raises:
        ConfigError: an internal output is compacted, or an ACL is missing (exit 2).
        TopicError: inputs missing or not co-partitioned, a misconfigured changelog or
            output topic.
        Stopping: a stop was requested while waiting.
    """
    inputs = app.input_topics
    p = wait_for_inputs(admin, inputs, input_wait_ms, waiting)
    topics, replication = output_topic_specs(app.outputs.values(), p)
    changelogs = [changelog_topic(name, n) for n in app.stores]
    topics.update({t: (p, dict(CHANGELOG_CONFIG)) for t in changelogs})
    topics[out.dlq] = (p, {})
    topics[control] = (p, dict(CONTROL_CONFIG))
    topics[REGISTRY_TOPIC] = (1, dict(CONTROL_CONFIG))
    needs = access_needed(inputs, out.outputs, changelogs, out.dlq, control)
    admin.check_access(needs)  # existing topics, before creating any
    admin.ensure_topics(topics, replication=replication)
    admin.check_access(needs)  # the topics just created too (the group: GroupWatch's child)
    check_output_topics(admin, output_topic_configs(app.outputs.values()))
    retention = admin.check_changelogs(changelogs)
    compacted = frozenset(
        t
        for t in out.outputs
        if "compact" in admin.topic_config(t).get("cleanup.policy", "").split(",")
    )
    compacted_internal = sorted(compacted & out.internal_set)
    if compacted_internal:
        raise ConfigError(
            f"internal outputs {compacted_internal} have cleanup.policy=compact: barriers "
            "are keyless and a downstream replay needs every record, so internal topics "
            "must use cleanup.policy=delete"
        )
    return Topology(
        partitions=p,
        changelog_retention_ms=min(retention.values(), default=None),
        internal_partitions=dict(admin.partitions_of(out.internal_outputs)),
        compacted=compacted,
    )
