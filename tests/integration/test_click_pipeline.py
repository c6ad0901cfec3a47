"""examples/click_pipeline.py end to end: two apps chained through an internal topic.

Two click_app and two region_app processes; clicks on a 4-partition topic, user-counts with
4 partitions. Both committed outputs (read_committed) are compared with an independent model
computed from the stored clicks (tests/chaos/_pipeline.py), in both checkpoint modes.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from tests.chaos._pipeline import (
    CLICK_SPEC,
    REGION_SPEC,
    Model,
    PipelineFleet,
    Topics,
    barrier_partitions,
    check_pipeline,
    data_records,
    pipeline_env,
    produce_clicks,
    random_clicks,
    read_clicks,
    read_topic,
)
from tests.support.kafka import create_topic

N = 3000
PARTITIONS = 4


@pytest.mark.parametrize("alignment", ["aligned", "none"])
def test_click_pipeline_exact_output(kafka_bootstrap: str, tmp_path: Path, alignment: str) -> None:
    topics = Topics.fresh("pipe")
    create_topic(kafka_bootstrap, topics.clicks, PARTITIONS)
    create_topic(kafka_bootstrap, topics.counts, PARTITIONS)
    clicks = random_clicks(N, users=40, regions=5, seed=11)
    produce_clicks(kafka_bootstrap, topics.clicks, clicks[: N // 2])
    common = {"LOCKGATE_CHECKPOINT_INTERVAL_MS": "300", "LOCKGATE_ALIGNMENT": alignment}
    click_fleet = PipelineFleet(
        CLICK_SPEC,
        pipeline_env(kafka_bootstrap, topics, topics.click_app, **common),
        tmp_path,
        ["c1", "c2"],
        ports=True,
    )
    region_fleet = PipelineFleet(
        REGION_SPEC,
        pipeline_env(kafka_bootstrap, topics, topics.region_app, **common),
        tmp_path,
        ["r1", "r2"],
        ports=True,
    )
    fleets = (click_fleet, region_fleet)
    codes: dict[str, int] = {}
    started = time.monotonic()
    try:
        for fleet in fleets:
            fleet.start_all()
        # Once the first half went through click_app, the second half arrives in bursts:
        # several epochs, with barriers between the data records of the internal topic.
        read_topic(kafka_bootstrap, topics.counts, expected=N // 2, timeout=60, idle=0)
        for burst in range(5):
            time.sleep(0.5)
            part = clicks[N // 2 + burst * N // 10 : N // 2 + (burst + 1) * N // 10]
            produce_clicks(kafka_bootstrap, topics.clicks, part)
        counts = read_topic(kafka_bootstrap, topics.counts, expected=N, timeout=75, idle=2)
        totals = read_topic(kafka_bootstrap, topics.totals, expected=N, timeout=30, idle=2)
    finally:
        for fleet in fleets:
            codes.update(fleet.stop_all())
    elapsed = time.monotonic() - started
    logs = "\n".join(fleet.logs() for fleet in fleets)

    stored = read_clicks(kafka_bootstrap, topics.clicks, N)
    assert sorted(stored) == sorted(clicks)
    problems = check_pipeline(Model.of(stored), counts, totals)
    assert problems == [], "\n".join(problems[:20]) + "\n" + logs
    assert len(data_records(counts)) == N and len(data_records(totals)) == N
    # Barriers are in the internal topic (and only there: check_pipeline checked totals).
    barriers = barrier_partitions(counts)
    assert set(barriers) == set(range(PARTITIONS)), barriers
    assert codes == {"c1": 0, "c2": 0, "r1": 0, "r2": 0}, logs
    print(f"{alignment}: {N} clicks through both apps in {elapsed:.1f}s, barriers {barriers}")
