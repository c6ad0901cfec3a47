"""Instance HTTP endpoints for the console: where they are, what ``/metrics`` says.

An instance's address comes from an explicit ``ID=URL`` (``--instance``) or from a URL
template with ``{instance}`` (and optionally ``{app}``), by default the instances' own
``LOCKGATE_QUERY_PEER_URL``. Instance ids come from the checkpoint records and are put
into a template only when they look like Kafka group instance ids
(:func:`processors._runtime.query.valid_owner`), so a record cannot steer the console to
an arbitrary URL.
"""

from __future__ import annotations

import urllib.error
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from processors._runtime.query import valid_owner

__all__ = ["InstanceDirectory", "InstanceStatus", "parse_metrics", "probe_instance"]

#: Counters and gauges of ``/metrics`` the console shows (sample name -> short name).
SHOWN = {
    "lockgate_records_in_total": "records_in",
    "lockgate_records_out_total": "records_out",
    "lockgate_dlq_records_total": "dlq_records",
    "lockgate_epochs_committed_total": "epochs_committed",
    "lockgate_epochs_aborted_total": "epochs_aborted",
    "lockgate_last_checkpoint_id": "last_checkpoint_id",
    "lockgate_key_groups_assigned": "key_groups_assigned",
    "lockgate_key_groups_halted": "key_groups_halted",
    "lockgate_consumer_lag_records": "consumer_lag",
    "lockgate_alignments_forced_total": "alignments_forced",
    "lockgate_epoch_commit_seconds_max": "commit_seconds_max",
}
#: Histograms whose mean the console shows (family -> short name).
MEANS = {
    "lockgate_alignment_seconds": "alignment_mean_s",
    "lockgate_epoch_commit_seconds": "commit_mean_s",
}


class InstanceDirectory:
    """Resolves an instance id to the base URL of its HTTP port.

    Args:
        explicit: instance id -> base URL (``--instance ID=URL``).
        template: a URL with ``{instance}`` (and optionally ``{app}``), or ``None``.
    """

    def __init__(self, explicit: Mapping[str, str], template: str | None) -> None:
        self._explicit = {k: v.rstrip("/") for k, v in explicit.items()}
        self._template = template

    def url(self, app: str, instance: str) -> str | None:
        """Return the base URL of ``instance`` of ``app``, or ``None`` when not known."""
        if instance in self._explicit:
            return self._explicit[instance]
        if self._template is None or not valid_owner(instance) or not valid_owner(app):
            return None
        return self._template.replace("{instance}", instance).replace("{app}", app).rstrip("/")


@dataclass
class InstanceStatus:
    """What one instance's endpoints said.

    Attributes:
        url: the base URL asked (``None``: not known).
        ready: ``True``/``False`` from ``/readyz``; ``None`` when not asked or no answer.
        metrics: short name -> value (see :data:`SHOWN` and :data:`MEANS`).
        watermarks: one row per ``*watermark*`` (and ``lockgate_key_group_idle``) sample:
            labels and value.
        error: why the endpoints did not answer.
        text: the ``/metrics`` text (for the dashboard's history; not in :meth:`to_json`).
    """

    url: str | None
    ready: bool | None = None
    metrics: dict[str, float] = field(default_factory=dict)
    watermarks: list[dict[str, Any]] = field(default_factory=list)
    error: str | None = None
    text: str | None = field(default=None, repr=False)

    def to_json(self) -> dict[str, Any]:
        """Return a JSON-able form."""
        return {
            "url": self.url,
            "ready": self.ready,
            "metrics": self.metrics,
            "watermarks": self.watermarks,
            "error": self.error,
        }


def parse_metrics(text: str) -> tuple[dict[str, float], list[dict[str, Any]]]:
    """Return the shown values and the watermark samples of a ``/metrics`` exposition.

    Args:
        text: Prometheus text format.

    Returns:
        (short name -> value, [{"name", "labels", "value"}] for every sample whose name
        contains ``watermark``, and ``lockgate_key_group_idle``).
    """
    values: dict[str, float] = {}
    watermarks: list[dict[str, Any]] = []
    sums: dict[str, float] = {}
    counts: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            name = sample.name
            if name in SHOWN:
                values[SHOWN[name]] = float(sample.value)
            elif "watermark" in name or name == "lockgate_key_group_idle":
                labels = {
                    k: v for k, v in sample.labels.items() if k not in ("app", "lockgate_instance")
                }
                watermarks.append({"name": name, "labels": labels, "value": sample.value})
            elif family.name in MEANS and name == f"{family.name}_sum":
                sums[family.name] = float(sample.value)
            elif family.name in MEANS and name == f"{family.name}_count":
                counts[family.name] = float(sample.value)
    for fam, short in MEANS.items():
        if counts.get(fam):
            values[short] = sums.get(fam, 0.0) / counts[fam]
    return values, watermarks


def _get(url: str, timeout_s: float) -> tuple[int, bytes]:
    req = urllib.request.Request(url, method="GET")  # noqa: S310 - operator-configured URL
    try:
        with urllib.request.urlopen(req, timeout=timeout_s) as resp:  # noqa: S310
            return int(resp.status), bytes(resp.read())
    except urllib.error.HTTPError as exc:
        return int(exc.code), bytes(exc.read())


def probe_instance(url: str | None, timeout_s: float = 1.0) -> InstanceStatus:
    """Ask ``url``'s ``/readyz`` and ``/metrics`` (never raises).

    Args:
        url: the base URL, or ``None`` (nothing is asked).
        timeout_s: per request.
    """
    status = InstanceStatus(url)
    if url is None:
        return status
    try:
        code, _ = _get(f"{url}/readyz", timeout_s)
        status.ready = code == 200
        code, body = _get(f"{url}/metrics", timeout_s)
        if code == 200:
            status.text = body.decode(errors="replace")
            status.metrics, status.watermarks = parse_metrics(status.text)
        else:
            status.error = f"/metrics answered {code}"
    except (OSError, ValueError) as exc:
        status.error = f"no answer ({type(exc).__name__}: {exc})"
    return status
