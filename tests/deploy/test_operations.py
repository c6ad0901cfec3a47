"""Production operations on Kubernetes (issue 14): the chart's side.

Autoscaling that does not feed on itself, Strimzi and common clusters (credentials, rotation,
scheduling, staged rollouts, sidecars, alerts, network policy, image digest), release isolation
(appName, KafkaUser ACLs and KafkaTopics named as the runtime names its topics) and the static
membership budget. Each refusal is tested with the message the user sees.
"""

from __future__ import annotations

import re
import shutil
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.support.helm import (
    CHART_DIR,
    HelmError,
    manifests,
    one_manifest,
    render,
    statefulset_container_spec,
)

VALUES_DIR = Path(__file__).resolve().parent / "values"
MINIMAL = VALUES_DIR / "minimal.yaml"
PRODUCTION = VALUES_DIR / "production.yaml"
STRIMZI = VALUES_DIR / "strimzi.yaml"
SINGLE = VALUES_DIR / "single-replica.yaml"
QUERY = VALUES_DIR / "queryable-state.yaml"


def _env(docs: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {e["name"]: e for e in statefulset_container_spec(docs)["env"]}


def _pod(docs: list[dict[str, Any]]) -> dict[str, Any]:
    return one_manifest(docs, "StatefulSet")["spec"]["template"]


# --- item 6: KEDA ---------------------------------------------------------------------------

_KEDA = {"autoscaling.keda.enabled": True, "kafka.inputPartitions": 6}


def test_keda_scale_up_policy_is_configurable() -> None:
    docs = render(
        values_files=[MINIMAL],
        set_values={
            **_KEDA,
            "autoscaling.keda.scaleUpPods": 2,
            "autoscaling.keda.scaleUpPeriodSeconds": 1200,
        },
    )
    behavior = one_manifest(docs, "ScaledObject")["spec"]["advanced"][
        "horizontalPodAutoscalerConfig"
    ]["behavior"]
    assert behavior["scaleUp"] == {
        "stabilizationWindowSeconds": 60,
        "policies": [{"type": "Pods", "value": 2, "periodSeconds": 1200}],
    }
    # The HPA refuses policy periods above 30 minutes: so does the schema.
    with pytest.raises(HelmError, match="maximum"):
        render(
            values_files=[MINIMAL],
            set_values={**_KEDA, "autoscaling.keda.scaleUpPeriodSeconds": 1801},
        )


def test_max_replicas_are_capped_at_the_partition_count() -> None:
    so = one_manifest(
        render(
            values_files=[MINIMAL],
            set_values={**_KEDA, "autoscaling.keda.maxReplicaCount": 6},
        ),
        "ScaledObject",
    )
    assert so["spec"]["maxReplicaCount"] == 6
    with pytest.raises(HelmError, match=r"maxReplicaCount \(7\) exceeds kafka.inputPartitions"):
        render(
            values_files=[MINIMAL],
            set_values={**_KEDA, "autoscaling.keda.maxReplicaCount": 7},
        )
    with pytest.raises(HelmError, match="autoscaling.keda needs kafka.inputPartitions"):
        render(values_files=[MINIMAL], set_values={"autoscaling.keda.enabled": True})


def test_replica_count_above_the_partition_count_is_refused() -> None:
    render(values_files=[MINIMAL], set_values={"kafka.inputPartitions": 4, "replicaCount": 4})
    with pytest.raises(HelmError, match=r"replicaCount \(5\) exceeds kafka.inputPartitions \(4\)"):
        render(values_files=[MINIMAL], set_values={"kafka.inputPartitions": 4, "replicaCount": 5})
    # Not stated: not checked.
    render(values_files=[MINIMAL], set_values={"replicaCount": 5})


def test_keda_key_password_and_literal_username() -> None:
    docs = render(values_files=[STRIMZI], set_values=_KEDA)
    auth = one_manifest(docs, "TriggerAuthentication")
    # Strimzi's Secret has no username: KEDA reads the literal from the container's env.
    assert auth["spec"]["env"] == [
        {"parameter": "username", "name": "LOCKGATE_SASL_USERNAME", "containerName": "processor"}
    ]
    assert _env(docs)["LOCKGATE_SASL_USERNAME"] == {
        "name": "LOCKGATE_SASL_USERNAME",
        "value": "sums-lockgate",
    }
    refs = {r["parameter"]: (r["name"], r["key"]) for r in auth["spec"]["secretTargetRef"]}
    assert refs == {
        "password": ("sums-lockgate", "password"),
        "ca": ("my-cluster-cluster-ca-cert", "ca.crt"),
    }
    # An encrypted key in a separate client Secret: cert/key from it, keyPassword from its own.
    docs = render(
        values_files=[STRIMZI],
        set_values={
            **_KEDA,
            "kafka.tls.clientSecret": "sums-tls-user",
            "kafka.tls.certKey": "user.crt",
            "kafka.tls.keyKey": "user.key",
            "kafka.tls.keyPasswordSecret": "sums-key-password",
        },
    )
    auth = one_manifest(docs, "TriggerAuthentication")
    refs = {r["parameter"]: (r["name"], r["key"]) for r in auth["spec"]["secretTargetRef"]}
    assert refs["cert"] == ("sums-tls-user", "user.crt")
    assert refs["key"] == ("sums-tls-user", "user.key")
    assert refs["keyPassword"] == ("sums-key-password", "password")
    assert _env(docs)["LOCKGATE_KAFKA__SSL_KEY_PASSWORD"]["valueFrom"] == {
        "secretKeyRef": {"name": "sums-key-password", "key": "password"}
    }


# --- item 7: credentials --------------------------------------------------------------------


def test_literal_sasl_username_needs_the_password_secret() -> None:
    with pytest.raises(HelmError, match="kafka.sasl.username needs kafka.sasl.existingSecret"):
        render(values_files=[MINIMAL], set_values={"kafka.sasl.username": "sums"})


def test_ca_and_client_certificate_from_separate_secrets() -> None:
    docs = render(
        values_files=[MINIMAL],
        set_values={
            "kafka.tls.existingSecret": "my-cluster-cluster-ca-cert",
            "kafka.tls.clientSecret": "sums-tls-user",
            "kafka.tls.certKey": "user.crt",
            "kafka.tls.keyKey": "user.key",
        },
    )
    [volume] = [v for v in _pod(docs)["spec"]["volumes"] if v["name"] == "kafka-tls"]
    assert volume["projected"] == {
        "defaultMode": 0o440,
        "sources": [
            {
                "secret": {
                    "name": "my-cluster-cluster-ca-cert",
                    "items": [{"key": "ca.crt", "path": "ca.crt"}],
                }
            },
            {
                "secret": {
                    "name": "sums-tls-user",
                    "items": [
                        {"key": "user.crt", "path": "tls.crt"},
                        {"key": "user.key", "path": "tls.key"},
                    ],
                }
            },
        ],
    }
    env = _env(docs)
    assert env["LOCKGATE_KAFKA__SECURITY_PROTOCOL"]["value"] == "SSL"
    assert env["LOCKGATE_KAFKA__SSL_CERTIFICATE_LOCATION"]["value"] == (
        "/etc/lockgate/kafka-tls/tls.crt"
    )


@pytest.mark.parametrize(
    ("set_values", "message"),
    [
        ({"kafka.tls.clientSecret": "u"}, "need kafka.tls.existingSecret"),
        ({"kafka.tls.keyPasswordSecret": "p"}, "need kafka.tls.existingSecret"),
        (
            {
                "kafka.tls.existingSecret": "ca",
                "kafka.tls.clientSecret": "u",
                "kafka.tls.certKey": "",
                "kafka.tls.keyKey": "",
            },
            "clientSecret needs kafka.tls.certKey",
        ),
        (
            {
                "kafka.tls.existingSecret": "ca",
                "kafka.tls.keyPasswordSecret": "p",
                "kafka.tls.certKey": "",
                "kafka.tls.keyKey": "",
            },
            "keyPasswordSecret needs a client certificate",
        ),
    ],
    ids=["client-without-ca", "password-without-ca", "client-without-keys", "password-no-cert"],
)
def test_inconsistent_tls_values_are_refused(set_values: dict[str, Any], message: str) -> None:
    with pytest.raises(HelmError, match=message):
        render(values_files=[MINIMAL], set_values=set_values)


def test_the_password_reaches_the_app_as_a_mounted_file() -> None:
    """LOCKGATE_SASL_PASSWORD_FILE names the Secret's password key, mounted without subPath.

    A Secret volume mounted as a directory is updated in place by the kubelet when the Secret
    changes (a subPath mount never is), and the app reads the file at each client creation.
    """
    docs = render(values_files=[STRIMZI])
    env = _env(docs)
    assert "LOCKGATE_SASL_PASSWORD" not in env
    assert env["LOCKGATE_SASL_PASSWORD_FILE"] == {
        "name": "LOCKGATE_SASL_PASSWORD_FILE",
        "value": "/etc/lockgate/kafka-sasl/password",
    }
    pod = _pod(docs)["spec"]
    [volume] = [v for v in pod["volumes"] if v["name"] == "kafka-sasl"]
    assert volume == {
        "name": "kafka-sasl",
        "secret": {
            "secretName": "sums-lockgate",
            "defaultMode": 0o440,
            "items": [{"key": "password", "path": "password"}],
        },
    }
    # 0440: readable by the pod's fsGroup, which the non-root process runs with.
    assert pod["securityContext"]["fsGroup"] == pod["securityContext"]["runAsGroup"]
    container = statefulset_container_spec(docs)
    [mount] = [m for m in container["volumeMounts"] if m["name"] == "kafka-sasl"]
    assert mount == {
        "name": "kafka-sasl",
        "mountPath": "/etc/lockgate/kafka-sasl",
        "readOnly": True,
    }
    assert "subPath" not in mount
    # The username is no file: it stays a literal (Strimzi) or a secretKeyRef.
    assert env["LOCKGATE_SASL_USERNAME"] == {
        "name": "LOCKGATE_SASL_USERNAME",
        "value": "sums-lockgate",
    }


def test_sasl_mount_path_is_a_value() -> None:
    docs = render(
        values_files=[MINIMAL],
        set_values={"kafka.sasl.existingSecret": "user", "kafka.sasl.mountPath": "/run/sasl/"},
    )
    assert _env(docs)["LOCKGATE_SASL_PASSWORD_FILE"]["value"] == "/run/sasl/password"
    assert not [
        v
        for v in _pod(render(values_files=[MINIMAL]))["spec"]["volumes"]
        if v["name"] == "kafka-sasl"
    ]


@pytest.mark.parametrize(
    ("set_values", "message"),
    [
        ({"kafka.sasl.mountPath": "/etc/lockgate/kafka-tls"}, "must be separate directories"),
        ({"kafka.sasl.mountPath": "/etc/lockgate/kafka-tls/sasl"}, "must be separate directories"),
        ({"kafka.tls.mountPath": "/etc/lockgate/kafka-sasl/tls"}, "must be separate directories"),
        ({"kafka.sasl.mountPath": "etc/sasl"}, "does not match pattern"),
        ({"kafka.sasl.passwordFile": "/p"}, "additional properties 'passwordFile'"),
    ],
    ids=["same", "sasl-inside-tls", "tls-inside-sasl", "relative", "typo"],
)
def test_bad_sasl_mount_path_is_refused(set_values: dict[str, Any], message: str) -> None:
    with pytest.raises(HelmError, match=message):
        render(values_files=[PRODUCTION], set_values=set_values)


def test_credential_rotation_annotations() -> None:
    annotations = _pod(render(values_files=[STRIMZI]))["metadata"]["annotations"]
    assert annotations["lockgate.io/credentials-revision"] == "2026-11-01"
    # helm template sees no cluster: lookup finds no Secret, so no checksum is rendered.
    docs = render(values_files=[STRIMZI], set_values={"credentialRotation.lookupSecrets": True})
    assert "checksum/kafka-credentials" not in _pod(docs)["metadata"]["annotations"]
    plain = _pod(render(values_files=[MINIMAL]))["metadata"]["annotations"]
    assert plain == {"kubectl.kubernetes.io/default-container": "processor"}


def _chart_with_secrets(tmp_path: Path, secrets: dict[str, dict[str, str]]) -> Path:
    """A copy of the chart whose Secret lookups answer from ``secrets`` (helm template has no
    cluster, so ``lookup`` finds nothing there)."""
    chart = tmp_path / "lockgate"
    shutil.copytree(CHART_DIR, chart)
    helpers = chart / "templates" / "_helpers.tpl"
    text = helpers.read_text()
    stubbed = re.sub(
        r'lookup "v1" "Secret" \$\.Release\.Namespace (\S+)',
        r'index (include "test.secrets" $ | fromYaml) \1',
        text,
    )
    assert 'lookup "v1"' not in stubbed and "test.secrets" in stubbed, "lookups changed"
    data = {name: {"data": keys} for name, keys in secrets.items()}
    helpers.write_text(
        stubbed + '\n{{- define "test.secrets" -}}\n' + yaml.safe_dump(data) + "{{- end }}\n"
    )
    return chart


def _checksum(chart: Path, values_file: Path) -> str | None:
    docs = render(
        values_files=[values_file],
        set_values={"credentialRotation.lookupSecrets": True},
        chart=chart,
    )
    value: str | None = _pod(docs)["metadata"]["annotations"].get("checksum/kafka-credentials")
    return value


def test_the_lookup_checksum_covers_every_credential(tmp_path: Path) -> None:
    """Each credential Secret counts, the SASL password included.

    The password file reaches the clients created after the kubelet updated it, but the
    consumer and producer created at start keep the password they were given (and reconnect
    with it), so an upgrade after a password rotation still rolls the pods.
    """
    user = {"username": "dXNlcg==", "password": "b2xk"}
    ca = {"ca.crt": "Q0E=", "user.crt": "Q1JU", "user.key": "S0VZ"}
    key_password = {"password": "a3A="}
    base = {"sums-kafka-user": user, "kafka-cluster-ca": ca, "sums-key-password": key_password}

    def checksum(secrets: dict[str, dict[str, str]], name: str) -> str | None:
        return _checksum(_chart_with_secrets(tmp_path / name, secrets), PRODUCTION)

    first = checksum(base, "base")
    assert first is not None
    assert checksum(base, "again") == first
    changed = {
        "password": {**base, "sums-kafka-user": {**user, "password": "bmV3"}},
        "username": {**base, "sums-kafka-user": {**user, "username": "b3RoZXI="}},
        "certificate": {**base, "kafka-cluster-ca": {**ca, "user.crt": "TkVX"}},
        "key-password": {**base, "sums-key-password": {"password": "bmV3"}},
    }
    for name, secrets in changed.items():
        assert checksum(secrets, name) != first, name
    # A Secret the release does not reference changes nothing.
    assert checksum({**base, "unrelated": {"x": "eQ=="}}, "unrelated") == first


# --- item 7: scheduling, rollouts, sidecars, image -------------------------------------------


def test_default_soft_pod_anti_affinity() -> None:
    selector = one_manifest(render(values_files=[MINIMAL]), "StatefulSet")["spec"]["selector"]
    affinity = _pod(render(values_files=[MINIMAL]))["spec"]["affinity"]
    assert affinity == {
        "podAntiAffinity": {
            "preferredDuringSchedulingIgnoredDuringExecution": [
                {
                    "weight": 100,
                    "podAffinityTerm": {
                        "topologyKey": "kubernetes.io/hostname",
                        "labelSelector": {"matchLabels": selector["matchLabels"]},
                    },
                }
            ]
        }
    }
    hard = _pod(render(values_files=[MINIMAL], set_values={"podAntiAffinityPreset": "hard"}))
    terms = hard["spec"]["affinity"]["podAntiAffinity"]
    assert list(terms) == ["requiredDuringSchedulingIgnoredDuringExecution"]
    none = _pod(render(values_files=[MINIMAL], set_values={"podAntiAffinityPreset": "none"}))
    assert "affinity" not in none["spec"]
    # An explicit podAntiAffinity wins; other affinity kinds keep the preset.
    node = {"nodeAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": []}}
    mixed = _pod(render(values_files=[MINIMAL], set_values={"affinity": node}))
    assert set(mixed["spec"]["affinity"]) == {"nodeAffinity", "podAntiAffinity"}
    prod = _pod(render(values_files=[PRODUCTION]))["spec"]["affinity"]["podAntiAffinity"]
    [term] = prod["preferredDuringSchedulingIgnoredDuringExecution"]
    assert term["podAffinityTerm"]["labelSelector"] == {
        "matchLabels": {"app.kubernetes.io/instance": "sums"}
    }


def test_topology_spread_gets_the_release_selector() -> None:
    docs = render(
        values_files=[STRIMZI],
        set_values={
            "topologySpreadConstraints": [
                {
                    "maxSkew": 1,
                    "topologyKey": "topology.kubernetes.io/zone",
                    "whenUnsatisfiable": "ScheduleAnyway",
                },
                {
                    "maxSkew": 2,
                    "topologyKey": "kubernetes.io/hostname",
                    "whenUnsatisfiable": "DoNotSchedule",
                    "labelSelector": {"matchLabels": {"team": "payments"}},
                },
            ]
        },
    )
    sts = one_manifest(docs, "StatefulSet")
    first, second = sts["spec"]["template"]["spec"]["topologySpreadConstraints"]
    assert first["labelSelector"] == {"matchLabels": sts["spec"]["selector"]["matchLabels"]}
    assert second["labelSelector"] == {"matchLabels": {"team": "payments"}}


def test_priority_class_partition_and_digest() -> None:
    docs = render(values_files=[STRIMZI])
    sts = one_manifest(docs, "StatefulSet")
    assert sts["spec"]["updateStrategy"] == {
        "type": "RollingUpdate",
        "rollingUpdate": {"partition": 2},
    }
    assert sts["spec"]["template"]["spec"]["priorityClassName"] == "streaming-critical"
    container = statefulset_container_spec(docs)
    assert container["image"] == (
        "registry.example.com/streaming/sums@sha256:"
        "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"
    )
    # The tag stays the version label.
    assert sts["metadata"]["labels"]["app.kubernetes.io/version"] == "1.5.0"
    minimal = one_manifest(render(values_files=[MINIMAL]), "StatefulSet")
    assert "priorityClassName" not in minimal["spec"]["template"]["spec"]


def test_extra_volumes_mounts_and_sidecars() -> None:
    docs = render(values_files=[STRIMZI])
    pod = _pod(docs)["spec"]
    assert [c["name"] for c in pod["containers"]] == ["processor", "log-shipper"]
    assert {"name": "exporter-config", "configMap": {"name": "sums-exporter"}} in pod["volumes"]
    mounts = statefulset_container_spec(docs)["volumeMounts"]
    assert mounts[-1] == {"name": "exporter-config", "mountPath": "/etc/sums", "readOnly": True}


# --- item 7: alerts -------------------------------------------------------------------------


def _exported_series() -> dict[str, set[str]]:
    """Series names the runtime exports on /metrics, with their label names."""
    from prometheus_client import generate_latest
    from prometheus_client.parser import text_string_to_metric_families

    from processors._runtime.health import Metrics, metrics_registry

    m = Metrics("sums", "sums-lockgate-0")
    m.watermark_ms = 1_700_000_000_000  # the watermark series exists once there is one
    text = generate_latest(metrics_registry(m)).decode()
    out: dict[str, set[str]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            out.setdefault(sample.name, set()).update(sample.labels)
    return out


def test_prometheus_rule_uses_the_series_the_runtime_exports() -> None:
    docs = render(values_files=[STRIMZI])
    rule = one_manifest(docs, "PrometheusRule")
    assert rule["metadata"]["labels"]["release"] == "prometheus"
    [group] = rule["spec"]["groups"]
    alerts = {r["alert"]: r for r in group["rules"]}
    assert set(alerts) == {
        "LockgateConsumerLag",
        "LockgateRestoreStuck",
        "LockgateEpochsAborting",
        "LockgateDeadLetters",
        "LockgateKeyGroupsHalted",
        "LockgateNoCheckpoint",
        "LockgateWatermarkLag",
        "LockgateCrashLooping",
    }
    # Crash restarts come from kube-state-metrics, selected by the release's pods.
    crash = alerts.pop("LockgateCrashLooping")["expr"]
    assert "kube_pod_container_status_restarts_total{" in crash
    assert "lockgate_" not in crash
    exported = _exported_series()
    for name, rule_ in alerts.items():
        expr = rule_["expr"]
        series = set(re.findall(r"\blockgate_[a-z_]+", expr))
        assert series, name
        assert series <= set(exported), f"{name}: {series - set(exported)} not exported"
        for s in series:
            assert "app" in exported[s], s
        # Selected by app (= appName), never by the instance-id label being renamed.
        assert 'app="sums"' in expr, name
        assert "instance" not in expr, name
    assert alerts["LockgateDeadLetters"]["expr"].endswith("> 10")
    assert alerts["LockgateConsumerLag"]["for"] == "15m"
    assert "{{ $labels.pod }}" in alerts["LockgateRestoreStuck"]["annotations"]["description"]
    halted = alerts["LockgateKeyGroupsHalted"]
    assert halted["expr"] == 'max by (app, pod) (lockgate_key_groups_halted{app="sums"}) > 0'
    assert halted["for"] == "10m"


def test_a_liveness_restart_has_its_own_short_grace_period() -> None:
    """A hung process never handles SIGTERM: the probe's restart must not wait the pod's
    whole grace period (the platform trial saw 91 s from a stall to a restart)."""
    pod = one_manifest(render(values_files=[MINIMAL]), "StatefulSet")["spec"]["template"]["spec"]
    [container] = pod["containers"]
    assert container["livenessProbe"]["terminationGracePeriodSeconds"] == 15
    assert pod["terminationGracePeriodSeconds"] > 15
    unset = one_manifest(
        render(
            values_files=[MINIMAL],
            set_values={"probes.liveness.terminationGracePeriodSeconds": None},
        ),
        "StatefulSet",
    )
    [container] = unset["spec"]["template"]["spec"]["containers"]
    assert "terminationGracePeriodSeconds" not in container["livenessProbe"]


def test_prometheus_rule_is_off_by_default() -> None:
    assert not manifests(render(values_files=[PRODUCTION]), "PrometheusRule")


# --- item 7: network policy -----------------------------------------------------------------


def test_network_policy() -> None:
    docs = render(values_files=[STRIMZI])
    policy = one_manifest(docs, "NetworkPolicy")
    selector = one_manifest(docs, "StatefulSet")["spec"]["selector"]
    assert policy["spec"]["podSelector"] == selector
    assert policy["spec"]["policyTypes"] == ["Ingress", "Egress"]
    [ingress] = policy["spec"]["ingress"]
    assert ingress["ports"] == [{"port": "http", "protocol": "TCP"}]
    assert ingress["from"][0]["namespaceSelector"]["matchLabels"] == {
        "kubernetes.io/metadata.name": "monitoring"
    }
    dns, kafka, api = policy["spec"]["egress"]
    assert {p["port"] for p in dns["ports"]} == {53}
    assert kafka["ports"] == [{"port": 9093, "protocol": "TCP"}]
    assert kafka["to"][0]["podSelector"]["matchLabels"] == {"strimzi.io/cluster": "my-cluster"}
    # kafka.leaveGroupOnScaleDown (default on): the one StatefulSet read at SIGTERM.
    assert api["ports"] == [{"port": 443, "protocol": "TCP"}, {"port": 6443, "protocol": "TCP"}]
    off = render({"kafka": {"leaveGroupOnScaleDown": False}}, values_files=[STRIMZI])
    assert len(one_manifest(off, "NetworkPolicy")["spec"]["egress"]) == 2
    assert not manifests(render(values_files=[MINIMAL]), "NetworkPolicy")


def test_scale_down_leave_reads_only_its_own_statefulset() -> None:
    """kafka.leaveGroupOnScaleDown: a Role on this StatefulSet (get only), a projected token."""
    docs = render(values_files=[MINIMAL])
    sts = one_manifest(docs, "StatefulSet")
    role, binding = one_manifest(docs, "Role"), one_manifest(docs, "RoleBinding")
    assert role["rules"] == [
        {
            "apiGroups": ["apps"],
            "resources": ["statefulsets"],
            "resourceNames": [sts["metadata"]["name"]],
            "verbs": ["get"],
        }
    ]
    assert binding["roleRef"]["name"] == role["metadata"]["name"]
    [subject] = binding["subjects"]
    assert subject["name"] == sts["spec"]["template"]["spec"]["serviceAccountName"]
    env = _env(docs)
    assert env["LOCKGATE_LEAVE_GROUP_ON_STOP"]["value"] == "scale-down"
    token_dir = env["LOCKGATE_KUBERNETES_TOKEN_DIR"]["value"]
    pod = sts["spec"]["template"]["spec"]
    [mount] = [m for m in pod["containers"][0]["volumeMounts"] if m["name"] == "kubernetes-api"]
    assert mount["mountPath"] == token_dir and mount["readOnly"] is True
    [volume] = [v for v in pod["volumes"] if v["name"] == "kubernetes-api"]
    sources = volume["projected"]["sources"]
    assert sources[0]["serviceAccountToken"] == {"path": "token", "expirationSeconds": 3600}
    assert sources[1]["configMap"]["items"] == [{"key": "ca.crt", "path": "ca.crt"}]
    assert sources[2]["downwardAPI"]["items"][0]["path"] == "namespace"
    assert pod["automountServiceAccountToken"] is False  # the default token stays unmounted

    off = render({"kafka": {"leaveGroupOnScaleDown": False}}, values_files=[MINIMAL])
    assert not manifests(off, "Role") and not manifests(off, "RoleBinding")
    assert _env(off)["LOCKGATE_LEAVE_GROUP_ON_STOP"]["value"] == "never"
    assert "LOCKGATE_KUBERNETES_TOKEN_DIR" not in _env(off)
    off_pod = one_manifest(off, "StatefulSet")["spec"]["template"]["spec"]
    assert "kubernetes-api" not in {v["name"] for v in off_pod["volumes"]}


# --- item 8: release isolation --------------------------------------------------------------


def test_app_name_is_required_and_not_derived_from_the_release() -> None:
    with pytest.raises(HelmError, match="appName is required"):
        render(values_files=[MINIMAL], set_values={"appName": ""})
    env = _env(render(values_files=[MINIMAL], release="other"))
    assert env["LOCKGATE_APP_NAME"]["value"] == "sums"


def _runtime_names(app: str, instance: str) -> dict[str, Any]:
    """Topic, group and transactional-id names as the runtime builds them."""
    from processors._checkpoint.control_topics import REGISTRY_TOPIC, control_topic
    from processors._config.settings import Settings
    from processors._kafka.clients import consumer_config, restore_consumer_config
    from processors._ops.dlq import dlq_topic
    from state.cache import changelog_topic

    settings = Settings(instance_id=instance, app_name=app)
    return {
        "changelog": changelog_topic(app, "sums"),
        "dlq": dlq_topic(app),
        "control": control_topic(app),
        "registry": REGISTRY_TOPIC,
        "group": consumer_config(settings, app)["group.id"],
        "restore_group": restore_consumer_config(settings, app)["group.id"],
        # processors/_runtime/epoch.py: transactional.id = <app>-<instance id>
        "transactional_id": f"{app}-{instance}",
    }


def _allowed(acls: list[dict[str, Any]], kind: str, name: str) -> set[str]:
    ops: set[str] = set()
    for acl in acls:
        res = acl["resource"]
        if res["type"] != kind:
            continue
        pattern = res.get("patternType", "literal")
        if (pattern == "literal" and res.get("name") == name) or (
            pattern == "prefix" and name.startswith(res["name"])
        ):
            ops |= set(acl["operations"])
    return ops


#: Strimzi's names of the ACL resource types, pattern types and operations, as in Kafka's API.
_STRIMZI_NAMES = {
    "topic": "TOPIC",
    "group": "GROUP",
    "transactionalId": "TRANSACTIONAL_ID",
    "cluster": "CLUSTER",
    "literal": "LITERAL",
    "prefix": "PREFIXED",
    "Read": "READ",
    "Write": "WRITE",
    "Create": "CREATE",
    "Describe": "DESCRIBE",
    "DescribeConfigs": "DESCRIBE_CONFIGS",
    "IdempotentWrite": "IDEMPOTENT_WRITE",
}


def _granted(acls: list[dict[str, Any]]) -> set[tuple[str, str, str, str]]:
    """(resource type, name, pattern type, operation) of each Strimzi ACL, in Kafka's names."""
    out = set()
    for acl in acls:
        res = acl["resource"]
        assert acl.get("type", "allow") == "allow", acl
        for op in acl["operations"]:
            out.add(
                (
                    _STRIMZI_NAMES[res["type"]],
                    res.get("name", "kafka-cluster"),
                    _STRIMZI_NAMES[res.get("patternType", "literal")],
                    _STRIMZI_NAMES[op],
                )
            )
    return out


@pytest.mark.parametrize("guarantee", ["exactly_once", "at_least_once"])
def test_kafka_user_grants_exactly_the_documented_acls(guarantee: str) -> None:
    """The KafkaUser's ACLs are the set the security tier grants and runs the app with
    (tests/security/support.py ``app_acls``, docs/security.md): no more, no less."""
    from tests.security.support import app_acls

    docs = render(values_files=[STRIMZI], set_values={"processing.guarantee": guarantee})
    user = one_manifest(docs, "KafkaUser")
    sts = one_manifest(docs, "StatefulSet")
    assert user["metadata"]["name"] == sts["metadata"]["name"]  # = the Secret Strimzi writes
    assert user["metadata"]["labels"]["strimzi.io/cluster"] == "my-cluster"
    assert user["spec"]["authentication"] == {"type": "scram-sha-512"}
    documented = {
        (a.resource.name, a.name, a.pattern.name, a.operation.name)
        for a in app_acls("sums", ["payments"], ["sums"])
        # at_least_once: no transactional producer (docs/security.md)
        if guarantee == "exactly_once" or a.resource.name != "TRANSACTIONAL_ID"
    }
    assert _granted(user["spec"]["authorization"]["acls"]) == documented
    # The names are the runtime's: its group, restore group, internal topics, transactional id.
    acls = user["spec"]["authorization"]["acls"]
    names = _runtime_names("sums", "sums-lockgate-3")
    for topic in ("changelog", "dlq", "control"):
        assert _allowed(acls, "topic", names[topic]) >= {"Read", "Write", "Create"}, topic
    assert _allowed(acls, "topic", names["registry"]) == {"Read", "Write"}
    assert _allowed(acls, "group", names["group"]) == {"Read"}
    assert _allowed(acls, "group", names["restore_group"]) == {"Describe"}
    txn = _allowed(acls, "transactionalId", names["transactional_id"])
    assert txn == ({"Write"} if guarantee == "exactly_once" else set())
    # Nothing of another app: its internal topics, its group, its transactional ids.
    other = _runtime_names("totals", "totals-lockgate-0")
    for topic in ("changelog", "dlq", "control"):
        assert not _allowed(acls, "topic", other[topic]), topic
    assert not _allowed(acls, "group", other["group"])
    assert not _allowed(acls, "transactionalId", other["transactional_id"])


def test_kafka_user_tls_and_extra_acls() -> None:
    extra = {
        "resource": {"type": "topic", "name": "audit", "patternType": "literal"},
        "operations": ["Write"],
    }
    user = one_manifest(
        render(
            values_files=[STRIMZI],
            set_values={
                "strimzi.kafkaUser.authentication": "tls",
                "strimzi.kafkaUser.extraAcls": [extra],
            },
        ),
        "KafkaUser",
    )
    assert user["spec"]["authentication"] == {"type": "tls"}
    assert user["spec"]["authorization"]["acls"][-1] == extra


def test_kafka_topics_match_the_runtime() -> None:
    from processors._checkpoint.control_topics import CONTROL_CONFIG
    from processors._kafka.clients import CHANGELOG_CONFIG

    docs = render(values_files=[STRIMZI])
    topics = {t["spec"]["topicName"]: t for t in manifests(docs, "KafkaTopic")}
    names = _runtime_names("sums", "sums-lockgate-0")
    assert set(topics) == {names["changelog"], names["dlq"], names["control"]}
    for topic in topics.values():
        assert topic["spec"]["partitions"] == 8  # kafka.inputPartitions
        assert topic["spec"]["replicas"] == 3
        assert topic["metadata"]["labels"]["strimzi.io/cluster"] == "my-cluster"
        assert topic["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep"
    assert topics[names["changelog"]]["spec"]["config"] == dict(CHANGELOG_CONFIG)
    assert topics[names["control"]]["spec"]["config"] == dict(CONTROL_CONFIG)
    assert "config" not in topics[names["dlq"]]["spec"]
    # The shared registry only on request (one release per cluster renders it).
    docs = render(values_files=[STRIMZI], set_values={"strimzi.kafkaTopics.registry": True})
    [registry] = [
        t for t in manifests(docs, "KafkaTopic") if t["spec"]["topicName"] == names["registry"]
    ]
    assert registry["spec"]["partitions"] == 1
    assert registry["spec"]["config"] == dict(CONTROL_CONFIG)


def test_kafka_topic_resource_names_are_valid() -> None:
    docs = render(values_files=[STRIMZI], set_values={"strimzi.stores": ["Daily_Totals"]})
    names = {t["spec"]["topicName"]: t["metadata"]["name"] for t in manifests(docs, "KafkaTopic")}
    assert names["sums.Daily_Totals.changelog"] == "sums.daily-totals.changelog"


@pytest.mark.parametrize(
    ("set_values", "message"),
    [
        ({"strimzi.clusterName": ""}, "strimzi.clusterName is required"),
        ({"kafka.inputPartitions": 0}, "strimzi.kafkaTopics needs kafka.inputPartitions"),
    ],
)
def test_strimzi_resources_need_their_inputs(set_values: dict[str, Any], message: str) -> None:
    with pytest.raises(HelmError, match=message):
        render(values_files=[STRIMZI], set_values=set_values)


# --- item 3: session timeout and grace period -----------------------------------------------


def test_session_timeout_is_a_value() -> None:
    env = _env(render(values_files=[MINIMAL], set_values={"kafka.sessionTimeoutMs": 120000}))
    assert env["LOCKGATE_KAFKA__SESSION_TIMEOUT_MS"]["value"] == "120000"
    # In kafka.config it would be set twice: the schema refuses it there.
    with pytest.raises(HelmError, match="false schema"):
        render(values_files=[MINIMAL], set_values={"kafka.config.session\\.timeout\\.ms": 1})
    with pytest.raises(HelmError, match="heartbeat.interval.ms .* must be lower"):
        render(
            values_files=[MINIMAL],
            set_values={
                "kafka.sessionTimeoutMs": 10000,
                "kafka.config.heartbeat\\.interval\\.ms": 10000,
            },
        )
    # The broker's default bounds (group.min/max.session.timeout.ms).
    for bad in (5999, 1800001):
        with pytest.raises(HelmError, match="sessionTimeoutMs"):
            render(values_files=[MINIMAL], set_values={"kafka.sessionTimeoutMs": bad})


# --- item 1: minReadySeconds ----------------------------------------------------------------


def test_min_ready_seconds_holds_a_rolling_update_after_readiness() -> None:
    sts = one_manifest(render(values_files=[MINIMAL]), "StatefulSet")
    assert sts["spec"]["minReadySeconds"] == 10
    # Readiness is what it waits on: /readyz (joined, first assignment, key groups restored).
    container = statefulset_container_spec([sts])
    assert container["readinessProbe"]["httpGet"]["path"] == "/readyz"
    sts = one_manifest(render(values_files=[QUERY]), "StatefulSet")
    assert sts["spec"]["minReadySeconds"] == 30
    zero = render(values_files=[MINIMAL], set_values={"minReadySeconds": 0})
    assert one_manifest(zero, "StatefulSet")["spec"]["minReadySeconds"] == 0


@pytest.mark.parametrize(
    ("value", "message"),
    [(-1, "minimum"), ("10", "want integer"), (1.5, "want integer"), (3601, "maximum")],
    ids=["negative", "string", "fraction", "too-long"],
)
def test_bad_min_ready_seconds_is_refused(value: Any, message: str) -> None:
    with pytest.raises(HelmError, match=message):
        render(values_files=[MINIMAL], set_values={"minReadySeconds": value})


# --- queryable state ------------------------------------------------------------------------


def test_query_is_off_by_default() -> None:
    docs = render(values_files=[STRIMZI])
    env = _env(docs)
    assert env["LOCKGATE_QUERY_ENABLED"]["value"] == "false"
    assert not {n for n in env if n.startswith("LOCKGATE_QUERY_") and n != "LOCKGATE_QUERY_ENABLED"}
    policy = one_manifest(docs, "NetworkPolicy")
    assert len(policy["spec"]["ingress"]) == 1
    assert len(policy["spec"]["egress"]) == 3  # DNS, the brokers, the API server only


def test_query_env_and_peer_url() -> None:
    docs = render(values_files=[QUERY], namespace="streams")
    env = _env(docs)
    assert env["LOCKGATE_QUERY_ENABLED"]["value"] == "true"
    assert env["LOCKGATE_QUERY_TIMEOUT_MS"]["value"] == "2000"
    assert env["LOCKGATE_QUERY_TOKEN"] == {
        "name": "LOCKGATE_QUERY_TOKEN",
        "valueFrom": {"secretKeyRef": {"name": "sums-query-token", "key": "token"}},
    }
    url = env["LOCKGATE_QUERY_PEER_URL"]["value"]
    # The runtime's placeholder survives Helm templating literally.
    assert url == "http://{instance}.sums-lockgate-headless.streams.svc:8080"
    # {instance} is the instance id, the pod name: the URL is that pod's DNS name under the
    # headless Service that governs the StatefulSet.
    sts = one_manifest(docs, "StatefulSet")
    svc = one_manifest(docs, "Service")
    assert svc["spec"]["clusterIP"] == "None"
    assert sts["spec"]["serviceName"] == svc["metadata"]["name"]
    assert svc["spec"]["publishNotReadyAddresses"] is True
    assert env["LOCKGATE_INSTANCE_ID"]["valueFrom"] == {"fieldRef": {"fieldPath": "metadata.name"}}
    pod = f"{sts['metadata']['name']}-2"
    assert url.replace("{instance}", pod) == (
        f"http://{pod}.{svc['metadata']['name']}.streams.svc:{svc['spec']['ports'][0]['port']}"
    )


def test_query_peer_url_follows_names_and_port() -> None:
    docs = render(
        values_files=[SINGLE],
        set_values={"query.enabled": True, "fullnameOverride": "totals"},
        namespace="team-a",
    )
    env = _env(docs)
    assert env["LOCKGATE_QUERY_PEER_URL"]["value"] == (
        "http://{instance}.totals-headless.team-a.svc:9090"
    )
    assert env["LOCKGATE_QUERY_TIMEOUT_MS"]["value"] == "5000"
    assert "LOCKGATE_QUERY_TOKEN" not in env  # no tokenSecret: no authentication


def test_network_policy_lets_the_release_pods_forward_queries() -> None:
    docs = render(values_files=[QUERY])
    policy = one_manifest(docs, "NetworkPolicy")
    pod_labels = one_manifest(docs, "StatefulSet")["spec"]["template"]["metadata"]["labels"]
    metrics, peers = policy["spec"]["ingress"]
    assert metrics["from"][0]["namespaceSelector"]  # metricsFrom unchanged
    assert peers["ports"] == [{"port": "http", "protocol": "TCP"}]
    [peer] = peers["from"]
    assert set(peer) == {"podSelector"}  # same namespace only
    assert peer["podSelector"]["matchLabels"].items() <= pod_labels.items()
    dns, kafka, forward, _api = policy["spec"]["egress"]
    assert {p["port"] for p in dns["ports"]} == {53}
    assert kafka["ports"] == [{"port": 9093, "protocol": "TCP"}]
    assert forward["ports"] == [{"port": 8080, "protocol": "TCP"}]
    [target] = forward["to"]
    assert set(target) == {"podSelector"}
    assert target["podSelector"]["matchLabels"].items() <= pod_labels.items()
    # The egress port is the http port's number (the same pods listen on it).
    other = render(
        values_files=[QUERY], set_values={"httpPort": 9191, "networkPolicy.extraEgress": []}
    )
    egress = one_manifest(other, "NetworkPolicy")["spec"]["egress"]
    assert egress[2]["ports"] == [{"port": 9191, "protocol": "TCP"}]


@pytest.mark.parametrize(
    ("set_values", "message"),
    [
        (
            {"query.enabled": False},
            "query.tokenSecret needs query.enabled",
        ),
        ({"query.tokenKey": ""}, "minLength"),
        ({"query.tokenSecret": "Not_A_Secret"}, "does not match pattern"),
        ({"query.timeoutMs": 50}, "minimum"),
        ({"query.timeoutMs": "5000"}, "want integer"),
        ({"query.token": "hunter2"}, "additional properties 'token' not allowed"),
        ({"query.enabled": "true"}, "want boolean"),
        ({"env": {"LOCKGATE_QUERY_ENABLED": "true"}}, "LOCKGATE_QUERY_ENABLED is set twice"),
        ({"env": {"LOCKGATE_QUERY_PEER_URL": "http://x"}}, "LOCKGATE_QUERY_PEER_URL is set twice"),
    ],
    ids=[
        "token-without-query",
        "token-secret-without-key",
        "secret-name",
        "timeout-too-short",
        "timeout-type",
        "literal-token",
        "enabled-type",
        "enabled-in-env",
        "peer-url-in-env",
    ],
)
def test_bad_query_values_are_refused(set_values: dict[str, Any], message: str) -> None:
    with pytest.raises(HelmError, match=message):
        render(values_files=[QUERY], set_values=set_values)


def test_memory_limit_reaches_the_runtime_through_the_downward_api() -> None:
    """limits.memory -> LOCKGATE_MEMORY_LIMIT_BYTES (the whole memory plan is sized from it)."""
    env = _env(render(values_files=[MINIMAL]))
    assert env["LOCKGATE_MEMORY_LIMIT_BYTES"]["valueFrom"] == {
        "resourceFieldRef": {"resource": "limits.memory"}
    }
    # No limit: the downward API would give the node's allocatable memory; the runtime
    # reads the cgroup (none: 2 GiB) instead.
    unlimited = render({"resources": {"limits": {"memory": None}}}, values_files=[MINIMAL])
    assert "LOCKGATE_MEMORY_LIMIT_BYTES" not in _env(unlimited)
