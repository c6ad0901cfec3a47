"""Pipeline savepoints and alignment timeouts on examples/click_pipeline.py.

* **Savepoint equivalence**: a stop-with-savepoint of the whole two-app pipeline is
  triggered under load; every instance is stopped; both apps are restarted from the
  savepoint (fresh state dirs) and run to the end. The committed outputs must equal an
  uninterrupted run's: exactly one user-counts record per click with the per-user
  running count, exactly one region total per record with totals 1..n per region.
* **A stopped upstream**: with one of two upstream instances SIGSTOPped, the downstream
  keeps committing (alignments switch to unaligned after LOCKGATE_ALIGNMENT_TIMEOUT_MS,
  nothing waits for the stopped writer beyond it, no transaction times out), and a
  savepoint then fails with a clear error instead of hanging.
"""

from __future__ import annotations

import signal
import time
from pathlib import Path

import pytest

from tests.chaos._pipeline import (
    CLICK_SPEC,
    REGION_SPEC,
    ClickFeeder,
    Model,
    PipelineFleet,
    Topics,
    check_pipeline,
    count_committed_data,
    data_records,
    pipeline_env,
    read_clicks,
    read_topic,
)
from tests.integration._util import http_get, metric
from tests.support.kafka import create_topic
from tests.support.procs import lockgate_cli, wait_until

PARTITIONS = 4


def _fleets(
    bootstrap: str, topics: Topics, root: Path, **common: str
) -> tuple[PipelineFleet, PipelineFleet]:
    click = PipelineFleet(
        CLICK_SPEC,
        pipeline_env(bootstrap, topics, topics.click_app, **common),
        root,
        ["c1", "c2"],
        ports=True,
    )
    region = PipelineFleet(
        REGION_SPEC,
        pipeline_env(bootstrap, topics, topics.region_app, **common),
        root,
        ["r1", "r2"],
        ports=True,
    )
    return click, region


def _wait_stable(*fleets: PipelineFleet) -> None:
    """Wait until every instance of ``fleets`` owns two key groups (the groups formed)."""

    def stable() -> bool:
        owned = [
            metric(http_get(port, "/metrics")[1], "lockgate_key_groups_assigned")
            for fleet in fleets
            for port in fleet.ports.values()
        ]
        return bool(owned) and owned == [2.0] * len(owned)

    wait_until(stable, timeout=60, what="both groups with two key groups per instance")


@pytest.mark.parametrize("alignment", ["aligned", "none"])
def test_pipeline_stop_with_savepoint_and_restore_equals_uninterrupted_run(
    kafka_bootstrap: str, tmp_path: Path, alignment: str
) -> None:
    """With LOCKGATE_ALIGNMENT=none too: a savepoint barrier aligns until it completes."""
    topics = Topics.fresh("sp-pipe")
    create_topic(kafka_bootstrap, topics.clicks, PARTITIONS)
    create_topic(kafka_bootstrap, topics.counts, PARTITIONS)
    sp_dir = tmp_path / "savepoints"
    common = {
        "LOCKGATE_CHECKPOINT_INTERVAL_MS": "300",
        "LOCKGATE_SAVEPOINT_DIR": str(sp_dir),
        "LOCKGATE_ALIGNMENT": alignment,
    }
    # Fed from when both groups have formed until the restored apps have run a few
    # seconds: the stop-with-savepoint lands mid-stream however slowly the apps start,
    # rebalance or stop (a loaded machine: a fixed feed could be processed before it).
    feeder = ClickFeeder(kafka_bootstrap, topics.clicks, 10**6, rate=800, users=40, regions=5)
    first = _fleets(kafka_bootstrap, topics, tmp_path / "a", **common)
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    second: tuple[PipelineFleet, ...] = ()
    codes: dict[str, int] = {}
    try:
        for fleet in first:
            fleet.start_all()
        _wait_stable(*first)
        feeder.start()
        read_topic(kafka_bootstrap, topics.totals, expected=1500, timeout=90, idle=0)
        env = {"LOCKGATE_BOOTSTRAP_SERVERS": kafka_bootstrap, "LOCKGATE_SAVEPOINT_DIR": str(sp_dir)}
        trig = lockgate_cli(env, "savepoint", "trigger", "--pipeline", topics.click_app, "--stop")
        logs = "\n".join(f.logs() for f in first)
        assert trig.returncode == 0, trig.stderr[-3000:] + logs
        sp_id = trig.stdout.strip().splitlines()[-1]
        listed = lockgate_cli(env, "checkpoints", "list", "--pipeline", topics.region_app)
        assert listed.returncode == 0, listed.stderr
        for fleet in first:
            codes.update(fleet.stop_all())
        assert set(codes.values()) == {0}, (codes, logs)
        halted_totals = count_committed_data(kafka_bootstrap, topics.totals)
        assert halted_totals > 0

        restore = {**common, "LOCKGATE_FROM_SAVEPOINT": sp_id}
        second = _fleets(kafka_bootstrap, topics, tmp_path / "b", **restore)
        for fleet in second:
            fleet.start_all()
        time.sleep(3)
        feeder.stop()
        feeder.join(60)
        assert feeder.error is None
        total = len(feeder.produced)
        assert halted_totals < total, (halted_totals, total)
        counts = read_topic(kafka_bootstrap, topics.counts, expected=total, timeout=180, idle=2)
        totals = read_topic(kafka_bootstrap, topics.totals, expected=total, timeout=60, idle=2)
    finally:
        feeder.stop()
        for fleet in (*first, *second):
            for proc in fleet.procs.values():
                if proc.alive:
                    proc.terminate()
    logs = "\n".join(f.logs() for f in (*first, *second))
    stored = read_clicks(kafka_bootstrap, topics.clicks, total)
    problems = check_pipeline(Model.of(stored), counts, totals)
    assert problems == [], "\n".join(problems[:20]) + "\n" + logs
    assert "seeded from a savepoint" in logs


def test_stopped_upstream_switches_to_unaligned_and_fails_savepoint(
    kafka_bootstrap: str, tmp_path: Path
) -> None:
    topics = Topics.fresh("stall")
    create_topic(kafka_bootstrap, topics.clicks, PARTITIONS)
    create_topic(kafka_bootstrap, topics.counts, PARTITIONS)
    common = {
        "LOCKGATE_CHECKPOINT_INTERVAL_MS": "300",
        "LOCKGATE_TRANSACTION_TIMEOUT_MS": "6000",
        "LOCKGATE_ALIGNMENT_TIMEOUT_MS": "1000",
        "LOCKGATE_SAVEPOINT_DIR": str(tmp_path / "savepoints"),
        # A stopped member must not be kicked out during the test: its key groups keep
        # their owner (and their writers keep not delivering barriers).
        "LOCKGATE_KAFKA__SESSION_TIMEOUT_MS": "120000",
    }
    feeder = ClickFeeder(kafka_bootstrap, topics.clicks, 80000, rate=800, users=40, regions=5)
    feeder.start()
    click, region = _fleets(kafka_bootstrap, topics, tmp_path, **common)
    stopped = None
    try:
        click.start_all()
        region.start_all()
        read_topic(kafka_bootstrap, topics.totals, expected=800, timeout=90, idle=0)

        # A stopped member in the middle of a rebalance stalls it all.
        _wait_stable(click, region)
        port = region.ports["r1"]
        # An epoch that met the start-up rebalance aborts (ILLEGAL_GENERATION: r2 joined
        # while r1 committed): that is not the stalled upstream's doing, so only aborts
        # after the SIGSTOP count, read once r1 has committed two epochs since the groups
        # formed (a start-up abort and its producer replacement are over by then).
        committed = metric(http_get(port, "/metrics")[1], "lockgate_epochs_committed_total") or 0
        wait_until(
            lambda: (
                (metric(http_get(port, "/metrics")[1], "lockgate_epochs_committed_total") or 0)
                >= committed + 2
            ),
            60,
            what="two epochs committed by r1",
        )
        aborted_before = metric(http_get(port, "/metrics")[1], "lockgate_epochs_aborted_total")
        stopped = click.procs["c2"]
        stopped.signal(signal.SIGSTOP)

        def forced() -> bool:
            _, text = http_get(port, "/metrics")
            return (metric(text, "lockgate_alignments_forced_total") or 0) > 0

        try:
            wait_until(forced, timeout=30, what="an alignment forced to unaligned")
        except TimeoutError as exc:
            raise AssertionError(
                f"{exc}\n{region.logs()}\n{http_get(port, '/metrics')[1]}"
            ) from exc
        before = count_committed_data(kafka_bootstrap, topics.totals)

        def flowing() -> bool:
            # c1's clicks keep flowing downstream once the broker aborted c2's open
            # transaction (transaction timeout): nothing waits for c2's barriers.
            # (The read stops as soon as there are enough, at most after 20 s.)
            got = read_topic(
                kafka_bootstrap, topics.totals, expected=before + 201, timeout=20, idle=0
            )
            return len(data_records(got)) > before + 200

        wait_until(flowing, timeout=45, interval=1, what="records flowing without c2")
        _, text = http_get(port, "/metrics")
        assert metric(text, "lockgate_epochs_aborted_total") == aborted_before, text
        env = {
            "LOCKGATE_BOOTSTRAP_SERVERS": kafka_bootstrap,
            "LOCKGATE_SAVEPOINT_DIR": common["LOCKGATE_SAVEPOINT_DIR"],
        }
        trig = lockgate_cli(
            env, "savepoint", "trigger", "--pipeline", topics.click_app, "--stop", "--timeout", "8"
        )
        assert trig.returncode == 1, trig.stdout + trig.stderr
        assert "key group" in trig.stderr, trig.stderr
        # c1's key groups halted at the savepoint; it failed, so it was cancelled and they
        # resume: c1's clicks flow again.
        assert "cancelled" in trig.stderr, trig.stderr
        before = count_committed_data(kafka_bootstrap, topics.totals)
        wait_until(flowing, timeout=45, interval=1, what="records flowing after the cancel")
        assert "savepoint cancelled: key groups resume" in click.procs["c1"].log_text()
    finally:
        feeder.rate = 1e-12  # its next pause never ends (a daemon thread): input stops
        if stopped is not None:
            stopped.signal(signal.SIGCONT)
        click.stop_all()
        region.stop_all()


def test_cancelled_stop_with_savepoint_resumes_both_apps_exactly(
    kafka_bootstrap: str, tmp_path: Path
) -> None:
    """Halted source *and* downstream key groups resume on a cancel, exactly once.

    A stop-with-savepoint of the pipeline completes (every key group halted, the
    downstream ones mid-alignment with records released but not processed), then
    `lockgate savepoint cancel` lifts it: both apps go on where they stopped, and
    the outputs of the whole run are checked against the independent model.
    """
    topics = Topics.fresh("sp-cancel")
    create_topic(kafka_bootstrap, topics.clicks, PARTITIONS)
    create_topic(kafka_bootstrap, topics.counts, PARTITIONS)
    sp_dir = tmp_path / "savepoints"
    common = {"LOCKGATE_CHECKPOINT_INTERVAL_MS": "300", "LOCKGATE_SAVEPOINT_DIR": str(sp_dir)}
    # Fed from when both groups have formed until a few seconds after the cancel (as in
    # the first test: a fixed feed could be processed before the trigger).
    feeder = ClickFeeder(kafka_bootstrap, topics.clicks, 10**6, rate=600, users=40, regions=5)
    fleets = _fleets(kafka_bootstrap, topics, tmp_path, **common)
    cli_env = {"LOCKGATE_BOOTSTRAP_SERVERS": kafka_bootstrap, "LOCKGATE_SAVEPOINT_DIR": str(sp_dir)}
    codes: dict[str, int] = {}
    try:
        for fleet in fleets:
            fleet.start_all()
        _wait_stable(*fleets)
        feeder.start()
        read_topic(kafka_bootstrap, topics.totals, expected=1500, timeout=90, idle=0)
        trig = lockgate_cli(
            cli_env, "savepoint", "trigger", "--pipeline", topics.click_app, "--stop"
        )
        assert trig.returncode == 0, trig.stderr[-3000:]
        sp_id = trig.stdout.strip().splitlines()[-1]
        halted = count_committed_data(kafka_bootstrap, topics.totals)
        time.sleep(2)  # halted: nothing more is committed
        assert count_committed_data(kafka_bootstrap, topics.totals) == halted
        cancel = lockgate_cli(cli_env, "savepoint", "cancel", sp_id, "--pipeline", topics.click_app)
        assert cancel.returncode == 0, cancel.stderr
        time.sleep(3)
        feeder.stop()
        feeder.join(60)
        assert feeder.error is None
        total = len(feeder.produced)
        counts = read_topic(kafka_bootstrap, topics.counts, expected=total, timeout=120, idle=2)
        totals = read_topic(kafka_bootstrap, topics.totals, expected=total, timeout=60, idle=2)
    finally:
        feeder.stop()
        for fleet in fleets:
            codes.update(fleet.stop_all())
    logs = "\n".join(f.logs() for f in fleets)
    assert halted < total
    for fleet in fleets:  # source and downstream key groups both halted and resumed
        text = "".join(p.log_text() for p in fleet.procs.values())
        assert "key group halted at a stop-with-savepoint" in text, text[-3000:]
        assert "savepoint cancelled: key groups resume" in text, text[-3000:]
    stored = read_clicks(kafka_bootstrap, topics.clicks, total)
    problems = check_pipeline(Model.of(stored), counts, totals)
    assert problems == [], "\n".join(problems[:20]) + "\n" + logs
    assert set(codes.values()) == {0}, (codes, logs)


def test_stop_with_savepoint_of_the_upstream_alone_leaves_the_downstream_running(
    kafka_bootstrap: str, tmp_path: Path
) -> None:
    """``savepoint trigger --app UP --stop`` halts UP only (issue 25, hole 3).

    The barriers of the savepoint name the apps it was requested for; the downstream app
    is not one of them, so it takes no savepoint and never halts. Before, it halted
    indefinitely (surviving restarts) although nobody asked it to. Cancelling the
    savepoint resumes the upstream, and the whole run is exact.
    """
    topics = Topics.fresh("sp-upstream")
    create_topic(kafka_bootstrap, topics.clicks, PARTITIONS)
    create_topic(kafka_bootstrap, topics.counts, PARTITIONS)
    sp_dir = tmp_path / "savepoints"
    common = {"LOCKGATE_CHECKPOINT_INTERVAL_MS": "300", "LOCKGATE_SAVEPOINT_DIR": str(sp_dir)}
    feeder = ClickFeeder(kafka_bootstrap, topics.clicks, 10**6, rate=600, users=40, regions=5)
    click, region = _fleets(kafka_bootstrap, topics, tmp_path, **common)
    cli_env = {"LOCKGATE_BOOTSTRAP_SERVERS": kafka_bootstrap, "LOCKGATE_SAVEPOINT_DIR": str(sp_dir)}
    codes: dict[str, int] = {}
    try:
        for fleet in (click, region):
            fleet.start_all()
        _wait_stable(click, region)
        feeder.start()
        read_topic(kafka_bootstrap, topics.totals, expected=1000, timeout=90, idle=0)
        trig = lockgate_cli(cli_env, "savepoint", "trigger", "--app", topics.click_app, "--stop")
        assert trig.returncode == 0, trig.stderr[-3000:]
        sp_id = trig.stdout.strip().splitlines()[-1]
        time.sleep(3)  # the downstream reads the savepoint's barriers by now
        region_ready = [http_get(port, "/readyz")[0] for port in region.ports.values()]
        click_ready = [http_get(port, "/readyz")[0] for port in click.ports.values()]
        cancel = lockgate_cli(cli_env, "savepoint", "cancel", sp_id, "--app", topics.click_app)
        assert cancel.returncode == 0, cancel.stderr
        time.sleep(2)
        feeder.stop()
        feeder.join(60)
        assert feeder.error is None
        total = len(feeder.produced)
        counts = read_topic(kafka_bootstrap, topics.counts, expected=total, timeout=120, idle=2)
        totals = read_topic(kafka_bootstrap, topics.totals, expected=total, timeout=60, idle=2)
    finally:
        feeder.stop()
        for fleet in (click, region):
            codes.update(fleet.stop_all())
    logs = "\n".join(f.logs() for f in (click, region))
    click_text = "".join(p.log_text() for p in click.procs.values())
    region_text = "".join(p.log_text() for p in region.procs.values())
    assert "key group halted at a stop-with-savepoint" in click_text, click_text[-3000:]
    assert "key group halted at a stop-with-savepoint" not in region_text, region_text[-3000:]
    assert "requested for other apps: not taken here" in region_text, region_text[-3000:]
    assert click_ready == [503, 503] and region_ready == [200, 200], (click_ready, region_ready)
    stored = read_clicks(kafka_bootstrap, topics.clicks, total)
    problems = check_pipeline(Model.of(stored), counts, totals)
    assert problems == [], "\n".join(problems[:20]) + "\n" + logs
    assert set(codes.values()) == {0}, (codes, logs)


def test_a_non_stop_savepoint_does_not_restore_a_downstream_app_unless_allowed(
    kafka_bootstrap: str, tmp_path: Path
) -> None:
    """Restoring a pipeline from a savepoint taken without --stop double-counts downstream.

    The internal topic still holds what the old upstream wrote after the savepoint, and a
    restored upstream writes it again (issue 25, hole 6). A downstream key group refuses
    such a restore with the reason (exit 2); LOCKGATE_ALLOW_NON_STOP_RESTORE=true lets it
    restore when only it is restored (its upstream keeps running).
    """
    topics = Topics.fresh("sp-nonstop")
    create_topic(kafka_bootstrap, topics.clicks, PARTITIONS)
    create_topic(kafka_bootstrap, topics.counts, PARTITIONS)
    sp_dir = tmp_path / "savepoints"
    common = {"LOCKGATE_CHECKPOINT_INTERVAL_MS": "300", "LOCKGATE_SAVEPOINT_DIR": str(sp_dir)}
    feeder = ClickFeeder(kafka_bootstrap, topics.clicks, 3000, rate=600, users=40, regions=5)
    click, region = _fleets(kafka_bootstrap, topics, tmp_path, **common)
    cli_env = {"LOCKGATE_BOOTSTRAP_SERVERS": kafka_bootstrap, "LOCKGATE_SAVEPOINT_DIR": str(sp_dir)}
    try:
        for fleet in (click, region):
            fleet.start_all()
        _wait_stable(click, region)
        feeder.start()
        read_topic(kafka_bootstrap, topics.totals, expected=500, timeout=90, idle=0)
        trig = lockgate_cli(cli_env, "savepoint", "trigger", "--pipeline", topics.click_app)
        assert trig.returncode == 0, trig.stderr[-3000:]
        sp_id = trig.stdout.strip().splitlines()[-1]
    finally:
        feeder.stop()
        codes = {**click.stop_all(), **region.stop_all()}
    assert set(codes.values()) == {0}, codes
    env = pipeline_env(kafka_bootstrap, topics, topics.region_app, **common)
    env["LOCKGATE_FROM_SAVEPOINT"] = sp_id
    (tmp_path / "refused").mkdir()
    (tmp_path / "allowed").mkdir()
    # Instance id r1 again: it replaces the stopped static member at once (a new id would
    # wait for the old members' sessions to expire before it gets key groups).
    refused = PipelineFleet(REGION_SPEC, env, tmp_path / "refused", ["r1"])
    proc = refused.start("r1")
    assert proc.wait(90) == 2, proc.log_text()[-3000:]
    assert "taken without --stop" in proc.log_text(), proc.log_text()[-3000:]
    env["LOCKGATE_ALLOW_NON_STOP_RESTORE"] = "true"
    allowed = PipelineFleet(REGION_SPEC, env, tmp_path / "allowed", ["r1"])
    proc = allowed.start("r1")
    try:
        wait_until(
            lambda: "seeded from a savepoint" in proc.log_text(), 90, what="the allowed restore"
        )
    finally:
        assert proc.terminate() == 0, proc.log_text()[-3000:]


def test_helm_style_savepoint_upgrade_of_two_releases_downstream_first_is_exact(
    kafka_bootstrap: str, tmp_path: Path
) -> None:
    """The chart's pipeline upgrade (docs/helm.md) without a cluster, while clicks flow.

    The downstream release's pre-upgrade hook command (``savepoint trigger --pipeline
    <region app> --stop --json``) halts both apps; the downstream "release" then rolls one
    instance at a time (same ids and state dirs, ``LOCKGATE_RESUME_FROM_STOP_SAVEPOINT=true``),
    then the upstream one, with no savepoint id anywhere. Both outputs are exact.
    """
    topics = Topics.fresh("sp-helm")
    create_topic(kafka_bootstrap, topics.clicks, PARTITIONS)
    create_topic(kafka_bootstrap, topics.counts, PARTITIONS)
    sp_dir = tmp_path / "savepoints"
    common = {"LOCKGATE_CHECKPOINT_INTERVAL_MS": "300", "LOCKGATE_SAVEPOINT_DIR": str(sp_dir)}
    feeder = ClickFeeder(kafka_bootstrap, topics.clicks, 10**6, rate=800, users=40, regions=5)
    click, region = _fleets(kafka_bootstrap, topics, tmp_path, **common)
    try:
        click.start_all()
        region.start_all()
        _wait_stable(click, region)
        feeder.start()
        read_topic(kafka_bootstrap, topics.totals, expected=1500, timeout=90, idle=0)
        env = {"LOCKGATE_BOOTSTRAP_SERVERS": kafka_bootstrap, "LOCKGATE_SAVEPOINT_DIR": str(sp_dir)}
        hook = lockgate_cli(
            env, "savepoint", "trigger", "--pipeline", topics.region_app, "--stop", "--json"
        )
        assert hook.returncode == 0, hook.stderr[-3000:] + click.logs() + region.logs()
        for fleet in (region, click):  # downstream first, one instance at a time
            fleet.env["LOCKGATE_RESUME_FROM_STOP_SAVEPOINT"] = "true"
            for iid in reversed(fleet.ids):
                old = fleet.procs[iid]
                old.signal(signal.SIGTERM)
                assert old.wait(90) == 0, fleet.logs()
                fleet.start(iid)
                wait_until(
                    lambda fleet=fleet, iid=iid: (  # type: ignore[misc]
                        "seeded from a savepoint" in fleet.procs[iid].log_text()
                    ),
                    120,
                    what=f"{iid} resuming from its halt",
                )
        time.sleep(3)
        feeder.stop()
        feeder.join(60)
        assert feeder.error is None
        total = len(feeder.produced)
        counts = read_topic(kafka_bootstrap, topics.counts, expected=total, timeout=180, idle=2)
        totals = read_topic(kafka_bootstrap, topics.totals, expected=total, timeout=60, idle=2)
    finally:
        feeder.stop()
        for fleet in (click, region):
            for proc in fleet.procs.values():
                if proc.alive:
                    proc.terminate()
    logs = click.logs() + region.logs()
    stored = read_clicks(kafka_bootstrap, topics.clicks, total)
    problems = check_pipeline(Model.of(stored), counts, totals)
    assert problems == [], "\n".join(problems[:20]) + "\n" + logs
