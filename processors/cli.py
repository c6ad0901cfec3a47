"""The ``lockgate`` command line.

Exit codes: 0 clean stop; 1 runtime failure (Kafka fatal error, fenced); 2 bad
usage, configuration or topics; 3 a record failed with ``LOCKGATE_ON_ERROR=fail``.
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
from processors.exceptions import FatalKafkaError, LockgateError

log = logging.getLogger("lockgate.cli")


def load_app(spec: str) -> App:
    """Import ``module:attribute`` and return the :class:`App` it names.

    Raises:
        click.UsageError: the module or attribute is missing, or is not an App.
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
    app = getattr(module, attr, None)
    if not isinstance(app, App):
        raise click.UsageError(f"{spec} is {type(app).__name__}, not a lockgate App")
    return app


def _settings() -> Settings:
    try:
        return load_settings()
    except LockgateError as exc:
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
    settings = _settings()
    configure(settings.log_level, settings.log_format.value)
    app = load_app(app_spec)
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
def config() -> None:
    """Print the effective configuration as JSON (secrets masked)."""
    settings = _settings()
    data: dict[str, Any] = settings.masked()
    click.echo(orjson.dumps(data, option=orjson.OPT_INDENT_2).decode())
