"""The in-process test driver, exercised on the reference example."""

import doctest

import pytest

import processors.testing
from examples.running_sum import app
from processors.exceptions import UserCodeError
from processors.testing import TestDriver


def test_docstring_example_runs() -> None:
    result = doctest.testmod(processors.testing)
    assert result.attempted > 0 and result.failed == 0


def test_running_sum_with_commit_and_crash() -> None:
    d = TestDriver(app)
    assert [
        e.value["sum"] for e in (d.send("a", {"v": 1, "seq": 0}) + d.send("a", {"v": 2, "seq": 1}))
    ] == [1, 3]
    d.commit()
    d.send("a", {"v": 10, "seq": 2})
    assert d.state("totals", "a") == [13, 3]
    d.crash()
    assert d.state("totals", "a") == [3, 2]
    assert d.send("b", {"v": 4, "seq": 3})[0].value == {"sum": 4, "count": 1, "seq": 3}


def test_user_errors_are_dead_lettered() -> None:
    d = TestDriver(app)
    assert d.send("a", {"seq": 0}) == []
    [dl] = d.dead_letters
    assert isinstance(dl.error, KeyError) and dl.value == {"seq": 0} and dl.stage == "process"


def test_user_errors_surface_with_on_error_fail() -> None:
    d = TestDriver(app, on_error="fail")
    with pytest.raises(UserCodeError, match="KeyError"):
        d.send("a", {"seq": 0})
