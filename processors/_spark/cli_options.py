"""``lockgate savepoint rescale``: change an app's key-group count through a savepoint.

Copies the app's inputs into topics with the new partition count
(:func:`processors.rescale.copy_topic_repartitioned`), then writes a new savepoint
with the state re-keyed to match (:func:`state.spark.rewrite_savepoint`) on a Spark
session started here. ``processors/cli.py`` adds the command to ``lockgate savepoint``.
"""

from __future__ import annotations

import importlib.util
import logging
import sys
from collections.abc import Callable, Sequence
from typing import Any, NoReturn, TypeVar

import click
from confluent_kafka import KafkaException

from processors._checkpoint.control_topics import control_topic
from processors._config.log_setup import configure
from processors._config.settings import Settings, load_settings
from processors._kafka.clients import Admin
from processors._ops.catalog import OpsError, open_store
from processors.exceptions import LockgateError
from processors.rescale import RescaleError, copy_topic_repartitioned
from state.cache import changelog_topic
from state.savepoint import SavepointError, check_savepoint_id
from state.spark import SavedApp, check_rewritable, load_saved_app, rewrite_savepoint

__all__ = ["parse_spark_conf", "parse_topics", "rescale", "spark_options", "spark_session"]

F = TypeVar("F", bound=Callable[..., Any])


def _fail(message: str, code: int = 2) -> NoReturn:
    click.echo(f"lockgate: {message}", err=True)
    sys.exit(code)


def parse_topics(pairs: Sequence[str], inputs: Sequence[str]) -> dict[str, str]:
    """Return source -> target from ``--topic SOURCE=TARGET`` options.

    Raises:
        click.UsageError: a pair is malformed, a source is not an input of the app, an
            input has no pair, or a target repeats or is one of the sources.
    """
    mapping: dict[str, str] = {}
    for pair in pairs:
        source, sep, target = pair.partition("=")
        if not sep or not source or not target:
            raise click.UsageError(f"--topic {pair!r}: expected SOURCE=TARGET")
        if source in mapping:
            raise click.UsageError(f"--topic: {source} is given twice")
        mapping[source] = target
    unknown = sorted(set(mapping) - set(inputs))
    missing = [t for t in inputs if t not in mapping]
    if unknown or missing:
        parts = []
        if missing:
            parts.append(f"no --topic for input(s) {', '.join(missing)}")
        if unknown:
            parts.append(f"{', '.join(unknown)} is not an input of the app")
        raise click.UsageError(
            f"{'; '.join(parts)} (the saved app reads {', '.join(inputs)}; every input needs "
            "a copy with the new partition count)"
        )
    targets = list(mapping.values())
    clash = sorted({t for t in targets if targets.count(t) > 1 or t in mapping})
    if clash:
        raise click.UsageError(f"--topic: target(s) {', '.join(clash)} repeat or are inputs")
    return mapping


def spark_options(command: F) -> F:
    """Add ``--master`` and ``--conf KEY=VALUE`` (repeatable) to a Spark command."""
    conf = click.option(
        "--conf",
        "conf",
        multiple=True,
        metavar="KEY=VALUE",
        help="Spark configuration (repeatable).",
    )
    master = click.option(
        "--master", default="local[2]", show_default=True, help="Spark master URL."
    )
    return master(conf(command))


def parse_spark_conf(items: tuple[str, ...]) -> dict[str, str]:
    """Return ``--conf KEY=VALUE`` items as a dict.

    Raises:
        click.BadParameter: an item is not KEY=VALUE.
    """
    conf: dict[str, str] = {}
    for item in items:
        key, eq, value = item.partition("=")
        if not eq or not key:
            raise click.BadParameter(f"{item!r} is not KEY=VALUE", param_hint="--conf")
        conf[key] = value
    return conf


def spark_session(master: str, conf: dict[str, str] | None = None) -> Any:
    """Start a Spark session on ``master`` (needs pyspark), UI off.

    Local masters bind to 127.0.0.1; any other master gets lockgate's packages shipped to
    its executors (they read the savepoint files). ``conf`` adds (or overrides) Spark
    configuration.
    """
    from processors._spark.job import spark_session as build

    settings = {"spark.ui.showConsoleProgress": "false", **(conf or {})}
    ship = None if master.startswith("local") else ["processors", "state"]
    session = build(master, "lockgate-savepoint-rescale", conf=settings, ship=ship)
    session.sparkContext.setLogLevel("WARN")
    return session


def _check_name_free(settings: Settings, saved: SavedApp, name: str, key_groups: int) -> None:
    """Refuse an app name whose internal topics have another partition count."""
    topics = [control_topic(name), *(changelog_topic(name, s) for s in saved.stores)]
    found = Admin(settings).partitions_of(topics)
    wrong = {t: n for t, n in found.items() if n != key_groups}
    if wrong:
        listed = ", ".join(f"{t} ({n})" for t, n in sorted(wrong.items()))
        raise RescaleError(
            f"app name {name!r} has internal topics with another partition count: {listed}. "
            f"Run the rescaled app under a new name (--as NEW_NAME, then "
            f"LOCKGATE_APP_NAME=NEW_NAME) or delete those topics first",
            2,
        )


def _plan(
    saved: SavedApp, mapping: dict[str, str], key_groups: int, name: str, master: str
) -> list[str]:
    lines = [
        f"savepoint {saved.savepoint}: app {saved.app}, {saved.key_groups} key groups -> "
        f"{key_groups}" + (f", restored as {name}" if name != saved.app else "")
    ]
    for source, target in mapping.items():
        cut = saved.cut(source)
        lines.append(
            f"copy {source} ({saved.key_groups} partitions) -> {target} ({key_groups} "
            f"partitions): records before offsets {cut} first, then the rest"
        )
    lines.append(
        f"rewrite the savepoint with {key_groups} key groups on Spark ({master}); start offsets "
        "= the copies' cut offsets"
    )
    lines.append(
        "then: switch the producers to the new topics, and run the app on them (inputs "
        f"{', '.join(mapping.values())}, LOCKGATE_APP_NAME={name}) with --from-savepoint NEW_ID"
    )
    return lines


@click.command("rescale")
@click.argument("savepoint_id", metavar="SAVEPOINT_ID")
@click.option("--app", "app", required=True, metavar="NAME", help="The app in the savepoint.")
@click.option(
    "--key-groups",
    "key_groups",
    required=True,
    type=click.IntRange(min=1),
    help="The new key-group count (the new topics' partition count).",
)
@click.option(
    "--topic",
    "topics",
    multiple=True,
    required=True,
    metavar="SOURCE=TARGET",
    help="Copy input SOURCE into the new topic TARGET (one per input; repeatable).",
)
@click.option(
    "--as",
    "new_name",
    metavar="NAME",
    help="The name the rescaled app runs under (LOCKGATE_APP_NAME); default: the same.",
)
@spark_options
@click.option("--dry-run", is_flag=True, help="Check and print the plan; change nothing.")
def rescale(
    savepoint_id: str,
    app: str,
    key_groups: int,
    topics: tuple[str, ...],
    new_name: str | None,
    master: str,
    conf: tuple[str, ...],
    dry_run: bool,
) -> None:
    """Rescale APP to --key-groups through SAVEPOINT_ID; print the new savepoint id.

    Take the savepoint with `lockgate savepoint trigger --app NAME --stop` and stop the
    input's producers first. Each input is copied into a new topic with the new
    partition count (records placed by murmur2 of their key, exactly once, the records
    before the savepoint first); then a Spark job writes a new savepoint with every
    store re-keyed to the new key groups, starting at the copies' cut offsets. The
    savepoint itself is not changed. Afterwards point the producers at the new topics
    and start the app on them with --from-savepoint NEW_ID (the last line of stdout).
    """
    spark_conf = parse_spark_conf(conf)
    try:
        settings = load_settings()
    except LockgateError as exc:
        _fail(str(exc))
    configure(settings.log_level, settings.log_format.value)
    logging.getLogger("py4j").setLevel(logging.WARNING)  # its connection chatter
    try:
        check_savepoint_id(savepoint_id)
        store = open_store(settings)
        saved = load_saved_app(store, savepoint_id, app)
        check_rewritable(saved)
        mapping = parse_topics(topics, saved.inputs)
        cuts = {source: saved.cut(source) for source in mapping}
        name = new_name or app
        _check_name_free(settings, saved, name, key_groups)
    except click.UsageError:
        raise
    except (SavepointError, OpsError) as exc:
        _fail(str(exc), exc.exit_code if isinstance(exc, OpsError) else 2)
    except KafkaException as exc:
        _fail(f"Kafka client error: {exc}", 1)
    if dry_run:
        for line in _plan(saved, mapping, key_groups, name, master):
            click.echo(line)
        return
    if importlib.util.find_spec("pyspark") is None:
        _fail("savepoint rescale needs pyspark: pip install 'lockgate[spark]'")
    offsets: dict[str, dict[int, int]] = {}
    for source, target in mapping.items():
        try:
            offsets[target] = copy_topic_repartitioned(
                settings, source, target, key_groups, cuts[source]
            )
        except RescaleError as exc:
            done = f" (already copied: {', '.join(offsets)})" if offsets else ""
            _fail(f"{exc}{done}", exc.exit_code)
        except KafkaException as exc:
            _fail(f"Kafka client error while copying {source}: {exc}", 1)
        click.echo(f"copied {source} -> {target}; cut offsets {offsets[target]}", err=True)
    assert settings.savepoint_dir is not None  # open_store checked it
    spark = None
    try:
        spark = spark_session(master, spark_conf)
        new_id = rewrite_savepoint(
            spark,
            settings.savepoint_dir,
            savepoint_id,
            app,
            key_groups,
            offsets=offsets,
            topics=mapping,
            new_app_name=name,
        )
    except Exception as exc:  # noqa: BLE001 - Spark and I/O errors: one line, no traceback
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        _fail(
            f"rewriting savepoint {savepoint_id} failed: {first}. The topic copies are "
            f"complete (cut offsets {offsets}): rerun state.spark.rewrite_savepoint with "
            "them, or delete the copies and rescale again",
            2 if isinstance(exc, SavepointError) else 1,
        )
    finally:
        if spark is not None:
            spark.stop()
    click.echo(
        f"savepoint {new_id}: app {name} with {key_groups} key groups, inputs "
        f"{', '.join(mapping.values())}",
        err=True,
    )
    click.echo(new_id)
