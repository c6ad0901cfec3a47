"""Principals, ACLs and client settings for the SASL_SSL broker of the security tier.

:func:`app_acls` is the ACL set docs/security.md documents for one app: the tests grant
exactly it (or it minus one entry) and run the app as that principal.
"""

from __future__ import annotations

import os
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from confluent_kafka.admin import (  # type: ignore[attr-defined]
    AclBinding,
    AclBindingFilter,
    AclOperation,
    AclPermissionType,
    AdminClient,
    ResourcePatternType,
    ResourceType,
    ScramCredentialInfo,
    ScramMechanism,
    UserScramCredentialUpsertion,
)

from tests.support.procs import LOCKGATE, ROOT

REGISTRY_TOPIC = "lockgate.registry"


def lockgate_cli(
    env: dict[str, str], *args: str, stdin: str = "", timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    """Run ``lockgate ARGS`` with ``env`` over this process's environment."""
    return subprocess.run(
        [str(LOCKGATE), *args],
        cwd=ROOT,
        env={**os.environ, "LOCKGATE_LOG_FORMAT": "console", **env},
        input=stdin,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


@dataclass(frozen=True)
class Acl:
    """One ALLOW ACL: ``operation`` on a resource (literal name or name prefix)."""

    resource: ResourceType
    name: str
    pattern: ResourcePatternType
    operation: AclOperation
    why: str

    def describe(self) -> str:
        """E.g. ``WRITE on TOPIC sums (LITERAL)``."""
        return f"{self.operation.name} on {self.resource.name} {self.name} ({self.pattern.name})"


def app_acls(app: str, inputs: list[str], outputs: list[str]) -> list[Acl]:
    """The ACLs an app named ``app`` needs (docs/security.md, "ACLs of an app").

    Args:
        app: the app name (consumer group; prefix of its topics and transactional ids).
        inputs: its input topics (created beforehand by someone else).
        outputs: its output topics (created beforehand by someone else).

    Returns:
        The set, each with the reason it is needed.
    """
    T, G, X = ResourceType.TOPIC, ResourceType.GROUP, ResourceType.TRANSACTIONAL_ID
    lit, pre = ResourcePatternType.LITERAL, ResourcePatternType.PREFIXED
    op = AclOperation
    # Found by running running_sum with each ACL of a larger set left out (DESCRIBE is
    # implied by READ and WRITE; cluster IdempotentWrite is implied by WRITE on a topic
    # since Kafka 3.0, and a transactional producer needs WRITE on its id instead).
    acls = [
        Acl(G, app, lit, op.READ, "join the app's consumer group, commit offsets"),
        # The changelog reader's group id (librdkafka requires one; never joined or
        # committed): the consumer still looks up its coordinator. Without this each restore
        # logs a GROUP_AUTHORIZATION_FAILED warning and `lockgate backfill` fails.
        Acl(G, f"{app}.restore", lit, op.DESCRIBE, "coordinator lookup of the restorer"),
        Acl(T, f"{app}.", pre, op.CREATE, "create changelogs, <app>.control, <app>.dlq"),
        Acl(T, f"{app}.", pre, op.READ, "restore changelogs, read checkpoints"),
        Acl(T, f"{app}.", pre, op.WRITE, "write changelogs, checkpoints, DLQ records"),
        Acl(T, f"{app}.", pre, op.DESCRIBE_CONFIGS, "check changelog compaction/retention"),
        Acl(X, f"{app}-", pre, op.WRITE, "transactions of <app>-<instance id>"),
        Acl(T, REGISTRY_TOPIC, lit, op.READ, "learn upstream writers at start"),
        Acl(T, REGISTRY_TOPIC, lit, op.WRITE, "register the app at start"),
    ]
    for topic in inputs:
        acls.append(Acl(T, topic, lit, op.READ, "consume the input"))
    for topic in outputs:
        acls += [
            Acl(T, topic, lit, op.WRITE, "produce the output"),
            Acl(T, topic, lit, op.DESCRIBE_CONFIGS, "check the output's cleanup policy"),
        ]
    return acls


def topics_command_acls(inputs: list[str]) -> list[Acl]:
    """What ``lockgate topics --app`` needs beyond :func:`app_acls`.

    It reports every topic's configuration: DESCRIBE_CONFIGS on the inputs and on the
    registry too (``--create`` creates with the app's CREATE on its prefix).
    """
    T, lit, op = ResourceType.TOPIC, ResourcePatternType.LITERAL, AclOperation.DESCRIBE_CONFIGS
    return [Acl(T, t, lit, op, "report the topic's configuration") for t in inputs] + [
        Acl(T, REGISTRY_TOPIC, lit, op, "report the registry's configuration")
    ]


@dataclass
class SecureKafka:
    """The tier's broker: its bootstrap address, the admin's settings, the CA file."""

    bootstrap: str
    admin_conf: dict[str, Any]
    ca: Path

    def admin(self) -> AdminClient:
        """An AdminClient of the super user."""
        return AdminClient({**self.admin_conf, "bootstrap.servers": self.bootstrap})

    def client_conf(self, user: str, password: str) -> dict[str, Any]:
        """librdkafka settings of ``user`` (without bootstrap.servers)."""
        return {
            "security.protocol": "SASL_SSL",
            "sasl.mechanism": "SCRAM-SHA-512",
            "sasl.username": user,
            "sasl.password": password,
            "ssl.ca.location": str(self.ca),
        }

    def app_env(self, user: str, password: str, ca: Path | None = None) -> dict[str, str]:
        """The ``LOCKGATE_*`` variables that make lockgate connect as ``user``."""
        return {
            "LOCKGATE_BOOTSTRAP_SERVERS": self.bootstrap,
            "LOCKGATE_KAFKA__SECURITY_PROTOCOL": "SASL_SSL",
            "LOCKGATE_KAFKA__SASL_MECHANISM": "SCRAM-SHA-512",
            "LOCKGATE_KAFKA__SSL_CA_LOCATION": str(ca or self.ca),
            "LOCKGATE_SASL_USERNAME": user,
            "LOCKGATE_SASL_PASSWORD": password,
        }

    def add_user(self, user: str, password: str) -> None:
        """Create (or update) the SCRAM-SHA-512 credential of ``user``."""
        info = ScramCredentialInfo(ScramMechanism.SCRAM_SHA_512, 4096)
        admin = self.admin()  # referenced until the result: a destroyed client fails it
        futs = admin.alter_user_scram_credentials(
            [UserScramCredentialUpsertion(user, info, password.encode())]
        )
        for fut in futs.values():
            fut.result(30)

    def grant(self, user: str, acls: list[Acl]) -> None:
        """Create ALLOW ACLs for ``User:<user>`` and wait until the broker applies them."""
        bindings = [
            AclBinding(
                a.resource,
                a.name,
                a.pattern,
                f"User:{user}",
                "*",
                a.operation,
                AclPermissionType.ALLOW,
            )
            for a in acls
        ]
        admin = self.admin()
        for fut in admin.create_acls(bindings).values():
            fut.result(30)
        want = len(set(bindings))
        query = AclBindingFilter(
            ResourceType.ANY,
            None,
            ResourcePatternType.ANY,
            f"User:{user}",
            None,
            AclOperation.ANY,
            AclPermissionType.ANY,
        )
        deadline = time.monotonic() + 30
        while len(admin.describe_acls(query).result(30)) < want:
            if time.monotonic() > deadline:
                raise TimeoutError(f"the ACLs of {user} did not appear")
            time.sleep(0.1)


def dlq_acls(app: str, sources: list[str]) -> list[Acl]:
    """What ``lockgate dlq list|replay`` needs beyond :func:`app_acls` (docs/security.md).

    Args:
        app: the app name.
        sources: the topics the dead letters came from (the replay writes them back).
    """
    T, G, X = ResourceType.TOPIC, ResourceType.GROUP, ResourceType.TRANSACTIONAL_ID
    lit, op = ResourcePatternType.LITERAL, AclOperation
    acls = [
        Acl(G, f"{app}.dlq-replay", lit, op.READ, "the replay position: its committed offsets"),
        Acl(X, f"{app}.dlq-replay", lit, op.WRITE, "the replay's transactions"),
    ]
    return acls + [Acl(T, t, lit, op.WRITE, "re-inject into the source topic") for t in sources]


def reset_acls(app: str, stores: list[str]) -> list[Acl]:
    """What ``lockgate reset`` needs beyond :func:`app_acls` (docs/security.md).

    Emptying a changelog adds ``delete`` to its cleanup policy for the deletion.
    """
    T, lit, op = ResourceType.TOPIC, ResourcePatternType.LITERAL, AclOperation
    acls: list[Acl] = []
    for store in stores:
        topic = f"{app}.{store}.changelog"
        acls += [
            Acl(T, topic, lit, op.ALTER_CONFIGS, "add delete to the cleanup policy, restore it"),
            Acl(T, topic, lit, op.DELETE, "delete the changelog's records"),
        ]
    return acls
