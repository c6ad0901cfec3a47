"""running_sum on a real Kubernetes cluster, installed with the Helm chart.

One namespace per module: a one-broker Kafka StatefulSet (lockgate/kafka:dev) and the chart
(lockgate/processor:dev, ``imagePullPolicy: Never``, the cluster's local StorageClass, whose
volumes honour the chart's ``fsGroup``). The tests run in file order against one release; each
scenario feeds more inputs and then checks the *whole* committed output against the
independent exactly-once model (tests/support/checker.py): no loss, no duplicate, no reorder.

Scenarios, as Kubernetes itself drives them: install; delete a pod (it returns on its volume);
a pod on a fresh volume is Ready only after its key groups restored; rolling update with inputs
flowing (restart time measured); scale down and up; an eviction that the PDB refuses.
"""

from __future__ import annotations

import json
import subprocess
import threading
import time
from collections.abc import Iterator

import pytest

from tests.k8s.kube import Cluster, pod_ready, timed
from tests.k8s.pipeline import Pipeline, install_args, metric, restarts
from tests.support.kafka import create_topic, unique

# Every scenario here is long (make test-k8s, make chaos); make test's quick subset of the tier
# is test_savepoint_upgrade_k8s.py's s3 release (install, savepoint, console, alerts).
pytestmark = [pytest.mark.k8s, pytest.mark.k8s_long]

RELEASE = "sums"
STS = f"{RELEASE}-lockgate"
REPLICAS = 2
PARTITIONS = 4


@pytest.fixture(scope="module")
def pipeline(cluster: Cluster) -> Iterator[Pipeline]:
    ns = unique("lgk8s")
    cluster.create_namespace(ns)
    p = Pipeline(cluster, ns, "", unique("k8s-sum"), unique("k8s-in"), unique("k8s-out"), RELEASE)
    try:
        p.bootstrap = cluster.install_kafka(ns)
        create_topic(p.bootstrap, p.inp, PARTITIONS)
        t = time.monotonic()
        cluster.helm("install", *install_args(p, REPLICAS))
        p.wait_all_ready(REPLICAS)
        timed("helm install -> 2/2 Ready", time.monotonic() - t)
        # Started right after the broker (its group coordinator still loading): no restart.
        assert set(restarts(p).values()) == {0}, p.debug()
        yield p
    except BaseException:
        try:
            print(p.debug())
        except Exception as e:  # noqa: BLE001 - best effort diagnostics
            print(f"no diagnostics: {e}")
        raise
    finally:
        try:
            cluster.helm("uninstall", RELEASE, "--namespace", ns, "--wait", "--timeout", "120s")
        except Exception as e:  # noqa: BLE001 - teardown continues; the cluster goes anyway
            print(f"helm uninstall: {e}")
        cluster.delete_namespace(ns)


def test_install_computes_exact_running_sums(pipeline: Pipeline) -> None:
    pipeline.feed(2000)
    t = time.monotonic()
    assert pipeline.problems() == []
    timed("first 2000 inputs -> checked output", time.monotonic() - t)


def test_deleted_pod_returns_on_its_volume(pipeline: Pipeline) -> None:
    c, ns = pipeline.cluster, pipeline.ns
    pod = f"{STS}-0"
    pvc_before = c.get(ns, "pvc", f"data-{pod}")
    uid_before = pipeline.pods()[pod]["metadata"]["uid"]
    t = time.monotonic()
    c.kubectl("-n", ns, "delete", "pod", pod, "--wait=false")
    pipeline.feed(1000)
    deadline = time.monotonic() + 300
    while True:
        cur = pipeline.pods().get(pod)
        if cur and cur["metadata"]["uid"] != uid_before and pod_ready(cur):
            break
        assert time.monotonic() < deadline, pipeline.debug()
        time.sleep(0.5)
    timed("delete pod -> replacement Ready", time.monotonic() - t)
    pvc_after = c.get(ns, "pvc", f"data-{pod}")
    assert pvc_after["metadata"]["uid"] == pvc_before["metadata"]["uid"]
    assert pvc_after["spec"]["volumeName"] == pvc_before["spec"]["volumeName"]
    vols = {v["name"]: v for v in cur["spec"]["volumes"]}
    assert vols["data"]["persistentVolumeClaim"]["claimName"] == f"data-{pod}"
    pipeline.wait_all_ready(REPLICAS)
    assert pipeline.problems() == []


def test_ready_only_after_restore_on_a_fresh_volume(pipeline: Pipeline) -> None:
    """Pod 1 loses its volume: its key groups restore from the changelogs before it is Ready."""
    c, ns = pipeline.cluster, pipeline.ns
    pod = f"{STS}-1"
    pipeline.feed(3000)
    pipeline.wait_outputs()
    old_pv = c.get(ns, "pvc", f"data-{pod}")["spec"]["volumeName"]
    uid_before = pipeline.pods()[pod]["metadata"]["uid"]
    t = time.monotonic()
    c.kubectl("-n", ns, "delete", "pvc", f"data-{pod}", "--wait=false")
    c.kubectl("-n", ns, "delete", "pod", pod, "--wait=false")
    samples: list[tuple[float, bool, int, str, float, float]] = []
    deadline = time.monotonic() + 300
    while True:
        cur = pipeline.pods().get(pod)
        if cur and cur["metadata"]["uid"] != uid_before:
            code, body = pipeline.http(cur, "/readyz")
            _, metrics = pipeline.http(cur, "/metrics")
            restoring = metric(metrics, "lockgate_key_groups_restoring")
            restored = metric(metrics, "lockgate_restore_seconds_count")
            samples.append((time.monotonic() - t, pod_ready(cur), code, body, restoring, restored))
            if pod_ready(cur):
                break
        assert time.monotonic() < deadline, pipeline.debug()
        time.sleep(0.2)
    timed("fresh volume: delete pod+pvc -> Ready (restored)", time.monotonic() - t)
    new_pv = c.get(ns, "pvc", f"data-{pod}")["spec"]["volumeName"]
    assert new_pv != old_pv, "the pod should have come back on a new, empty volume"
    # Kubernetes marked it Ready only once /readyz said so, and /readyz only after restore.
    first_ok = next(i for i, s in enumerate(samples) if s[2] == 200)
    first_ready = next(i for i, s in enumerate(samples) if s[1])
    assert first_ok <= first_ready, samples
    for _, k8s_ready, code, body, restoring, _ in samples:
        if code == 200:
            assert restoring == 0, (code, body)
        if code not in (0, 200):
            assert not k8s_ready or code == 0, (code, body)
    last = samples[-1]
    assert last[4] == 0 and last[5] > 0, f"no restore recorded before Ready: {samples[-3:]}"
    pipeline.feed(1000)
    assert pipeline.problems() == []


def test_rolling_update_is_exactly_once(pipeline: Pipeline) -> None:
    c, ns = pipeline.cluster, pipeline.ns
    stop = threading.Event()
    errors: list[BaseException] = []

    def feeder() -> None:
        try:
            while not stop.is_set():
                pipeline.feed(50)
                stop.wait(0.25)
        except BaseException as e:  # noqa: BLE001 - reported by the test thread
            errors.append(e)

    th = threading.Thread(target=feeder, daemon=True)
    before = {n: p["metadata"]["uid"] for n, p in pipeline.pods().items()}
    th.start()
    t = time.monotonic()
    gone: dict[str, float] = {}
    back: dict[str, float] = {}
    try:
        c.kubectl("-n", ns, "rollout", "restart", f"statefulset/{STS}")
        deadline = time.monotonic() + 600
        while len(back) < REPLICAS:
            now = time.monotonic() - t
            pods = pipeline.pods()
            for name, uid in before.items():
                cur = pods.get(name)
                if name not in gone and (
                    cur is None
                    or cur["metadata"]["uid"] != uid
                    or cur["metadata"].get("deletionTimestamp")
                ):
                    gone[name] = now
                if name in gone and name not in back and cur and cur["metadata"]["uid"] != uid:
                    if pod_ready(cur):
                        back[name] = now
            assert time.monotonic() < deadline, pipeline.debug()
            time.sleep(0.25)
        pipeline.wait_all_ready(REPLICAS)
    finally:
        stop.set()
        th.join(30)
    assert not errors, errors
    timed("rolling update (2 pods, minReadySeconds 10) total", time.monotonic() - t)
    for name in sorted(back):
        timed(f"rolling update: {name} not-ready -> Ready", back[name] - gone[name])
    assert pipeline.problems() == []


def test_scale_down_and_up(pipeline: Pipeline) -> None:
    c, ns = pipeline.cluster, pipeline.ns
    t = time.monotonic()
    c.kubectl("-n", ns, "scale", f"statefulset/{STS}", "--replicas=1")
    pipeline.wait_all_ready(1)
    pipeline.feed(1000)
    handover = pipeline.wait_outputs(timeout=240)
    timed("scale 2->1: inputs fed after it -> all outputs", handover)
    timed("scale 2->1 total (incl. outputs)", time.monotonic() - t)
    assert pipeline.problems() == []
    # The removed pod left the group at SIGTERM (kafka.leaveGroupOnScaleDown): its key groups
    # did not wait for its 45 s session (measured 44-45 s before the explicit leave).
    assert handover < 25, f"scale 2->1 hand-over took {handover:.1f}s: no explicit leave?"
    t = time.monotonic()
    c.kubectl("-n", ns, "scale", f"statefulset/{STS}", "--replicas=2")
    pipeline.wait_all_ready(2)
    timed("scale 1->2: -> 2/2 Ready", time.monotonic() - t)
    pipeline.feed(1000)
    timed("scale 1->2: inputs fed after it -> all outputs", pipeline.wait_outputs(timeout=240))
    assert pipeline.problems() == []


def test_eviction_respects_the_pdb(pipeline: Pipeline) -> None:
    """A drain evicts one pod; the PDB (maxUnavailable 1) refuses the second meanwhile."""
    c, ns = pipeline.cluster, pipeline.ns

    def evict(pod: str) -> str:
        body = json.dumps(
            {
                "apiVersion": "policy/v1",
                "kind": "Eviction",
                "metadata": {"name": pod, "namespace": ns},
            }
        )
        try:
            c.kubectl(
                "create", "--raw", f"/api/v1/namespaces/{ns}/pods/{pod}/eviction", "-f", "-",
                stdin=body,
            )  # fmt: skip
            return "evicted"
        except RuntimeError as e:
            return str(e)

    deadline = time.monotonic() + 120
    while c.get(ns, "pdb", STS)["status"].get("disruptionsAllowed", 0) != 1:
        assert time.monotonic() < deadline, c.kubectl("-n", ns, "get", "pdb", "-o", "yaml")
        time.sleep(0.5)
    t = time.monotonic()
    assert evict(f"{STS}-0") == "evicted"
    refused = evict(f"{STS}-1")
    assert "disruption budget" in refused or "429" in refused, refused
    pipeline.feed(1000)
    pipeline.wait_all_ready(REPLICAS)
    timed("evict pod 0 -> 2/2 Ready again", time.monotonic() - t)
    assert pipeline.problems() == []


#: A name outside the cluster that public DNS resolves (RFC 2606's documentation domain):
#: a pod resolving it would have upstream DNS. Deliberately no package registry.
OUTSIDE_NAME = "example.com"


def test_pods_reach_nothing_outside_the_machine(pipeline: Pipeline) -> None:
    """The network fence: a pod has no route off the machine and no upstream DNS."""
    gateway = subprocess.run(
        ["ip", "-o", "route", "show", "default"], capture_output=True, text=True, check=True
    ).stdout.split()
    target = gateway[gateway.index("via") + 1] if "via" in gateway else "192.0.2.1"
    probe = (
        "import socket, sys\n"
        "out = []\n"
        f"for host in ({target!r}, '1.1.1.1'):\n"
        "    s = socket.socket(); s.settimeout(3)\n"
        "    try:\n"
        "        s.connect((host, 443)); out.append(host + ' CONNECTED')\n"
        "    except OSError as e:\n"
        "        out.append(host + ' ' + type(e).__name__ + ' ' + str(e.errno))\n"
        f"name = {OUTSIDE_NAME!r}\n"
        "try:\n"
        "    socket.getaddrinfo(name, 443); out.append(name + ' RESOLVED')\n"
        "except OSError as e:\n"
        "    out.append(name + ' ' + type(e).__name__)\n"
        "print('\\n'.join(out))\n"
    )
    out = pipeline.cluster.kubectl(
        "-n", pipeline.ns, "exec", f"{STS}-0", "-c", "processor", "--", "python3", "-c", probe
    )
    lines = out.splitlines()
    assert "CONNECTED" not in out and "RESOLVED" not in out, out
    assert all(line.endswith(" 101") for line in lines[:2]), out  # ENETUNREACH: no route
