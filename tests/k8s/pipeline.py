"""A running-sum pipeline installed with the chart in a namespace of the test cluster.

:class:`Pipeline` feeds inputs from the host, reads the committed output (read_committed) and
checks the whole of it against the independent exactly-once model (tests/support/checker.py);
:func:`install_args` are the chart values every k8s test starts from.
"""

from __future__ import annotations

import json
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from tests.k8s.kube import Cluster, chart_dir, kafka_bootstrap_in_cluster, pod_ready
from tests.support.checker import check, model
from tests.support.kafka import produce_numbers, read_all, read_inputs

KEYS = 37


@dataclass
class Pipeline:
    cluster: Cluster
    ns: str
    bootstrap: str  # the broker as the test process (on the host) reaches it
    app: str
    inp: str
    out: str
    release: str = "sums"
    inputs: list[tuple[str, int, int]] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def feed(self, n: int) -> None:
        with self.lock:
            base = len(self.inputs)
            batch = [(f"key-{(base + i) % KEYS}", (base + i) % 23, base + i) for i in range(n)]
            produce_numbers(self.bootstrap, self.inp, batch)
            self.inputs.extend(batch)

    def problems(self, timeout: float = 180) -> list[str]:
        """Problems of the committed output against the model of every input fed so far."""
        expected = model(read_inputs(self.bootstrap, self.inp, len(self.inputs)))
        got = read_all(self.bootstrap, self.out, expected=len(self.inputs), timeout=timeout, idle=2)
        return check(expected, got)

    def wait_outputs(self, timeout: float = 180) -> float:
        """Seconds until the committed output covers every input fed so far."""
        t = time.monotonic()
        got = read_all(self.bootstrap, self.out, expected=len(self.inputs), timeout=timeout, idle=0)
        assert len(got) >= len(self.inputs), f"{len(got)} outputs of {len(self.inputs)}"
        return time.monotonic() - t

    @property
    def sts(self) -> str:
        """The release's StatefulSet (the chart's fullname)."""
        return f"{self.release}-lockgate"

    def pods(self) -> dict[str, dict[str, Any]]:
        selector = f"app.kubernetes.io/instance={self.release},app.kubernetes.io/name=lockgate"
        return {p["metadata"]["name"]: p for p in self.cluster.pods(self.ns, selector)}

    def wait_all_ready(self, replicas: int, timeout: float = 300) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            sts = self.cluster.get(self.ns, "statefulset", self.sts)
            st = sts["status"]
            pods = self.pods()
            if (
                st.get("readyReplicas", 0) == replicas
                and st.get("updatedReplicas", 0) == replicas
                and st.get("currentRevision") == st.get("updateRevision")
                and len(pods) == replicas
                and all(pod_ready(p) for p in pods.values())
            ):
                return
            time.sleep(0.5)
        raise AssertionError(
            f"{self.sts} not {replicas}/{replicas} ready in {timeout}s:\n{self.debug()}"
        )

    def debug(self) -> str:
        out = [self.cluster.kubectl("-n", self.ns, "get", "pods,pvc", "-o", "wide")]
        for name in self.pods():
            out.append(f"--- {name}\n{self.cluster.pod_logs(self.ns, name, 60)}")
        return "\n".join(out)

    def http(self, pod: dict[str, Any], path: str) -> tuple[int, str]:
        ip = pod["status"].get("podIP")
        if not ip:
            return 0, "no pod IP"
        try:
            with urllib.request.urlopen(f"http://{ip}:8080{path}", timeout=2) as r:
                return int(r.status), r.read().decode()
        except urllib.error.HTTPError as e:
            return int(e.code), e.read().decode()
        except OSError as e:
            return 0, str(e)


def metric(text: str, name: str) -> float:
    """Sum of a metric family's samples in a Prometheus exposition."""
    total = 0.0
    for line in text.splitlines():
        if line.startswith(name) and (line[len(name)] in " {"):
            total += float(line.rsplit(" ", 1)[1])
    return total


def install_args(p: Pipeline, replicas: int) -> list[str]:
    """``helm install``/``upgrade`` arguments of the running-sum release of ``p``."""
    return [
        p.release, chart_dir(), "--namespace", p.ns,
        "--set", "app=examples.running_sum:app",
        "--set", f"appName={p.app}",
        "--set", f"replicaCount={replicas}",
        "--set", f"kafka.bootstrapServers={kafka_bootstrap_in_cluster(p.ns)}",
        "--set", "image.tag=dev",
        "--set", "image.pullPolicy=Never",
        "--set", "persistence.storageClassName=lockgate-local",
        "--set", "persistence.size=1Gi",
        "--set", "processing.checkpointIntervalMs=500",
        "--set", "resources.requests.cpu=100m",
        "--set", "resources.requests.memory=256Mi",
        "--set-json",
        "env=" + json.dumps({"LOCKGATE_INPUT_TOPIC": p.inp, "LOCKGATE_OUTPUT_TOPIC": p.out}),
    ]  # fmt: skip


def revision_and_uids(p: Pipeline) -> tuple[str, dict[str, str]]:
    """The StatefulSet's update revision and its pods' uids."""
    st = p.cluster.get(p.ns, "statefulset", p.sts)["status"]
    return st["updateRevision"], {n: q["metadata"]["uid"] for n, q in p.pods().items()}


def restarts(p: Pipeline) -> dict[str, int]:
    """Container restarts of each pod of the release."""
    return {
        n: sum(cs.get("restartCount", 0) for cs in q["status"].get("containerStatuses", []))
        for n, q in p.pods().items()
    }


def json_line(line: str) -> dict[str, Any]:
    """``line`` as a JSON object, or ``{}``."""
    try:
        value = json.loads(line)
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


def descriptor_in(log: str) -> dict[str, Any]:
    """The savepoint descriptor a ``savepoint trigger --json`` printed last in ``log``."""
    found = [d for d in map(json_line, log.splitlines()) if "savepoint" in d and "apps" in d]
    assert found, f"no savepoint descriptor in the log:\n{log[-3000:]}"
    return found[-1]


class Feeder(threading.Thread):
    """Feeds 50 inputs every 0.25 s until stopped (``with Feeder(p): ...``)."""

    def __init__(self, p: Pipeline) -> None:
        super().__init__(daemon=True)
        self.p = p
        self.halt = threading.Event()
        self.errors: list[BaseException] = []

    def run(self) -> None:
        try:
            while not self.halt.is_set():
                self.p.feed(50)
                self.halt.wait(0.25)
        except BaseException as e:  # noqa: BLE001 - reported by the test thread
            self.errors.append(e)

    def __enter__(self) -> Feeder:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.halt.set()
        self.join(30)
        assert not self.errors, self.errors


class JobWatch(threading.Thread):
    """Records a Job's status and pod log while it runs (Helm deletes a successful hook Job)."""

    def __init__(self, p: Pipeline, job: str) -> None:
        super().__init__(daemon=True)
        self.p = p
        self.job = job
        self.halt = threading.Event()
        self.log = ""
        self.status: dict[str, Any] = {}

    def run(self) -> None:
        while not self.halt.is_set():
            try:
                self.status = self.p.cluster.get(self.p.ns, "job", self.job)["status"]
                text = self.p.cluster.kubectl(
                    "-n", self.p.ns, "logs", f"job/{self.job}", "--tail=-1", timeout=20
                )
                if text:
                    self.log = text
            except (RuntimeError, OSError, ValueError):
                pass
            self.halt.wait(0.5)

    def __enter__(self) -> JobWatch:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.halt.set()
        self.join(30)

    def seconds(self) -> float | None:
        """The Job's start -> completion, from its status (``None`` when not complete)."""
        start, end = self.status.get("startTime"), self.status.get("completionTime")
        if not (start and end):
            return None
        fmt = "%Y-%m-%dT%H:%M:%SZ"
        return (
            datetime.strptime(end, fmt).replace(tzinfo=UTC)
            - datetime.strptime(start, fmt).replace(tzinfo=UTC)
        ).total_seconds()


def log_text(p: Pipeline, pod: str) -> str:
    """The whole log of a pod's processor container."""
    return p.cluster.kubectl("-n", p.ns, "logs", pod, "-c", "processor", "--tail=-1")


def run_cron_job(p: Pipeline, cronjob: str, job: str, timeout: int = 240) -> str:
    """``kubectl create job --from=cronjob/CRONJOB JOB``, wait until complete; return its log.

    The Job is deleted afterwards (its log is printed when it does not complete).
    """
    c, ns = p.cluster, p.ns
    c.kubectl("-n", ns, "create", "job", f"--from=cronjob/{cronjob}", job)
    try:
        c.kubectl(
            "-n", ns, "wait", "--for=condition=complete", f"job/{job}", f"--timeout={timeout}s",
            timeout=timeout + 20,
        )  # fmt: skip
        return c.kubectl("-n", ns, "logs", f"job/{job}", "--tail=-1")
    except RuntimeError:
        print(c.kubectl("-n", ns, "logs", f"job/{job}", "--tail=-1"))
        raise
    finally:
        c.kubectl("-n", ns, "delete", "job", job, "--wait=false", "--ignore-not-found")
