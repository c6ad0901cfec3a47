"""The runner hands its components the same objects and the right callbacks.

Each component has tests of its own, with stand-ins for what it is given; this test
builds a real :class:`Runner` (no broker is needed until ``run``) and checks the wiring
between them: a callback re-pointed at the wrong method, or a component given a copy
of a dict the runner later changes, passes every component test and fails here.

Each runner gets its own copy of an example app (the module loaded again under another
name): building a ``Runner`` changes its app (``App.run_as`` names the per-app late
topics, the time service gets the runner's hooks), and the example modules' apps are
shared with every other test of the process.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from processors._config.settings import Settings
from processors._dsl.app import App
from processors._runtime.runner import Runner

EXAMPLES = Path(__file__).resolve().parents[3] / "examples"


def _own_copy(example: str) -> App:
    """A fresh ``app`` of ``examples/<example>.py``, not the one other tests import."""
    spec = importlib.util.spec_from_file_location(f"wiring_{example}", EXAMPLES / f"{example}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    app = module.app
    assert isinstance(app, App)
    return app


@pytest.fixture
def runner(tmp_path: Path) -> Runner:
    app = _own_copy("running_sum")
    return Runner(app, Settings(state_dir=tmp_path, app_name=app.name))


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
    epochs = r._epochs
    assert epochs._kgs is r._kgs and epochs._halted is r._halted
    assert epochs._open is r._open and epochs._positions is r._positions
    assert epochs._marks is r._marks and epochs._out is r._out and epochs._sinks is r._sinks
    assert epochs._savepoints is r._savepoints and epochs._poison is r._poison
    assert epochs._globals is r._globals and epochs._interleaver is r._interleaver
    assert epochs._timer_guard is r._timer_guard


def test_callbacks_reach_the_methods_that_own_them(runner: Runner) -> None:
    r = runner
    assert r._barriers._halt == r._savepoints.halt
    assert r._barriers._write_barriers == r._epochs.write_barriers
    assert r._assignment._seed_from_savepoint == r._savepoints.seed
    assert r._assignment._end_epoch == r._epochs.end_epoch
    assert r._assignment._abort_epoch == r._epochs.abort_epoch
    assert r._assignment._reset_epoch_deadline == r._epochs.reset_deadline
    ended: list[bool] = []
    r._epochs.end_epoch = lambda: ended.append(True)  # type: ignore[method-assign]
    r._savepoints._end_epoch()  # the participant ends the runner's epoch sequence
    assert ended == [True]


def test_live_values_are_read_through_getters(runner: Runner) -> None:
    r = runner
    consumer = object()
    r._consumer = consumer  # a rejoin replaces the consumer
    assert r._assignment._consumer() is consumer
    assert r._savepoints._consumer() is consumer
    assert r._epochs._consumer() is consumer
    rules = object()
    r._sp_rules = rules  # type: ignore[assignment]  # a bounded run's end phase
    assert r._epochs._sp_rules() is rules
    assert not r._epochs._finishing()
    r._finishing = True
    assert r._epochs._finishing()
    r._stop = True
    assert r._assignment._should_stop()
    assert r._epochs._stop_requested()
    failure = RuntimeError("in a rebalance callback")
    r._assignment._failed_in_callback(failure)
    assert r._assignment._callback_failed()
    assert r._epochs._callback_failed()
    assert r._callback_failed and r._fatal is failure


def test_the_timer_guard_and_the_interleaver_reach_the_epoch_sequence(tmp_path: Path) -> None:
    """Built before the epoch sequence, or its commits never clear dead-lettered timers."""
    joined, windowed = _own_copy("enrich_orders"), _own_copy("window_count")
    with_timers = Runner(windowed, Settings(state_dir=tmp_path / "w", app_name=windowed.name))
    guard = with_timers._timer_guard
    assert guard is not None and with_timers._epochs._timer_guard is guard
    two_inputs = Runner(joined, Settings(state_dir=tmp_path / "j", app_name=joined.name))
    interleaver = two_inputs._interleaver
    assert interleaver is not None
    assert two_inputs._epochs._interleaver is interleaver
    assert two_inputs._assignment._interleaver is interleaver


def test_clients_made_at_start_are_read_through_getters(runner: Runner) -> None:
    admin, restorer = object(), object()
    runner._admin = admin  # type: ignore[assignment]  # made in _setup, after the wiring
    runner._restorer = restorer  # type: ignore[assignment]
    assert runner._epochs._admin() is admin
    assert runner._epochs._restorer() is restorer


@pytest.mark.parametrize(
    ("guarantee", "atomic"), [("exactly_once", True), ("at_least_once", False)]
)
def test_only_exactly_once_lets_same_epoch_timers_skip_their_writes(
    tmp_path: Path, guarantee: str, atomic: bool
) -> None:
    """Under at-least-once an aborted epoch's changelog stays: timers keep their tombstones."""
    app = _own_copy("window_count")
    settings = Settings(state_dir=tmp_path, app_name=app.name, guarantee=guarantee)
    Runner(app, settings)
    assert app.time_service is not None
    assert app.time_service.atomic_epochs is atomic
