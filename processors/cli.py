"""The ``lockgate`` command line.

Exit codes: 0 clean stop; 1 runtime failure (Kafka fatal error, fenced); 2 bad
usage, configuration or topics; 3 a record failed with ``LOCKGATE_ON_ERROR=fail``.
Errors go to stderr; ``lockgate config`` prints JSON on stdout. No message contains
the value of a secret.
"""

from __future__ import annotations

import importlib
import logging
import sys
from pathlib import Path
from typing import Any

import click
import orjson
from confluent_kafka import KafkaException

from processors._app import App
from processors._logging import configure
from processors._runtime import run_app
from processors._settings import Settings, load_settings
from processors.exceptions import ConfigError, FatalKafkaError, LockgateError

log = logging.getLogger("lockgate.cli")


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


def _settings(app: App | None = None) -> Settings:
    """Load the settings (accepting ``app``'s own variables) or exit 2 with the reason."""
    try:
        return load_settings(app_env=app.env if app is not None else ())
    except LockgateError as exc:
        click.echo(f"lockgate: {exc}", err=True)
        sys.exit(2)


def _check_app(app: App) -> None:
    """Everything the runtime checks about the app before it touches Kafka; exit 2 if bad."""
    try:
        app.handler()
    except ConfigError as exc:
        click.echo(f"lockgate: {exc}", err=True)
        sys.exit(2)


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="lockgate")
def main() -> None:
    """Lockgate: stateful, exactly-once stream processing on Kafka.

    Configuration comes from LOCKGATE_* environment variables
    (see docs/configuration.md, or `lockgate config`).
    """


@main.command()
@click.argument("app_spec", metavar="MODULE:APP")
def run(app_spec: str) -> None:
    """Run the app MODULE:APP until SIGTERM/SIGINT."""
    app = load_app(app_spec)
    settings = _settings(app)
    configure(settings.log_level, settings.log_format.value)
    try:
        code = run_app(app, settings)
    except FatalKafkaError as exc:
        log.error("%s", exc)
        click.echo(f"lockgate: {exc}", err=True)
        sys.exit(1)
    except LockgateError as exc:
        log.error("%s", exc)
        click.echo(f"lockgate: {exc}", err=True)
        sys.exit(2)
    except KafkaException as exc:
        log.error("Kafka client error: %s", exc)
        click.echo(f"lockgate: Kafka client error: {exc}", err=True)
        sys.exit(1)
    sys.exit(code)


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
    settings = _settings(app)
    if app is not None:
        _check_app(app)
    data: dict[str, Any] = settings.masked()
    click.echo(orjson.dumps(data, option=orjson.OPT_INDENT_2).decode())
