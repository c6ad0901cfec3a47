"""``lockgate console``: the click command that serves the web console until stopped.

The click command is added to ``lockgate`` by ``processors/cli.py``; settings and errors
follow :mod:`processors._ops.cli_common`.
"""

from __future__ import annotations

import signal
import threading
from pathlib import Path
from types import FrameType

import click

from processors._ops.cli_common import ops_settings
from processors._ops.console.dashboard import MetricsHistory, load_dashboard
from processors._ops.console.data import Snapshotter
from processors._ops.console.instances import InstanceDirectory
from processors._ops.console.jobs import SavepointJobs
from processors._ops.console.server import ConsoleServer

__all__ = ["console", "parse_instances"]


def parse_instances(values: tuple[str, ...]) -> dict[str, str]:
    """Return instance id -> base URL from ``ID=URL`` values.

    Raises:
        click.BadParameter: a value is not ``ID=http(s)://...``.
    """
    out: dict[str, str] = {}
    for value in values:
        iid, sep, url = value.partition("=")
        if not sep or not iid or not url.startswith(("http://", "https://")):
            raise click.BadParameter(
                f"{value!r}: expected ID=URL, e.g. c1=http://127.0.0.1:8080",
                param_hint="--instance",
            )
        out[iid] = url
    return out


@click.command()
@click.option(
    "--host",
    default="127.0.0.1",
    show_default=True,
    envvar="LOCKGATE_CONSOLE_HOST",
    help="Address to bind (LOCKGATE_CONSOLE_HOST).",
)
@click.option(
    "--port",
    default=8088,
    show_default=True,
    type=click.IntRange(0, 65535),
    envvar="LOCKGATE_CONSOLE_PORT",
    help="Port to bind; 0 picks a free one (LOCKGATE_CONSOLE_PORT).",
)
@click.option(
    "--instance",
    "instances",
    multiple=True,
    metavar="ID=URL",
    help="Where instance ID serves /metrics and /readyz (repeatable).",
)
@click.option(
    "--instance-url",
    metavar="TEMPLATE",
    help=(
        "URL of an instance's HTTP port with {instance} (and {app}); default: "
        "LOCKGATE_QUERY_PEER_URL. Instances neither names are shown without metrics."
    ),
)
@click.option(
    "--refresh",
    default=1.0,
    show_default=True,
    type=click.FloatRange(min=0.2),
    help="Seconds between two reads of the control topics.",
)
@click.option(
    "--savepoint-timeout",
    default=120.0,
    show_default=True,
    type=click.FloatRange(min=0, min_open=True),
    help="Seconds a savepoint triggered from the console waits for every key group.",
)
@click.option(
    "--scrape-interval",
    default=5.0,
    show_default=True,
    type=click.FloatRange(min=0.2),
    help="Seconds between two /metrics scrapes kept for the dashboard page.",
)
@click.option(
    "--history",
    "history_s",
    default=900.0,
    show_default=True,
    type=click.FloatRange(min=10),
    help="Seconds of /metrics history the dashboard page keeps and draws.",
)
@click.option(
    "--dashboard",
    "dashboard_file",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    help="A Grafana dashboard JSON to draw instead of the chart's (dashboards/lockgate.json).",
)
def console(
    host: str,
    port: int,
    instances: tuple[str, ...],
    instance_url: str | None,
    refresh: float,
    savepoint_timeout: float,
    scrape_interval: float,
    history_s: float,
    dashboard_file: Path | None,
) -> None:
    """Serve the web console: pipeline, key groups, checkpoints, lag, savepoints.

    Reads the registry and the control topics (read_committed), the savepoint store
    (LOCKGATE_SAVEPOINT_DIR) and the instances' /metrics and /readyz where their address
    is known; /dashboard draws the chart's Grafana dashboard from a history of /metrics.
    Savepoint trigger and cancel need LOCKGATE_QUERY_TOKEN (sent by the page as
    a bearer token). Runs until SIGTERM or Ctrl-C. See docs/console.md.
    """
    settings = ops_settings()
    directory = InstanceDirectory(
        parse_instances(instances), instance_url or settings.query_peer_url
    )
    try:
        dashboard = load_dashboard(dashboard_file)
    except (OSError, ValueError) as exc:
        raise click.BadParameter(str(exc), param_hint="--dashboard") from exc
    history = MetricsHistory(dashboard, scrape_interval, history_s)
    snapshots = Snapshotter(settings, directory, refresh, history)
    jobs = SavepointJobs(settings, savepoint_timeout, on_done=snapshots.refresh_savepoints)
    try:
        server = ConsoleServer(settings, snapshots, jobs, host, port, history)
    except OSError as exc:
        click.echo(f"lockgate: console: cannot listen on {host}:{port} ({exc.strerror})", err=True)
        raise SystemExit(2) from exc
    stopped = threading.Event()

    def stop(_signum: int, _frame: FrameType | None) -> None:
        stopped.set()

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    server.start()
    bound_host, bound_port = server.address
    click.echo(f"lockgate console: http://{bound_host}:{bound_port}/", err=True)
    stopped.wait()
    server.stop()
