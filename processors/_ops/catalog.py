"""Operator commands: the checkpoint catalog and savepoints (``lockgate checkpoints|savepoint``).

Everything here reads what the runtime committed to the control topics
(:mod:`processors._checkpoint.control_topics`) with a group-less ``read_committed``
consumer, so a listing never shows a checkpoint or a savepoint manifest of an aborted transaction.

This module is the one import of the CLI (``processors/cli.py``), the console and the other
commands; it re-exports the parts, one concern each:

* :mod:`processors._ops.errors`: :class:`OpsError` with the exit code the CLI uses (2 for
  usage and configuration problems, 1 for runtime failures and timeouts);
* :mod:`processors._ops.pipelines`: the registry's pipeline graph (closure, sources,
  :func:`resolve_apps`), pure;
* :mod:`processors._ops.savepoint_requests`: a savepoint's checkpoint id, request record
  and manifests' progress, pure;
* :mod:`processors._ops.client`: :class:`Ops`, the Kafka side (registry, checkpoint
  history, savepoint requests and manifests);
* :mod:`processors._ops.checkpoints`: completeness, :func:`checkpoint_summary` and
  :func:`list_checkpoints`;
* :mod:`processors._ops.savepoints`: :func:`trigger_savepoint`, :func:`cancel_savepoint`,
  :func:`cancel_halted`, :func:`halted_key_groups`, :func:`list_savepoints`,
  :func:`describe_savepoint`, :func:`open_store`;
* :mod:`processors._ops.bounded_savepoint`: :class:`BoundedSavepoint`, the final savepoint
  of ``lockgate run --until BOUND --savepoint`` (handed to the runtime).
"""

from __future__ import annotations

from processors._ops.bounded_savepoint import BoundedSavepoint
from processors._ops.checkpoints import (
    checkpoint_summary,
    complete_bound,
    complete_checkpoints,
    list_checkpoints,
)
from processors._ops.client import Ops
from processors._ops.errors import OpsError
from processors._ops.pipelines import (
    pipeline_closure,
    resolve_apps,
    source_apps,
    topo_order,
    unnamed_upstreams,
    writers_by_topic,
)
from processors._ops.savepoint_requests import (
    REQUEST_TTL_MS,
    SAVEPOINT_MARGIN_MS,
    choose_checkpoint,
    manifest_problems,
    missing_key_groups,
    progress_text,
    savepoint_request,
)
from processors._ops.savepoints import (
    cancel_halted,
    cancel_savepoint,
    describe_savepoint,
    halted_key_groups,
    list_savepoints,
    open_store,
    savepoint_text,
    trigger_savepoint,
)

__all__ = [
    "REQUEST_TTL_MS",
    "SAVEPOINT_MARGIN_MS",
    "BoundedSavepoint",
    "Ops",
    "OpsError",
    "cancel_halted",
    "cancel_savepoint",
    "checkpoint_summary",
    "choose_checkpoint",
    "complete_bound",
    "complete_checkpoints",
    "describe_savepoint",
    "halted_key_groups",
    "list_checkpoints",
    "list_savepoints",
    "manifest_problems",
    "missing_key_groups",
    "savepoint_text",
    "open_store",
    "pipeline_closure",
    "progress_text",
    "resolve_apps",
    "savepoint_request",
    "source_apps",
    "topo_order",
    "trigger_savepoint",
    "unnamed_upstreams",
    "writers_by_topic",
]
