"""A pipeline of two Helm releases upgraded with a savepoint, as docs/helm.md prescribes.

examples/click_pipeline.py as two releases in one namespace: ``clicks`` (click_app: reads the
clicks, writes per-user counts to an internal topic) and ``regions`` (region_app: reads that
topic, writes region totals), 2 replicas each, both ``upgrade.mode: savepoint`` with one
savepoint location (the claim ``clicks`` renders; ``regions`` names it as ``existingClaim``).

While clicks flow: ``helm upgrade regions`` (the downstream release first; its pre-upgrade hook
halts the whole pipeline at one stop-with-savepoint), then ``helm upgrade clicks`` with
``upgrade.triggerSavepoint=false`` (no hook). Every pod of both releases rolls and resumes from
the savepoint, and both committed outputs (read_committed) equal the model of the clicks as
stored: one user count per click with the user's running count, one region total per count.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator

import pytest

from tests.chaos._pipeline import (
    CLICK_SPEC,
    REGION_SPEC,
    ClickFeeder,
    Model,
    Topics,
    check_pipeline,
    pipeline_env,
    read_clicks,
    read_topic,
)
from tests.k8s.kube import Cluster, chart_dir, kafka_bootstrap_in_cluster, timed
from tests.k8s.pipeline import (
    JobWatch,
    Pipeline,
    descriptor_in,
    log_text,
    restarts,
    revision_and_uids,
)
from tests.support.kafka import create_topic, unique

pytestmark = [pytest.mark.k8s, pytest.mark.k8s_long]

REPLICAS = 2
PARTITIONS = 4
SP_MOUNT = "/var/lib/lockgate-savepoints"
SP_CLAIM = "clicks-lockgate-savepoints"


def release_args(p: Pipeline, spec: str, topics: Topics) -> list[str]:
    # The three topics, as the apps declare them (pipeline_env's other entries are the chart's).
    env = {k: v for k, v in pipeline_env("", topics, "").items() if k.endswith("_TOPIC")}
    claim = (
        ["--set", "savepoints.persistentVolumeClaim.storageClassName=lockgate-local",
         "--set", "savepoints.persistentVolumeClaim.size=1Gi",
         "--set-json", 'savepoints.persistentVolumeClaim.accessModes=["ReadWriteOnce"]']
        if p.release == "clicks"
        else ["--set", f"savepoints.persistentVolumeClaim.existingClaim={SP_CLAIM}"]
    )  # fmt: skip
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
        "--set", "savepoints.persistentVolumeClaim.enabled=true",
        *claim,
        "--set", f"savepoints.location={SP_MOUNT}/clicks-pipeline",
        "--set", "savepoints.triggerTimeoutSeconds=90",
        "--set", "upgrade.mode=savepoint",
        "--set-json", "env=" + json.dumps(env),
    ]  # fmt: skip


@pytest.fixture(scope="module")
def pipeline(cluster: Cluster) -> Iterator[tuple[Pipeline, Pipeline, Topics, str]]:
    ns = unique("lgk8s-pipe")
    cluster.create_namespace(ns)
    topics = Topics.fresh("k8s-pipe")
    clicks = Pipeline(cluster, ns, "", topics.click_app, topics.clicks, topics.counts)
    clicks.release = "clicks"
    regions = Pipeline(cluster, ns, "", topics.region_app, topics.counts, topics.totals)
    regions.release = "regions"
    try:
        bootstrap = cluster.install_kafka(ns)
        clicks.bootstrap = regions.bootstrap = bootstrap
        create_topic(bootstrap, topics.clicks, PARTITIONS)
        create_topic(bootstrap, topics.counts, PARTITIONS)
        t = time.monotonic()
        cluster.helm("install", *release_args(clicks, CLICK_SPEC, topics))
        cluster.helm("install", *release_args(regions, REGION_SPEC, topics))
        clicks.wait_all_ready(REPLICAS)
        regions.wait_all_ready(REPLICAS)
        timed("pipeline: 2 releases installed -> 4/4 Ready", time.monotonic() - t)
        for p in (clicks, regions):  # none at start-up (the group coordinators were loading)
            assert set(restarts(p).values()) == {0}, p.debug()
        yield clicks, regions, topics, bootstrap
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


def test_pipeline_upgrade_downstream_first_while_clicks_flow_is_exact(
    pipeline: tuple[Pipeline, Pipeline, Topics, str],
) -> None:
    clicks, regions, topics, bootstrap = pipeline
    c = clicks.cluster
    feeder = ClickFeeder(bootstrap, topics.clicks, 10**6, rate=200, users=40, regions=5)
    before = {p.release: revision_and_uids(p) for p in (clicks, regions)}
    feeder.start()
    try:
        read_topic(bootstrap, topics.totals, expected=500, timeout=120, idle=0)
        t = time.monotonic()
        with JobWatch(regions, "regions-lockgate-savepoint-upgrade") as hook:
            c.helm(
                "upgrade", *release_args(regions, REGION_SPEC, topics),
                "--wait", "--timeout", "8m", timeout=600,
            )  # fmt: skip
        timed("pipeline: helm upgrade regions (hook + roll)", time.monotonic() - t)
        t2 = time.monotonic()
        c.helm(
            "upgrade", *release_args(clicks, CLICK_SPEC, topics),
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
