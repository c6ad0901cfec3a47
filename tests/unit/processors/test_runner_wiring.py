"""The runner hands its components the same objects and the right callbacks.

Each component has tests of its own, with stand-ins for what it is given; this test
builds a real :class:`Runner` (no broker is needed until ``run``) and checks the wiring
between them: a callback re-pointed at the wrong method, or a component given a copy
of a dict the runner later changes, passes every component test and fails here.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from processors._config.settings import Settings
from processors._runtime.runner import Runner


@pytest.fixture
def runner(tmp_path: Path) -> Runner:
    from examples.running_sum import app

    return Runner(app, Settings(state_dir=tmp_path, app_name="wiring-test"))


def test_components_share_the_runners_objects(runner: Runner) -> None:
    r = runner
    barriers, assignment, savepoints = r._barriers, r._assignment, r._savepoints
    assert barriers._kgs is r._kgs and assignment._kgs is r._kgs
    assert barriers._halted is r._halted is r._marks.halted
    assert barriers._open is r._open and assignment._open is r._open
    assert savepoints._open is r._open
    assert barriers._positions is r._positions and assignment._positions is r._positions
    assert assignment._globals is r._globals and assignment._interleaver is r._interleaver
    assert assignment._cancelled is r._sp_requests.cancelled


def test_callbacks_reach_the_methods_that_own_them(runner: Runner) -> None:
    r = runner
    assert r._barriers._halt == r._savepoints.halt
    assert r._barriers._write_barriers == r._write_barriers
    assert r._assignment._seed_from_savepoint == r._savepoints.seed
    assert r._assignment._end_epoch == r._end_epoch
    assert r._assignment._abort_epoch == r._abort_epoch


def test_live_values_are_read_through_getters(runner: Runner) -> None:
    r = runner
    consumer = object()
    r._consumer = consumer  # a rejoin replaces the consumer
    assert r._assignment._consumer() is consumer
    assert r._savepoints._consumer() is consumer
    r._stop = True
    assert r._assignment._should_stop()
    failure = RuntimeError("in a rebalance callback")
    r._assignment._failed_in_callback(failure)
    assert r._assignment._callback_failed()
    assert r._callback_failed and r._fatal is failure
