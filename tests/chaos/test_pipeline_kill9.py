"""Exactly-once across two chained apps under kill -9 at random moments.

examples/click_pipeline.py: two click_app instances read a 4-partition clicks topic that
keeps receiving clicks and write the internal topic user-counts (4 partitions, barriers at
every epoch end); two region_app instances read it and write region-totals. Every click is
from a user of key group 0, so the click_app instance that does not own it gets no input at
all (an idle upstream instance: it must keep sending barriers, or every downstream
checkpoint waits for it; issue 25). A random
instance of either app is killed with SIGKILL at random moments (sometimes again right after
its restart, into start-up and restore; sometimes its state dir is wiped) and restarted with
the same instance id. After the input ends and everything drained, both committed outputs
(read_committed) must equal the independent model of tests/chaos/_pipeline.py: one record
per click with the user's exact running count, in order, and per region the totals 1..n.

``LOCKGATE_CHAOS_KILLS`` (default 6; ``make chaos`` uses 40) sets the number of kills and
``LOCKGATE_CHAOS_SEED`` repeats a run (the seed is printed and in every assertion message).
"""

from __future__ import annotations

import os
import random
import time
from pathlib import Path

import pytest

from tests.chaos._harness import (
    chaos_env,
    chaos_seed,
    describe_group,
    kill_at_random,
    stop_feeding_soon,
)
from tests.chaos._pipeline import (
    CLICK_SPEC,
    REGION_SPEC,
    ClickFeeder,
    Model,
    PipelineFleet,
    Topics,
    check_pipeline,
    data_records,
    pipeline_env,
    read_clicks,
    read_topic,
)
from tests.support.kafka import create_topic

pytestmark = pytest.mark.chaos

KILLS = int(os.environ.get("LOCKGATE_CHAOS_KILLS", "6"))
PARTITIONS = 4


def _env(bootstrap: str, topics: Topics, app_name: str, alignment: str) -> dict[str, str]:
    env = chaos_env(bootstrap, app_name, topics.clicks, topics.totals)
    del env["LOCKGATE_INPUT_TOPIC"]  # the pipeline's apps name their topics themselves
    return pipeline_env(bootstrap, topics, app_name, **env, LOCKGATE_ALIGNMENT=alignment)


@pytest.mark.parametrize("alignment", ["aligned", "none"])
def test_pipeline_kill9_exactly_once(kafka_bootstrap: str, tmp_path: Path, alignment: str) -> None:
    seed = chaos_seed()
    rng = random.Random(seed)
    topics = Topics.fresh("chaos-pipe")
    create_topic(kafka_bootstrap, topics.clicks, PARTITIONS)
    create_topic(kafka_bootstrap, topics.counts, PARTITIONS)
    total = max(4000, KILLS * 500)
    feeder = ClickFeeder(
        kafka_bootstrap,
        topics.clicks,
        total=total,
        rate=total / (KILLS * 2.5 + 10),
        users=40,
        regions=5,
        only={0},
        partitions=PARTITIONS,
    )
    fleets = {
        "click": PipelineFleet(
            CLICK_SPEC,
            _env(kafka_bootstrap, topics, topics.click_app, alignment),
            tmp_path,
            ["c1", "c2"],
        ),
        "region": PipelineFleet(
            REGION_SPEC,
            _env(kafka_bootstrap, topics, topics.region_app, alignment),
            tmp_path,
            ["r1", "r2"],
        ),
    }
    instances = [(name, iid) for name, fleet in fleets.items() for iid in fleet.ids]
    history: list[str] = []
    started = time.monotonic()

    def logs() -> str:
        return "\n".join(fleet.logs() for fleet in fleets.values())

    def diagnose() -> str:
        """Groups, then stacks and log tails of live instances (compact: CI cuts long output)."""
        for fleet in fleets.values():
            fleet.dump_stacks()
        time.sleep(1.0)
        groups = [describe_group(kafka_bootstrap, a) for a in (topics.click_app, topics.region_app)]
        return "\n".join(groups + [fleet.tails(40) for fleet in fleets.values()])

    def about() -> str:
        return f"seed {seed} ({alignment}); kills: {', '.join(history)}"

    for fleet in fleets.values():
        fleet.start_all()
    feeder.start()
    try:

        def pick() -> tuple[PipelineFleet, str]:
            name, victim = rng.choice(instances)
            return fleets[name], victim

        kill_at_random(rng, pick, KILLS, history, started)
        stop_feeding_soon(feeder)
        feeder.join(300)
        assert feeder.error is None, feeder.error
        n = len(feeder.produced)
        stored = read_clicks(kafka_bootstrap, topics.clicks, n)
        assert sorted(stored) == sorted(feeder.produced), about()
        counts = read_topic(kafka_bootstrap, topics.counts, expected=n, timeout=180, idle=3)
        totals = read_topic(kafka_bootstrap, topics.totals, expected=n, timeout=120, idle=3)
        problems = check_pipeline(Model.of(stored), counts, totals)
        report = diagnose() if problems else ""
        codes: dict[str, int] = {}
        for fleet in fleets.values():
            codes.update(fleet.stop_all())
    except BaseException:
        print(about())
        print(logs())
        print(diagnose())
        raise
    starts = sum(fleet.starts for fleet in fleets.values())
    print(
        f"pipeline chaos {about()}: {n} clicks, {len(data_records(counts))} user-counts, "
        f"{len(data_records(totals))} region-totals, {starts} starts, "
        f"{time.monotonic() - started:.0f}s"
    )
    assert problems == [], about() + "\n" + "\n".join(problems[:20]) + "\n" + report
    assert codes == {"c1": 0, "c2": 0, "r1": 0, "r2": 0}, about() + "\n" + logs()
