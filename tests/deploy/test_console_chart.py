"""The chart's ``console`` section: a Deployment and a Service of ``lockgate console``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tests.support.helm import manifests, one_manifest, render

VALUES_DIR = Path(__file__).resolve().parent / "values"
CONSOLE = VALUES_DIR / "console.yaml"
MINIMAL = VALUES_DIR / "minimal.yaml"


def _console(docs: list[dict[str, Any]]) -> tuple[dict[str, Any], dict[str, Any]]:
    deployment = one_manifest(docs, "Deployment")
    services = [s for s in manifests(docs, "Service") if s["metadata"]["name"].endswith("-console")]
    assert len(services) == 1, services
    return deployment, services[0]


def test_off_by_default() -> None:
    docs = render(values_files=[MINIMAL])
    assert not manifests(docs, "Deployment")
    assert all(not s["metadata"]["name"].endswith("-console") for s in manifests(docs, "Service"))


def test_deployment_and_service() -> None:
    docs = render(values_files=[CONSOLE])
    deployment, service = _console(docs)
    pod = deployment["spec"]["template"]
    container = pod["spec"]["containers"][0]
    assert container["args"][:5] == ["console", "--host", "0.0.0.0", "--port", "8090"]
    peer = "http://{instance}.sums-lockgate-headless.default.svc:8080"
    assert container["args"][-2:] == ["--instance-url", peer]
    assert container["ports"] == [{"name": "http", "containerPort": 8090, "protocol": "TCP"}]
    assert container["readinessProbe"]["httpGet"] == {"path": "/healthz", "port": "http"}
    assert service["spec"]["ports"][0]["port"] == 80
    assert service["spec"]["selector"] == deployment["spec"]["selector"]["matchLabels"]
    assert pod["metadata"]["labels"]["app.kubernetes.io/component"] == "console"
    # Nothing of the processors selects the console's pods.
    statefulset = one_manifest(docs, "StatefulSet")
    wanted = statefulset["spec"]["selector"]["matchLabels"]
    labels = pod["metadata"]["labels"]
    assert not all(labels.get(k) == v for k, v in wanted.items())


def test_environment_and_credentials() -> None:
    docs = render(values_files=[CONSOLE])
    deployment, _ = _console(docs)
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    env = {e["name"]: e for e in container["env"]}
    assert env["LOCKGATE_BOOTSTRAP_SERVERS"]["value"] == "kafka-0.kafka.svc:9093"
    assert env["LOCKGATE_SAVEPOINT_DIR"]["value"] == "s3://clicks/savepoints"
    assert env["LOCKGATE_QUERY_TOKEN"]["valueFrom"]["secretKeyRef"] == {
        "name": "clicks-query-token",
        "key": "token",
    }
    for processor_only in ("LOCKGATE_STATE_DIR", "LOCKGATE_MEMORY_LIMIT_BYTES"):
        assert processor_only not in env
    mounts = {m["name"]: m for m in container["volumeMounts"]}
    assert mounts["kafka-sasl"]["readOnly"] and mounts["kafka-tls"]["readOnly"]
    volumes = {v["name"] for v in deployment["spec"]["template"]["spec"]["volumes"]}
    assert {"tmp", "kafka-sasl", "kafka-tls"} <= volumes
    assert container["securityContext"]["readOnlyRootFilesystem"] is True


def test_notes_tell_how_to_reach_it(tmp_path: Path) -> None:
    import shutil

    from tests.support.helm import CHART_DIR

    chart = tmp_path / "lockgate"
    shutil.copytree(CHART_DIR, chart)
    shutil.copy(chart / "templates" / "NOTES.txt", chart / "notes.src")
    (chart / "templates" / "zz-notes.yaml").write_text(
        "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: notes\n"
        'data:\n  notes: {{ tpl (.Files.Get "notes.src") . | quote }}\n'
    )
    notes = one_manifest(render(values_files=[CONSOLE], chart=chart), "ConfigMap")
    assert "port-forward svc/sums-lockgate-console 8088:80" in notes["data"]["notes"]


def test_no_token_without_query_token_secret() -> None:
    docs = render(values_files=[MINIMAL], values={"console": {"enabled": True}})
    deployment, _ = _console(docs)
    env = {e["name"] for e in deployment["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert "LOCKGATE_QUERY_TOKEN" not in env
