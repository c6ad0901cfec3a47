"""The chart renders valid Kubernetes manifests with the properties lockgate relies on.

Built-in kinds are validated with kubernetes-validate in strict mode (unknown fields rejected)
against the oldest and the newest Kubernetes version it ships schemas for. ServiceMonitor,
PrometheusRule, ScaledObject, TriggerAuthentication, KafkaUser and KafkaTopic are CRDs it has no
schema for: they are checked against the chart's own expectations (CRD_EXPECTATIONS below), not
against the upstream CRD schemas.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
from kubernetes_validate import utils as kv_utils

from processors._checkpoint.txn import stop_budget_s
from tests.support.helm import (
    CHART_DIR,
    HelmError,
    container_env,
    lint,
    manifests,
    one_manifest,
    render,
    secret_files,
    statefulset_container_spec,
)

VALUES_DIR = Path(__file__).resolve().parent / "values"
VALUES_FILES = sorted(VALUES_DIR.glob("*.yaml"))
MINIMAL = VALUES_DIR / "minimal.yaml"
PRODUCTION = VALUES_DIR / "production.yaml"
SINGLE = VALUES_DIR / "single-replica.yaml"
STRIMZI = VALUES_DIR / "strimzi.yaml"
QUERY = VALUES_DIR / "queryable-state.yaml"

_versions = sorted(set(kv_utils.all_versions()), key=lambda v: tuple(map(int, v.split("."))))
KUBE_VERSIONS = [_versions[0], _versions[-1]]

_LABELS = {"type": "object", "additionalProperties": {"type": "string"}}
_METADATA = {
    "type": "object",
    "required": ["name", "labels"],
    "properties": {"name": {"type": "string", "maxLength": 63}, "labels": _LABELS},
}
_SECRET_REF = {
    "type": "object",
    "additionalProperties": False,
    "required": ["parameter", "name", "key"],
    "properties": {
        "parameter": {"enum": ["username", "password", "ca", "cert", "key", "keyPassword"]},
        "name": {"type": "string", "minLength": 1},
        "key": {"type": "string", "minLength": 1},
    },
}
#: What the chart promises for each CRD kind (a subset of the upstream CRD schemas).
CRD_EXPECTATIONS: dict[str, dict[str, Any]] = {
    "ServiceMonitor": {
        "type": "object",
        "required": ["apiVersion", "kind", "metadata", "spec"],
        "properties": {
            "apiVersion": {"const": "monitoring.coreos.com/v1"},
            "metadata": _METADATA,
            "spec": {
                "type": "object",
                "additionalProperties": False,
                "required": ["selector", "endpoints"],
                "properties": {
                    "selector": {
                        "type": "object",
                        "additionalProperties": False,
                        "properties": {"matchLabels": _LABELS},
                    },
                    "endpoints": {
                        "type": "array",
                        "minItems": 1,
                        "items": {
                            "type": "object",
                            "additionalProperties": False,
                            "required": ["port", "path"],
                            "properties": {
                                "port": {"const": "http"},
                                "path": {"const": "/metrics"},
                                "interval": {"type": "string", "pattern": "^([0-9]+(ms|s|m|h))+$"},
                                "scrapeTimeout": {
                                    "type": "string",
                                    "pattern": "^([0-9]+(ms|s|m|h))+$",
                                },
                            },
                        },
                    },
                },
            },
        },
    },
    "ScaledObject": {
        "type": "object",
        "required": ["apiVersion", "kind", "metadata", "spec"],
        "properties": {
            "apiVersion": {"const": "keda.sh/v1alpha1"},
            "metadata": _METADATA,
            "spec": {
                "type": "object",
                "additionalProperties": False,
                "required": ["scaleTargetRef", "minReplicaCount", "maxReplicaCount", "triggers"],
                "properties": {
                    "scaleTargetRef": {
                        "type": "object",
                        "additionalProperties": False,
                        "required": ["apiVersion", "kind", "name"],
                        "properties": {
                            "apiVersion": {"const": "apps/v1"},
                            "kind": {"const": "StatefulSet"},
                            "name": {"type": "string"},
                        },
                    },
                    "minReplicaCount": {"type": "integer", "minimum": 1},
                    "maxReplicaCount": {"type": "integer", "minimum": 1},
                    "pollingInterval": {"type": "integer", "minimum": 1},
                    "advanced": {"type": "object"},
                    "triggers": {
                        "type": "array",
                        "minItems": 1,
                        "items": {
                            "type": "object",
                            "additionalProperties": False,
                            "required": ["type", "metadata"],
                            "properties": {
                                "type": {"const": "kafka"},
                                # KEDA trigger metadata is a map of strings.
                                "metadata": {
                                    "type": "object",
                                    "required": ["bootstrapServers", "consumerGroup"],
                                    "additionalProperties": {"type": "string"},
                                },
                                "authenticationRef": {
                                    "type": "object",
                                    "additionalProperties": False,
                                    "required": ["name"],
                                    "properties": {"name": {"type": "string"}},
                                },
                            },
                        },
                    },
                },
            },
        },
    },
    "TriggerAuthentication": {
        "type": "object",
        "required": ["apiVersion", "kind", "metadata", "spec"],
        "properties": {
            "apiVersion": {"const": "keda.sh/v1alpha1"},
            "metadata": _METADATA,
            "spec": {
                "type": "object",
                "additionalProperties": False,
                "required": ["secretTargetRef"],
                "properties": {
                    "secretTargetRef": {"type": "array", "minItems": 1, "items": _SECRET_REF},
                    # Parameters read from the scale target's container env (a literal username).
                    "env": {
                        "type": "array",
                        "items": {
                            "type": "object",
                            "additionalProperties": False,
                            "required": ["parameter", "name", "containerName"],
                            "properties": {
                                "parameter": {"const": "username"},
                                "name": {"type": "string"},
                                "containerName": {"const": "processor"},
                            },
                        },
                    },
                },
            },
        },
    },
}


_DURATION = {"type": "string", "pattern": "^([0-9]+(ms|s|m|h))+$"}
_STRIMZI_METADATA = {
    "type": "object",
    "required": ["name", "labels"],
    "properties": {
        "name": {"type": "string", "maxLength": 253, "pattern": "^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$"},
        "labels": {
            "type": "object",
            "required": ["strimzi.io/cluster"],
            "additionalProperties": {"type": "string"},
        },
    },
}
_ACL = {
    "type": "object",
    "additionalProperties": False,
    "required": ["resource", "operations"],
    "properties": {
        "resource": {
            "type": "object",
            "additionalProperties": False,
            "required": ["type"],
            "properties": {
                "type": {"enum": ["topic", "group", "cluster", "transactionalId"]},
                "name": {"type": "string", "minLength": 1},
                "patternType": {"enum": ["literal", "prefix"]},
            },
        },
        "operations": {"type": "array", "minItems": 1, "items": {"type": "string"}},
        "type": {"enum": ["allow", "deny"]},
        "host": {"type": "string"},
    },
}
CRD_EXPECTATIONS["PrometheusRule"] = {
    "type": "object",
    "required": ["apiVersion", "kind", "metadata", "spec"],
    "properties": {
        "apiVersion": {"const": "monitoring.coreos.com/v1"},
        "metadata": _METADATA,
        "spec": {
            "type": "object",
            "additionalProperties": False,
            "required": ["groups"],
            "properties": {
                "groups": {
                    "type": "array",
                    "minItems": 1,
                    "items": {
                        "type": "object",
                        "additionalProperties": False,
                        "required": ["name", "rules"],
                        "properties": {
                            "name": {"type": "string"},
                            "rules": {
                                "type": "array",
                                "minItems": 1,
                                "items": {
                                    "type": "object",
                                    "additionalProperties": False,
                                    "required": ["alert", "expr"],
                                    "properties": {
                                        "alert": {"type": "string", "pattern": "^[A-Za-z]+$"},
                                        "expr": {"type": "string"},
                                        "for": _DURATION,
                                        "labels": _LABELS,
                                        "annotations": _LABELS,
                                    },
                                },
                            },
                        },
                    },
                }
            },
        },
    },
}
CRD_EXPECTATIONS["KafkaUser"] = {
    "type": "object",
    "required": ["apiVersion", "kind", "metadata", "spec"],
    "properties": {
        "apiVersion": {"const": "kafka.strimzi.io/v1beta2"},
        "metadata": _STRIMZI_METADATA,
        "spec": {
            "type": "object",
            "additionalProperties": False,
            "required": ["authentication", "authorization"],
            "properties": {
                "authentication": {
                    "type": "object",
                    "additionalProperties": False,
                    "required": ["type"],
                    "properties": {"type": {"enum": ["scram-sha-512", "tls", "tls-external"]}},
                },
                "authorization": {
                    "type": "object",
                    "additionalProperties": False,
                    "required": ["type", "acls"],
                    "properties": {
                        "type": {"const": "simple"},
                        "acls": {"type": "array", "minItems": 1, "items": _ACL},
                    },
                },
            },
        },
    },
}
CRD_EXPECTATIONS["KafkaTopic"] = {
    "type": "object",
    "required": ["apiVersion", "kind", "metadata", "spec"],
    "properties": {
        "apiVersion": {"const": "kafka.strimzi.io/v1beta2"},
        "metadata": _STRIMZI_METADATA,
        "spec": {
            "type": "object",
            "additionalProperties": False,
            "required": ["topicName", "partitions", "replicas"],
            "properties": {
                "topicName": {"type": "string", "pattern": "^[A-Za-z0-9._-]{1,249}$"},
                "partitions": {"type": "integer", "minimum": 1},
                "replicas": {"type": "integer", "minimum": 1, "maximum": 32767},
                "config": {"type": "object", "additionalProperties": {"type": "string"}},
            },
        },
    },
}


def _env_map(docs: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Return the processor container's env entries by name."""
    return {e["name"]: e for e in statefulset_container_spec(docs)["env"]}


def _pod_spec(docs: list[dict[str, Any]]) -> dict[str, Any]:
    return one_manifest(docs, "StatefulSet")["spec"]["template"]["spec"]


# --- every values file: valid manifests, lint ------------------------------------------------


@pytest.mark.parametrize("values_file", VALUES_FILES, ids=lambda p: p.stem)
def test_manifests_validate_strictly(values_file: Path) -> None:
    docs = render(values_files=[values_file])
    kinds = {doc["kind"] for doc in docs}
    assert {"StatefulSet", "Service", "ServiceAccount"} <= kinds
    for doc in docs:
        if doc["kind"] in CRD_EXPECTATIONS:
            jsonschema.Draft202012Validator(CRD_EXPECTATIONS[doc["kind"]]).validate(doc)
            continue
        for version in KUBE_VERSIONS:
            try:
                kubernetes_validate.validate(doc, version, strict=True)
            except kubernetes_validate.ValidationError as exc:
                path = ".".join(str(p) for p in exc.path)
                pytest.fail(f"{doc['kind']} invalid for Kubernetes {version} at {path}: {exc}")


@pytest.mark.parametrize("values_file", VALUES_FILES, ids=lambda p: p.stem)
def test_helm_lint_strict(values_file: Path) -> None:
    out = lint(values_files=[values_file])
    assert "0 chart(s) failed" in out


def test_every_values_file_is_tested() -> None:
    assert {p.name for p in VALUES_FILES} >= {
        "minimal.yaml",
        "production.yaml",
        "single-replica.yaml",
        "strimzi.yaml",
        "queryable-state.yaml",
        "console.yaml",
    }


# --- StatefulSet ---------------------------------------------------------------------------


def test_statefulset_keeps_state_volumes() -> None:
    sts = one_manifest(render(values_files=[MINIMAL]), "StatefulSet")
    spec = sts["spec"]
    assert spec["persistentVolumeClaimRetentionPolicy"] == {
        "whenDeleted": "Retain",
        "whenScaled": "Retain",
    }
    assert spec["podManagementPolicy"] == "Parallel"
    assert spec["updateStrategy"] == {"type": "RollingUpdate"}
    [claim] = spec["volumeClaimTemplates"]
    assert claim["metadata"]["name"] == "data"
    assert claim["spec"]["accessModes"] == ["ReadWriteOnce"]
    assert claim["spec"]["resources"]["requests"]["storage"] == "10Gi"
    container = statefulset_container_spec([sts])
    assert {"name": "data", "mountPath": "/var/lib/lockgate"} in container["volumeMounts"]
    volumes = {v["name"] for v in spec["template"]["spec"]["volumes"]}
    assert "data" not in volumes  # the claim, not a pod volume
    env = _env_map([sts])
    assert env["LOCKGATE_STATE_DIR"]["value"] == "/var/lib/lockgate/state"


def test_persistence_disabled_uses_emptydir() -> None:
    docs = render(values_files=[SINGLE])
    sts = one_manifest(docs, "StatefulSet")
    assert "volumeClaimTemplates" not in sts["spec"]
    volumes = {v["name"]: v for v in sts["spec"]["template"]["spec"]["volumes"]}
    assert volumes["data"] == {"name": "data", "emptyDir": {}}


def test_headless_service_matches_statefulset() -> None:
    docs = render(values_files=[MINIMAL])
    sts = one_manifest(docs, "StatefulSet")
    svc = one_manifest(docs, "Service")
    assert svc["spec"]["clusterIP"] == "None"
    assert sts["spec"]["serviceName"] == svc["metadata"]["name"]
    assert svc["spec"]["ports"] == [
        {"name": "http", "port": 8080, "targetPort": "http", "protocol": "TCP"}
    ]
    pod_labels = sts["spec"]["template"]["metadata"]["labels"]
    assert svc["spec"]["selector"].items() <= pod_labels.items()
    assert sts["spec"]["selector"]["matchLabels"] == svc["spec"]["selector"]


@pytest.mark.parametrize(
    ("values_file", "port"), [(MINIMAL, 8080), (SINGLE, 9090), (PRODUCTION, 8080)]
)
def test_probes_use_the_http_port(values_file: Path, port: int) -> None:
    docs = render(values_files=[values_file])
    container = statefulset_container_spec(docs)
    assert container["ports"] == [{"name": "http", "containerPort": port, "protocol": "TCP"}]
    assert _env_map(docs)["LOCKGATE_HTTP_PORT"]["value"] == str(port)
    paths = {"startupProbe": "/startupz", "livenessProbe": "/livez", "readinessProbe": "/readyz"}
    for probe, path in paths.items():
        assert container[probe]["httpGet"] == {"path": path, "port": "http"}, probe
    startup = container["startupProbe"]
    # A first start may include a restore: allow at least 10 minutes.
    assert startup["periodSeconds"] * startup["failureThreshold"] >= 600
    svc = one_manifest(docs, "Service")
    assert svc["spec"]["ports"][0]["port"] == port


def test_probe_can_be_disabled() -> None:
    docs = render(values_files=[MINIMAL], set_values={"probes.liveness.enabled": False})
    container = statefulset_container_spec(docs)
    assert "livenessProbe" not in container
    assert "readinessProbe" in container


def test_instance_id_is_the_pod_name() -> None:
    env = _env_map(render(values_files=[MINIMAL]))
    assert env["LOCKGATE_INSTANCE_ID"] == {
        "name": "LOCKGATE_INSTANCE_ID",
        "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}},
    }


def test_args_and_image() -> None:
    docs = render(values_files=[MINIMAL])
    container = statefulset_container_spec(docs)
    assert container["command"] is None  # the image's entrypoint, `lockgate`
    assert container["args"] == ["run", "examples.running_sum:app"]
    assert container["image"] == "lockgate/processor:0.1.0"
    prod = statefulset_container_spec(render(values_files=[PRODUCTION]))
    assert prod["image"] == "registry.example.com/streaming/sums:1.4.2"
    assert prod["imagePullPolicy"] == "Always"


def test_grace_period() -> None:
    assert _pod_spec(render(values_files=[MINIMAL]))["terminationGracePeriodSeconds"] == 60
    prod = render(values_files=[PRODUCTION])
    assert _pod_spec(prod)["terminationGracePeriodSeconds"] == 140
    env = _env_map(prod)
    # The runtime's own stop budget (processors/_checkpoint/txn.py), with the scale-down leave.
    needed_s = stop_budget_s(int(env["LOCKGATE_TRANSACTION_TIMEOUT_MS"]["value"]) / 1000, True)
    assert _pod_spec(prod)["terminationGracePeriodSeconds"] > needed_s


def test_grace_period_shorter_than_the_stop_budget_is_refused() -> None:
    with pytest.raises(HelmError, match="terminationGracePeriodSeconds"):
        render(values_files=[MINIMAL], set_values={"terminationGracePeriodSeconds": 10})
    # The chart's check is the runtime's stop budget: 58 s with the defaults and the
    # scale-down leave, 45 s without it.
    with_leave = stop_budget_s(10.0, True)
    without = stop_budget_s(10.0, False)
    assert (with_leave, without) == (58.0, 45.0)
    with pytest.raises(HelmError, match=r"must exceed the stop budget"):
        render(values_files=[MINIMAL], set_values={"terminationGracePeriodSeconds": 58})
    render(values_files=[MINIMAL], set_values={"terminationGracePeriodSeconds": 59})
    no_leave = {"kafka": {"leaveGroupOnScaleDown": False}}
    with pytest.raises(HelmError, match=r"must exceed the stop budget"):
        render(no_leave, values_files=[MINIMAL], set_values={"terminationGracePeriodSeconds": 45})
    render(no_leave, values_files=[MINIMAL], set_values={"terminationGracePeriodSeconds": 46})
    tight = {"processing.checkpointIntervalMs": 5000, "processing.transactionTimeoutMs": 9000}
    with pytest.raises(HelmError, match="at least twice processing.checkpointIntervalMs"):
        render(values_files=[MINIMAL], set_values=tight)
    # The app only checks that rule under exactly_once.
    render(values_files=[MINIMAL], set_values={**tight, "processing.guarantee": "at_least_once"})


def test_runs_as_non_root_with_read_only_root() -> None:
    docs = render(values_files=[PRODUCTION])
    pod = _pod_spec(docs)
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["runAsUser"] == 10001
    assert pod["securityContext"]["fsGroup"] == 10001
    assert pod["automountServiceAccountToken"] is False
    container = statefulset_container_spec(docs)
    sc = container["securityContext"]
    assert sc["readOnlyRootFilesystem"] is True
    assert sc["allowPrivilegeEscalation"] is False
    assert sc["capabilities"] == {"drop": ["ALL"]}
    assert {"name": "tmp", "mountPath": "/tmp"} in container["volumeMounts"]
    assert {"name": "tmp", "emptyDir": {}} in pod["volumes"]


def test_scheduling_values_pass_through() -> None:
    pod = _pod_spec(render(values_files=[PRODUCTION]))
    assert pod["nodeSelector"] == {"node-pool": "streaming"}
    assert pod["tolerations"][0]["key"] == "dedicated"
    assert "podAntiAffinity" in pod["affinity"]
    assert pod["imagePullSecrets"] == [{"name": "registry-credentials"}]
    assert statefulset_container_spec(render(values_files=[PRODUCTION]))["resources"] == {
        "requests": {"cpu": "1", "memory": "4Gi"},
        "limits": {"memory": "4Gi"},
    }


# --- environment ---------------------------------------------------------------------------


def test_processing_values_become_env() -> None:
    env = _env_map(render(values_files=[SINGLE]))
    plain = {name: e.get("value") for name, e in env.items()}
    assert plain["LOCKGATE_BOOTSTRAP_SERVERS"] == "kafka:9092"
    assert plain["LOCKGATE_APP_NAME"] == "sums"
    assert plain["LOCKGATE_GUARANTEE"] == "at_least_once"
    assert plain["LOCKGATE_ON_ERROR"] == "fail"
    assert plain["LOCKGATE_LOG_LEVEL"] == "DEBUG"
    assert plain["LOCKGATE_LOG_FORMAT"] == "console"
    assert plain["LOCKGATE_CONSUME_BATCH_SIZE"] == "500"  # from `env:`
    assert plain["LOCKGATE_KAFKA__SESSION_TIMEOUT_MS"] == "30000"  # kafka.sessionTimeoutMs


def test_kafka_config_passes_through_as_env() -> None:
    env = _env_map(
        render(
            values_files=[MINIMAL],
            set_values={
                "kafka.config.fetch\\.max\\.bytes": 52428800,
                "kafka.config.queue\\.buffering\\.max\\.messages": 1000000,
                "kafka.config.socket\\.keepalive\\.enable": True,
                "kafka.config.client\\.rack": "eu-west-1a",
            },
        )
    )
    assert env["LOCKGATE_KAFKA__FETCH_MAX_BYTES"]["value"] == "52428800"
    # The session timeout is a value of its own (default: librdkafka's 45 s).
    assert env["LOCKGATE_KAFKA__SESSION_TIMEOUT_MS"]["value"] == "45000"
    # Helm reads numbers as float64; the chart must not print 1e+06.
    assert env["LOCKGATE_KAFKA__QUEUE_BUFFERING_MAX_MESSAGES"]["value"] == "1000000"
    assert env["LOCKGATE_KAFKA__SOCKET_KEEPALIVE_ENABLE"]["value"] == "true"
    assert env["LOCKGATE_KAFKA__CLIENT_RACK"]["value"] == "eu-west-1a"
    assert "LOCKGATE_KAFKA__SECURITY_PROTOCOL" not in env  # no SASL/TLS: librdkafka default


def test_env_extra_env_and_env_from() -> None:
    docs = render(values_files=[PRODUCTION])
    container = statefulset_container_spec(docs)
    assert container["envFrom"] == [{"configMapRef": {"name": "sums-extra-settings"}}]
    env = _env_map(docs)
    assert env["LOCKGATE_KAFKA__SSL_KEY_PASSWORD"]["valueFrom"] == {
        "secretKeyRef": {"name": "sums-key-password", "key": "password"}
    }


def test_a_variable_set_twice_is_refused() -> None:
    with pytest.raises(HelmError, match="LOCKGATE_GUARANTEE is set twice"):
        render(values_files=[MINIMAL], set_values={"env.LOCKGATE_GUARANTEE": "at_least_once"})
    with pytest.raises(HelmError, match="LOCKGATE_INSTANCE_ID is set twice"):
        render(
            values_files=[MINIMAL],
            set_values={"extraEnv": [{"name": "LOCKGATE_INSTANCE_ID", "value": "x"}]},
        )


@pytest.mark.parametrize(
    ("drop", "message"),
    [
        ("app", "app is required"),
        ("appName", "appName is required"),
        ("kafka", "kafka.bootstrapServers is required"),
    ],
)
def test_required_values(drop: str, message: str) -> None:
    values = {
        "app": "examples.running_sum:app",
        "appName": "sums",
        "kafka": {"bootstrapServers": "k:9092"},
    }
    del values[drop]
    with pytest.raises(HelmError, match=message):
        render(values)


# --- SASL / TLS ----------------------------------------------------------------------------


def test_sasl_credentials_come_from_the_existing_secret() -> None:
    docs = render(values_files=[PRODUCTION])
    env = _env_map(docs)
    assert env["LOCKGATE_SASL_USERNAME"]["valueFrom"] == {
        "secretKeyRef": {"name": "sums-kafka-user", "key": "username"}
    }
    # The password is a mounted file, never an env value.
    assert "LOCKGATE_SASL_PASSWORD" not in env
    assert env["LOCKGATE_SASL_PASSWORD_FILE"] == {
        "name": "LOCKGATE_SASL_PASSWORD_FILE",
        "value": "/etc/lockgate/kafka-sasl/password",
    }
    pod = _pod_spec(docs)
    [volume] = [v for v in pod["volumes"] if v["name"] == "kafka-sasl"]
    assert volume["secret"] == {
        "secretName": "sums-kafka-user",
        "defaultMode": 0o440,
        "items": [{"key": "password", "path": "password"}],
    }
    assert env["LOCKGATE_KAFKA__SASL_MECHANISM"]["value"] == "SCRAM-SHA-512"
    assert env["LOCKGATE_KAFKA__SECURITY_PROTOCOL"]["value"] == "SASL_SSL"
    assert not manifests(docs, "Secret")  # the chart never renders credentials


def test_tls_secret_is_mounted_read_only() -> None:
    docs = render(values_files=[PRODUCTION])
    pod = _pod_spec(docs)
    [volume] = [v for v in pod["volumes"] if v["name"] == "kafka-tls"]
    assert volume["secret"]["secretName"] == "kafka-cluster-ca"
    assert volume["secret"]["defaultMode"] == 0o440
    assert volume["secret"]["items"] == [
        {"key": "ca.crt", "path": "ca.crt"},
        {"key": "user.crt", "path": "tls.crt"},
        {"key": "user.key", "path": "tls.key"},
    ]
    container = statefulset_container_spec(docs)
    [mount] = [m for m in container["volumeMounts"] if m["name"] == "kafka-tls"]
    assert mount == {"name": "kafka-tls", "mountPath": "/etc/lockgate/kafka-tls", "readOnly": True}
    env = _env_map(docs)
    assert env["LOCKGATE_KAFKA__SSL_CA_LOCATION"]["value"] == "/etc/lockgate/kafka-tls/ca.crt"
    assert env["LOCKGATE_KAFKA__SSL_CERTIFICATE_LOCATION"]["value"] == (
        "/etc/lockgate/kafka-tls/tls.crt"
    )
    assert env["LOCKGATE_KAFKA__SSL_KEY_LOCATION"]["value"] == "/etc/lockgate/kafka-tls/tls.key"


def test_tls_without_client_certificate() -> None:
    docs = render(
        values_files=[MINIMAL],
        set_values={
            "kafka.tls.existingSecret": "cluster-ca",
            "kafka.tls.certKey": "",
            "kafka.tls.keyKey": "",
        },
    )
    env = _env_map(docs)
    assert env["LOCKGATE_KAFKA__SECURITY_PROTOCOL"]["value"] == "SSL"
    assert "LOCKGATE_KAFKA__SSL_CA_LOCATION" in env
    assert "LOCKGATE_KAFKA__SSL_CERTIFICATE_LOCATION" not in env
    with pytest.raises(HelmError, match="certKey and kafka.tls.keyKey must be set together"):
        render(
            values_files=[MINIMAL],
            set_values={"kafka.tls.existingSecret": "cluster-ca", "kafka.tls.keyKey": ""},
        )


def test_explicit_security_protocol_wins() -> None:
    env = _env_map(
        render(
            values_files=[MINIMAL],
            set_values={
                "kafka.sasl.existingSecret": "user",
                "kafka.config.security\\.protocol": "SASL_PLAINTEXT",
            },
        )
    )
    assert env["LOCKGATE_KAFKA__SECURITY_PROTOCOL"]["value"] == "SASL_PLAINTEXT"


# --- PDB, ServiceMonitor, KEDA -------------------------------------------------------------


@pytest.mark.parametrize(
    ("values_file", "set_values", "expected"),
    [
        (MINIMAL, {}, False),
        (SINGLE, {}, False),
        (MINIMAL, {"replicaCount": 2}, True),
        (MINIMAL, {"replicaCount": 3, "podDisruptionBudget.enabled": False}, False),
        (PRODUCTION, {}, True),
    ],
    ids=["minimal", "single", "two-replicas", "disabled", "production"],
)
def test_pdb_only_with_several_replicas(
    values_file: Path, set_values: dict[str, Any], expected: bool
) -> None:
    docs = render(values_files=[values_file], set_values=set_values)
    pdbs = manifests(docs, "PodDisruptionBudget")
    assert bool(pdbs) is expected
    if expected:
        [pdb] = pdbs
        assert pdb["spec"]["maxUnavailable"] == 1
        assert "minAvailable" not in pdb["spec"]
        pod_labels = one_manifest(docs, "StatefulSet")["spec"]["template"]["metadata"]["labels"]
        assert pdb["spec"]["selector"]["matchLabels"].items() <= pod_labels.items()


def test_optional_crds_are_off_by_default() -> None:
    kinds = {doc["kind"] for doc in render(values_files=[MINIMAL])}
    assert kinds == {"StatefulSet", "Service", "ServiceAccount", "Role", "RoleBinding"}


def test_service_monitor_scrapes_metrics() -> None:
    docs = render(values_files=[PRODUCTION])
    sm = one_manifest(docs, "ServiceMonitor")
    svc = one_manifest(docs, "Service")
    assert sm["spec"]["selector"]["matchLabels"].items() <= svc["metadata"]["labels"].items()
    assert sm["spec"]["endpoints"] == [
        {"port": "http", "path": "/metrics", "interval": "15s", "scrapeTimeout": "10s"}
    ]
    assert sm["metadata"]["labels"]["release"] == "prometheus"


def test_keda_scales_the_statefulset_on_lag() -> None:
    docs = render(values_files=[PRODUCTION])
    sts = one_manifest(docs, "StatefulSet")
    assert "replicas" not in sts["spec"]  # KEDA owns the count; upgrades must not reset it
    so = one_manifest(docs, "ScaledObject")
    assert so["spec"]["scaleTargetRef"] == {
        "apiVersion": "apps/v1",
        "kind": "StatefulSet",
        "name": sts["metadata"]["name"],
    }
    assert (so["spec"]["minReplicaCount"], so["spec"]["maxReplicaCount"]) == (3, 12)
    [trigger] = so["spec"]["triggers"]
    meta = trigger["metadata"]
    assert meta["consumerGroup"] == "sums"  # the app name is the group id
    assert meta["topic"] == "payments"
    assert meta["lagThreshold"] == "50000"
    assert meta["sasl"] == "scram_sha512"
    assert meta["tls"] == "enable"
    assert meta["bootstrapServers"] == _env_map(docs)["LOCKGATE_BOOTSTRAP_SERVERS"]["value"]
    auth = one_manifest(docs, "TriggerAuthentication")
    assert trigger["authenticationRef"] == {"name": auth["metadata"]["name"]}
    refs = {r["parameter"]: (r["name"], r["key"]) for r in auth["spec"]["secretTargetRef"]}
    assert refs == {
        "username": ("sums-kafka-user", "username"),
        "password": ("sums-kafka-user", "password"),
        "ca": ("kafka-cluster-ca", "ca.crt"),
        "cert": ("kafka-cluster-ca", "user.crt"),
        "key": ("kafka-cluster-ca", "user.key"),
        "keyPassword": ("sums-key-password", "password"),  # the client key is encrypted
    }
    # Scale-up is rate-limited by a policy whose period covers a restore.
    scale_up = so["spec"]["advanced"]["horizontalPodAutoscalerConfig"]["behavior"]["scaleUp"]
    assert scale_up["policies"] == [{"type": "Pods", "value": 1, "periodSeconds": 600}]


def test_keda_without_credentials_has_no_trigger_authentication() -> None:
    docs = render(
        values_files=[MINIMAL],
        set_values={"autoscaling.keda.enabled": True, "kafka.inputPartitions": 4},
    )
    [trigger] = one_manifest(docs, "ScaledObject")["spec"]["triggers"]
    assert "authenticationRef" not in trigger
    assert "tls" not in trigger["metadata"] and "sasl" not in trigger["metadata"]
    assert not manifests(docs, "TriggerAuthentication")


def test_keda_needs_the_partition_count() -> None:
    with pytest.raises(HelmError, match="autoscaling.keda needs kafka.inputPartitions"):
        render(values_files=[MINIMAL], set_values={"autoscaling.keda.enabled": True})
    with pytest.raises(HelmError, match="minReplicaCount"):
        render(
            values_files=[MINIMAL],
            set_values={
                "kafka.inputPartitions": 8,
                "autoscaling.keda.enabled": True,
                "autoscaling.keda.minReplicaCount": 4,
                "autoscaling.keda.maxReplicaCount": 2,
            },
        )


# --- names and the helper ------------------------------------------------------------------


def test_long_release_names_keep_pod_names_valid() -> None:
    release = "a-very-long-release-name-for-a-stream-processor-app"
    docs = render(values_files=[MINIMAL], release=release)
    name = one_manifest(docs, "StatefulSet")["metadata"]["name"]
    # Pod "<name>-<ordinal>", claim "data-<name>-<ordinal>" and the revision label must fit 63.
    assert len(f"data-{name}-999") <= 63
    assert len(f"{name}-" + "x" * 10) <= 63


def test_container_env_resolves_like_the_kubelet() -> None:
    spec = statefulset_container_spec(render(values_files=[PRODUCTION]))
    env = container_env(
        spec,
        pod_name="sums-lockgate-2",
        secrets={
            "sums-kafka-user": {"username": "u", "password": "p"},
            "sums-key-password": {"password": "kp"},
        },
        config_maps={"sums-extra-settings": {"LOCKGATE_CONSUME_BATCH_SIZE": "10"}},
    )
    assert env["LOCKGATE_INSTANCE_ID"] == "sums-lockgate-2"
    assert env["LOCKGATE_SASL_USERNAME"] == "u"
    assert env["LOCKGATE_SASL_PASSWORD_FILE"] == "/etc/lockgate/kafka-sasl/password"
    assert env["LOCKGATE_KAFKA__SSL_KEY_PASSWORD"] == "kp"
    assert env["LOCKGATE_CONSUME_BATCH_SIZE"] == "10"
    assert len(env) == len(spec["env"]) + 1
    with pytest.raises(KeyError, match="sums-kafka-user"):
        container_env(spec, pod_name="p", config_maps={"sums-extra-settings": {}})


def test_secret_files_resolve_like_the_kubelet() -> None:
    docs = render(values_files=[PRODUCTION])
    secrets = {
        "sums-kafka-user": {"username": "u", "password": "p\n"},
        "kafka-cluster-ca": {"ca.crt": "CA", "user.crt": "CRT", "user.key": "KEY", "x": "y"},
    }
    assert secret_files(docs, secrets=secrets) == {
        "/etc/lockgate/kafka-sasl/password": "p\n",
        "/etc/lockgate/kafka-tls/ca.crt": "CA",
        "/etc/lockgate/kafka-tls/tls.crt": "CRT",
        "/etc/lockgate/kafka-tls/tls.key": "KEY",
    }
    projected = render(
        values_files=[MINIMAL],
        set_values={"kafka.tls.existingSecret": "ca", "kafka.tls.clientSecret": "client"},
    )
    files = secret_files(
        projected, secrets={"ca": {"ca.crt": "CA"}, "client": {"tls.crt": "C", "tls.key": "K"}}
    )
    assert files == {
        "/etc/lockgate/kafka-tls/ca.crt": "CA",
        "/etc/lockgate/kafka-tls/tls.crt": "C",
        "/etc/lockgate/kafka-tls/tls.key": "K",
    }
    with pytest.raises(KeyError, match="sums-kafka-user"):
        secret_files(docs, secrets={"kafka-cluster-ca": secrets["kafka-cluster-ca"]})
    with pytest.raises(KeyError, match="'password'"):
        secret_files(docs, secrets={**secrets, "sums-kafka-user": {"username": "u"}})


@pytest.mark.parametrize("values_file", VALUES_FILES, ids=lambda p: p.stem)
def test_notes_render(values_file: Path, tmp_path: Path) -> None:
    """NOTES.txt renders (helm template skips it, so render it through tpl in a copy)."""
    chart = tmp_path / "lockgate"
    shutil.copytree(CHART_DIR, chart)
    shutil.copy(chart / "templates" / "NOTES.txt", chart / "notes.src")
    (chart / "templates" / "zz-notes.yaml").write_text(
        "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: notes\n"
        'data:\n  notes: {{ tpl (.Files.Get "notes.src") . | quote }}\n'
    )
    notes = one_manifest(render(values_files=[values_file], chart=chart), "ConfigMap")
    text = notes["data"]["notes"]
    assert "examples.running_sum:app" in text
    assert "sums-lockgate-0" in text
    assert ("retained" in text) is (values_file != SINGLE)
    assert "App name sums" in text
    assert ("Staged rollout" in text) is (values_file == STRIMZI)
    assert ("Queryable state is on" in text) is (values_file.name in (QUERY.name, "console.yaml"))
    assert "sums-query-token" in text if values_file == QUERY else "WARNING" not in text


def test_liveness_shorter_than_the_transaction_timeout_is_refused() -> None:
    slow = {"processing.transactionTimeoutMs": 60000, "terminationGracePeriodSeconds": 140}
    with pytest.raises(HelmError, match="progressTimeoutMs .60000. must exceed"):
        render(values_files=[MINIMAL], set_values=slow)
    render(values_files=[MINIMAL], set_values={**slow, "probes.liveness.progressTimeoutMs": 90000})
    render(values_files=[MINIMAL], set_values={**slow, "probes.liveness.enabled": False})
