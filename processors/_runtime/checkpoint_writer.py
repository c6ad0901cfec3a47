"""What the checkpoint protocol writes into an epoch's transaction besides the data.

Three kinds of record (docs/architecture.md, "Control topics", "Pipelines"):

* the app's **registration** in ``lockgate.registry`` (once per process, first epoch):
  inputs, outputs, key groups, stores and their state version, operators;
* **barriers** on every partition of every internal output, one per key group and
  checkpoint, after every output of the epoch that ends there; each carries the
  writer's watermark (event time) and, for a savepoint, its id, apps and stop flag;
* each owned key group's **checkpoint record** (``ckpt/<g>`` in ``<app>.control``):
  checkpoint, offsets, alignment snapshots, origin, seeding, halt, global tables.

Invariants this component owns:

* a barrier goes to every partition of every internal output (a downstream key group
  aligns on the barriers of every upstream key group);
* a downstream key group whose watermark (or idleness) changed since its last barrier
  announces it again (:meth:`CheckpointWriter.reannounce`); what was announced is
  forgotten when an epoch aborts or key groups move (:meth:`CheckpointWriter.forget`),
  so the next barrier says it again.
"""

from __future__ import annotations

import time
from typing import Any

import orjson

from processors._checkpoint.control_topics import REGISTRY_TOPIC, checkpoint_key, registry_key
from processors._checkpoint.protocol import Barrier
from processors._dsl.app import App
from processors._runtime.output import OutputWriter
from processors._runtime.savepoint_files import SavepointFiles
from processors._task.keygroups import KeyGroup
from processors._task.time import TIME_STORE

__all__ = ["CheckpointWriter"]


class CheckpointWriter:
    """Writes registrations, barriers and checkpoint records (see the module docs).

    Args:
        name: the name the app runs under (the writer ``<name>/<g>`` of its barriers).
        app: the app (its time service: watermarks).
        instance_id: this instance's id (in every record).
        out: producing into the open transaction.
        files: the savepoint files (the store schemas and operators registered).
        control_topic: the app's ``<app>.control``.
    """

    def __init__(
        self,
        name: str,
        app: App,
        instance_id: str,
        out: OutputWriter,
        files: SavepointFiles,
        control_topic: str,
    ) -> None:
        self._name = name
        self._app = app
        self._instance_id = instance_id
        self._out = out
        self._files = files
        self._control_topic = control_topic
        self._key_groups = 0
        self._internal_partitions: dict[str, int] = {}
        #: Per key group, the (watermark, idle) its barriers carried last (event time).
        self._announced: dict[int, tuple[int, bool]] = {}

    def start(self, key_groups: int, internal_partitions: dict[str, int]) -> None:
        """The app's key-group count and each internal output's partition count (at start)."""
        self._key_groups = key_groups
        self._internal_partitions = dict(internal_partitions)

    def forget(self) -> None:
        """Forget what barriers announced (after an abort, or when key groups move).

        An aborted epoch's barriers never reached anyone, and after a rebalance the
        watermarks are announced again to whoever reads them now.
        """
        self._announced.clear()

    def register(self) -> None:
        """Write this app's registration (once per process, in its first epoch)."""
        record = {
            "app": self._name,
            "inputs": list(self._app.input_topics),
            "outputs": sorted(self._out.outputs),
            "internal_outputs": sorted(self._out.internal_outputs),
            "key_groups": self._key_groups,
            "stores": self._files.store_schemas(),
            "state_version": self._files.state_version(),
            "operators": self._files.operator_stores(),
            "instance": self._instance_id,
            "ts": int(time.time() * 1000),
        }
        self._out.produce(
            REGISTRY_TOPIC, orjson.dumps(record), registry_key(self._name), partition=0
        )

    def _barrier(
        self, g: int, kg: KeyGroup, ckpt: int, savepoint: dict[str, Any] | None
    ) -> Barrier:
        """Barrier ``ckpt`` of key group ``g``, with its watermark if the app has event time."""
        wm, idle, event_time = -1, False, False
        svc = self._app.time_service
        if svc is not None and svc.strategies:
            # The writer's watermark: a downstream key group's is the minimum over its
            # writers (idle ones left out), DESIGN 9.
            wm, idle = svc.announce(kg.caches[TIME_STORE])
            self._announced[g] = (wm, idle)
            event_time = True
        return Barrier(
            ckpt,
            f"{self._name}/{g}",
            self._key_groups,
            wm,
            event_time=event_time,
            idle=idle,
            savepoint=None if savepoint is None else savepoint["savepoint"],
            stop=savepoint is not None and bool(savepoint.get("stop")),
            apps=() if savepoint is None else tuple(savepoint.get("apps") or ()),
        )

    def write_barriers(
        self, g: int, kg: KeyGroup, ckpt: int, savepoint: dict[str, Any] | None
    ) -> None:
        """Produce barrier ``ckpt`` of key group ``g`` to each internal output partition.

        In the open transaction, after every output of the epoch it ends.
        """
        if not self._out.internal_outputs:
            return
        value, headers = self._barrier(g, kg, ckpt, savepoint).encode()
        for topic in self._out.internal_outputs:
            for p in range(self._internal_partitions[topic]):
                self._out.produce(topic, value, None, partition=p, headers=headers)

    def reannounce(self, g: int, kg: KeyGroup, done: int) -> None:
        """Forward the watermark of a downstream key group again if it moved.

        A downstream key group whose watermark (or idleness) changed since its last
        barrier writes that barrier (``done``, its last completed checkpoint) once
        more, with the new watermark. Downstream aligners ignore a barrier they have
        seen (same checkpoint id); the watermark applies at once there, as nothing of
        this writer is held back past a checkpoint that completed. Without it a middle
        stage would keep the final watermark of a stream that went quiet to itself.
        """
        svc = self._app.time_service
        if svc is None or not svc.strategies or not self._out.internal_outputs or not done:
            return
        now = svc.announce(kg.caches[TIME_STORE])
        if now != self._announced.get(g):
            self.write_barriers(g, kg, done, None)

    def write_checkpoint(self, g: int, record: dict[str, Any]) -> None:
        """Produce key group ``g``'s checkpoint record (the fields the epoch decided)."""
        record = {"app": self._name, "key_group": g, **record, "instance": self._instance_id}
        self._out.produce(self._control_topic, orjson.dumps(record), checkpoint_key(g), partition=g)
