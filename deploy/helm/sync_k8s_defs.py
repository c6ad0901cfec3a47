"""Vendor the Kubernetes types the chart's values embed into lockgate/values.schema.json.

Values such as ``securityContext``, ``resources`` or ``affinity`` are passed through to the pod
spec unchanged. To reject typos inside them too, the schema references the strict Kubernetes
definitions (``additionalProperties: false`` at every level) shipped by the PyPI package
``kubernetes-validate``. This script copies the transitive closure of those definitions into
``#/definitions`` (descriptions dropped, ``$ref`` rewritten from ``#/$defs/`` to
``#/definitions/``) and rewrites the file; the hand-written part is kept.

Usage: ``.venv/bin/python deploy/helm/sync_k8s_defs.py [--kube-version 1.37.0]``.
tests/deploy checks that the file is in sync.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

SCHEMA_PATH = Path(__file__).resolve().parent / "lockgate" / "values.schema.json"
VERSION_KEY = "x-lockgate-kubernetes-version"
K8S_PREFIX = "io.k8s."
ROOTS = (
    "io.k8s.api.core.v1.Affinity",
    "io.k8s.api.core.v1.Container",
    "io.k8s.api.core.v1.EnvFromSource",
    "io.k8s.api.core.v1.EnvVar",
    "io.k8s.api.core.v1.LocalObjectReference",
    "io.k8s.api.core.v1.PodSecurityContext",
    "io.k8s.api.core.v1.ResourceRequirements",
    "io.k8s.api.core.v1.SecurityContext",
    "io.k8s.api.core.v1.Toleration",
    "io.k8s.api.core.v1.TopologySpreadConstraint",
    "io.k8s.api.core.v1.Volume",
    "io.k8s.api.core.v1.VolumeMount",
    "io.k8s.api.networking.v1.NetworkPolicyEgressRule",
    "io.k8s.api.networking.v1.NetworkPolicyPeer",
)


#: Definitions replaced after copying: free-form objects no values file has a reason to fill
#: (``managedFields`` entries, reachable through ephemeral volumes' claim templates) are closed,
#: so that every object level of the schema rejects unknown keys.
OVERRIDES: dict[str, Any] = {
    "io.k8s.apimachinery.pkg.apis.meta.v1.FieldsV1": {
        "type": ["object", "null"],
        "properties": {},
        "additionalProperties": False,
    },
}


def _strict_definitions(kube_version: str) -> dict[str, Any]:
    """Return the ``$defs`` of kubernetes-validate's strict schemas for ``kube_version``."""
    import importlib.resources

    root = importlib.resources.files("kubernetes_validate") / "kubernetes-json-schema"
    path = root / f"v{kube_version}-local-strict" / "_definitions.json"
    defs: dict[str, Any] = json.loads(path.read_text())["$defs"]
    return defs


def _rewrite(node: Any, refs: set[str]) -> Any:
    """Return ``node`` without descriptions and with local refs; collect referenced names."""
    if isinstance(node, dict):
        out: dict[str, Any] = {}
        for key, value in node.items():
            if key == "description":
                continue
            if key == "$ref":
                name = value.rsplit("/", 1)[-1]
                refs.add(name)
                out[key] = f"#/definitions/{name}"
            else:
                out[key] = _rewrite(value, refs)
        return out
    if isinstance(node, list):
        return [_rewrite(item, refs) for item in node]
    return node


def k8s_definitions(kube_version: str) -> dict[str, Any]:
    """Return the closure of :data:`ROOTS` in the form stored in values.schema.json."""
    source = _strict_definitions(kube_version)
    result: dict[str, Any] = {}
    pending = list(ROOTS)
    while pending:
        name = pending.pop()
        if name in result:
            continue
        refs: set[str] = set()
        result[name] = OVERRIDES.get(name) or _rewrite(source[name], refs)
        pending.extend(sorted(refs - result.keys()))
    return dict(sorted(result.items()))


def format_json(node: Any, indent: int = 0, width: int = 100) -> str:
    """Return ``node`` as JSON: inline when it fits in ``width`` columns, else one item a line."""
    inline = json.dumps(node, ensure_ascii=False)
    if len(inline) + indent <= width or not isinstance(node, dict | list) or not node:
        return inline
    pad = " " * (indent + 2)
    if isinstance(node, dict):
        items = [
            f"{pad}{json.dumps(k, ensure_ascii=False)}: {format_json(v, indent + 2, width)}"
            for k, v in node.items()
        ]
        return "{\n" + ",\n".join(items) + "\n" + " " * indent + "}"
    items = [f"{pad}{format_json(v, indent + 2, width)}" for v in node]
    return "[\n" + ",\n".join(items) + "\n" + " " * indent + "]"


def synced_schema(schema: dict[str, Any], kube_version: str) -> dict[str, Any]:
    """Return ``schema`` with its Kubernetes definitions replaced by those of ``kube_version``."""
    own = {k: v for k, v in schema.get("definitions", {}).items() if not k.startswith(K8S_PREFIX)}
    out = {k: v for k, v in schema.items() if k not in ("definitions", VERSION_KEY)}
    out[VERSION_KEY] = kube_version
    out["definitions"] = {**own, **k8s_definitions(kube_version)}
    return out


def main() -> None:
    """Rewrite values.schema.json with the Kubernetes definitions of the chosen version."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    current = json.loads(SCHEMA_PATH.read_text())
    parser.add_argument(
        "--kube-version",
        default=current.get(VERSION_KEY, "1.37.0"),
        help="Kubernetes version of the definitions (default: the one recorded in the schema)",
    )
    args = parser.parse_args()
    SCHEMA_PATH.write_text(format_json(synced_schema(current, args.kube_version)) + "\n")
    print(f"wrote {SCHEMA_PATH} with Kubernetes {args.kube_version} definitions")


if __name__ == "__main__":
    main()
