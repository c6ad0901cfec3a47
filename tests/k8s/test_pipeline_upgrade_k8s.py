"""A pipeline of two Helm releases: upgraded with a savepoint, then restored into fresh volumes.

examples/click_pipeline.py as two releases in one namespace: ``clicks`` (click_app: reads the
clicks, writes per-user counts to an internal topic) and ``regions`` (region_app: reads that
topic, writes region totals), 2 replicas each, both ``upgrade.mode: savepoint`` with one
savepoint location in an object store (``s3://``, an S3 API server on the node: moto's, as in
test_savepoint_upgrade_k8s.py), credentials from a Secret. ``clicks`` also runs the chart's
console and has the stop and cancel CronJobs.

1. While clicks flow: ``helm upgrade regions`` (the downstream release first; its pre-upgrade
   hook halts the whole pipeline at one stop-with-savepoint), then ``helm upgrade clicks`` with
   ``upgrade.triggerSavepoint=false`` (no hook). Every pod of both releases rolls and resumes
   from the savepoint.
2. While clicks flow: a stop-with-savepoint of the pipeline to the object store (a Job of the
   ``clicks`` release's stop CronJob, ``savepoints.stopJobs``: ``lockgate savepoint trigger
   --pipeline --stop``), both releases uninstalled and their
   state claims deleted (no local state left), both installed again with
   ``LOCKGATE_FROM_SAVEPOINT``: every key group of both apps is seeded from the savepoint in the
   store on a fresh volume, as docs/helm.md's restore prescribes.

After each, both committed outputs (read_committed) equal the model of the clicks as stored: one
user count per click with the user's running count, one region total per count.
"""

from __future__ import annotations

import json
import time
import urllib.request
from collections.abc import Iterator

import pytest

from tests.chaos._pipeline import (
    CLICK_SPEC,
    REGION_SPEC,
    ClickFeeder,
    Model,
    Topics,
    check_pipeline,
    count_committed_data,
    pipeline_env,
    read_clicks,
    read_topic,
)
from tests.k8s.kube import Cluster, chart_dir, kafka_bootstrap_in_cluster, timed
from tests.k8s.pipeline import (
    JobWatch,
    Pipeline,
    descriptor_in,
    json_line,
    log_text,
    restarts,
    revision_and_uids,
    run_cron_job,
)
from tests.k8s.store import BUCKET, S3Server, create_secret, s3_values
from tests.support.kafka import create_topic, unique

pytestmark = [pytest.mark.k8s, pytest.mark.k8s_long]

REPLICAS = 2
PARTITIONS = 4
SP_PREFIX = f"{BUCKET}/clicks-pipeline"
CONSOLE_PORT = 8088
Fixture = tuple[Pipeline, Pipeline, Topics, str, S3Server]


def release_args(p: Pipeline, spec: str, topics: Topics, server: S3Server) -> list[str]:
    """The release's values: the same savepoint location for both, the console in ``clicks``."""
    # The three topics, as the apps declare them (pipeline_env's other entries are the chart's).
    env = {k: v for k, v in pipeline_env("", topics, "").items() if k.endswith("_TOPIC")}
    # The console and the stop and cancel CronJobs in clicks (they act on the whole pipeline).
    console = (
        ["--set", "console.enabled=true", "--set", "savepoints.stopJobs.enabled=true"]
        if p.release == "clicks"
        else []
    )
    return [
        p.release, chart_dir(), "--namespace", p.ns,
        "--set", f"app={spec}",
        "--set", f"appName={p.app}",
        "--set", f"replicaCount={REPLICAS}",
        "--set", f"kafka.bootstrapServers={kafka_bootstrap_in_cluster(p.ns)}",
        "--set", "image.tag=dev",
        "--set", "image.pullPolicy=Never",
        "--set", "persistence.storageClassName=lockgate-local",
        "--set", "persistence.size=1Gi",
        "--set", "processing.checkpointIntervalMs=500",
        "--set", "resources.requests.cpu=100m",
        "--set", "resources.requests.memory=256Mi",
        *s3_values(server, SP_PREFIX),
        *console,
        "--set", "savepoints.triggerTimeoutSeconds=90",
        "--set", "upgrade.mode=savepoint",
        "--set-json", "env=" + json.dumps(env),
    ]  # fmt: skip


@pytest.fixture(scope="module")
def pipeline(cluster: Cluster) -> Iterator[Fixture]:
    ns = unique("lgk8s-pipe")
    cluster.create_namespace(ns)
    topics = Topics.fresh("k8s-pipe")
    clicks = Pipeline(cluster, ns, "", topics.click_app, topics.clicks, topics.counts)
    clicks.release = "clicks"
    regions = Pipeline(cluster, ns, "", topics.region_app, topics.counts, topics.totals)
    regions.release = "regions"
    server = S3Server()
    try:
        server.start()
        server.create_bucket()
        create_secret(cluster, ns)
        bootstrap = cluster.install_kafka(ns)
        clicks.bootstrap = regions.bootstrap = bootstrap
        create_topic(bootstrap, topics.clicks, PARTITIONS)
        create_topic(bootstrap, topics.counts, PARTITIONS)
        t = time.monotonic()
        cluster.helm("install", *release_args(clicks, CLICK_SPEC, topics, server))
        cluster.helm("install", *release_args(regions, REGION_SPEC, topics, server))
        clicks.wait_all_ready(REPLICAS)
        regions.wait_all_ready(REPLICAS)
        timed("pipeline: 2 releases installed -> 4/4 Ready", time.monotonic() - t)
        for p in (clicks, regions):  # none at start-up (the group coordinators were loading)
            assert set(restarts(p).values()) == {0}, p.debug()
        yield clicks, regions, topics, bootstrap, server
    except BaseException:
        for p in (clicks, regions):
            try:
                print(p.debug())
            except Exception as e:  # noqa: BLE001 - best effort diagnostics
                print(f"no diagnostics: {e}")
        raise
    finally:
        for release in ("regions", "clicks"):
            try:
                cluster.helm("uninstall", release, "--namespace", ns, "--wait", "--timeout", "120s")
            except Exception as e:  # noqa: BLE001 - teardown continues; the cluster goes anyway
                print(f"helm uninstall {release}: {e}")
        cluster.delete_namespace(ns)
        server.stop()


def test_pipeline_upgrade_downstream_first_while_clicks_flow_is_exact(pipeline: Fixture) -> None:
    clicks, regions, topics, bootstrap, server = pipeline
    c = clicks.cluster
    feeder = ClickFeeder(bootstrap, topics.clicks, 10**6, rate=200, users=40, regions=5)
    before = {p.release: revision_and_uids(p) for p in (clicks, regions)}
    feeder.start()
    try:
        read_topic(bootstrap, topics.totals, expected=500, timeout=120, idle=0)
        t = time.monotonic()
        with JobWatch(regions, "regions-lockgate-savepoint-upgrade") as hook:
            c.helm(
                "upgrade", *release_args(regions, REGION_SPEC, topics, server),
                "--wait", "--timeout", "8m", timeout=600,
            )  # fmt: skip
        timed("pipeline: helm upgrade regions (hook + roll)", time.monotonic() - t)
        t2 = time.monotonic()
        c.helm(
            "upgrade", *release_args(clicks, CLICK_SPEC, topics, server),
            "--set", "upgrade.triggerSavepoint=false",
            "--wait", "--timeout", "8m", timeout=600,
        )  # fmt: skip
        timed("pipeline: helm upgrade clicks (no hook; roll)", time.monotonic() - t2)
        timed("pipeline: both upgrades", time.monotonic() - t)
        clicks.wait_all_ready(REPLICAS)
        regions.wait_all_ready(REPLICAS)
        time.sleep(3)
    finally:
        feeder.stop()
        feeder.join(60)
    assert feeder.error is None, feeder.error
    descriptor = descriptor_in(hook.log)
    assert descriptor["stop"] is True, descriptor
    assert set(descriptor["apps"]) == {topics.click_app, topics.region_app}, descriptor
    sp_id = descriptor["savepoint"]
    assert sp_id in server.ids(SP_PREFIX), server.ids(SP_PREFIX)
    # Both releases rolled every pod, and every new pod resumed from the hook's savepoint.
    for p in (clicks, regions):
        revision, uids = revision_and_uids(p)
        assert revision != before[p.release][0], p.release
        assert all(uids[n] != before[p.release][1][n] for n in uids), p.release
        logs = {n: log_text(p, n) for n in uids}
        assert sum(text.count("seeded from a savepoint") for text in logs.values()) > 0, p.release
        assert any(sp_id in text for text in logs.values()), (p.release, sp_id)
    total = len(feeder.produced)
    t = time.monotonic()
    counts = read_topic(bootstrap, topics.counts, expected=total, timeout=240, idle=2)
    totals = read_topic(bootstrap, topics.totals, expected=total, timeout=120, idle=2)
    stored = read_clicks(bootstrap, topics.clicks, total)
    problems = check_pipeline(Model.of(stored), counts, totals)
    assert problems == [], "\n".join(problems[:20])
    timed(f"pipeline: {total} clicks -> both outputs checked", time.monotonic() - t)


def test_console_names_both_apps_of_the_pipeline(pipeline: Fixture) -> None:
    """The chart's console (``console.enabled`` in ``clicks``) serves a page naming both apps
    of the pipeline (it reads every app's control topic and scrapes the pods by DNS name)."""
    clicks, regions, topics, _, _ = pipeline
    c, ns = clicks.cluster, clicks.ns
    selector = "app.kubernetes.io/instance=clicks,app.kubernetes.io/name=lockgate-console"
    c.kubectl(
        "-n", ns, "wait", "--for=condition=ready", "pod", "-l", selector, "--timeout=120s",
        timeout=140,
    )  # fmt: skip
    [pod] = c.pods(ns, selector)
    url = f"http://{pod['status']['podIP']}:{CONSOLE_PORT}/"
    apps = {topics.click_app, topics.region_app}
    page = ""
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline:
        with urllib.request.urlopen(url, timeout=10) as r:
            assert r.status == 200
            page = r.read().decode()
        if all(a in page for a in apps):
            break
        time.sleep(1)
    assert "lockgate console" in page, page[:2000]
    assert all(a in page for a in apps), (apps, page[:4000])


def test_restore_both_releases_into_fresh_volumes_from_the_object_store_is_exact(
    pipeline: Fixture,
) -> None:
    """Stop-with-savepoint to S3 while clicks flow, uninstall both releases, delete every state
    claim, install both again from the savepoint: every key group is seeded from it on a fresh
    volume, and both outputs are exact (nothing after the cut was committed before it)."""
    clicks, regions, topics, bootstrap, server = pipeline
    c, ns = clicks.cluster, clicks.ns
    releases = (clicks, regions)
    before = count_committed_data(bootstrap, topics.clicks)
    old_claims = {p.release: claims(p) for p in releases}
    assert all(len(v) == REPLICAS for v in old_claims.values()), old_claims
    feeder = ClickFeeder(bootstrap, topics.clicks, 10**6, rate=200, users=40, regions=5)
    feeder.start()
    try:
        time.sleep(3)
        t = time.monotonic()
        # The operator's stop-with-savepoint: a Job of the clicks release's stop CronJob
        # (savepoints.stopJobs; no exec), as docs/helm.md's restore runs it.
        out = run_cron_job(clicks, "clicks-lockgate-savepoint-stop", "restore-stop")
        descriptor = descriptor_in(out)
        assert descriptor["stop"] is True, descriptor
        assert set(descriptor["apps"]) == {topics.click_app, topics.region_app}, descriptor
        sp_id = descriptor["savepoint"]
        assert sp_id in server.ids(SP_PREFIX), server.ids(SP_PREFIX)
        timed("restore: stop-with-savepoint to s3", time.monotonic() - t)
        # No local state left: both releases and every claim of their pods gone.
        t = time.monotonic()
        for p in (regions, clicks):
            c.helm("uninstall", p.release, "--namespace", ns, "--wait", "--timeout", "3m")
        for p in releases:
            c.kubectl("-n", ns, "delete", "pvc", *old_claims[p.release], "--wait=true", timeout=180)
            assert claims(p) == {}, claims(p)
        timed("restore: both releases uninstalled, claims deleted", time.monotonic() - t)
        # Both again, from the savepoint (docs/helm.md, restore into fresh volumes).
        t = time.monotonic()
        for p, spec in ((clicks, CLICK_SPEC), (regions, REGION_SPEC)):
            c.helm(
                "install", *release_args(p, spec, topics, server),
                "--set", "upgrade.mode=none",
                "--set-string", f"env.LOCKGATE_FROM_SAVEPOINT={sp_id}",
            )  # fmt: skip
        for p in releases:
            p.wait_all_ready(REPLICAS)
        timed(
            "restore: both releases installed from the savepoint -> 4/4 Ready", time.monotonic() - t
        )
        time.sleep(3)
    finally:
        feeder.stop()
        feeder.join(60)
    assert feeder.error is None, feeder.error
    for p in releases:
        new = claims(p)
        assert len(new) == REPLICAS, new
        # Fresh volumes: other PersistentVolumes (the old ones are Released: Retain policy).
        assert all(new.values()), new
        assert not set(new.values()) & set(old_claims[p.release].values()), (new, old_claims)
        # Every key group of the app (one per input partition) was seeded from that savepoint.
        seeded = [
            line
            for n in p.pods()
            for line in map(json_line, log_text(p, n).splitlines())
            if line.get("msg") == "key group seeded from a savepoint"
        ]
        assert {line["key_group"] for line in seeded} == set(range(PARTITIONS)), seeded
        assert {line["savepoint"] for line in seeded} == {sp_id}, seeded
    total = before + len(feeder.produced)
    t = time.monotonic()
    counts = read_topic(bootstrap, topics.counts, expected=total, timeout=240, idle=2)
    totals = read_topic(bootstrap, topics.totals, expected=total, timeout=120, idle=2)
    stored = read_clicks(bootstrap, topics.clicks, total)
    assert len(stored) == total, (len(stored), total)
    problems = check_pipeline(Model.of(stored), counts, totals)
    assert problems == [], "\n".join(problems[:20])
    timed(f"restore: {total} clicks -> both outputs checked", time.monotonic() - t)


def claims(p: Pipeline) -> dict[str, str]:
    """The release's state claims (``data-<pod>``): name -> the PersistentVolume bound to it."""
    items = p.cluster.get(p.ns, "pvc")["items"]
    prefix = f"data-{p.sts}-"
    return {
        q["metadata"]["name"]: q["spec"].get("volumeName", "")
        for q in items
        if q["metadata"]["name"].startswith(prefix)
    }
