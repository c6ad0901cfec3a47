"""What an instance learns about its consumer group from outside its own process.

:class:`GroupWatch` owns the group-probe child (processors/_kafka/group_probe.py: a
DescribeConsumerGroups that meets a dropped connection can abort the process that sent it,
librdkafka #4605, so the processing process never sends one) and the two checks built on
its answers:

* at start, :meth:`GroupWatch.check_subscriptions` refuses to join while live members of
  the group consume another topic (they would own the same key groups);
* while running, :meth:`GroupWatch.stranded_heal` finds partitions a *stable* group
  assigns to no member (a static member killed between a cooperative revoke and its
  rejoin) and elects one member to rejoin, which makes the coordinator rebalance.

And a static member's leave at a clean stop (:func:`leave_reason`, :func:`leave_group`).

Neither blocks the loop: the heal asks the child and reads its answer on a later call.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

from processors._config.settings import GroupProtocol, LeaveGroup, Settings
from processors._kafka.authz import authorization_error
from processors._kafka.clients import admin_config
from processors._kafka.group_probe import GroupProbe
from processors._runtime.kubernetes import scaled_down
from processors.exceptions import ConfigError

log = logging.getLogger("lockgate.runtime")

#: How often an instance looks for partitions no member of its (stable) group owns.
STRAND_CHECK_S = 10.0


class GroupWatch:
    """The group checks of one instance (the loop thread only).

    Args:
        group: the consumer group (the app's name).
        topic: the subscribed input: partition ``g`` of it is key group ``g``.
        settings: the instance's settings (its id, the session timeout, the protocol).
        wait: called about every 0.1 s while a start-up check waits; it raises
            :class:`~processors._kafka.errors.Stopping` on a stop request and beats liveness.
    """

    def __init__(
        self, group: str, topic: str, settings: Settings, wait: Callable[[], None]
    ) -> None:
        self._group = group
        self._topic = topic
        self._settings = settings
        self._wait = wait
        self._probe: GroupProbe | None = None
        #: Only a classic-protocol group of static members strands partitions this way.
        self.heals = settings.group_protocol is GroupProtocol.CLASSIC and (
            settings.static_membership
        )
        self._next_strand_check = time.monotonic() + STRAND_CHECK_S
        self._stranded_since: float | None = None

    def _child(self) -> GroupProbe:
        if self._probe is None:
            self._probe = GroupProbe(admin_config(self._settings))
        return self._probe

    def close(self) -> None:
        """Stop the probe child (idempotent)."""
        if self._probe is not None:
            self._probe.close()

    def check_subscriptions(self, principal: str | None = None) -> None:
        """Refuse to join while live members of the group consume another topic.

        Members that subscribe different topics split key groups between them (each
        topic's partitions go to its own subscribers): during a rolling update from a
        version with another subscribed input, an old and a new instance would both own
        key group ``g``. A change of the subscribed input needs every old instance
        stopped first. Members of a version stopped cleanly stay listed until their
        session expires (static members send no leave): they are waited for that long.
        A group that cannot be described is joined anyway (logged).

        The first description also checks that ``principal`` may join the group (READ;
        an in-process DescribeConsumerGroups could abort the process, librdkafka #4605).

        Raises:
            AuthorizationError: the principal may not read (join) the group (exit 2).
            ConfigError: a live member is assigned a topic this version does not subscribe.
            Stopping: a stop was requested while waiting.
        """
        mine = self._topic
        me = self._settings.instance_id
        session_ms = int(self._settings.kafka_config().get("session.timeout.ms", 45_000))
        deadline = time.monotonic() + session_ms / 1000 + 10
        probe = self._child()
        log.info("checking the group's subscriptions", extra={"group": self._group})
        checked = False
        while True:
            answer = probe.describe(self._group, 10.0, self._wait)
            if not checked:
                checked = True
                if probe.denied:
                    raise authorization_error(principal, "READ", "GROUP", self._group, str(answer))
                ops = probe.authorized_operations
                if not isinstance(answer, str) and ops and "READ" not in ops:
                    raise authorization_error(principal, "READ", "GROUP", self._group)
            if isinstance(answer, str):  # best effort: the join goes on
                log.warning(
                    "could not describe the group to check its subscriptions; joining anyway",
                    extra={"reason": answer},
                )
                return
            members = {m: {t for t, _ in parts} for m, parts in answer[1].items()}
            others = {m: sorted(t - {mine}) for m, t in members.items() if t - {mine} and m != me}
            if not others or time.monotonic() > deadline:
                break
            log.warning(
                "members of the group consume another topic than this version subscribes; "
                "waiting for them to leave",
                extra={"members": others, "subscribes": mine},
            )
            until = time.monotonic() + 2.0
            while time.monotonic() < until:
                self._wait()
                time.sleep(0.1)
        if others:
            raise ConfigError(
                f"live members of group {self._group!r} consume {others}, but this version of "
                f"the app subscribes {mine!r} (key group g = partition g of {mine!r}): they "
                "would own the same key groups. The subscribed input (the first stream "
                "declared) changed: stop every instance of the old version before starting "
                "this one (not a rolling update)"
            )

    def heal_due(self, now: float) -> bool:
        """Whether :meth:`stranded_heal` should run now (cheap; per batch)."""
        return self.heals and now >= self._next_strand_check

    def stranded_heal(self, partitions: int) -> bool:
        """Look for partitions of a stable group that no member owns; whether to rejoin.

        Cooperative rebalancing moves a partition in two rounds: its owner revokes it,
        then rejoins so the next round gives it to another member. A static member
        killed between the two rejoins as a *replacement* (same instance id) of a stable
        group, which the coordinator answers with its current assignment and no
        rebalance: the revoked partitions stay with nobody until the membership changes
        (seen in the chaos tests: minutes, with records waiting). When two checks in a row
        see that, the member with the fewest partitions (ties: smallest id) is elected.

        Args:
            partitions: the key-group count (partitions of the subscribed input).

        Returns:
            True when this instance is the elected member: the caller unsubscribes and
            subscribes again, so its join with new metadata makes the coordinator
            rebalance.
        """
        now = time.monotonic()
        probe = self._child()
        if not probe.request(self._group):
            self._next_strand_check = now + STRAND_CHECK_S  # the probe restarts later
            return False
        answer = probe.result()
        if answer is None:
            return False
        self._next_strand_check = now + STRAND_CHECK_S
        if isinstance(answer, str):  # best effort: look again later
            log.debug("describing the group failed: %s", answer)
            return False
        state, members = answer
        owned = {p for parts in members.values() for t, p in parts if t == self._topic}
        stranded = sorted(set(range(partitions)) - owned)
        if state != "STABLE" or not stranded or not members:
            self._stranded_since = None
            return False
        if self._stranded_since is None:
            self._stranded_since = now
            return False
        healer = min(members, key=lambda m: (len(members[m]), m))
        log.warning(
            "partitions of a stable group are assigned to no member (a member was killed "
            "between revoking them and rejoining)",
            extra={"partitions": stranded, "members": sorted(members), "healer": healer},
        )
        self._stranded_since = None
        if healer != self._settings.instance_id:
            return False
        log.warning("rejoining the group to force a rebalance")
        return True


def leave_reason(settings: Settings) -> str | None:
    """Why a static member should leave its group at a clean stop; ``None``: it stays.

    librdkafka never sends LeaveGroup for a static member that closes (KIP-345), so its
    key groups wait ``session.timeout.ms`` for it. It should leave when it goes for good:
    ``LOCKGATE_LEAVE_GROUP_ON_STOP=always``, or ``scale-down`` and Kubernetes says the
    StatefulSet was scaled below this pod. Under ``group.protocol=consumer`` librdkafka
    leaves a static member only temporarily, so it stays (logged).
    """
    if not settings.static_membership or settings.leave_group_on_stop is LeaveGroup.NEVER:
        return None
    try:
        if settings.leave_group_on_stop is LeaveGroup.SCALE_DOWN:
            verdict = scaled_down(settings.instance_id, sa_dir=settings.kubernetes_token_dir)
            if not verdict.leave:
                log.info("keeping the static group membership: %s", verdict.reason)
                return None
            reason = verdict.reason
        else:
            reason = "LOCKGATE_LEAVE_GROUP_ON_STOP=always"
    except Exception as exc:  # noqa: BLE001 - best effort: the session timeout remains
        log.warning("leaving the group failed: %s", exc)
        return None
    if settings.group_protocol is not GroupProtocol.CLASSIC:
        log.info(
            "not leaving the group (%s): under group.protocol=consumer librdkafka "
            "leaves a static member only temporarily (the broker's session timeout "
            "applies)",
            reason,
        )
        return None
    return reason


def leave_group(
    consumer: Any, reason: str, owns: Callable[[], bool], beat: Callable[[], None], batch: int
) -> None:
    """Leave the group now (classic protocol, static member), waiting 10 s at most.

    ``unsubscribe()`` sends the LeaveGroup (after the revoke, which the consumer serves
    here through its callbacks; ``close()`` afterwards no longer suppresses it). Best
    effort: any failure keeps the membership (the session timeout applies).

    Args:
        consumer: the group consumer.
        reason: why (logged).
        owns: whether key groups are still owned (the revoke has not run yet).
        beat: called while waiting (liveness).
        batch: how many records one ``consume`` call may return (they are dropped).
    """
    log.info("leaving the consumer group: %s", reason)
    started = time.monotonic()
    try:
        consumer.unsubscribe()
        deadline = started + 10.0
        while time.monotonic() < deadline and (owns() or consumer.assignment()):
            beat()
            consumer.consume(batch, 0.1)
        for _ in range(3):  # the LeaveGroup goes out right after the unassign
            consumer.poll(0.05)
        left = not (owns() or consumer.assignment())
    except Exception as exc:  # noqa: BLE001 - best effort: the session timeout remains
        log.warning("leaving the group failed: %s", exc)
        return
    took = round(time.monotonic() - started, 3)
    if not left:
        log.warning(
            "leaving the group: the revoke did not complete within 10s (the session "
            "timeout applies to what is left)",
            extra={"seconds": took},
        )
    else:
        log.info("left the consumer group", extra={"seconds": took})
