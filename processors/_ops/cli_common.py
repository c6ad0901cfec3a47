"""What every ``lockgate`` command shares: loading an app and the settings, exiting.

Used by ``processors/cli.py`` (the click wiring) and the operator commands (one module
per command: ``processors/_ops/topics.py``, ``send.py``, ``read.py``, ``dlq.py``,
``reset.py``), so
the commands behave alike without importing the CLI module that registers them.

Conventions (as the rest of the CLI): exit 0 on success, 1 on a runtime failure (Kafka),
2 on bad usage, configuration, topic mismatches or a refusal; errors on stderr as
``lockgate: ...`` (:func:`ops_fail`, :func:`fail`); no message names the value of a
secret.
"""

from __future__ import annotations

import importlib
import sys
from pathlib import Path
from typing import Any, NoReturn

import click
import orjson
from confluent_kafka import KafkaError, KafkaException

from processors._config.log_setup import configure
from processors._config.settings import Settings, load_settings
from processors._config.times import time_ms
from processors._dsl.app import App
from processors._kafka.authz import AUTHORIZATION_CODES
from processors._ops.catalog import OpsError
from processors.exceptions import ConfigError, LockgateError, TopicError
from state.codecs import Codec
from state.savepoint import SavepointError

#: The client name (client.id prefix) of the operator commands' Kafka clients.
CLI_CLIENT = "lockgate-cli"


def load_app(spec: str) -> App:
    """Import ``module:attribute`` and return the :class:`App` it names.

    The current directory is put on ``sys.path`` first (as ``python -m`` does).

    Raises:
        click.UsageError: the spec is malformed, the module cannot be imported or
            refuses its app definition (:class:`ConfigError` at import), or the
            attribute is missing or not an App; the message lists the module's Apps.
    """
    module_name, _, attr = spec.partition(":")
    if not module_name or not attr:
        raise click.UsageError(f"expected MODULE:APP (e.g. examples.running_sum:app), got {spec!r}")
    if str(Path.cwd()) not in sys.path:
        sys.path.insert(0, str(Path.cwd()))
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise click.UsageError(f"cannot import {module_name!r}: {exc}") from exc
    except ConfigError as exc:
        raise click.UsageError(f"{module_name}: invalid app definition: {exc}") from exc
    apps = sorted(name for name, obj in vars(module).items() if isinstance(obj, App))
    found = f"App objects it defines: {', '.join(apps)}" if apps else "it defines no lockgate App"
    if not hasattr(module, attr):
        raise click.UsageError(f"module {module_name!r} has no attribute {attr!r}; {found}")
    app = getattr(module, attr)
    if not isinstance(app, App):
        raise click.UsageError(f"{spec} is a {type(app).__name__}, not a lockgate App; {found}")
    return app


def app_settings(app: App | None = None) -> Settings:
    """Load the settings (accepting ``app``'s own variables) or exit 2 with the reason."""
    try:
        return load_settings(app_env=app.env if app is not None else ())
    except LockgateError as exc:
        click.echo(f"lockgate: {exc}", err=True)
        sys.exit(2)


def check_app(app: App) -> None:
    """Everything the runtime checks about the app before it touches Kafka; exit 2 if bad."""
    try:
        app.handlers()
    except ConfigError as exc:
        click.echo(f"lockgate: {exc}", err=True)
        sys.exit(2)


def ops_settings() -> Settings:
    """Load the settings for an operator command (exit 2 with the reason if invalid).

    ``LOCKGATE_*`` variables that no setting reads are a warning here, not an error:
    inside an app's pod the environment holds the app's own variables (its topics), which
    an operator command without ``--app`` cannot know.
    """

    def warn(lines: list[str]) -> None:
        click.echo(
            "lockgate: warning: ignoring variables no setting reads (the app's own, or "
            "misspelt):\n  " + "\n  ".join(lines),
            err=True,
        )

    try:
        settings = load_settings(on_unknown=warn)
    except LockgateError as exc:
        click.echo(f"lockgate: {exc}", err=True)
        sys.exit(2)
    configure(settings.log_level, settings.log_format.value)
    return settings


def not_authorized_text(exc: KafkaException) -> str | None:
    """The message for a Kafka authorization error (``None`` for any other error)."""
    err = exc.args[0] if exc.args else None
    if not isinstance(err, KafkaError) or err.code() not in AUTHORIZATION_CODES:
        return None
    return (
        f"not authorized: the broker refused a {AUTHORIZATION_CODES[err.code()]} operation "
        f"this command needs ({err.name()}: {err.str()}); docs/security.md lists the ACLs "
        "of each command"
    )


def ops_fail(exc: Exception) -> NoReturn:
    """Print ``exc`` to stderr and exit with its code (1 unless it is a usage problem)."""
    code = (
        exc.exit_code
        if isinstance(exc, OpsError)
        else 2
        if isinstance(exc, ConfigError | SavepointError)
        else 1
    )
    denied = not_authorized_text(exc) if isinstance(exc, KafkaException) else None
    if denied is not None:
        click.echo(f"lockgate: {denied}", err=True)
        code = 2  # an ACL to grant, like a configuration error: retrying cannot help
    elif isinstance(exc, KafkaException):
        click.echo(f"lockgate: Kafka client error: {exc}", err=True)
    else:
        click.echo(f"lockgate: {exc}", err=True)
    sys.exit(code)


def json_out(data: Any) -> None:
    click.echo(orjson.dumps(data, option=orjson.OPT_INDENT_2).decode())


def fail(exc: Exception) -> NoReturn:
    """Exit through the CLI's error path; a topic problem is a usage problem (exit 2)."""
    if isinstance(exc, TopicError):
        exc = OpsError(str(exc), exit_code=2)
    ops_fail(exc)
    raise AssertionError("unreachable")  # pragma: no cover


def load_for_command(app_spec: str) -> tuple[App, Settings, str]:
    """Load MODULE:APP and its settings (exit 2 when either is invalid); return the name."""
    app: App = load_app(app_spec)
    settings: Settings = app_settings(app)
    configure(settings.log_level, settings.log_format.value)
    check_app(app)
    name = settings.app_name or app.name
    try:
        app.run_as(name)
    except ConfigError as exc:
        click.echo(f"lockgate: {exc}", err=True)
        sys.exit(2)
    return app, settings, name


def echo_err(line: str) -> None:
    """Print ``line`` on stderr."""
    click.echo(line, err=True)


def codecs_for(app: App, topic: str) -> tuple[Codec, Codec]:
    """Return the key and value codecs of ``topic`` in ``app``.

    ``topic`` is one of the app's inputs, outputs or global tables (looked up in that
    order).

    Raises:
        OpsError: (exit code 2) the topic is none of them; the message lists the app's
            topics.
    """
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


def parse_time_ms(text: str, option: str) -> int:
    """Return the time ``text`` names in milliseconds since the epoch.

    ``text`` is an integer (ms since the epoch) or an ISO 8601 time
    (``2026-01-31T12:00:00Z``; without an offset it is UTC).

    Raises:
        OpsError: (exit code 2) neither; the message names ``option``.
    """
    ms = time_ms(text)
    if ms is None:
        raise OpsError(
            f"{option}: {text!r} is not a time in ms or ISO 8601 (e.g. 2026-01-31T12:00:00Z)",
            exit_code=2,
        )
    return ms
