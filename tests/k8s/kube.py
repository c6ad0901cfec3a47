"""Drive the single-node test cluster of deploy/k8s/cluster.sh from tests.

    cluster = Cluster.up()            # builds (cached) and starts the cluster, images loaded
    kafka = cluster.install_kafka(ns)  # a one-broker Kafka StatefulSet in namespace ns
    cluster.kubectl("-n", ns, "get", "pods")
    cluster.helm("install", ...)

Everything runs inside this machine (see deploy/k8s/cluster.sh: bridges, fences). The test
process reaches Kafka through the broker pod's IP on the cluster bridge (listener HOST, port
9094); pods use the pod DNS name (listener PLAINTEXT, port 9092).
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.support import docker as dk
from tests.support.helm import CHART_DIR, ensure_helm

REPO_ROOT = Path(__file__).resolve().parents[2]
CLUSTER_SH = REPO_ROOT / "deploy" / "k8s" / "cluster.sh"
PROCESSOR_IMAGE = "lockgate/processor:dev"
#: The node address (deploy/k8s/cluster.sh NODE_IP): pods reach this machine there.
NODE_IP = "10.200.0.1"
KAFKA_IMAGE = "lockgate/kafka:dev"

#: Wall-clock seconds measured by the tier (printed in pytest's terminal summary).
TIMES: dict[str, float] = {}


def timed(name: str, seconds: float) -> None:
    TIMES[name] = round(seconds, 1)
    print(f"k8s timing: {name} {seconds:.1f}s", file=sys.stderr)


def _run(cmd: list[str], timeout: float, env: dict[str, str] | None = None) -> str:
    proc = subprocess.run(
        cmd, capture_output=True, text=True, timeout=timeout,
        env=env, check=False,
    )  # fmt: skip
    if proc.returncode != 0:
        raise RuntimeError(f"{shlex.join(cmd)} exited {proc.returncode}:\n{proc.stderr[-4000:]}")
    return proc.stdout


def cluster_sh(command: str, timeout: float = 3600) -> None:
    """Run ``deploy/k8s/cluster.sh COMMAND`` with its progress on this process's stderr."""
    subprocess.run([str(CLUSTER_SH), command], check=True, timeout=timeout)


@dataclass
class Cluster:
    kubeconfig: str
    kubectl_bin: str
    helm_bin: str = ""
    env: dict[str, str] = field(default_factory=dict)

    @classmethod
    def up(cls) -> Cluster:
        t = time.monotonic()
        dk.ensure_images()  # docker/build-images.sh: skips images whose inputs did not change
        timed("images (docker/build-images.sh)", time.monotonic() - t)
        t = time.monotonic()
        cluster_sh("build")
        timed("cluster.sh build", time.monotonic() - t)
        t = time.monotonic()
        cluster_sh("up")
        timed("cluster.sh up", time.monotonic() - t)
        out = _run([str(CLUSTER_SH), "env"], 30)
        values = dict(
            shlex.split(line)[1].split("=", 1) for line in out.splitlines() if line.strip()
        )
        c = cls(kubeconfig=values["KUBECONFIG"], kubectl_bin=values["LGK8S_KUBECTL"])
        c.env = {k: v for k, v in os.environ.items() if not k.startswith("HELM_")}
        c.env["KUBECONFIG"] = c.kubeconfig
        c.helm_bin = str(ensure_helm())
        return c

    def kubectl(self, *args: str, timeout: float = 120, stdin: str | None = None) -> str:
        cmd = [self.kubectl_bin, *args]
        proc = subprocess.run(
            cmd, input=stdin, capture_output=True, text=True,
            timeout=timeout, env=self.env, check=False,
        )  # fmt: skip
        if proc.returncode != 0:
            raise RuntimeError(
                f"kubectl {shlex.join(args)} exited {proc.returncode}:\n{proc.stderr}"
            )
        return proc.stdout

    def get(self, ns: str, *what: str) -> Any:
        return json.loads(self.kubectl("-n", ns, "get", *what, "-o", "json"))

    def apply(self, ns: str, manifest: str) -> None:
        self.kubectl("-n", ns, "apply", "-f", "-", stdin=manifest)

    def helm(self, *args: str, timeout: float = 600) -> str:
        return _run([self.helm_bin, *args], timeout, env=self.env)

    def create_namespace(self, ns: str) -> None:
        self.kubectl("create", "namespace", ns)

    def delete_namespace(self, ns: str) -> None:
        self.kubectl("delete", "namespace", ns, "--wait=false", "--ignore-not-found")

    def install_kafka(self, ns: str) -> str:
        """A one-broker KRaft Kafka StatefulSet in ``ns``; returns the bootstrap for the host."""
        t = time.monotonic()
        self.apply(ns, KAFKA_MANIFEST)
        self.kubectl(
            "-n", ns, "rollout", "status", "statefulset/kafka", "--timeout=300s", timeout=320
        )
        ip = self.get(ns, "pod", "kafka-0")["status"]["podIP"]
        timed("kafka in the cluster (apply -> ready)", time.monotonic() - t)
        return f"{ip}:9094"

    def pod_logs(self, ns: str, pod: str, tail: int = 200) -> str:
        try:
            return self.kubectl("-n", ns, "logs", pod, f"--tail={tail}")
        except RuntimeError as e:
            return str(e)

    def pods(self, ns: str, selector: str) -> list[dict[str, Any]]:
        items: list[dict[str, Any]] = self.get(ns, "pods", "-l", selector)["items"]
        return items


def pod_ready(pod: dict[str, Any]) -> bool:
    if pod["metadata"].get("deletionTimestamp"):
        return False
    for cond in pod.get("status", {}).get("conditions", []):
        if cond["type"] == "Ready":
            return bool(cond["status"] == "True")
    return False


def kafka_bootstrap_in_cluster(ns: str) -> str:
    return f"kafka-0.kafka.{ns}.svc.cluster.local:9092"


def chart_dir() -> str:
    return str(CHART_DIR)


# One KRaft broker+controller. The image's listeners are 127.0.0.1: KAFKA_EXTRA_PROPERTIES
# (appended to server.properties, so it wins) makes it listen on the pod network, advertised as
# the pod's stable DNS name for pods and as the pod IP for the test process on the host.
KAFKA_MANIFEST = f"""
apiVersion: v1
kind: Service
metadata: {{name: kafka}}
spec:
  clusterIP: None
  publishNotReadyAddresses: true
  selector: {{app: kafka}}
  ports: [{{name: plain, port: 9092}}]
---
apiVersion: apps/v1
kind: StatefulSet
metadata: {{name: kafka}}
spec:
  serviceName: kafka
  replicas: 1
  selector: {{matchLabels: {{app: kafka}}}}
  template:
    metadata: {{labels: {{app: kafka}}}}
    spec:
      securityContext: {{runAsNonRoot: true, runAsUser: 10002, runAsGroup: 10002, fsGroup: 10002}}
      terminationGracePeriodSeconds: 30
      containers:
      - name: kafka
        image: {KAFKA_IMAGE}
        imagePullPolicy: Never
        env:
        - name: POD_IP
          valueFrom: {{fieldRef: {{fieldPath: status.podIP}}}}
        - name: POD_NAMESPACE
          valueFrom: {{fieldRef: {{fieldPath: metadata.namespace}}}}
        - name: KAFKA_EXTRA_PROPERTIES
          value: |
            listeners=PLAINTEXT://0.0.0.0:9092,CONTROLLER://127.0.0.1:9093,HOST://0.0.0.0:9094
            advertised.listeners=PLAINTEXT://kafka-0.kafka.$(POD_NAMESPACE).svc.cluster.local:9092,HOST://$(POD_IP):9094
            listener.security.protocol.map=PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT,HOST:PLAINTEXT
        ports:
        - {{name: plain, containerPort: 9092}}
        - {{name: host, containerPort: 9094}}
        readinessProbe:
          tcpSocket: {{port: 9092}}
          periodSeconds: 2
        resources:
          requests: {{cpu: 100m, memory: 768Mi}}
        volumeMounts: [{{name: data, mountPath: /var/lib/kafka}}]
      volumes: [{{name: data, emptyDir: {{}}}}]
"""
