"""Render the lockgate Helm chart from tests, and read the processor container out of it.

Tests use the chart's own output as the single source of a processor's environment: container
tests start the image with exactly the env and args of the rendered StatefulSet, so what runs in
a test is what Kubernetes would run.

    from tests.support.helm import render, statefulset_container_spec, container_env

    docs = render(
        {
            "app": "examples.running_sum:app",
            "appName": "sums",
            "kafka": {"bootstrapServers": "k:9092"},
        }
    )
    spec = statefulset_container_spec(docs)
    env = container_env(spec, pod_name="sums-lockgate-0")   # dict[str, str] for the container
    args = spec["args"]                                      # ["run", "examples.running_sum:app"]

Files the pod mounts from Secrets (the SASL password file, TLS certificates) are resolved by
:func:`secret_files` (container path -> content), for a test to lay them out on disk.

The helm binary comes from ``deploy/helm/ensure-helm.sh`` (built with Go on first use, cached in
``~/.cache/lockgate/tools``; several minutes the first time, instant afterwards).
"""

from __future__ import annotations

import copy
import functools
import json
import os
import subprocess
import tempfile
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import yaml

__all__ = [
    "BUILD_TIMEOUT_S",
    "CHART_DIR",
    "ENSURE_HELM",
    "KUBE_VERSION",
    "PROCESSOR_CONTAINER",
    "HelmError",
    "container_env",
    "ensure_helm",
    "find_helm",
    "lint",
    "manifests",
    "one_manifest",
    "render",
    "secret_files",
    "statefulset_container_spec",
]

REPO_ROOT = Path(__file__).resolve().parents[2]
CHART_DIR = REPO_ROOT / "deploy" / "helm" / "lockgate"
ENSURE_HELM = REPO_ROOT / "deploy" / "helm" / "ensure-helm.sh"
#: Kubernetes version given to ``helm template``/``helm lint`` (.Capabilities.KubeVersion).
KUBE_VERSION = "1.37.0"
#: Name of the processor container in the StatefulSet's pod template.
PROCESSOR_CONTAINER = "processor"
#: Wall-clock limit of the first helm build (the ensure-helm script), seconds.
BUILD_TIMEOUT_S = 1800
_HELM_TIMEOUT_S = 120

Manifest = dict[str, Any]


class HelmError(RuntimeError):
    """A helm command failed; the message carries the command and helm's stderr."""

    def __init__(self, args: list[str], returncode: int, stderr: str) -> None:
        self.args_list = args
        self.returncode = returncode
        self.stderr = stderr
        super().__init__(f"{' '.join(args)} exited with {returncode}:\n{stderr.strip()}")


def find_helm() -> Path | None:
    """Return the pinned helm if it is already there (cache or PATH), else ``None``.

    Never builds: cheap enough to call at collection time.
    """
    proc = subprocess.run(
        [str(ENSURE_HELM), "--no-build"],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        timeout=_HELM_TIMEOUT_S,
        check=False,
    )
    return Path(proc.stdout.strip()) if proc.returncode == 0 and proc.stdout.strip() else None


@functools.cache
def ensure_helm() -> Path:
    """Return the path of the pinned helm binary, building it on first use.

    Runs ``deploy/helm/ensure-helm.sh`` once per process; its progress and errors go to this
    process's stderr as they happen. The first run on a machine builds helm with ``go install``
    and can take several minutes.

    Raises:
        HelmError: the script failed (no Go toolchain, module proxy unreachable, ...).
    """
    args = [str(ENSURE_HELM)]
    proc = subprocess.run(
        args, stdout=subprocess.PIPE, text=True, timeout=BUILD_TIMEOUT_S, check=False
    )
    if proc.returncode != 0:
        raise HelmError(args, proc.returncode, "see the ensure-helm messages on stderr")
    path = Path(proc.stdout.strip().splitlines()[-1])
    if not path.is_file():
        raise HelmError(args, proc.returncode, f"printed {path}, which is not a file")
    return path


def _run_helm(args: list[str]) -> str:
    cmd = [str(ensure_helm()), *args]
    # A user's HELM_* settings (plugins, repositories, kube context) must not leak into tests.
    env = {k: v for k, v in os.environ.items() if not k.startswith("HELM_")}
    proc = subprocess.run(
        cmd,
        capture_output=True,
        text=True,
        timeout=_HELM_TIMEOUT_S,
        check=False,
        env=env,
    )
    if proc.returncode != 0:
        raise HelmError(cmd, proc.returncode, proc.stderr or proc.stdout)
    return proc.stdout


def _values_args(
    values: Mapping[str, Any] | None,
    values_files: Iterable[Path] | None,
    set_values: Mapping[str, Any] | None,
    tmpdir: Path,
) -> list[str]:
    """Return helm's values flags, lowest precedence first: files, ``values``, ``set_values``."""
    args: list[str] = []
    for path in values_files or ():
        args += ["--values", str(path)]
    if values is not None:
        inline = tmpdir / "values.yaml"
        inline.write_text(yaml.safe_dump(dict(values), sort_keys=False))
        args += ["--values", str(inline)]
    for key, value in (set_values or {}).items():
        # --set-json keeps types exact ("true" stays a string, 1000000 an integer).
        args += ["--set-json", f"{key}={json.dumps(value)}"]
    return args


def render(
    values: dict[str, Any] | None = None,
    values_files: list[Path] | None = None,
    set_values: dict[str, Any] | None = None,
    *,
    release: str = "sums",
    namespace: str = "default",
    chart: Path = CHART_DIR,
) -> list[Manifest]:
    """Render the chart with ``helm template`` and return its manifests, in helm's order.

    Args:
        values: values merged over ``values_files`` (as one more values file).
        values_files: values files, applied in order.
        set_values: ``--set-json`` overrides, highest precedence; keys are helm paths, with
            dots inside a key escaped (``{"kafka.config.session\\.timeout\\.ms": 45000}``).
        release: release name (resource names are ``<release>-lockgate``).
        namespace: release namespace.
        chart: chart directory (a modified copy, for tests of the chart itself).

    Returns:
        The parsed documents (empty documents dropped).

    Raises:
        HelmError: helm failed (schema violation, a ``required``/``fail`` in a template, ...);
            the message holds helm's stderr.
    """
    with tempfile.TemporaryDirectory(prefix="lockgate-helm-") as tmp:
        args = [
            "template",
            release,
            str(chart),
            "--namespace",
            namespace,
            "--kube-version",
            KUBE_VERSION,
            *_values_args(values, values_files, set_values, Path(tmp)),
        ]
        out = _run_helm(args)
    return [doc for doc in yaml.safe_load_all(out) if doc]


def lint(
    values: dict[str, Any] | None = None,
    values_files: list[Path] | None = None,
    set_values: dict[str, Any] | None = None,
    *,
    strict: bool = True,
) -> str:
    """Run ``helm lint`` (``--strict`` by default: warnings fail) and return its output.

    Raises:
        HelmError: lint found errors (or warnings, with ``strict``).
    """
    with tempfile.TemporaryDirectory(prefix="lockgate-helm-") as tmp:
        args = ["lint", str(CHART_DIR), "--kube-version", KUBE_VERSION]
        if strict:
            args.append("--strict")
        args += _values_args(values, values_files, set_values, Path(tmp))
        return _run_helm(args)


def manifests(docs: Iterable[Manifest], kind: str) -> list[Manifest]:
    """Return the manifests of ``kind`` (e.g. ``"StatefulSet"``) among ``docs``."""
    return [doc for doc in docs if doc.get("kind") == kind]


def one_manifest(docs: Iterable[Manifest], kind: str) -> Manifest:
    """Return the single manifest of ``kind``.

    Raises:
        LookupError: there is none, or more than one.
    """
    found = manifests(docs, kind)
    if len(found) != 1:
        raise LookupError(f"expected one {kind}, found {len(found)}")
    return found[0]


def statefulset_container_spec(docs: Iterable[Manifest]) -> dict[str, Any]:
    """Return a copy of the processor container of the rendered StatefulSet.

    The result is the Kubernetes container object (``image``, ``args``, ``env``, ``ports``,
    ``volumeMounts``, ...) with ``command``, ``args``, ``env`` and ``envFrom`` always present:
    ``command`` is ``None`` when the image's entrypoint (``lockgate``) is used, ``args`` the
    argument list after it, and ``env`` the list of EnvVar dicts in order (see
    :func:`container_env` to turn it into plain strings).

    Raises:
        LookupError: no single StatefulSet, or no container named ``processor``.
    """
    sts = one_manifest(docs, "StatefulSet")
    containers = sts["spec"]["template"]["spec"]["containers"]
    for container in containers:
        if container.get("name") == PROCESSOR_CONTAINER:
            spec = copy.deepcopy(container)
            spec.setdefault("command", None)
            spec.setdefault("args", [])
            spec.setdefault("env", [])
            spec.setdefault("envFrom", [])
            return spec
    names = [c.get("name") for c in containers]
    raise LookupError(f"no container named {PROCESSOR_CONTAINER!r} in the StatefulSet: {names}")


def container_env(
    container: Mapping[str, Any],
    *,
    pod_name: str,
    namespace: str = "default",
    secrets: Mapping[str, Mapping[str, str]] | None = None,
    config_maps: Mapping[str, Mapping[str, str]] | None = None,
) -> dict[str, str]:
    """Resolve a container's ``envFrom`` and ``env`` into plain strings, as the kubelet would.

    ``envFrom`` sources come first and ``env`` entries override them. ``fieldRef`` resolves
    ``metadata.name`` to ``pod_name`` and ``metadata.namespace`` to ``namespace``;
    ``secretKeyRef``/``configMapKeyRef`` are looked up in ``secrets``/``config_maps``
    (``{object name: {key: value}}``). ``$(VAR)`` references are not expanded (the chart
    renders none).

    Raises:
        KeyError: a referenced Secret/ConfigMap key is missing and not ``optional``.
        ValueError: a ``valueFrom`` kind this helper does not resolve.
    """
    secrets = secrets or {}
    config_maps = config_maps or {}
    fields = {"metadata.name": pod_name, "metadata.namespace": namespace}
    out: dict[str, str] = {}

    for source in container.get("envFrom") or ():
        prefix = source.get("prefix", "")
        if "configMapRef" in source:
            ref, store = source["configMapRef"], config_maps
        else:
            ref, store = source["secretRef"], secrets
        if ref["name"] not in store:
            if ref.get("optional"):
                continue
            raise KeyError(f"envFrom references {ref['name']!r}, which was not given")
        for key, value in store[ref["name"]].items():
            out[prefix + key] = value

    for var in container.get("env") or ():
        name = var["name"]
        if "valueFrom" not in var:
            out[name] = str(var.get("value", ""))
            continue
        source = var["valueFrom"]
        if "fieldRef" in source:
            out[name] = fields[source["fieldRef"]["fieldPath"]]
        elif "secretKeyRef" in source or "configMapKeyRef" in source:
            is_secret = "secretKeyRef" in source
            ref = source["secretKeyRef" if is_secret else "configMapKeyRef"]
            store = secrets if is_secret else config_maps
            value = store.get(ref["name"], {}).get(ref["key"])
            if value is None:
                if ref.get("optional"):
                    continue
                kind = "Secret" if is_secret else "ConfigMap"
                raise KeyError(f"{name}: {kind} {ref['name']!r} key {ref['key']!r} not given")
            out[name] = value
        elif "resourceFieldRef" in source:
            # The kubelet writes the container's own limit, in bytes (divisor 1).
            resource = source["resourceFieldRef"]["resource"]
            kind, _, what = resource.partition(".")
            quantity = (container.get("resources") or {}).get(kind, {}).get(what)
            if quantity is None:
                raise ValueError(f"{name}: {resource} is not set (the node's would be used)")
            out[name] = str(quantity_bytes(str(quantity)))
        else:
            raise ValueError(f"{name}: cannot resolve valueFrom {sorted(source)}")
    return out


_QUANTITY_SUFFIXES = {
    "Ki": 1024,
    "Mi": 1024**2,
    "Gi": 1024**3,
    "Ti": 1024**4,
    "k": 1000,
    "M": 1000**2,
    "G": 1000**3,
    "T": 1000**4,
}


def quantity_bytes(quantity: str) -> int:
    """A Kubernetes memory quantity (``512Mi``, ``1G``, ``1073741824``) in bytes."""
    for suffix in sorted(_QUANTITY_SUFFIXES, key=len, reverse=True):
        if quantity.endswith(suffix):
            return int(float(quantity[: -len(suffix)]) * _QUANTITY_SUFFIXES[suffix])
    return int(quantity)


def secret_files(
    docs: Iterable[Manifest],
    *,
    secrets: Mapping[str, Mapping[str, str]],
) -> dict[str, str]:
    """Return the files the processor container sees from Secret volumes, as the kubelet would.

    Covers ``secret`` and ``projected`` (``sources[].secret``) pod volumes mounted by the
    processor container: each file's container path (the mount path joined with the item's
    ``path``, or the key when the volume lists no items) maps to its content, looked up in
    ``secrets`` (``{Secret name: {key: value}}``). Other volume kinds are ignored. A test
    writes the files under a temporary root and points the path variables there.

    Raises:
        KeyError: a mounted Secret, or a listed key of one, is missing and not ``optional``.
    """
    sts = one_manifest(docs, "StatefulSet")
    pod = sts["spec"]["template"]["spec"]
    container = statefulset_container_spec([sts])
    volumes = {v["name"]: v for v in pod.get("volumes") or ()}
    out: dict[str, str] = {}
    for mount in container.get("volumeMounts") or ():
        volume = volumes.get(mount["name"])
        if volume is None:
            continue  # a claim of volumeClaimTemplates
        if "secret" in volume:
            sources = [{**volume["secret"], "name": volume["secret"]["secretName"]}]
        elif "projected" in volume:
            sources = [s["secret"] for s in volume["projected"]["sources"] if "secret" in s]
        else:
            continue
        base = mount["mountPath"].rstrip("/")
        for source in sources:
            data = secrets.get(source["name"])
            if data is None:
                if source.get("optional"):
                    continue
                name = source["name"]
                raise KeyError(f"volume {mount['name']!r} mounts Secret {name!r}, not given")
            items = source.get("items") or [{"key": k, "path": k} for k in data]
            for item in items:
                if item["key"] not in data:
                    if source.get("optional"):
                        continue
                    raise KeyError(f"Secret {source['name']!r} has no key {item['key']!r}")
                out[f"{base}/{item['path']}"] = data[item["key"]]
    return out
