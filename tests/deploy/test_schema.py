"""values.schema.json rejects typos and bad enums, and values.yaml documents every value."""

from __future__ import annotations

import importlib.util
import json
import re
from pathlib import Path
from types import ModuleType
from typing import Any

import jsonschema
import pytest
import yaml
from kubernetes_validate import utils as kv_utils

from tests.support.helm import CHART_DIR, HelmError, render

VALUES_DIR = Path(__file__).resolve().parent / "values"
MINIMAL = VALUES_DIR / "minimal.yaml"
SCHEMA_PATH = CHART_DIR / "values.schema.json"
SYNC_SCRIPT = CHART_DIR.parent / "sync_k8s_defs.py"


def _schema() -> dict[str, Any]:
    schema: dict[str, Any] = json.loads(SCHEMA_PATH.read_text())
    return schema


def _sync_module() -> ModuleType:
    spec = importlib.util.spec_from_file_location("sync_k8s_defs", SYNC_SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# --- helm applies the schema ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("set_values", "message"),
    [
        ({"replicaCuont": 3}, "additional properties 'replicaCuont' not allowed"),
        ({"kafka.bootstrapServer": "k:9092"}, "additional properties 'bootstrapServer'"),
        ({"probes.readiness.periodSecond": 5}, "additional properties 'periodSecond'"),
        ({"securityContext.runAsUsr": 1}, "additional properties 'runAsUsr' not allowed"),
        ({"resources.limit": {"cpu": "1"}}, "additional properties 'limit' not allowed"),
        ({"autoscaling.keda.maxReplicas": 4}, "additional properties 'maxReplicas'"),
        (
            {"extraContainers": [{"name": "s", "image": "i", "imagePullPolicey": "Always"}]},
            "additional properties 'imagePullPolicey'",
        ),
        ({"extraVolumes": [{"name": "v", "emptyDirr": {}}]}, "additional properties 'emptyDirr'"),
        (
            {
                "topologySpreadConstraints": [
                    {"maxSkew": 1, "topologyKey": "k", "whenUnsatisfiable": "x", "skew": 1}
                ]
            },
            "additional properties 'skew'",
        ),
        (
            {"updateStrategy.rollingUpdate.maxUnavailable": 1},
            "additional properties 'maxUnavailable'",
        ),
        ({"networkPolicy.egress": []}, "additional properties 'egress'"),
        ({"strimzi.kafkaUser.acls": []}, "additional properties 'acls'"),
    ],
    ids=[
        "top-level",
        "kafka",
        "probe",
        "securityContext",
        "resources",
        "keda",
        "sidecar",
        "volume",
        "topology-spread",
        "update-strategy",
        "network-policy",
        "kafka-user",
    ],
)
def test_typo_is_rejected(set_values: dict[str, Any], message: str) -> None:
    with pytest.raises(HelmError, match=re.escape(message)):
        render(values_files=[MINIMAL], set_values=set_values)


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("processing.guarantee", "twice"),
        ("processing.onError", "ignore"),
        ("logging.format", "xml"),
        ("logging.level", "TRACE"),
        ("kafka.sasl.mechanism", "GSSAPI"),
        ("podManagementPolicy", "Random"),
        ("podAntiAffinityPreset", "always"),
        ("strimzi.kafkaUser.authentication", "scram-sha-256"),
        ("metrics.prometheusRule.severity", "page"),
    ],
)
def test_wrong_enum_is_rejected(key: str, value: str) -> None:
    with pytest.raises(HelmError, match="value must be one of"):
        render(values_files=[MINIMAL], set_values={key: value})


@pytest.mark.parametrize(
    ("set_values", "message"),
    [
        ({"processing.checkpointIntervalMs": 5}, "minimum"),
        ({"terminationGracePeriodSeconds": 0}, "minimum"),
        ({"httpPort": 0}, "minimum"),
        ({"replicaCount": "3"}, "want integer"),
        ({"app": "examples/running_sum.py"}, "does not match pattern"),
        ({"kafka.config.group\\.id": "other"}, "false schema"),
        ({"kafka.config.sasl\\.password": "hunter2"}, "false schema"),
        ({"kafka.config.SESSION_TIMEOUT_MS": 1}, "additional properties"),
        ({"env.1BAD": "x"}, "additional properties"),
        ({"autoscaling.keda.minReplicaCount": 0}, "minimum"),
        ({"kafka.config.group\\.protocol": "consumer"}, "false schema"),
        ({"kafka.config.partition\\.assignment\\.strategy": "range"}, "false schema"),
        ({"kafka.config.session\\.timeout\\.ms": 10000}, "false schema"),
        ({"image.digest": "sha256:abc"}, "does not match pattern"),
        ({"image.digest": "1.4.2"}, "does not match pattern"),
        ({"kafka.inputPartitions": -1}, "minimum"),
        ({"updateStrategy.rollingUpdate.partition": -1}, "minimum"),
        ({"metrics.prometheusRule.consumerLagFor": "15 minutes"}, "does not match pattern"),
        ({"strimzi.inputTopics": ["bad topic"]}, "does not match pattern"),
        ({"networkPolicy.kafkaPorts": []}, "minItems"),
    ],
    ids=[
        "checkpoint-interval",
        "grace-period",
        "http-port",
        "replicas-type",
        "app-format",
        "reserved-kafka-key",
        "secret-in-kafka-config",
        "kafka-key-format",
        "env-name",
        "keda-scale-to-zero",
        "group-protocol",
        "assignment-strategy",
        "session-timeout-in-config",
        "short-digest",
        "tag-as-digest",
        "negative-partitions",
        "negative-rollout-partition",
        "rule-duration",
        "topic-name",
        "no-kafka-port",
    ],
)
def test_bad_value_is_rejected(set_values: dict[str, Any], message: str) -> None:
    with pytest.raises(HelmError, match=message):
        render(values_files=[MINIMAL], set_values=set_values)


# --- the schema itself ---------------------------------------------------------------------


def test_schema_is_draft_07() -> None:
    schema = _schema()
    assert schema["$schema"] == "http://json-schema.org/draft-07/schema#"
    jsonschema.Draft7Validator.check_schema(schema)


def _object_nodes(node: Any, path: str = "#") -> list[tuple[str, dict[str, Any]]]:
    """Return every sub-schema that describes an object, with its JSON pointer."""
    found: list[tuple[str, dict[str, Any]]] = []
    if isinstance(node, dict):
        types = node.get("type")
        types = types if isinstance(types, list) else [types]
        if "object" in types or "properties" in node or "patternProperties" in node:
            found.append((path, node))
        for key, value in node.items():
            found += _object_nodes(value, f"{path}/{key}")
    elif isinstance(node, list):
        for i, value in enumerate(node):
            found += _object_nodes(value, f"{path}/{i}")
    return found


def test_every_object_level_is_closed() -> None:
    """Objects with named fields reject others; free-form maps constrain their values."""
    open_levels = []
    for path, node in _object_nodes(_schema()):
        if "/properties/" in path and path.rsplit("/", 1)[-1] in ("type", "properties"):
            continue  # a property that happens to be named like a keyword
        extra = node.get("additionalProperties")
        if "properties" in node or "patternProperties" in node:
            if extra is not False:
                open_levels.append(path)
        elif not isinstance(extra, dict):
            open_levels.append(path)
    assert not open_levels, f"object levels without additionalProperties: {open_levels}"


def test_values_yaml_satisfies_the_schema() -> None:
    values = yaml.safe_load((CHART_DIR / "values.yaml").read_text())
    jsonschema.Draft7Validator(_schema()).validate(values)


def test_every_value_is_documented() -> None:
    """Each key of values.yaml, or an enclosing key, has a comment line right above it."""
    undocumented = []
    documented_at: list[int] = []  # indents of documented ancestors
    previous = ""
    for line in (CHART_DIR / "values.yaml").read_text().splitlines():
        match = re.match(r"^( *)([A-Za-z][\w.-]*):", line)
        if match:
            indent = len(match.group(1))
            documented_at = [i for i in documented_at if i < indent]
            if previous.lstrip().startswith("#"):
                documented_at.append(indent)
            elif not documented_at:
                # A key without its own comment is fine when all its children have one:
                # checked when they are reached (they are not covered by this key).
                value = line.split(":", 1)[1].strip()
                if value and not value.startswith("#"):
                    undocumented.append(match.group(2))
        if line.strip():
            previous = line
    assert not undocumented, f"values without a comment: {undocumented}"


def test_kubernetes_definitions_are_in_sync() -> None:
    schema = _schema()
    sync = _sync_module()
    version = schema[sync.VERSION_KEY]
    if version not in kv_utils.all_versions():
        pytest.skip(f"kubernetes-validate no longer ships Kubernetes {version} schemas")
    assert sync.synced_schema(schema, version) == schema, (
        "values.schema.json is out of sync: run .venv/bin/python deploy/helm/sync_k8s_defs.py"
    )


#: Values passed through to Kubernetes whole: documented as one row (the dashboard's labels
#: are the ConfigMap's, default grafana_dashboard: "1").
_PASS_THROUGH = {
    "podSecurityContext",
    "securityContext",
    "resources",
    "metrics.dashboard.labels",
    "savepoints.jobResources",
    "savepoints.credentials.env",
}


def _value_paths(node: dict[str, Any], prefix: str = "") -> set[str]:
    paths = set()
    for key, value in node.items():
        path = f"{prefix}{key}"
        if isinstance(value, dict) and value and path not in _PASS_THROUGH:
            paths |= _value_paths(value, f"{path}.")
        else:
            paths.add(path)
    return paths


def test_docs_table_lists_every_value() -> None:
    values = yaml.safe_load((CHART_DIR / "values.yaml").read_text())
    docs = (CHART_DIR.parents[2] / "docs" / "helm.md").read_text()
    rows = set(re.findall(r"^\| `([A-Za-z][\w.]*)` \|", docs, flags=re.MULTILINE))
    paths = _value_paths(values)
    assert not paths - rows, f"values missing from docs/helm.md: {sorted(paths - rows)}"
    assert not rows - paths, f"docs/helm.md rows for unknown values: {sorted(rows - paths)}"
