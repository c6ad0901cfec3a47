"""Is this pod going away for good? One read of its StatefulSet from the Kubernetes API.

A static group member (``group.instance.id``) keeps its partitions through a restart:
the group waits ``session.timeout.ms`` for it to come back. That is right for a rolling
update, an eviction or a crash, and wrong for a scale-down, where the departed pod's key
groups would sit idle for the whole session timeout. Kubernetes does not tell a pod why
it is stopped, but a scale-down lowers the StatefulSet's ``spec.replicas`` *before* it
deletes the pods at ordinals ``>= replicas`` — so at SIGTERM, a pod whose ordinal is not
below the desired replica count (or whose StatefulSet is being deleted) is not coming
back, and leaves the group explicitly.

The read uses the pod's service-account token (the chart mounts a projected token and
grants ``get`` on its own StatefulSet only). No client library: one HTTPS GET with the
cluster CA, bounded by a timeout. Any failure answers "stay" (the pre-existing
behaviour: the group waits the session timeout), with the reason.
"""

from __future__ import annotations

import json
import os
import re
import ssl
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

__all__ = ["SERVICE_ACCOUNT_DIR", "Verdict", "scaled_down"]

#: Where Kubernetes (or the chart's projected volume) puts the token, CA and namespace.
SERVICE_ACCOUNT_DIR = Path("/var/run/secrets/kubernetes.io/serviceaccount")
_ORDINAL = re.compile(r"^(?P<set>[a-z0-9]([-a-z0-9.]*[a-z0-9])?)-(?P<ordinal>\d+)$")


@dataclass(frozen=True)
class Verdict:
    """Whether the pod leaves for good, and why (logged either way)."""

    leave: bool
    reason: str


def _api_base() -> str | None:
    host = os.environ.get("KUBERNETES_SERVICE_HOST")
    if not host:
        return None
    port = os.environ.get("KUBERNETES_SERVICE_PORT", "443")
    if ":" in host:  # IPv6
        host = f"[{host}]"
    return f"https://{host}:{port}"


def scaled_down(
    pod: str,
    *,
    sa_dir: Path = SERVICE_ACCOUNT_DIR,
    api: str | None = None,
    timeout_s: float = 3.0,
) -> Verdict:
    """Ask the API server whether the StatefulSet pod ``pod`` is being scaled away.

    Args:
        pod: the pod name (``<statefulset>-<ordinal>``; the chart's instance id).
        sa_dir: directory holding ``token``, ``ca.crt`` and ``namespace``.
        api: API server base URL; default from ``KUBERNETES_SERVICE_HOST``/``_PORT``.
        timeout_s: bound of the whole request.

    Returns:
        ``leave=True`` when the StatefulSet's ``spec.replicas`` is at most the pod's
        ordinal or the StatefulSet is being deleted; ``leave=False`` otherwise and on
        every failure (not in Kubernetes, not a StatefulSet pod name, no token, refused,
        unreachable, unexpected answer). Never raises.
    """
    base = api or _api_base()
    if base is None:
        return Verdict(False, "not running in Kubernetes (no KUBERNETES_SERVICE_HOST)")
    m = _ORDINAL.match(pod)
    if m is None:
        return Verdict(False, f"instance id {pod!r} is not a StatefulSet pod name")
    name, ordinal = m["set"], int(m["ordinal"])
    try:
        token = (sa_dir / "token").read_text().strip()
        namespace = (sa_dir / "namespace").read_text().strip()
        context = ssl.create_default_context(cafile=str(sa_dir / "ca.crt"))
    except (OSError, ssl.SSLError) as exc:
        return Verdict(False, f"no service-account credentials in {sa_dir}: {exc}")
    url = f"{base}/apis/apps/v1/namespaces/{namespace}/statefulsets/{name}"
    request = urllib.request.Request(  # noqa: S310 - https URL built above
        url, headers={"Authorization": f"Bearer {token}", "Accept": "application/json"}
    )
    opener = urllib.request.build_opener(
        urllib.request.ProxyHandler({}), urllib.request.HTTPSHandler(context=context)
    )
    try:
        with opener.open(request, timeout=timeout_s) as resp:
            body = json.loads(resp.read(1 << 20))
    except urllib.error.HTTPError as exc:
        hint = " (the pod needs get on its StatefulSet)" if exc.code in (401, 403) else ""
        return Verdict(False, f"GET {url}: HTTP {exc.code}{hint}")
    except (OSError, ValueError) as exc:
        return Verdict(False, f"GET {url}: {exc}")
    if not isinstance(body, dict):
        return Verdict(False, f"GET {url}: not a StatefulSet")
    if (body.get("metadata") or {}).get("deletionTimestamp"):
        return Verdict(True, f"StatefulSet {name} is being deleted")
    replicas = (body.get("spec") or {}).get("replicas", 1)
    if not isinstance(replicas, int):
        return Verdict(False, f"GET {url}: spec.replicas is {replicas!r}")
    if ordinal >= replicas:
        return Verdict(True, f"StatefulSet {name} scaled to {replicas}: ordinal {ordinal} goes")
    return Verdict(False, f"StatefulSet {name} keeps {replicas} replicas (ordinal {ordinal})")
