"""Answering ``/state`` queries on the loop thread: read locally or say who owns the key.

:class:`QueryRouter` is the loop's side of queryable state (the HTTP side and the
threading contract are in :mod:`processors._runtime.query`). Between two batches the loop
calls :meth:`QueryRouter.serve`: queued queries are answered from the committed state of
an owned key group, or routed to the owner that the group's last description names
(learned from a group-probe child, never in-process: processors/_kafka/group_probe.py).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from typing import Any

from processors._config.settings import Settings
from processors._dsl.partitioner import key_group
from processors._kafka.clients import admin_config
from processors._kafka.group_probe import GroupProbe
from processors._runtime.query import Answer, QueryService, StateQuery, valid_owner
from processors._task.keygroups import KeyGroup
from state.base.store import checkpoint_of
from state.cache import DELETED
from state.primitives import live_value

log = logging.getLogger("lockgate.runtime")

#: How long a group description answers /state routing before it is asked again.
OWNERS_FRESH_S = 10.0


class QueryRouter:
    """Answers the queries a :class:`QueryService` queued (the loop thread only).

    Args:
        service: the hand-off from the HTTP thread.
        group: the consumer group (the app's name).
        topic: the subscribed input: partition ``g`` of it is key group ``g``.
        settings: instance id, static membership and the peer URL template.
        handles: the app's state stores by name (their spec and codec).
        kgs: the owned key groups (the runner's live mapping, read only).
        partitions: the key-group count (0 until start-up learned it).
    """

    def __init__(
        self,
        service: QueryService,
        group: str,
        topic: str,
        settings: Settings,
        handles: Mapping[str, Any],
        kgs: Mapping[int, KeyGroup],
        partitions: Callable[[], int],
    ) -> None:
        self.service = service
        self._group = group
        self._topic = topic
        self._settings = settings
        self._handles = handles
        self._kgs = kgs
        self._partitions = partitions
        self._probe: GroupProbe | None = None
        #: Who owns which key group, as the group's last description said, and when.
        self._owners: dict[int, str] = {}
        self._owners_at = 0.0
        self._looked_up = False
        #: The owner map is kept warm: described again at this time.
        self._owners_next = 0.0

    def close(self) -> None:
        """Stop the probe child (idempotent)."""
        if self._probe is not None:
            self._probe.close()

    def serve(self) -> None:
        """Answer what is queued and refresh the owner map when due (never blocks long)."""
        service = self.service
        if service.pending:
            service.serve(self.answer)
        if service.owners_wanted or service.deferred or time.monotonic() >= self._owners_next:
            self._refresh_owners()

    def answer(self, q: StateQuery) -> Answer | None:
        """Answer a ``/state`` query from the committed state.

        The key group's database holds committed state only (an epoch's changes are
        applied after its transaction committed), so it is read directly, never the
        epoch cache.

        Returns:
            The answer, or ``None`` while the owner is being looked up (the query waits).
        """
        handle = self._handles.get(q.store)
        if handle is None:
            return Answer(
                404, {"status": "unknown store", "store": q.store, "stores": sorted(self._handles)}
            )
        partitions = self._partitions()
        if not partitions:
            return Answer(503, {"status": "starting"})
        g = key_group(q.key, partitions)
        where_ = {"store": q.store, "key": q.key_text, "key_group": g}
        kg = self._kgs.get(g)
        if kg is None:
            return self._route(q, g, where_)
        raw = kg.db.get(q.store, q.key)
        if raw is None:
            return Answer(404, {"status": "no value", **where_})
        value = live_value(handle.spec, handle.spec.codec.decode(raw), int(time.time() * 1000))
        if value is DELETED:  # expired (TTL): what the handle would read
            return Answer(404, {"status": "no value (expired)", **where_})
        return Answer(
            200,
            {
                "status": "ok",
                **where_,
                "value": value,
                "checkpoint": checkpoint_of(kg.db),
                "instance": self._settings.instance_id,
            },
        )

    def _route(self, q: StateQuery, g: int, where_: dict[str, Any]) -> Answer | None:
        """Forward to the owner of key group ``g`` when known and reachable, else say why.

        A stale map (older than ``OWNERS_FRESH_S``) is used while a new description is
        asked for; an unknown owner (or this instance, which does not hold ``g`` now)
        defers the query until the description arrived.
        """
        owner = self._owners.get(g)
        if time.monotonic() - self._owners_at >= OWNERS_FRESH_S:
            self.service.owners_wanted = True
        if owner is None or owner == self._settings.instance_id:
            if self._looked_up:  # asked again after the lookup: nobody owns it now
                return Answer(503, {"status": "owner unknown (rebalancing?); retry", **where_})
            self.service.owners_wanted = True
            return None
        template = self._settings.query_peer_url
        if (
            q.forwarded
            or template is None
            or not self._settings.static_membership
            or not valid_owner(owner)
        ):
            return Answer(
                421, {"status": "not the owner of this key group", "owner": owner, **where_}
            )
        return Answer(200, where_, forward_to=template.replace("{instance}", owner))

    def _refresh_owners(self) -> None:
        """Learn who owns which key group from the group's description (never blocks).

        Asked every ``OWNERS_FRESH_S / 2`` seconds (so a query rarely waits for it), and
        at once when a query finds no owner; deferred queries are answered once it came.
        """
        if self._probe is None:
            self._probe = GroupProbe(admin_config(self._settings))
        if not self._probe.request(self._group):
            return
        answer = self._probe.result()
        if answer is None:
            return
        self.service.owners_wanted = False
        self._owners_next = time.monotonic() + OWNERS_FRESH_S / 2
        if isinstance(answer, str):
            log.debug("describing the group for a state query failed: %s", answer)
        else:
            _, members = answer
            self._owners = {
                p: m for m, parts in members.items() for t, p in parts if t == self._topic
            }
            self._owners_at = time.monotonic()
        self._looked_up = True  # deferred queries: no second lookup
        try:
            self.service.retry_deferred(self.answer)
        finally:
            self._looked_up = False
