"""Start-up permission checks against an authorizing broker (ACLs).

A principal that lacks an ACL the app needs is refused at start with an
:class:`~processors.exceptions.AuthorizationError` naming the operation and the resource
(exit 2, like other configuration errors), instead of a retry loop or a stack trace
later. The checks ask the broker which operations the principal may perform (KIP-430
``include_authorized_operations``) on each topic and on the consumer group; a resource
the principal may not even describe answers ``*_AUTHORIZATION_FAILED``, and since READ,
WRITE and DESCRIBE_CONFIGS checks only run on resources it may describe, the message
always names an operation the app really uses. Transactional ids have no describe call:
their refusal (``TRANSACTIONAL_ID_AUTHORIZATION_FAILED`` from ``init_transactions``) is
translated where it happens, with :func:`authorization_error`.

docs/security.md lists the ACL set these checks expect.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping

from confluent_kafka import KafkaError, KafkaException, TopicCollection
from confluent_kafka.admin import AdminClient

from processors._kafka.errors import RETRIABLE_CODES
from processors.exceptions import AuthorizationError

__all__ = [
    "AUTHORIZATION_CODES",
    "authorization_error",
    "check_group",
    "check_topics",
    "is_authorization_failure",
]

#: Authorization error codes and the resource type they are about.
AUTHORIZATION_CODES: dict[int, str] = {
    KafkaError.TOPIC_AUTHORIZATION_FAILED: "TOPIC",
    KafkaError.GROUP_AUTHORIZATION_FAILED: "GROUP",
    KafkaError.TRANSACTIONAL_ID_AUTHORIZATION_FAILED: "TRANSACTIONAL_ID",
    KafkaError.CLUSTER_AUTHORIZATION_FAILED: "CLUSTER",
}


def is_authorization_failure(err: KafkaError) -> bool:
    """Whether ``err`` is one of :data:`AUTHORIZATION_CODES`."""
    return err.code() in AUTHORIZATION_CODES


def _who(principal: str | None) -> str:
    return f"User:{principal}" if principal else "this principal"


def authorization_error(
    principal: str | None, operation: str, resource: str, name: str, detail: str = ""
) -> AuthorizationError:
    """Return the error that names a missing ACL.

    Args:
        principal: the SASL user name (``None``: not known, e.g. mTLS).
        operation: the ACL operation, e.g. ``WRITE``.
        resource: the ACL resource type, e.g. ``TOPIC``.
        name: the resource name (a transactional id or a prefix ends in its pattern).
        detail: what the broker answered, appended in brackets (never a secret).

    Returns:
        The error; its message starts with "not authorized:" and says what to grant.
    """
    extra = f" ({detail})" if detail else ""
    return AuthorizationError(
        f"not authorized: {_who(principal)} lacks the {operation} ACL on {resource} {name}"
        f"{extra}; grant it (docs/security.md lists the ACLs an app needs)"
    )


def _error_of(exc: BaseException) -> KafkaError | None:
    if isinstance(exc, KafkaException) and exc.args and isinstance(exc.args[0], KafkaError):
        return exc.args[0]
    return None


def check_topics(
    client: AdminClient,
    principal: str | None,
    needs: Mapping[str, Iterable[str]],
    timeout: float = 30.0,
) -> None:
    """Check that the principal may perform each operation on each topic.

    Args:
        client: an admin client of the principal.
        principal: its SASL user name (for the message), if any.
        needs: topic -> ACL operation names (``READ``, ``WRITE``, ``DESCRIBE_CONFIGS``).
        timeout: seconds for the describe call.

    Raises:
        AuthorizationError: an operation is not allowed (for a topic the principal may
            not describe: every operation it needs there); every missing ACL is named. A
            topic that does not exist (and may be described) is skipped.
        KafkaException: the broker could not be asked (not an authorization problem).
    """
    topics = sorted(needs)
    if not topics:
        return
    futures = client.describe_topics(
        TopicCollection(topics), request_timeout=timeout, include_authorized_operations=True
    )
    missing: list[tuple[str, str, str]] = []
    for topic in topics:
        want = list(dict.fromkeys(needs[topic]))
        try:
            description = futures[topic].result(timeout)
        except KafkaException as exc:
            err = _error_of(exc)
            if err is not None and err.code() == KafkaError.UNKNOWN_TOPIC_OR_PART:
                continue  # describable but missing: not an authorization problem
            if err is None or err.code() != KafkaError.TOPIC_AUTHORIZATION_FAILED:
                raise
            missing += [(op, topic, err.name()) for op in want]
            continue
        allowed = {op.name for op in description.authorized_operations or ()}
        if not allowed:
            continue  # a broker without an authorizer does not answer the operations
        missing += [(op, topic, "") for op in want if op not in allowed]
    _raise_missing(principal, "TOPIC", missing)


#: Seconds of one attempt of :func:`check_group`'s describe.
_ATTEMPT_S = 10.0


def check_group(
    client: AdminClient,
    principal: str | None,
    group: str,
    timeout: float = 30.0,
    operation: str = "READ",
) -> None:
    """Check that the principal may perform ``operation`` on ``group``.

    Args:
        client: an admin client of the principal.
        principal: its SASL user name (for the message), if any.
        group: the consumer group.
        timeout: seconds for the describe call.
        operation: ``READ`` (join, commit offsets) or ``DESCRIBE`` (read committed offsets).

    Raises:
        AuthorizationError: ``operation`` on the group is not allowed.
        KafkaException: the broker could not be asked (not an authorization problem).
    """
    # A coordinator that is still loading (a fresh broker's __consumer_offsets) or moving
    # answers with a retriable error, or not before the request's timeout: ask again until
    # ``timeout`` (seen on the Kubernetes tier: COORDINATOR_LOAD_IN_PROGRESS, and a describe
    # left unanswered for 30 s, ended instances started right after the broker).
    # Each attempt is short: a describe sent while the coordinator was unknown was seen to
    # stay unanswered for minutes after it had become available.
    deadline = time.monotonic() + timeout
    while True:
        attempt = min(_ATTEMPT_S, max(1.0, deadline - time.monotonic()))
        future = client.describe_consumer_groups(
            [group], request_timeout=attempt, include_authorized_operations=True
        )[group]
        try:
            description = future.result(attempt + 5)
            break
        except KafkaException as exc:
            err = _error_of(exc)
            if err is not None and err.code() == KafkaError.GROUP_AUTHORIZATION_FAILED:
                raise authorization_error(
                    principal, operation, "GROUP", group, err.name()
                ) from None
            if err is None or err.code() not in RETRIABLE_CODES or time.monotonic() >= deadline:
                raise
        except TimeoutError:  # the future's own wait (concurrent.futures)
            if time.monotonic() >= deadline:
                raise KafkaException(
                    KafkaError(
                        KafkaError._TIMED_OUT,  # noqa: SLF001 - a public librdkafka code
                        f"describing consumer group {group!r}: no answer within {timeout:.0f} s "
                        "(is its group coordinator available?)",
                    )
                ) from None
        time.sleep(0.5)
    allowed = {op.name for op in description.authorized_operations or ()}
    if allowed and operation not in allowed:
        raise authorization_error(principal, operation, "GROUP", group)


def _raise_missing(
    principal: str | None, resource: str, missing: list[tuple[str, str, str]]
) -> None:
    if not missing:
        return
    if len(missing) == 1:
        op, name, detail = missing[0]
        raise authorization_error(principal, op, resource, name, detail)
    listed = "; ".join(f"{op} on {resource} {name}" for op, name, _ in missing)
    raise AuthorizationError(
        f"not authorized: {_who(principal)} lacks these ACLs: {listed}; grant them "
        "(docs/security.md lists the ACLs an app needs)"
    )
