"""Savepoints and ``upgrade.mode: savepoint`` of the chart on a real cluster.

The running-sum release with ``upgrade.mode: savepoint`` and the savepoint CronJob (suspended),
once per savepoint location (the module's fixture is parametrized):

- ``pvc`` (``k8s_long``): a PersistentVolumeClaim the chart renders (the cluster's local
  StorageClass; one node, so a ReadWriteOnce claim is shared by both pods and the Jobs);
- ``s3``: an S3 API server (moto's, tests/k8s/store.py) on the node address, reached by s3fs in
  the shipped image through ``savepoints.endpointUrl``, with the credentials from a Secret
  (``savepoints.credentials``); this release also runs the chart's console.

The tests run in file order against each release (``make test`` runs the s3 release's tests
not marked ``k8s_long``: install, ad-hoc savepoint, console, alerts):

- an ad-hoc savepoint Job (``kubectl create job --from=cronjob/...``) takes a savepoint without
  halting anything;
- a failed savepoint fails ``helm upgrade`` (pvc: a file where the savepoint directory goes;
  s3: the store is down): the pre-upgrade hook Job exits 1, Helm marks the revision failed and
  changes nothing (same StatefulSet revision, same pods, Ready), and the pipeline, cancelled
  out of its halt, goes on exactly;
- ``helm upgrade`` while input flows: the hook takes a stop-with-savepoint, every pod rolls and
  resumes its key groups from it (their logs say so), the savepoint is in the store, and the
  whole committed output (read_committed) equals the model: no loss, no duplicate;
- the console (s3): its page names the app, and it lists the store's completed savepoints;
- the chart's alerts over the pods' /metrics (tests/k8s/alerts.py): quiet while healthy; a
  stop-with-savepoint while input flows (a Job of the chart's stop CronJob, no exec) fires the
  lag and halted-key-groups alerts; a Job of its cancel CronJob (``savepoint cancel --halted``)
  resumes the pipeline exactly and the alerts go quiet;
- (s3, ``k8s_long``) LockgateCrashLooping fires on a second, crash-looping release in the
  namespace (its processor exits 2 at start) and not on the healthy one, over
  ``kube_pod_container_status_restarts_total`` built from the API's restartCount
  (kube-state-metrics is not on this cluster).
"""

from __future__ import annotations

import json
import os
import time
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.k8s.alerts import PodScraper, RestartSampler, chart_rule, chart_rules
from tests.k8s.kube import Cluster, pod_ready, timed
from tests.k8s.pipeline import (
    Feeder,
    JobWatch,
    Pipeline,
    descriptor_in,
    install_args,
    log_text,
    restarts,
    revision_and_uids,
    run_cron_job,
)
from tests.k8s.store import BUCKET, SECRET, S3Server, create_secret, s3_values
from tests.support.kafka import create_topic, unique

pytestmark = pytest.mark.k8s

RELEASE = "spsums"
REPLICAS = 2
PARTITIONS = 4
SP_MOUNT = "/var/lib/lockgate-savepoints"
SP_SUBDIR = "sums"
HOOK_JOB = f"{RELEASE}-lockgate-savepoint-upgrade"
CRONJOB = f"{RELEASE}-lockgate-savepoint"
STOP_CRONJOB = f"{RELEASE}-lockgate-savepoint-stop"
CANCEL_CRONJOB = f"{RELEASE}-lockgate-savepoint-cancel"
#: The crash-looping release of the LockgateCrashLooping test (same namespace).
CRASHY = "crashy"
SP_CLAIM = f"{RELEASE}-lockgate-savepoints"
#: LockgateConsumerLag's threshold in the rendered rules (the chart's default is 100000).
LAG_THRESHOLD = 500


@dataclass
class Store:
    """Where the release's savepoints go, and how the test sees and breaks it."""

    kind: str
    values: list[str]
    #: The ids of the savepoints in the store.
    ids: Callable[[], list[str]]
    #: Make the store unusable until the context exits.
    broken: Callable[[], Any]


def common_values() -> list[str]:
    return [
        "--set", "savepoints.triggerTimeoutSeconds=60",
        "--set", "savepoints.cronJob.enabled=true",
        "--set", "savepoints.stopJobs.enabled=true",
        "--set", "upgrade.mode=savepoint",
    ]  # fmt: skip


def pvc_store(p: Pipeline) -> Store:
    def host_dir() -> Path:
        """The savepoint claim's local PV as a directory of this machine."""
        pv = p.cluster.get(p.ns, "pvc", SP_CLAIM)["spec"]["volumeName"]
        return Path(p.cluster.get("default", "pv", pv)["spec"]["local"]["path"]) / SP_SUBDIR

    def ids() -> list[str]:
        d = host_dir()
        return sorted(os.listdir(d)) if d.is_dir() else []

    @contextmanager
    def broken() -> Iterator[None]:
        # A regular file where the savepoint directory goes: neither the pods' exports nor the
        # Job's descriptor can be written, and no kubelet ownership change makes it a directory.
        location = host_dir()
        aside = location.with_name(f"{SP_SUBDIR}.aside")
        if location.exists():
            location.rename(aside)
        location.write_text("not a directory\n")
        try:
            yield
        finally:
            location.unlink()
            if aside.exists():
                aside.rename(location)

    values = [
        "--set", "savepoints.persistentVolumeClaim.enabled=true",
        "--set-json", 'savepoints.persistentVolumeClaim.accessModes=["ReadWriteOnce"]',
        "--set", "savepoints.persistentVolumeClaim.storageClassName=lockgate-local",
        "--set", "savepoints.persistentVolumeClaim.size=1Gi",
        "--set", f"savepoints.location={SP_MOUNT}/{SP_SUBDIR}",
    ]  # fmt: skip
    return Store("pvc", values, ids, broken)


def s3_store(p: Pipeline, server: S3Server) -> Store:
    prefix = f"{BUCKET}/{p.app}"

    @contextmanager
    def broken() -> Iterator[None]:
        server.stop()  # connection refused: s3fs fails fast
        try:
            yield
        finally:
            server.start()

    # The console runs with this release (it lists the savepoints of the same store).
    values = [*s3_values(server, prefix), "--set", "console.enabled=true"]
    return Store("s3", values, lambda: server.ids(prefix), broken)


@pytest.fixture(scope="module", params=[pytest.param("pvc", marks=pytest.mark.k8s_long), "s3"])
def release(cluster: Cluster, request: pytest.FixtureRequest) -> Iterator[tuple[Pipeline, Store]]:
    kind: str = request.param
    ns = unique(f"lgk8s-sp-{kind}")
    cluster.create_namespace(ns)
    p = Pipeline(cluster, ns, "", unique("k8s-sp"), unique("k8s-sp-in"), unique("k8s-sp-out"))
    p.release = RELEASE
    server = S3Server() if kind == "s3" else None
    try:
        if server is not None:
            server.start()
            server.create_bucket()
            create_secret(cluster, ns)
            store = s3_store(p, server)
        else:
            store = pvc_store(p)
        p.bootstrap = cluster.install_kafka(ns)
        create_topic(p.bootstrap, p.inp, PARTITIONS)
        t = time.monotonic()
        cluster.helm("install", *install_args(p, REPLICAS), *store.values, *common_values())
        p.wait_all_ready(REPLICAS)
        timed(f"[{kind}] helm install -> 2/2 Ready", time.monotonic() - t)
        assert set(restarts(p).values()) == {0}, p.debug()  # none at start-up
        yield p, store
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
        if server is not None:
            server.stop()


def upgrade(p: Pipeline, store: Store, *extra: str) -> str:
    """``helm upgrade --wait`` of the release with its install values plus ``extra``."""
    return p.cluster.helm(
        "upgrade", *install_args(p, REPLICAS), *store.values, *common_values(), *extra,
        "--wait", "--timeout", "8m",
        timeout=600,
    )  # fmt: skip


def test_install_with_a_savepoint_location_is_exact(release: tuple[Pipeline, Store]) -> None:
    p, store = release
    p.feed(2000)
    assert p.problems() == []
    sts = p.cluster.get(p.ns, "statefulset", p.sts)
    env = {e["name"]: e for e in sts["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert env["LOCKGATE_RESUME_FROM_STOP_SAVEPOINT"]["value"] == "true"
    if store.kind == "s3":
        assert env["LOCKGATE_SAVEPOINT_DIR"]["value"] == f"s3://{BUCKET}/{p.app}"
        assert env["AWS_SECRET_ACCESS_KEY"]["valueFrom"]["secretKeyRef"]["name"] == SECRET
    else:
        assert env["LOCKGATE_SAVEPOINT_DIR"]["value"] == f"{SP_MOUNT}/{SP_SUBDIR}"


def test_an_ad_hoc_savepoint_job_halts_nothing(release: tuple[Pipeline, Store]) -> None:
    p, store = release
    c, ns = p.cluster, p.ns
    job = "sp-adhoc"
    t = time.monotonic()
    c.kubectl("-n", ns, "create", "job", f"--from=cronjob/{CRONJOB}", job)
    try:
        c.kubectl(
            "-n", ns, "wait", "--for=condition=complete", f"job/{job}", "--timeout=240s",
            timeout=260,
        )  # fmt: skip
    except RuntimeError:
        print(c.kubectl("-n", ns, "logs", f"job/{job}", "--tail=-1"))
        raise
    timed(f"[{store.kind}] ad-hoc savepoint Job -> complete", time.monotonic() - t)
    descriptor = descriptor_in(c.kubectl("-n", ns, "logs", f"job/{job}", "--tail=-1"))
    assert descriptor["stop"] is False, descriptor
    assert p.app in descriptor["apps"], descriptor
    assert descriptor["savepoint"] in store.ids(), store.ids()
    c.kubectl("-n", ns, "delete", "job", job, "--wait=false")
    # Nothing halted: inputs fed after it are processed.
    p.feed(1000)
    p.wait_outputs(120)
    assert p.problems() == []


@pytest.mark.k8s_long
def test_a_failed_savepoint_fails_the_upgrade_and_changes_nothing(
    release: tuple[Pipeline, Store],
) -> None:
    """The savepoint cannot be written: the upgrade fails, the old pods go on, exactly."""
    p, store = release
    c, ns = p.cluster, p.ns
    revision, uids = revision_and_uids(p)
    restarted = restarts(p)
    version = c.get(ns, "secret", "-l", f"owner=helm,name={RELEASE}")["items"]
    before = len(version)
    t = time.monotonic()
    with store.broken():
        with pytest.raises(RuntimeError) as failed:
            upgrade(p, store, "--set", "savepoints.triggerTimeoutSeconds=30")
        timed(f"[{store.kind}] failed savepoint: helm upgrade -> failed", time.monotonic() - t)
        message = str(failed.value)
        assert "pre-upgrade hooks failed" in message or HOOK_JOB in message, message
        job = c.get(ns, "job", HOOK_JOB)  # kept after a failure, for its logs
        conditions = {x["type"]: x["status"] for x in job["status"].get("conditions", [])}
        assert conditions.get("Failed") == "True", job["status"]
        hook_log = c.kubectl("-n", ns, "logs", f"job/{HOOK_JOB}", "--tail=-1")
        print(f"--- the failed hook's log\n{hook_log[-3000:]}")
        status = c.helm("status", RELEASE, "--namespace", ns)
        assert "STATUS: failed" in status, status
        assert len(c.get(ns, "secret", "-l", f"owner=helm,name={RELEASE}")["items"]) == before + 1
        # Nothing of the release changed: same StatefulSet revision, the same pods, Ready.
        assert revision_and_uids(p) == (revision, uids)
        assert restarts(p) == restarted, p.debug()
        assert all(pod_ready(q) for q in p.pods().values()), p.debug()
    # The trigger cancelled its savepoint: the halted key groups resume where they stopped.
    p.feed(1000)
    timed(f"[{store.kind}] failed savepoint: inputs after it -> outputs", p.wait_outputs(240))
    assert p.problems() == []


@pytest.mark.k8s_long
def test_upgrade_with_a_savepoint_while_input_flows_is_exact(
    release: tuple[Pipeline, Store],
) -> None:
    p, store = release
    c, ns = p.cluster, p.ns
    revision, before = revision_and_uids(p)
    with Feeder(p), JobWatch(p, HOOK_JOB) as hook:
        time.sleep(3)
        t = time.monotonic()
        upgrade(p, store, "--set-string", "podAnnotations.lockgate-test/upgrade=one")
        timed(f"[{store.kind}] helm upgrade --wait (hook + roll)", time.monotonic() - t)
        p.wait_all_ready(REPLICAS)
    took = hook.seconds()
    if took is not None:
        timed(f"[{store.kind}] pre-upgrade hook Job (stop-with-savepoint)", took)
    # The hook's descriptor: a stop-with-savepoint of the app, in the store.
    descriptor = descriptor_in(hook.log)
    assert descriptor["stop"] is True, descriptor
    assert p.app in descriptor["apps"], descriptor
    sp_id = descriptor["savepoint"]
    assert sp_id in store.ids(), store.ids()
    # Helm deleted the successful hook Job (hook-succeeded).
    assert f"job.batch/{HOOK_JOB}" not in c.kubectl("-n", ns, "get", "jobs", "-o", "name")
    # Every pod rolled (a new StatefulSet revision) ...
    new_revision, after = revision_and_uids(p)
    assert new_revision != revision
    assert set(after) == set(before) and all(after[n] != before[n] for n in before)
    # ... and the new pods seeded their halted key groups from the hook's savepoint.
    logs = {n: log_text(p, n) for n in after}
    seeded = {n: text.count("seeded from a savepoint") for n, text in logs.items()}
    assert sum(seeded.values()) > 0, seeded
    assert any(sp_id in text for text in logs.values()), f"{sp_id} not in the pods' logs"
    # The operations commands run in a processor's environment (the app's own variables,
    # LOCKGATE_INPUT_TOPIC/OUTPUT_TOPIC, are not refused): no need for the hook's Job.
    listed = c.kubectl(
        "-n", ns, "exec", f"{p.sts}-0", "-c", "processor", "--",
        "lockgate", "savepoint", "list", "--json",
    )  # fmt: skip
    assert sp_id in listed, listed
    # The whole committed output, with input fed throughout: exact.
    p.feed(500)
    t = time.monotonic()
    assert p.problems(timeout=240) == []
    timed(f"[{store.kind}] savepoint upgrade: all inputs -> checked", time.monotonic() - t)


def test_the_console_serves_the_pipeline(release: tuple[Pipeline, Store]) -> None:
    """The chart's console section (``console.enabled``, the s3 release): over HTTP, its page
    names the app, its overview has the app's instances, and it lists the store's completed
    savepoints as the processors' CLI does."""
    p, store = release
    if store.kind != "s3":
        pytest.skip("the console runs with the s3 release (it lists the object store)")
    c, ns = p.cluster, p.ns
    selector = f"app.kubernetes.io/instance={RELEASE},app.kubernetes.io/name=lockgate-console"
    c.kubectl(
        "-n", ns, "wait", "--for=condition=ready", "pod", "-l", selector, "--timeout=120s",
        timeout=140,
    )  # fmt: skip
    [pod] = c.pods(ns, selector)
    base = f"http://{pod['status']['podIP']}:8088"
    service = c.get(ns, "service", f"{p.sts}-console")
    assert service["spec"]["ports"][0]["port"] == 8088, service["spec"]
    # The overview (the JSON behind the page) knows the app once it read its control topic
    # and scraped both instances by their pod DNS names.
    deadline = time.monotonic() + 90
    overview: Any = None
    while time.monotonic() < deadline:
        overview = json.loads(_get(f"{base}/api/overview"))
        if p.app in json.dumps(overview) and all(n in json.dumps(overview) for n in p.pods()):
            break
        time.sleep(1)
    assert p.app in json.dumps(overview), overview
    assert all(n in json.dumps(overview) for n in p.pods()), (list(p.pods()), overview)
    page = _get(f"{base}/")
    assert "lockgate console" in page and p.app in page, page[:3000]
    # The completed savepoints of the store, as the processors' own CLI lists them (a failed
    # savepoint may leave an incomplete directory behind: neither lists it).
    out = c.kubectl(
        "-n", ns, "exec", f"{p.sts}-0", "-c", "processor", "--",
        "lockgate", "savepoint", "list", "--json",
    )  # fmt: skip
    cli = json.loads(out)
    listed = json.loads(_get(f"{base}/api/savepoints"))
    assert [r["savepoint"] for r in cli], cli  # at least the ad-hoc savepoint's
    assert {r["savepoint"] for r in cli} <= set(store.ids()), (cli, store.ids())
    assert [r["savepoint"] for r in listed] == [r["savepoint"] for r in cli], (listed, cli)


def _get(url: str) -> str:
    with urllib.request.urlopen(url, timeout=10) as r:
        assert r.status == 200, url
        return str(r.read().decode())


def test_a_halted_pipeline_fires_the_lag_and_halted_alerts(
    release: tuple[Pipeline, Store],
) -> None:
    """The chart's PrometheusRule over the pods' /metrics: quiet while healthy; a
    stop-with-savepoint while input keeps flowing fires LockgateConsumerLag (the lag follows
    the group's committed offsets, not the halted epochs) and LockgateKeyGroupsHalted, and
    LockgateNoCheckpoint stays quiet (a halted pod still ends idle epochs); a cancel resumes
    the pipeline exactly and the alerts go quiet again.

    No `kubectl exec`: the halt is a Job of the chart's stop CronJob
    (``savepoints.stopJobs``: ``savepoint trigger --pipeline <app> --stop``), the resume a Job
    of its cancel CronJob (``savepoint cancel --halted --pipeline <app>``), which finds the
    savepoint every key group is halted at without being told its id."""
    p, store = release
    install = [*install_args(p, REPLICAS), *store.values, *common_values()]
    rules = chart_rules(
        p, install,
        "--set", f"metrics.prometheusRule.consumerLagRecords={LAG_THRESHOLD}",
        "--set", "metrics.prometheusRule.noCheckpointIntervals=20",  # 10 s at 500 ms
    )  # fmt: skip
    assert {"LockgateConsumerLag", "LockgateKeyGroupsHalted", "LockgateNoCheckpoint"} <= set(rules)
    pod0 = f"{p.sts}-0"
    with PodScraper(p) as scraper:
        p.feed(500)
        p.wait_outputs(120)
        scraper.wait_scrapes(REPLICAS, n=4)
        assert scraper.firing(rules) == set(), "alerts fire on a healthy pipeline"
        with Feeder(p):
            time.sleep(2)
            t = time.monotonic()
            out = run_cron_job(p, STOP_CRONJOB, "sp-stop")
            timed(
                f"[{store.kind}] stop Job (stop-with-savepoint) -> complete", time.monotonic() - t
            )
            descriptor = descriptor_in(out)
            assert descriptor["stop"] is True, descriptor
            sp_id = descriptor["savepoint"]
            assert sp_id in store.ids(), store.ids()
            fired = scraper.wait_firing(rules, {"LockgateConsumerLag", "LockgateKeyGroupsHalted"})
            timed(f"[{store.kind}] halt -> lag and halted alerts fire", time.monotonic() - t)
            assert fired == {"LockgateConsumerLag", "LockgateKeyGroupsHalted"}, fired
            lag = scraper.value(rules["LockgateConsumerLag"])
            assert list(lag.values())[0] > LAG_THRESHOLD, lag
            halted = scraper.value(rules["LockgateKeyGroupsHalted"])
            assert {dict(k)["pod"] for k in halted} == set(p.pods()), halted
            code, body = p.http(p.pods()[pod0], "/readyz")
            assert code == 503 and "halted" in body, (code, body)
            # The runbook's resume without a restore (the stop was a mistake): the cancel Job
            # finds the savepoint every key group is halted at (stdout: its id).
            t = time.monotonic()
            out = run_cron_job(p, CANCEL_CRONJOB, "sp-resume")
            timed(f"[{store.kind}] cancel Job (resume) -> complete", time.monotonic() - t)
            assert sp_id in out.splitlines(), out
            groups = ",".join(str(g) for g in range(PARTITIONS))
            assert f"cancelled {sp_id} in {p.app} (halted: {p.app} key group(s) {groups})" in out, (
                out
            )
        p.wait_outputs(180)
        deadline = time.monotonic() + 90
        while scraper.firing(rules) and time.monotonic() < deadline:
            time.sleep(0.5)
        assert scraper.firing(rules) == set(), "alerts still fire after the resume"
    assert p.problems() == []


@pytest.mark.k8s_long
def test_a_crash_looping_release_fires_lockgate_crash_looping(
    release: tuple[Pipeline, Store],
) -> None:
    """LockgateCrashLooping fires on a real crash-looping pod, and not on the healthy release.

    The rule reads kube-state-metrics' ``kube_pod_container_status_restarts_total``, and
    kube-state-metrics is not on this cluster: the series is built from the Kubernetes API
    instead (tests/k8s/alerts.py's RestartSampler: every container's ``restartCount``, every
    second, labelled ``namespace``, ``pod``, ``uid`` and ``container`` as kube-state-metrics
    exports it). The rule of each release is rendered by ``helm template`` from that release's
    values with ``crashRestartsPer15m=1`` and evaluated with its ``for:`` by the PromQL-subset
    evaluator after every sample. A second release, ``crashy``, in the same namespace runs an
    app attribute that does not exist: its processor exits 2 at start (a configuration error),
    again after each restart. Its rule fires once it restarted twice (increase > 1), for that
    pod; the healthy release's rule never leaves inactive.
    """
    p, store = release
    if store.kind != "s3":
        pytest.skip("runs once, with the s3 release")
    c, ns = p.cluster, p.ns
    crashy = Pipeline(c, ns, p.bootstrap, unique("k8s-crashy"), p.inp, unique("k8s-crashy-out"))
    crashy.release = CRASHY
    crashy_install = [
        *install_args(crashy, 1),
        "--set", "app=examples.running_sum:no_such_app",
        "--set", "persistence.enabled=false",
    ]  # fmt: skip
    threshold = ["--set", "metrics.prometheusRule.crashRestartsPer15m=1"]
    healthy_install = [*install_args(p, REPLICAS), *store.values, *common_values()]
    rules = {
        RELEASE: chart_rule(p, healthy_install, "LockgateCrashLooping", *threshold),
        CRASHY: chart_rule(crashy, crashy_install, "LockgateCrashLooping", *threshold),
    }
    assert rules[CRASHY]["expr"].endswith(") > 1"), rules
    pod = f"{crashy.sts}-0"
    try:
        with RestartSampler(p, rules) as sampler:
            deadline = time.monotonic() + 30
            while sampler.samples < 3 and time.monotonic() < deadline:
                time.sleep(0.5)
            assert sampler.samples >= 3, sampler.errors
            t = time.monotonic()
            c.helm("install", *crashy_install)
            fired = sampler.wait_firing(CRASHY, timeout=180)
            timed("LockgateCrashLooping: helm install -> fires", time.monotonic() - t)
            [state] = fired
            assert dict(state.labels) == {"namespace": ns, "pod": pod}, state
            assert state.value > 1, state
            assert sampler.transitions(RELEASE) == [], sampler.transitions(RELEASE)
            assert sampler.firing(RELEASE) == []
        status = c.get(ns, "pod", pod)["status"]
        [processor] = [x for x in status["containerStatuses"] if x["name"] == "processor"]
        assert processor["restartCount"] >= 2, processor
        assert processor["lastState"]["terminated"]["exitCode"] == 2, processor
        # The last run's log (the kubelet may be replacing that container just now: retry).
        previous = ""
        deadline = time.monotonic() + 60
        while "no_such_app" not in previous and time.monotonic() < deadline:
            try:
                previous = c.kubectl("-n", ns, "logs", pod, "-c", "processor", "--previous")
            except RuntimeError as e:
                previous = str(e)
            if "no_such_app" not in previous:
                time.sleep(2)
        assert "no_such_app" in previous, previous
    finally:
        c.helm("uninstall", CRASHY, "--namespace", ns, "--wait", "--timeout", "60s")
