"""The chart's savepoint storage, savepoint Jobs and upgrade.mode=savepoint (rendered only).

What a cluster would do with them (the hook's timing, a real rolling update) is not tested
here; the runtime half (pods resuming from their halt) is tests/integration/
test_savepoint_running_sum.py::test_a_helm_savepoint_upgrade_rolls_instances_that_resume_from_their_halt.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest

from processors._config.settings import load_settings
from tests.support.helm import (
    CHART_DIR,
    HelmError,
    container_env,
    manifests,
    one_manifest,
    render,
    statefulset_container_spec,
)

VALUES_DIR = Path(__file__).resolve().parent / "values"
MINIMAL = VALUES_DIR / "minimal.yaml"
PRODUCTION = VALUES_DIR / "production.yaml"
UPGRADE = VALUES_DIR / "savepoint-upgrade.yaml"

S3 = {"savepoints.location": "s3://bucket/prefix"}


def _env(docs: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {e["name"]: e for e in statefulset_container_spec(docs)["env"]}


def _hook_docs(docs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [d for d in docs if "helm.sh/hook" in (d["metadata"].get("annotations") or {})]


def _job(docs: list[dict[str, Any]]) -> dict[str, Any]:
    return one_manifest(docs, "Job")


def _job_container(job: dict[str, Any]) -> dict[str, Any]:
    (container,) = job["spec"]["template"]["spec"]["containers"]
    return container


# --- storage ---------------------------------------------------------------------------------


def test_no_savepoint_location_by_default() -> None:
    docs = render(values_files=[MINIMAL])
    assert "LOCKGATE_SAVEPOINT_DIR" not in _env(docs)
    assert "LOCKGATE_RESUME_FROM_STOP_SAVEPOINT" not in _env(docs)
    assert not manifests(docs, "PersistentVolumeClaim")
    assert not _hook_docs(docs)
    assert not manifests(docs, "CronJob")


def test_an_object_store_location_with_credentials_from_a_secret() -> None:
    docs = render(values_files=[UPGRADE])
    env = _env(docs)
    assert env["LOCKGATE_SAVEPOINT_DIR"]["value"] == "s3://lockgate-savepoints/sums"
    assert env["AWS_ENDPOINT_URL"]["value"] == "http://minio.storage.svc:9000"
    assert env["FSSPEC_S3_ENDPOINT_URL"]["value"] == "http://minio.storage.svc:9000"
    assert env["AWS_ACCESS_KEY_ID"]["valueFrom"] == {
        "secretKeyRef": {"name": "savepoint-store", "key": "access-key"}
    }
    assert env["AWS_SECRET_ACCESS_KEY"]["valueFrom"] == {
        "secretKeyRef": {"name": "savepoint-store", "key": "secret-key"}
    }
    # No credential value in any manifest.
    assert "secret-key\n" not in str(docs).replace("'secret-key'", "")
    assert not manifests(docs, "PersistentVolumeClaim")


def test_credentials_as_env_from_a_whole_secret() -> None:
    docs = render(
        values_files=[PRODUCTION],
        set_values={**S3, "savepoints.credentials.envFromSecret": "gcs-credentials"},
    )
    container = statefulset_container_spec(docs)
    # The chart's Secret first, the user's envFrom after it (later sources win a clash).
    assert container["envFrom"] == [
        {"secretRef": {"name": "gcs-credentials"}},
        {"configMapRef": {"name": "sums-extra-settings"}},
    ]
    assert "AWS_ACCESS_KEY_ID" not in _env(docs)  # no existingSecret: no secretKeyRef


def test_a_chart_rendered_claim_shared_by_every_pod() -> None:
    docs = render(
        values_files=[MINIMAL],
        set_values={
            "savepoints.persistentVolumeClaim.enabled": True,
            "savepoints.persistentVolumeClaim.size": "50Gi",
            "savepoints.persistentVolumeClaim.storageClassName": "nfs",
        },
    )
    claim = one_manifest(docs, "PersistentVolumeClaim")
    assert claim["metadata"]["name"] == "sums-lockgate-savepoints"
    assert claim["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep"
    assert claim["spec"] == {
        "accessModes": ["ReadWriteMany"],
        "storageClassName": "nfs",
        "resources": {"requests": {"storage": "50Gi"}},
    }
    # `kubectl delete pvc -l <the state volumes' selector>` (docs, NOTES) must not match it.
    sts = one_manifest(docs, "StatefulSet")
    selector = sts["spec"]["selector"]["matchLabels"]
    labels = claim["metadata"]["labels"]
    assert not all(labels.get(k) == v for k, v in selector.items())
    pod = sts["spec"]["template"]["spec"]
    assert {
        "name": "savepoints",
        "persistentVolumeClaim": {"claimName": "sums-lockgate-savepoints"},
    } in pod["volumes"]
    mounts = statefulset_container_spec(docs)["volumeMounts"]
    assert {"name": "savepoints", "mountPath": "/var/lib/lockgate-savepoints"} in mounts
    assert _env(docs)["LOCKGATE_SAVEPOINT_DIR"]["value"] == "/var/lib/lockgate-savepoints"


def test_an_existing_claim_and_a_location_under_its_mount() -> None:
    docs = render(
        values_files=[MINIMAL],
        set_values={
            "savepoints.persistentVolumeClaim.enabled": True,
            "savepoints.persistentVolumeClaim.existingClaim": "shared-savepoints",
            "savepoints.persistentVolumeClaim.mountPath": "/savepoints",
            "savepoints.location": "/savepoints/click-pipeline",
        },
    )
    assert not manifests(docs, "PersistentVolumeClaim")
    pod = one_manifest(docs, "StatefulSet")["spec"]["template"]["spec"]
    assert {
        "name": "savepoints",
        "persistentVolumeClaim": {"claimName": "shared-savepoints"},
    } in pod["volumes"]
    assert _env(docs)["LOCKGATE_SAVEPOINT_DIR"]["value"] == "/savepoints/click-pipeline"


def test_a_location_outside_the_claim_is_refused() -> None:
    with pytest.raises(HelmError, match="must be savepoints.persistentVolumeClaim.mountPath"):
        render(
            values_files=[MINIMAL],
            set_values={
                "savepoints.persistentVolumeClaim.enabled": True,
                "savepoints.location": "/elsewhere",
            },
        )
    with pytest.raises(HelmError, match="must be savepoints.persistentVolumeClaim.mountPath"):
        render(
            values_files=[MINIMAL],
            set_values={"savepoints.persistentVolumeClaim.enabled": True, **S3},
        )


def test_a_variable_the_savepoint_values_set_is_not_set_twice() -> None:
    with pytest.raises(HelmError, match="LOCKGATE_SAVEPOINT_DIR is set twice"):
        render(values_files=[MINIMAL], set_values={**S3, "env.LOCKGATE_SAVEPOINT_DIR": "/x"})
    with pytest.raises(HelmError, match="AWS_ENDPOINT_URL is set twice"):
        render(
            values_files=[MINIMAL],
            set_values={
                **S3,
                "savepoints.endpointUrl": "http://minio:9000",
                "env.AWS_ENDPOINT_URL": "http://other:9000",
            },
        )


@pytest.mark.parametrize(
    ("set_values", "message"),
    [
        ({"savepoints.location": "bucket/prefix"}, "does not match pattern"),
        ({"savepoints.location": "s3://bucket with space"}, "does not match pattern"),
        ({"savepoints.persistentVolumeClaim.size": "lots"}, "does not match pattern"),
        (
            {"savepoints.persistentVolumeClaim.accessModes": ["ReadWriteSome"]},
            "value must be one of",
        ),
        ({"savepoints.persistentVolumeClaim.mountPath": "relative"}, "does not match pattern"),
        ({"savepoints.persistentVolumeClaim.existingClaim": "Bad_Name"}, "does not match pattern"),
        ({"savepoints.credentials.existingSecret": "Bad_Name"}, "does not match pattern"),
        ({"savepoints.credentials.env.1BAD": "key"}, "additional properties"),
        ({"savepoints.credentials.env.AWS_ACCESS_KEY_ID": ""}, "minLength"),
        ({"savepoints.endpointUrl": "minio:9000"}, "does not match pattern"),
        ({"savepoints.triggerTimeoutSeconds": 0}, "minimum"),
        ({"savepoints.cronJob.schedule": ""}, "minLength"),
        ({"savepoints.bucket": "x"}, "additional properties"),
        ({"upgrade.mode": "last-state"}, "value must be one of"),
        ({"upgrade.triggerSavepoint": "yes"}, "want boolean"),
        ({"savepoints.stopJobs.enabled": "yes"}, "want boolean"),
        ({"savepoints.stopJobs.schedule": "@hourly"}, "additional properties"),
        ({"networkPolicy.objectStorePorts": [70000]}, "maximum"),
        (
            {"networkPolicy.apiServerTo": [{"ipBlock": {"cidrs": "10.0.0.0/8"}}]},
            "additional properties",
        ),
    ],
    ids=[
        "relative-location",
        "location-with-space",
        "claim-size",
        "claim-access-mode",
        "mount-path",
        "claim-name",
        "secret-name",
        "env-name",
        "empty-secret-key",
        "endpoint-without-scheme",
        "zero-timeout",
        "empty-schedule",
        "unknown-key",
        "upgrade-mode",
        "trigger-type",
        "stop-jobs-type",
        "stop-jobs-schedule",
        "object-store-port",
        "api-server-peer",
    ],
)
def test_bad_savepoint_values_are_rejected(set_values: dict[str, Any], message: str) -> None:
    with pytest.raises(HelmError, match=message):
        render(values_files=[MINIMAL], set_values=set_values)


@pytest.mark.parametrize(
    "set_values",
    [
        {"upgrade.mode": "savepoint"},
        {"savepoints.cronJob.enabled": True},
        {"savepoints.stopJobs.enabled": True},
    ],
)
def test_savepoint_jobs_need_a_location(set_values: dict[str, Any]) -> None:
    with pytest.raises(HelmError, match="need a savepoint location"):
        render(values_files=[MINIMAL], set_values=set_values)


def test_secret_without_variables_is_refused() -> None:
    with pytest.raises(HelmError, match="needs savepoints.credentials.env"):
        render(
            values_files=[MINIMAL],
            values={
                "savepoints": {
                    "location": "s3://b/p",
                    "credentials": {
                        "existingSecret": "s",
                        # null removes a default key: no variable left.
                        "env": {"AWS_ACCESS_KEY_ID": None, "AWS_SECRET_ACCESS_KEY": None},
                    },
                }
            },
        )


# --- upgrade.mode=savepoint ------------------------------------------------------------------


def test_the_pre_upgrade_hook_takes_a_stop_with_savepoint() -> None:
    docs = render(values_files=[UPGRADE])
    job = _job(docs)
    annotations = job["metadata"]["annotations"]
    assert annotations["helm.sh/hook"] == "pre-upgrade"
    assert annotations["helm.sh/hook-delete-policy"] == "before-hook-creation,hook-succeeded"
    assert job["spec"]["backoffLimit"] == 0
    assert job["spec"]["activeDeadlineSeconds"] == 120 + 120
    pod = job["spec"]["template"]["spec"]
    assert pod["restartPolicy"] == "Never"
    container = _job_container(job)
    assert container["args"] == [
        "savepoint", "trigger", "--pipeline", "sums", "--stop", "--json", "--timeout", "120",
    ]  # fmt: skip
    assert container.get("command") is None  # the image's entrypoint, lockgate
    assert container["image"] == statefulset_container_spec(docs)["image"]


def test_the_hook_runs_with_the_release_environment() -> None:
    docs = render(values_files=[PRODUCTION], set_values={**S3, "upgrade.mode": "savepoint"})
    container = _job_container(_job(docs))
    processor = statefulset_container_spec(docs)
    assert container["env"] == processor["env"]
    assert container["envFrom"] == processor["envFrom"]
    # The Kafka credentials' volumes, not the API token's.
    mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
    assert mounts == {
        "tmp": "/tmp",
        "kafka-sasl": "/etc/lockgate/kafka-sasl",
        "kafka-tls": "/etc/lockgate/kafka-tls",
    }
    pod = _job(docs)["spec"]["template"]["spec"]
    sts_pod = one_manifest(docs, "StatefulSet")["spec"]["template"]["spec"]
    shared = [v for v in sts_pod["volumes"] if v["name"] in ("kafka-sasl", "kafka-tls")]
    assert [v for v in pod["volumes"] if v["name"] != "tmp"] == shared
    assert container["securityContext"] == processor["securityContext"]
    assert pod["securityContext"] == sts_pod["securityContext"]
    assert pod["imagePullSecrets"] == sts_pod["imagePullSecrets"]


def test_the_hook_environment_loads_as_operator_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    container = _job_container(_job(render(values_files=[UPGRADE])))
    env = container_env(
        container,
        pod_name="sums-lockgate-savepoint-upgrade-x2x4k",
        secrets={"savepoint-store": {"access-key": "AK", "secret-key": "SK"}},
    )
    for name in [n for n in list(__import__("os").environ) if n.startswith("LOCKGATE_")]:
        monkeypatch.delenv(name)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    unknown: list[str] = []
    settings = load_settings(on_unknown=unknown.extend)
    assert unknown == []
    assert settings.savepoint_dir == "s3://lockgate-savepoints/sums"
    assert settings.app_name == "sums"


def test_the_hook_has_a_service_account_without_token_or_role() -> None:
    docs = render(values_files=[UPGRADE])
    hooks = _hook_docs(docs)
    assert sorted(d["kind"] for d in hooks) == ["Job", "ServiceAccount"]
    (account,) = [d for d in hooks if d["kind"] == "ServiceAccount"]
    assert account["automountServiceAccountToken"] is False
    # Created before the Job (lower weight), as a hook: it exists on the upgrade that
    # enables upgrade.mode.
    assert int(account["metadata"]["annotations"]["helm.sh/hook-weight"]) < int(
        _job(docs)["metadata"]["annotations"]["helm.sh/hook-weight"]
    )
    pod = _job(docs)["spec"]["template"]["spec"]
    assert pod["serviceAccountName"] == account["metadata"]["name"]
    assert pod["automountServiceAccountToken"] is False
    # No Role or RoleBinding names it: it has no access to the Kubernetes API.
    for binding in manifests(docs, "RoleBinding") + manifests(docs, "ClusterRoleBinding"):
        assert all(s["name"] != account["metadata"]["name"] for s in binding["subjects"])
    assert not [d for d in hooks if d["kind"] in ("Role", "RoleBinding", "ClusterRole")]


def test_the_hook_pods_are_not_selected_as_processors() -> None:
    docs = render(values_files=[UPGRADE])
    labels = _job(docs)["spec"]["template"]["metadata"]["labels"]
    for kind in ("Service", "PodDisruptionBudget"):
        for doc in manifests(docs, kind):
            selector = doc["spec"]["selector"]
            selector = selector.get("matchLabels", selector)
            assert not all(labels.get(k) == v for k, v in selector.items()), kind


def test_savepoint_mode_resumes_pods_and_rolls_them_on_every_upgrade() -> None:
    docs = render(values_files=[UPGRADE])
    assert _env(docs)["LOCKGATE_RESUME_FROM_STOP_SAVEPOINT"]["value"] == "true"
    annotations = one_manifest(docs, "StatefulSet")["spec"]["template"]["metadata"]["annotations"]
    assert annotations["lockgate.io/upgrade-revision"] == "1"  # .Release.Revision
    # The savepoint id is never in the release.
    assert "LOCKGATE_FROM_SAVEPOINT" not in _env(docs)


@pytest.mark.parametrize(
    "set_values",
    [
        {"env.LOCKGATE_FROM_SAVEPOINT": "sp-20260101T000000Z-abcdef"},
        {"extraEnv": [{"name": "LOCKGATE_FROM_SAVEPOINT", "value": "sp-20260101T000000Z-abcdef"}]},
    ],
    ids=["env", "extraEnv"],
)
def test_a_savepoint_id_in_the_release_is_refused_in_savepoint_mode(
    set_values: dict[str, Any],
) -> None:
    with pytest.raises(HelmError, match="LOCKGATE_FROM_SAVEPOINT in env or extraEnv"):
        render(values_files=[UPGRADE], set_values=set_values)
    render(values_files=[UPGRADE], set_values={**set_values, "upgrade.mode": "none"})


def test_other_releases_of_a_pipeline_resume_without_a_hook() -> None:
    docs = render(values_files=[UPGRADE], set_values={"upgrade.triggerSavepoint": False})
    assert not _hook_docs(docs)
    assert _env(docs)["LOCKGATE_RESUME_FROM_STOP_SAVEPOINT"]["value"] == "true"
    annotations = one_manifest(docs, "StatefulSet")["spec"]["template"]["metadata"]["annotations"]
    assert "lockgate.io/upgrade-revision" in annotations


def test_the_hook_job_mounts_the_savepoint_claim() -> None:
    docs = render(
        values_files=[MINIMAL],
        set_values={"upgrade.mode": "savepoint", "savepoints.persistentVolumeClaim.enabled": True},
    )
    container = _job_container(_job(docs))
    assert {"name": "savepoints", "mountPath": "/var/lib/lockgate-savepoints"} in container[
        "volumeMounts"
    ]
    pod = _job(docs)["spec"]["template"]["spec"]
    assert {
        "name": "savepoints",
        "persistentVolumeClaim": {"claimName": "sums-lockgate-savepoints"},
    } in pod["volumes"]


# --- ad-hoc savepoints: the CronJob ------------------------------------------------------------


def test_the_savepoint_cronjob_takes_savepoints_without_halting() -> None:
    docs = render(values_files=[UPGRADE])
    cron = one_manifest(docs, "CronJob")
    assert cron["metadata"]["name"] == "sums-lockgate-savepoint"
    assert cron["spec"]["suspend"] is True  # ad hoc only: kubectl create job --from=cronjob/...
    assert cron["spec"]["concurrencyPolicy"] == "Forbid"
    job = cron["spec"]["jobTemplate"]["spec"]
    assert job["backoffLimit"] == 0
    pod = job["template"]["spec"]
    (container,) = pod["containers"]
    assert container["args"] == [
        "savepoint", "trigger", "--pipeline", "sums", "--json", "--timeout", "120",
    ]  # fmt: skip
    assert pod["automountServiceAccountToken"] is False
    account = [
        d
        for d in manifests(docs, "ServiceAccount")
        if d["metadata"]["name"] == pod["serviceAccountName"]
    ]
    assert len(account) == 1 and "annotations" not in account[0]["metadata"]
    scheduled = render(
        values_files=[UPGRADE],
        set_values={"savepoints.cronJob.suspend": False, "savepoints.cronJob.schedule": "@hourly"},
    )
    assert one_manifest(scheduled, "CronJob")["spec"]["suspend"] is False
    assert one_manifest(scheduled, "CronJob")["spec"]["schedule"] == "@hourly"


def test_the_job_accounts_carry_the_cloud_identity_annotations() -> None:
    docs = render(
        values_files=[UPGRADE],
        set_values={
            "serviceAccount.annotations": {"eks.amazonaws.com/role-arn": "arn:aws:iam::1:role/sp"}
        },
    )
    for account in manifests(docs, "ServiceAccount"):
        assert account["metadata"]["annotations"]["eks.amazonaws.com/role-arn"].endswith("role/sp")


# --- NetworkPolicy ---------------------------------------------------------------------------


def _egress(policy: dict[str, Any]) -> list[dict[str, Any]]:
    return policy["spec"]["egress"]


def test_egress_goes_only_to_the_named_peers() -> None:
    docs = render(values_files=[UPGRADE])
    policies = {p["metadata"]["name"]: p for p in manifests(docs, "NetworkPolicy")}
    processors = policies["sums-lockgate"]
    rules = _egress(processors)
    # Every rule but DNS names its destination: no open egress.
    dns = {"ports": [{"port": 53, "protocol": "UDP"}, {"port": 53, "protocol": "TCP"}]}
    assert rules[0] == dns
    assert all("to" in rule for rule in rules[1:]), rules
    by_port = {p["port"]: r["to"] for r in rules[1:] for p in r["ports"]}
    assert by_port[9092] == [
        {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "kafka"}}}
    ]
    assert by_port[9000][0]["podSelector"] == {"matchLabels": {"app": "minio"}}
    assert by_port[8081] == [{"podSelector": {"matchLabels": {"app": "schema-registry"}}}]
    assert by_port[443] == by_port[6443] == [{"ipBlock": {"cidr": "10.0.0.1/32"}}]
    # The savepoint Jobs: the same egress without the API server, no ingress.
    jobs = policies["sums-lockgate-savepoint"]
    assert (
        jobs["spec"]["podSelector"]["matchLabels"]
        == _job(docs)["spec"]["template"]["metadata"]["labels"]
    )
    assert "ingress" not in jobs["spec"]
    assert _egress(jobs) == [r for r in rules if not {p["port"] for p in r["ports"]} & {443, 6443}]


def test_no_object_store_rule_for_a_claim() -> None:
    docs = render(
        values_files=[MINIMAL],
        set_values={
            "networkPolicy.enabled": True,
            "savepoints.persistentVolumeClaim.enabled": True,
        },
    )
    (policy,) = manifests(docs, "NetworkPolicy")  # no savepoint Jobs: one policy
    ports = {p["port"] for r in _egress(policy) for p in r["ports"]}
    assert ports == {53, 9092, 9093, 443, 6443}


# --- stop-with-savepoint and resume without exec: the stop and cancel CronJobs -----------------

STOP_JOBS = {"savepoints.stopJobs.enabled": True}


def _cronjobs(docs: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {c["metadata"]["name"]: c for c in manifests(docs, "CronJob")}


def _cron_container(cron: dict[str, Any]) -> dict[str, Any]:
    (container,) = cron["spec"]["jobTemplate"]["spec"]["template"]["spec"]["containers"]
    return container


def test_the_stop_and_cancel_cronjobs_run_the_cli_ad_hoc_only() -> None:
    docs = render(values_files=[UPGRADE], set_values=STOP_JOBS)
    crons = _cronjobs(docs)
    assert set(crons) == {
        "sums-lockgate-savepoint",
        "sums-lockgate-savepoint-stop",
        "sums-lockgate-savepoint-cancel",
    }
    stop, cancel = crons["sums-lockgate-savepoint-stop"], crons["sums-lockgate-savepoint-cancel"]
    for cron in (stop, cancel):
        # Only `kubectl create job --from=cronjob/...`: suspended, and never due (31 February).
        assert cron["spec"]["suspend"] is True
        assert cron["spec"]["schedule"] == "0 0 31 2 *"
        assert cron["spec"]["concurrencyPolicy"] == "Forbid"
        assert cron["spec"]["jobTemplate"]["spec"]["backoffLimit"] == 0
    assert _cron_container(stop)["args"] == [
        "savepoint", "trigger", "--pipeline", "sums", "--stop", "--json", "--timeout", "120",
    ]  # fmt: skip
    assert _cron_container(cancel)["args"] == [
        "savepoint", "cancel", "--halted", "--pipeline", "sums",
    ]  # fmt: skip
    assert stop["spec"]["jobTemplate"]["spec"]["activeDeadlineSeconds"] == 120 + 120
    assert cancel["spec"]["jobTemplate"]["spec"]["activeDeadlineSeconds"] == 180


def test_the_stop_and_cancel_args_parse_with_the_cli() -> None:
    """The rendered arguments are options the CLI has (parsed by click, nothing run)."""
    from processors.cli import main

    docs = render(values_files=[UPGRADE], set_values=STOP_JOBS)
    for name in ("sums-lockgate-savepoint-stop", "sums-lockgate-savepoint-cancel"):
        group, command, *rest = _cron_container(_cronjobs(docs)[name])["args"]
        ctx = main.commands[group].commands[command].make_context(command, list(rest))  # type: ignore[attr-defined]
        assert ctx.params["pipeline"] == "sums"
        if command == "cancel":
            assert ctx.params["halted"] is True and ctx.params["savepoint_id"] is None
        else:
            assert ctx.params["stop"] is True


def test_the_stop_and_cancel_jobs_have_the_release_environment_and_no_api_access() -> None:
    docs = render(values_files=[PRODUCTION], set_values={**S3, **STOP_JOBS})
    processor = statefulset_container_spec(docs)
    crons = _cronjobs(docs)
    assert set(crons) == {"sums-lockgate-savepoint-stop", "sums-lockgate-savepoint-cancel"}
    for cron in crons.values():
        container = _cron_container(cron)
        assert container["env"] == processor["env"]
        assert container["envFrom"] == processor["envFrom"]
        assert container["securityContext"] == processor["securityContext"]
        assert container["image"] == processor["image"]
        pod = cron["spec"]["jobTemplate"]["spec"]["template"]["spec"]
        assert pod["automountServiceAccountToken"] is False
        assert pod["serviceAccountName"] == "sums-lockgate-savepoint"
        assert pod["restartPolicy"] == "Never"
    # One ServiceAccount for the Jobs (rendered without the plain savepoint CronJob too),
    # without a token, and no Role or binding names it.
    (account,) = [
        d
        for d in manifests(docs, "ServiceAccount")
        if d["metadata"]["name"] == "sums-lockgate-savepoint"
    ]
    assert account["automountServiceAccountToken"] is False
    for binding in manifests(docs, "RoleBinding") + manifests(docs, "ClusterRoleBinding"):
        assert all(s["name"] != "sums-lockgate-savepoint" for s in binding["subjects"])


def test_the_stop_and_cancel_jobs_get_the_savepoint_jobs_network_policy() -> None:
    docs = render(
        values_files=[MINIMAL],
        set_values={**S3, **STOP_JOBS, "networkPolicy.enabled": True},
    )
    policies = {p["metadata"]["name"]: p for p in manifests(docs, "NetworkPolicy")}
    jobs = policies["sums-lockgate-savepoint"]
    for cron in _cronjobs(docs).values():
        labels = cron["spec"]["jobTemplate"]["spec"]["template"]["metadata"]["labels"]
        assert jobs["spec"]["podSelector"]["matchLabels"] == labels
    assert "ingress" not in jobs["spec"]


def test_the_stop_and_cancel_cronjob_names_stay_distinct_and_short() -> None:
    docs = render(
        values_files=[MINIMAL],
        set_values={
            **S3,
            **STOP_JOBS,
            "savepoints.cronJob.enabled": True,
            "fullnameOverride": "x" * 52,
        },
    )
    names = list(_cronjobs(docs))
    assert len(set(names)) == 3, names
    assert all(len(n) <= 52 for n in names), names
    assert {n.rsplit("-", 1)[-1] for n in names} >= {"stop", "cancel"}, names


def test_no_stop_and_cancel_jobs_by_default() -> None:
    docs = render(values_files=[UPGRADE])
    assert set(_cronjobs(docs)) == {"sums-lockgate-savepoint"}


def test_notes_name_the_stop_and_cancel_commands(tmp_path: Path) -> None:
    """NOTES.txt (rendered through tpl in a copy of the chart: helm template skips it)."""
    chart = tmp_path / "lockgate"
    shutil.copytree(CHART_DIR, chart)
    shutil.copy(chart / "templates" / "NOTES.txt", chart / "notes.src")
    (chart / "templates" / "zz-notes.yaml").write_text(
        "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: notes\n"
        'data:\n  notes: {{ tpl (.Files.Get "notes.src") . | quote }}\n'
    )
    on = one_manifest(
        render(values_files=[UPGRADE], set_values=STOP_JOBS, chart=chart), "ConfigMap"
    )
    text = on["data"]["notes"]
    assert "create job --from=cronjob/sums-lockgate-savepoint-stop sums-lockgate-sp-stop" in text
    assert (
        "create job --from=cronjob/sums-lockgate-savepoint-cancel sums-lockgate-sp-resume" in text
    )
    off = one_manifest(render(values_files=[UPGRADE], chart=chart), "ConfigMap")
    assert "savepoint-stop" not in off["data"]["notes"]
