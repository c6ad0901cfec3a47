"""Output topic configuration: :class:`TopicConfig`, created when missing, checked when not.

What a mismatch with an existing topic does (docs/codecs.md, "Output topic
configuration"):

- **Refused** (:class:`TopicError`, exit 2 at start): a partition count other than the
  declared one (records would be spread over other partitions than the consumers of
  the topic expect: co-partitioned joins downstream silently pair the wrong keys); a
  ``cleanup.policy`` other than the declared one (compaction drops all but the latest
  value of each key and keyless records; ``delete`` drops keys after the retention: both
  lose data the declaration says is kept); a retention shorter than declared (records
  deleted earlier than promised).
- **Warned** (logged at start, the app runs): a retention longer than declared, a
  replication factor other than declared, and any other ``config`` entry that differs.
  They change cost or durability, not what the topic holds; operators tune them on live
  topics, and lockgate never alters an existing topic.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from processors.exceptions import ConfigError, TopicError
from state.codecs import JSON, STR, Codec

if TYPE_CHECKING:
    from processors._kafka.clients import Admin

__all__ = [
    "OutputSpec",
    "TopicConfig",
    "check_output_topics",
    "output_topic_configs",
    "output_topic_specs",
]

log = logging.getLogger("lockgate.topics")

#: Kafka's effective retention for "keep forever".
_FOREVER = -1


@dataclass(frozen=True)
class TopicConfig:
    """An output topic with the configuration it is created with, and checked against.

    Use it wherever an output is declared: ``outputs=[TopicConfig(...)]`` of
    ``@app.process``, ``app.output(TopicConfig(...))`` or ``stream.to(TopicConfig(...))``.
    At start a missing topic is created with ``partitions`` (default: the input's
    partition count), ``replication_factor`` (default: the broker's) and the topic
    configuration :meth:`topic_settings`; an existing topic is never altered but
    checked: see the module docs for what is refused (exit 2) and what only warned.
    Only what is declared is checked (``None`` leaves it to the broker).

    Attributes:
        topic: the topic name.
        partitions: the partition count (``None``: the input's when created, not checked).
        replication_factor: replicas per partition (``None``: the broker's default).
        retention_ms: ``retention.ms`` (``-1``: forever).
        compact: ``True``: ``cleanup.policy=compact``; ``False``: ``delete``; ``None``:
            the broker's default, not checked.
        config: other topic configuration entries (``"max.message.bytes"``, ...); values
            are converted to strings (``True`` -> ``"true"``).
        key: the codec of the records' keys.
        value: the codec of the records' values.

    Raises:
        ConfigError: a count out of range, a config entry that is not a string, or a
            setting given twice (``compact`` and ``config["cleanup.policy"]``,
            ``retention_ms`` and ``config["retention.ms"]``).
    """

    topic: str
    partitions: int | None = None
    replication_factor: int | None = None
    retention_ms: int | None = None
    compact: bool | None = None
    config: Mapping[str, str | int | bool] = field(default_factory=dict, hash=False)
    key: Codec = STR
    value: Codec = JSON

    def __post_init__(self) -> None:
        where = f"TopicConfig({self.topic!r})"
        for attr, low in (("partitions", 1), ("replication_factor", 1), ("retention_ms", -1)):
            got = getattr(self, attr)
            if got is not None and (not isinstance(got, int) or isinstance(got, bool) or got < low):
                raise ConfigError(f"{where}: {attr} must be an int >= {low} or None, got {got!r}")
        if self.compact is not None and not isinstance(self.compact, bool):
            raise ConfigError(f"{where}: compact must be True, False or None")
        if not isinstance(self.config, Mapping):
            raise ConfigError(f"{where}: config must be a mapping of topic settings")
        conf: dict[str, str] = {}
        for name, val in self.config.items():
            if not isinstance(name, str) or not isinstance(val, str | int | bool):
                raise ConfigError(f"{where}: config entry {name!r}={val!r} is not a setting")
            conf[name] = str(val).lower() if isinstance(val, bool) else str(val)
        for name, attr in (("cleanup.policy", "compact"), ("retention.ms", "retention_ms")):
            if name in conf and getattr(self, attr) is not None:
                raise ConfigError(f"{where}: {name} is given twice ({attr}= and config=)")
        object.__setattr__(self, "config", conf)

    def topic_settings(self) -> dict[str, str]:
        """The topic configuration entries declared (created with, and checked)."""
        out = {name: str(value) for name, value in self.config.items()}  # strings already
        if self.compact is not None:
            out["cleanup.policy"] = "compact" if self.compact else "delete"
        if self.retention_ms is not None:
            out["retention.ms"] = str(self.retention_ms)
        return out


@dataclass(frozen=True)
class OutputSpec:
    """A declared output topic and the codecs of its records.

    Attributes:
        partitions: partition count used when lockgate creates the topic (``None``:
            the input's partition count).
        internal: read by another lockgate app: barrier records are written to it
            at every epoch end (DESIGN 6.2).
        topic_config: the configuration the topic is created with and checked against
            at start (declared with a :class:`TopicConfig`), or ``None``.
    """

    topic: str
    key: Codec = STR
    value: Codec = JSON
    partitions: int | None = None
    internal: bool = False
    topic_config: TopicConfig | None = None


def output_topic_specs(
    outputs: Iterable[OutputSpec], input_partitions: int
) -> tuple[dict[str, tuple[int, dict[str, str]]], dict[str, int]]:
    """What :meth:`Admin.ensure_topics` creates for ``outputs``.

    Returns:
        (topic -> (partitions, topic configuration), topic -> replication factor for the
        outputs that declare one). Partitions default to ``input_partitions``.
    """
    specs: dict[str, tuple[int, dict[str, str]]] = {}
    replication: dict[str, int] = {}
    for out in outputs:
        cfg = out.topic_config
        specs[out.topic] = (out.partitions or input_partitions, cfg.topic_settings() if cfg else {})
        if cfg is not None and cfg.replication_factor is not None:
            replication[out.topic] = cfg.replication_factor
    return specs, replication


def output_topic_configs(outputs: Iterable[OutputSpec]) -> list[TopicConfig]:
    """The :class:`TopicConfig` of the outputs that have one."""
    return [out.topic_config for out in outputs if out.topic_config is not None]


def _policy(value: str) -> frozenset[str]:
    return frozenset(p.strip() for p in value.split(",") if p.strip())


def _retention(value: str) -> float:
    ms = int(value)
    return float("inf") if ms < 0 else float(ms)


def check_output_topics(admin: Admin, configs: Iterable[TopicConfig]) -> None:
    """Check existing output topics against their :class:`TopicConfig`.

    Mismatches that change what the topic holds are refused, the others logged (module
    docs). Call it after the topics were created.

    Raises:
        TopicError: partitions, ``cleanup.policy`` or a shorter ``retention.ms`` than
            declared; the message names every such topic with the expected and the
            actual value, and how to fix it.
    """
    configs = list(configs)
    if not configs:
        return
    layout = admin.layout_of(c.topic for c in configs)
    problems: list[str] = []
    for cfg in configs:
        topic = cfg.topic
        if topic not in layout:
            problems.append(f"output topic {topic} does not exist after its creation")
            continue
        parts, replicas = layout[topic]
        if cfg.partitions is not None and parts != cfg.partitions:
            problems.append(
                f"output topic {topic} has {parts} partitions, TopicConfig declares "
                f"{cfg.partitions}: keyed records would land in other partitions than its "
                "readers expect; declare the actual count or recreate the topic"
            )
        if cfg.replication_factor is not None and replicas != cfg.replication_factor:
            log.warning(
                "output topic replication factor differs from its TopicConfig",
                extra={"topic": topic, "expected": cfg.replication_factor, "actual": replicas},
            )
        wanted = cfg.topic_settings()
        if not wanted:
            continue
        actual = admin.topic_config(topic)
        for name, value in sorted(wanted.items()):
            have = actual.get(name)
            fix = (
                f"kafka-configs.sh --alter --entity-type topics --entity-name {topic} "
                f"--add-config {name}={value}"
            )
            if name == "cleanup.policy":
                if have is None or _policy(have) != _policy(value):
                    problems.append(
                        f"output topic {topic} has cleanup.policy={have}, TopicConfig declares "
                        f"{value}: the topic would keep other records than declared; fix the "
                        f"declaration or the topic ({fix})"
                    )
            elif name == "retention.ms" and have is not None:
                if _retention(have) < _retention(value):
                    problems.append(
                        f"output topic {topic} has retention.ms={have}, TopicConfig declares "
                        f"{value}: records would be deleted earlier than declared; fix the "
                        f"declaration or the topic ({fix})"
                    )
                elif _retention(have) > _retention(value):
                    log.warning(
                        "output topic keeps records longer than its TopicConfig declares",
                        extra={"topic": topic, "setting": name, "expected": value, "actual": have},
                    )
            elif have != value:
                log.warning(
                    "output topic setting differs from its TopicConfig (not altered)",
                    extra={"topic": topic, "setting": name, "expected": value, "actual": have},
                )
    if problems:
        raise TopicError("; ".join(problems))
