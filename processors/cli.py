"""The ``lockgate`` command line.

Exit codes: 0 clean stop; 1 runtime failure (Kafka fatal error, fenced); 2 bad
usage, configuration or topics; 3 a record failed with ``LOCKGATE_ON_ERROR=fail``.
Errors go to stderr; ``lockgate config`` prints JSON on stdout. No message contains
the value of a secret.
"""

from __future__ import annotations

import logging
import sys
from typing import Any, NoReturn

import click
import orjson
from confluent_kafka import KafkaError, KafkaException

from processors._config.log_setup import configure
from processors._ops.catalog import (
    BoundedSavepoint,
    Ops,
    OpsError,
    cancel_halted,
    cancel_savepoint,
    describe_savepoint,
    list_checkpoints,
    list_savepoints,
    open_store,
    resolve_apps,
    savepoint_text,
    trigger_savepoint,
)
from processors._ops.cli_common import (
    app_settings,
    check_app,
    json_out,
    load_app,
    not_authorized_text,
    ops_fail,
    ops_settings,
)
from processors._runtime.bounded import parse_until
from processors._runtime.runner import Runner, defer_stop_signals, run_app
from processors._spark.cli_options import parse_spark_conf, spark_options
from processors.exceptions import ConfigError, FatalKafkaError, LockgateError
from state.savepoint import SavepointError, check_savepoint_id

log = logging.getLogger("lockgate.cli")


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="lockgate")
def main() -> None:
    """Lockgate: stateful, exactly-once stream processing on Kafka.

    Configuration comes from LOCKGATE_* environment variables
    (see docs/configuration.md, or `lockgate config`).
    """


@main.command()
@click.argument("app_spec", metavar="MODULE:APP")
@click.option(
    "--from-savepoint",
    "from_savepoint",
    metavar="ID",
    help=(
        "Start every key group from this savepoint (state, offsets, alignment) once; key "
        "groups already restored from it continue. Same as LOCKGATE_FROM_SAVEPOINT."
    ),
)
@click.option(
    "--allow-non-restored-state",
    is_flag=True,
    default=False,
    help="Accept saved stores the app no longer declares (their state is dropped).",
)
@click.option(
    "--until",
    metavar="BOUND",
    help=(
        "A bounded run: process up to BOUND (now, a time in ms or ISO 8601, or "
        "offsets:TOPIC:P=O,...), drain event time, commit and exit 0. Same as LOCKGATE_UNTIL."
    ),
)
@click.option(
    "--no-drain",
    is_flag=True,
    default=False,
    help="With --until: keep event time where the input left it (no final watermark).",
)
@click.option(
    "--savepoint",
    "until_savepoint",
    metavar="[LOCATION]",
    is_flag=False,
    flag_value="default",
    default=None,
    help=(
        "With --until: once every key group reached the bound (all instances), take a "
        "savepoint of the app, print its id and exit 0 only when it is complete. LOCATION "
        "(a path or fsspec URL) replaces LOCKGATE_SAVEPOINT_DIR for this run; without it "
        "the savepoint goes to LOCKGATE_SAVEPOINT_DIR. Same as LOCKGATE_UNTIL_SAVEPOINT."
    ),
)
def run(
    app_spec: str,
    from_savepoint: str | None,
    allow_non_restored_state: bool,
    until: str | None,
    no_drain: bool,
    until_savepoint: str | None,
) -> None:
    """Run the app MODULE:APP until SIGTERM/SIGINT (or, with --until, to a bound).

    With --until BOUND --savepoint the run ends with a savepoint of the app (Flink's
    stop-with-drain): its id is the last line of stdout, and the exit code is 0 only
    when it is complete (1: it failed or timed out, the reason on stderr).
    """
    defer_stop_signals()
    app = load_app(app_spec)
    settings = app_settings(app)
    if until_savepoint is not None:
        if until is None and settings.until is None:
            click.echo(
                "lockgate: --savepoint needs --until BOUND (the savepoint is taken at the end "
                "of a bounded run; use `lockgate savepoint trigger` for a running app)",
                err=True,
            )
            sys.exit(2)
        if until_savepoint == "default" and not settings.savepoint_dir:
            click.echo(
                "lockgate: --savepoint without LOCATION needs LOCKGATE_SAVEPOINT_DIR (where "
                "the savepoint goes); or give --savepoint LOCATION",
                err=True,
            )
            sys.exit(2)
        settings = settings.model_copy(update={"until_savepoint": until_savepoint})
    if until is not None or no_drain:
        if until is not None:
            try:
                parse_until(until)
            except ConfigError as exc:
                click.echo(f"lockgate: {exc}", err=True)
                sys.exit(2)
        settings = settings.model_copy(
            update={"until": until or settings.until, "until_drain": not no_drain}
        )
    if from_savepoint is not None or allow_non_restored_state:
        updates: dict[str, Any] = {}
        if from_savepoint is not None:
            try:
                updates["from_savepoint"] = check_savepoint_id(from_savepoint)
            except SavepointError as exc:
                click.echo(f"lockgate: --from-savepoint: {exc}", err=True)
                sys.exit(2)
        if allow_non_restored_state:
            updates["allow_non_restored_state"] = True
        settings = settings.model_copy(update=updates)
    if settings.from_savepoint is not None and not settings.savepoint_dir:
        click.echo(
            "lockgate: --from-savepoint needs LOCKGATE_SAVEPOINT_DIR (where the savepoint is)",
            err=True,
        )
        sys.exit(2)
    configure(settings.log_level, settings.log_format.value)
    runners: list[Runner] = []
    try:
        code = run_app(app, settings, on_started=runners.append, final_savepoint=BoundedSavepoint)
    except FatalKafkaError as exc:
        _run_failed(str(exc), 1)
    except LockgateError as exc:
        _run_failed(str(exc), 2)
    except KafkaException as exc:
        denied = not_authorized_text(exc)
        if denied is not None:
            log.error("%s", denied)
            click.echo(f"lockgate: {denied}", err=True)
            sys.exit(2)
        hint = _unreachable_hint(exc, settings.bootstrap_servers)
        _run_failed(f"Kafka client error: {exc}{hint}", 1)
    if code == 0 and runners and runners[0].savepoint_result:
        click.echo(runners[0].savepoint_result)
    sys.exit(code)


def _run_failed(message: str, code: int) -> NoReturn:
    """Say once why ``lockgate run`` stops, then exit with ``code``.

    As an ERROR log line (stderr, in the configured format, so log collectors get it as
    they get every other line); as ``lockgate: message`` on stderr only if no log handler
    would show it. Never both (it was printed twice).
    """
    if log.isEnabledFor(logging.ERROR) and log.hasHandlers():
        log.error("%s", message)
    else:
        click.echo(f"lockgate: {message}", err=True)
    sys.exit(code)


#: librdkafka's codes for "no broker answered" (transport failure, all brokers down, timeout).
_UNREACHABLE = frozenset({"_TRANSPORT", "_ALL_BROKERS_DOWN", "_TIMED_OUT"})


def _unreachable_hint(exc: KafkaException, bootstrap: str) -> str:
    """What to check when ``exc`` says no broker answered; else ``""``."""
    err = exc.args[0] if exc.args else None
    name = err.name() if isinstance(err, KafkaError) else ""
    if name not in _UNREACHABLE:
        return ""
    return (
        f" (no broker answered at {bootstrap}: check LOCKGATE_BOOTSTRAP_SERVERS, the network "
        "path and the LOCKGATE_KAFKA__SECURITY_PROTOCOL/SASL settings; exiting 1 so the "
        "supervisor restarts the instance)"
    )


@main.command()
@click.argument("app_spec", metavar="MODULE:APP")
@click.option(
    "--from",
    "from_",
    metavar="POS",
    help="First records: earliest (default), a time or offsets:p=o,...",
)
@click.option(
    "--until",
    metavar="POS",
    help="End (exclusive): now (default: the last stable offsets), a time or offsets:p=o,...",
)
@click.option(
    "--archive",
    metavar="PATH",
    help="Read archived Parquet (key, value, timestamp[, topic, partition, offset]), not Kafka.",
)
@click.option(
    "--live-from",
    "live_from",
    metavar="POS",
    help="With --archive: where the live app starts reading Kafka afterwards.",
)
@click.option(
    "--output-parquet",
    "output_parquet",
    metavar="DIR",
    help="Write outputs to Parquet files in DIR instead of the output topics.",
)
@spark_options
@click.option(
    "--resume", metavar="ID", help="Re-run a failed job (Kafka output) with its original plan."
)
@click.option(
    "--commit-every",
    default=5000,
    show_default=True,
    type=click.IntRange(1),
    help="Input records per transaction at most.",
)
@click.option(
    "--json",
    "as_json",
    is_flag=True,
    help="Print the summary as JSON (the id stays the last line).",
)
def backfill(
    app_spec: str,
    from_: str | None,
    until: str | None,
    archive: str | None,
    live_from: str | None,
    output_parquet: str | None,
    master: str,
    conf: tuple[str, ...],
    resume: str | None,
    commit_every: int,
    as_json: bool,
) -> None:
    """Replay history of MODULE:APP on Spark; end with a savepoint to continue live from.

    Progress goes to stderr; the last line of stdout is the savepoint id, for
    `lockgate run MODULE:APP --from-savepoint ID`. Exit 2: bad arguments or
    configuration; 1: the job failed (Kafka output: --resume ID continues it).
    """
    from processors.backfill import BackfillError, parse_position, run_backfill

    app = load_app(app_spec)
    settings = app_settings(app)
    configure(settings.log_level, settings.log_format.value)
    spark_conf = parse_spark_conf(conf)
    try:
        summary = run_backfill(
            app_spec,
            settings,
            from_=None if from_ is None else parse_position(from_, "--from"),
            until=None if until is None else parse_position(until, "--until"),
            archive=archive,
            live_from=None if live_from is None else parse_position(live_from, "--live-from"),
            output_parquet=output_parquet,
            master=master,
            spark_conf=spark_conf,
            resume=resume,
            commit_every=commit_every,
            report=lambda line: click.echo(line, err=True),
        )
    except (ConfigError, SavepointError) as exc:
        click.echo(f"lockgate: {exc}", err=True)
        sys.exit(2)
    except (BackfillError, LockgateError, KafkaException) as exc:
        click.echo(f"lockgate: {exc}", err=True)
        sys.exit(1)
    if as_json:
        json_out(summary)
    click.echo(summary["savepoint"])


@main.command()
@click.argument("app_spec", metavar="[MODULE:APP]", required=False)
def config(app_spec: str | None) -> None:
    """Check the configuration and print it as JSON (secrets masked).

    A dry run of everything `lockgate run` checks before it connects to Kafka: every
    LOCKGATE_* variable (unknown ones are errors) and the rules between settings.
    With MODULE:APP the app is loaded and its definition checked too, and the
    LOCKGATE_* variables it declares (App(..., env=[...])) are accepted. Exit code 2
    when anything is invalid.
    """
    app = load_app(app_spec) if app_spec is not None else None
    settings = app_settings(app)
    if app is not None:
        check_app(app)
    data: dict[str, Any] = settings.masked()
    click.echo(orjson.dumps(data, option=orjson.OPT_INDENT_2).decode())


# ------------------------------------------------------------- operator commands


def _yes(flag: bool) -> str:
    return "yes" if flag else "no"


def _offsets_text(offsets: dict[str, Any]) -> str:
    return " ".join(f"{t}={o}" for t, o in sorted(offsets.items())) or "-"


@main.group()
def checkpoints() -> None:
    """The checkpoint catalog: completed checkpoints from the control topics."""


@checkpoints.command("list")
@click.option("--app", "apps", multiple=True, metavar="NAME", help="An app (repeatable).")
@click.option("--pipeline", metavar="NAME", help="The app and every app connected to it.")
@click.option("--limit", default=20, show_default=True, help="At most this many checkpoints.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON on stdout.")
def checkpoints_list(
    apps: tuple[str, ...], pipeline: str | None, limit: int, as_json: bool
) -> None:
    """List the completed checkpoints of apps, newest first.

    Read from the committed checkpoint records of each key group (`ckpt/<g>` in
    `<app>.control`, read_committed): a checkpoint is complete when every key group
    of every app has committed it or a later one. Shows each key group's latest
    checkpoint, the key groups halted by a stop-with-savepoint or restored from a
    savepoint, and the offsets of the newest complete checkpoint.
    """
    settings = ops_settings()
    ops = Ops(settings)
    try:
        result = list_checkpoints(ops, apps, pipeline, limit)
    except (LockgateError, KafkaException) as exc:
        ops_fail(exc)
    finally:
        ops.close()
    if as_json:
        json_out(result)
        return
    for app, info in result["apps"].items():
        click.echo(f"app {app}: {info['key_groups']} key groups")
        for row in info["latest"]:
            if row["checkpoint"] is None:
                click.echo(f"  key group {row['key_group']}: no committed checkpoint")
                continue
            notes = []
            if row.get("halted"):
                notes.append(f"halted at savepoint {row['halted']}")
            if row.get("origin"):
                notes.append(f"restored from {row['origin']}")
            click.echo(
                f"  key group {row['key_group']}: checkpoint {row['checkpoint']} at "
                f"{row['time']} aligned={_yes(row['aligned'])} instance={row['instance']}"
                + (f" ({'; '.join(notes)})" if notes else "")
            )
    if not result["checkpoints"]:
        click.echo("no completed checkpoint (some key group has none committed yet)")
        return
    click.echo("completed checkpoints (newest first):")
    for row in result["checkpoints"]:
        click.echo(f"  {row['checkpoint']}  {row['time']}  aligned={_yes(row['aligned'])}")
    newest = result["newest"]
    click.echo(f"offsets at checkpoint {newest['checkpoint']}:")
    for app, rows in newest["key_groups"].items():
        for row in rows:
            click.echo(
                f"  {app}/{row['key_group']} (checkpoint {row['checkpoint']}): "
                f"{_offsets_text(row['offsets'])}"
            )


@main.group()
def savepoint() -> None:
    """Savepoints: take, list and describe them (LOCKGATE_SAVEPOINT_DIR)."""


@savepoint.command("trigger")
@click.option("--app", "apps", multiple=True, metavar="NAME", help="An app (repeatable).")
@click.option("--pipeline", metavar="NAME", help="The app and every app connected to it.")
@click.option("--stop", is_flag=True, help="Halt the apps at the savepoint.")
@click.option(
    "--timeout",
    default=120.0,
    show_default=True,
    type=click.FloatRange(min=0, min_open=True),
    help="Seconds to wait for every key group's manifest.",
)
@click.option("--json", "as_json", is_flag=True, help="Print the descriptor as JSON.")
def savepoint_trigger(
    apps: tuple[str, ...], pipeline: str | None, stop: bool, timeout: float, as_json: bool
) -> None:
    """Take a savepoint of apps and print its id (the last line of stdout).

    Writes a request to the control topic of the source apps (those not reading
    another app's internal topic); every key group of every app exports its state at
    the savepoint's checkpoint and commits a manifest. When all are committed the
    descriptor is written to LOCKGATE_SAVEPOINT_DIR. With --stop the apps pause at
    the savepoint (instances stay up until stopped). Exit 1 when a key group fails
    the savepoint or the timeout passes (the missing key groups are named).
    """
    settings = ops_settings()
    ops = Ops(settings)
    try:
        store = open_store(settings)
        descriptor = trigger_savepoint(
            ops,
            store,
            apps,
            pipeline,
            stop=stop,
            timeout_s=timeout,
            progress=lambda line: click.echo(line, err=True),
        )
    except (LockgateError, KafkaException) as exc:
        ops_fail(exc)
    finally:
        ops.close()
    if as_json:
        click.echo(orjson.dumps(descriptor).decode())
    else:
        click.echo(descriptor["savepoint"])


@savepoint.command("cancel")
@click.argument("savepoint_id", metavar="[ID]", required=False)
@click.option("--app", "apps", multiple=True, metavar="NAME", help="An app (repeatable).")
@click.option("--pipeline", metavar="NAME", help="The app and every app connected to it.")
@click.option(
    "--halted",
    is_flag=True,
    help="Instead of ID: cancel the savepoint(s) the apps' key groups are halted at.",
)
def savepoint_cancel(
    savepoint_id: str | None, apps: tuple[str, ...], pipeline: str | None, halted: bool
) -> None:
    """Cancel a savepoint: key groups halted by it (--stop) resume, none takes it any more.

    `savepoint trigger --stop` cancels by itself when the savepoint fails or times out;
    use this when the trigger command itself died, or to resume a halted pipeline. With
    --halted (and no ID) the savepoints are those the apps' key groups are halted at,
    read from their latest committed checkpoint records: their ids go to stdout, one per
    line; none halted is not an error (exit 0). The chart's savepoint-cancel Job runs
    this, so nobody has to find the id.
    """
    if halted == (savepoint_id is not None):
        ops_fail(OpsError("give either a savepoint ID or --halted", exit_code=2))
    settings = ops_settings()
    ops = Ops(settings)
    found: dict[str, dict[str, list[int]]] = {}
    try:
        registry = ops.registry()
        involved = resolve_apps(registry, apps, pipeline)
        if savepoint_id is not None:
            cancel_savepoint(ops, savepoint_id, involved)
            found = {savepoint_id: {}}
        else:
            found = cancel_halted(ops, registry, involved)
    except (LockgateError, KafkaException, SavepointError) as exc:
        ops_fail(exc)
    finally:
        ops.close()
    names = ", ".join(involved)
    if not found:
        click.echo(f"no key group of {names} is halted: nothing to cancel", err=True)
    for sp_id, by_app in sorted(found.items()):
        where = "; ".join(f"{a} key group(s) {_groups_text(gs)}" for a, gs in by_app.items())
        click.echo(
            f"cancelled {sp_id} in {names}" + (f" (halted: {where})" if where else ""), err=True
        )
        if halted:
            click.echo(sp_id)


def _groups_text(groups: list[int]) -> str:
    return ",".join(str(g) for g in groups)


@savepoint.command("list")
@click.option("--json", "as_json", is_flag=True, help="Print JSON on stdout.")
def savepoint_list(as_json: bool) -> None:
    """List the completed savepoints in LOCKGATE_SAVEPOINT_DIR, oldest first."""
    settings = ops_settings()
    try:
        rows = list_savepoints(open_store(settings))
    except LockgateError as exc:
        ops_fail(exc)
    if as_json:
        json_out(rows)
        return
    if not rows:
        click.echo("no savepoints", err=True)
    for row in rows:
        click.echo(
            f"{row['savepoint']}  created {row['created']}  checkpoint {row['checkpoint']}  "
            f"apps {','.join(row['apps'])}{'  (stop)' if row['stop'] else ''}"
        )


@savepoint.command("describe")
@click.argument("savepoint_id", metavar="ID")
@click.option("--json", "as_json", is_flag=True, help="Print the descriptor as JSON.")
def savepoint_describe(savepoint_id: str, as_json: bool) -> None:
    """Describe savepoint ID: its apps, and per key group the checkpoint, offsets and stores."""
    settings = ops_settings()
    try:
        d = describe_savepoint(open_store(settings), savepoint_id)
    except LockgateError as exc:
        ops_fail(exc)
    if as_json:
        json_out(d)
        return
    for line in savepoint_text(d):
        click.echo(line)


from processors._spark.cli_options import rescale  # noqa: E402

savepoint.add_command(rescale)

from processors._ops.console.command import console  # noqa: E402
from processors._ops.dlq import dlq  # noqa: E402
from processors._ops.read import read  # noqa: E402
from processors._ops.reset import reset  # noqa: E402
from processors._ops.send import send  # noqa: E402
from processors._ops.topics import topics  # noqa: E402

main.add_command(topics)
main.add_command(send)
main.add_command(read)
main.add_command(dlq)
main.add_command(reset)
main.add_command(console)
