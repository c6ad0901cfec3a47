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
import threading
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from processors._config.settings import SERVICE_ACCOUNT_DIR

__all__ = ["SERVICE_ACCOUNT_DIR", "Verdict", "scaled_down"]

#: Where Kubernetes (or the chart's projected volume) puts the token, CA and namespace.
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
        ``leave=True`` when the pod's ordinal is at or above ``spec.ordinals.start +
        spec.replicas``, or the StatefulSet is being deleted or no longer exists (404:
        the chart's Role names this StatefulSet only); ``leave=False`` otherwise and on
        every failure (not in Kubernetes, not a StatefulSet pod name, no token, refused,
        unreachable, no answer within ``timeout_s`` in all, unexpected answer). Never
        raises.
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
    answer: list[Verdict | dict[str, object]] = []

    def fetch() -> None:
        try:
            with opener.open(request, timeout=timeout_s) as resp:
                body = json.loads(resp.read(1 << 20))
        except urllib.error.HTTPError as exc:
            if exc.code == 404:
                # The Role names this StatefulSet only: "not found" means it is gone
                # (e.g. helm uninstall deletes it before its pods stop).
                answer.append(Verdict(True, f"StatefulSet {name} no longer exists"))
            else:
                hint = " (the pod needs get on its StatefulSet)" if exc.code in (401, 403) else ""
                answer.append(Verdict(False, f"GET {url}: HTTP {exc.code}{hint}"))
        except Exception as exc:  # noqa: BLE001 - any failure keeps the membership
            answer.append(Verdict(False, f"GET {url}: {type(exc).__name__}: {exc}"))
        else:
            answer.append(
                body if isinstance(body, dict) else Verdict(False, f"GET {url}: not an object")
            )

    # One bound for the whole request (urllib's timeout is per socket operation).
    worker = threading.Thread(target=fetch, name="lockgate-k8s-read", daemon=True)
    worker.start()
    worker.join(timeout_s)
    if not answer:
        return Verdict(False, f"GET {url}: no answer within {timeout_s:g}s")
    got = answer[0]
    if isinstance(got, Verdict):
        return got
    return _judge(got, name, ordinal, url)


def _judge(body: dict[str, object], name: str, ordinal: int, url: str) -> Verdict:
    meta = body.get("metadata")
    if isinstance(meta, dict) and meta.get("deletionTimestamp"):
        return Verdict(True, f"StatefulSet {name} is being deleted")
    spec = body.get("spec")
    spec = spec if isinstance(spec, dict) else {}
    replicas = spec.get("replicas", 1)
    ordinals = spec.get("ordinals")
    start = ordinals.get("start", 0) if isinstance(ordinals, dict) else 0
    if not isinstance(replicas, int) or not isinstance(start, int):
        return Verdict(False, f"GET {url}: spec.replicas {replicas!r}, ordinals.start {start!r}")
    if ordinal >= start + replicas:
        return Verdict(True, f"StatefulSet {name} scaled to {replicas}: ordinal {ordinal} goes")
    return Verdict(False, f"StatefulSet {name} keeps {replicas} replicas (ordinal {ordinal})")
