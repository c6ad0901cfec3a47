"""Operator ids of windows and interval joins, and how a restore maps state by them.

Ids are derived from what an operator reads (stable when declarations are reordered),
or given with ``uid=``; an id two operators would share is refused where the second
is declared. A savepoint's operator stores and timers map onto the app's by id
(:func:`plan_operator_restore`, :func:`rename_timers`).
"""

from __future__ import annotations

from typing import Any

import pytest

from processors import App, ConfigError, Count, Tumbling
from processors._runtime.operator_plan import (
    OperatorPlan,
    moved_operator_state,
    plan_operator_restore,
    rename_timers,
)
from state.savepoint import SavepointError


def _two_windows(order: tuple[str, str], **uids: str) -> App:
    app = App("ids")
    streams = {"a": app.stream("a"), "b": app.stream("b")}
    for name in order:
        streams[name].window(Tumbling(10), uid=uids.get(name)).count().to("out")
    return app


def test_derived_ids_do_not_depend_on_declaration_order() -> None:
    first, second = _two_windows(("a", "b")), _two_windows(("b", "a"))
    assert set(first.operators) == set(second.operators) == {"window(a)", "window(b)"}
    # ... while the stores and timers are numbered by declaration order
    assert first.operators["window(a)"].stores == ("window-1",)
    assert second.operators["window(a)"].stores == ("window-2",)
    assert second.operators["window(a)"].timers == "w2"
    assert not first.operators["window(a)"].given


def test_derived_ids_of_chained_windows_and_joins_name_their_upstream() -> None:
    app = App("ids")
    joined = app.stream("left").interval_join(app.stream("right"), lower_ms=0, upper_ms=5)
    joined.window(Count(2)).count().window(Count(3)).count().to("out")
    ops = app.operators
    assert list(ops) == [
        "interval_join(left,right)",
        "window(interval_join(left,right))",
        "window(window(interval_join(left,right)))",
    ]
    join = ops["interval_join(left,right)"]
    assert join.kind == "interval_join"
    assert join.stores == ("interval-join-1.left", "interval-join-1.right")
    assert join.timers is None
    assert app.store_operator("interval-join-1.right") is join
    assert app.store_operator("window-2") is ops["window(interval_join(left,right))"]


def test_a_given_uid_is_the_id_and_names_the_store_fields() -> None:
    app = _two_windows(("a", "b"), a="clicks-per-minute")
    info = app.operators["clicks-per-minute"]
    assert info.given and info.stores == ("window-1",)
    assert info.store_fields() == {"operator": "clicks-per-minute", "timers": "w1"}
    assert app.store_operator("totals") is None


def test_two_operators_with_one_id_are_refused_where_the_second_is_declared() -> None:
    app = App("ids")
    app.stream("a").window(Count(2), uid="counts").count().to("out")
    with pytest.raises(ConfigError) as err:
        app.stream("b").window(Count(2), uid="counts")
    msg = str(err.value)
    assert "'counts'" in msg and "uid=" in msg
    assert "stream of 'a'" in msg and "stream of 'b'" in msg
    # nothing of the refused operator was declared
    assert list(app.operators) == ["counts"] and "window-2" not in app.stores


def test_a_uid_equal_to_another_operators_derived_id_is_refused() -> None:
    app = App("ids")
    a = app.stream("a")
    a.window(Count(2), uid="x").count().to("out")
    left, right = app.stream("l"), app.stream("r")
    with pytest.raises(ConfigError, match="'x'"):
        left.interval_join(right, lower_ms=0, upper_ms=1, uid="x")
    assert "interval-join-2.left" not in app.stores


def test_an_id_taken_between_window_and_its_aggregate_is_refused() -> None:
    app = App("ids")
    pending = app.stream("a").window(Count(2), uid="w")
    app.stream("b").window(Count(2), uid="w").count().to("out")
    with pytest.raises(ConfigError, match="'w'"):
        pending.count()


@pytest.mark.parametrize("uid", ["", "has space", "a:b", "-lead"])
def test_illegal_uids_are_refused(uid: str) -> None:
    with pytest.raises(ConfigError, match="uid"):
        App("ids").stream("a").window(Count(2), uid=uid)


def test_a_uid_that_is_not_a_string_is_a_type_error() -> None:
    with pytest.raises(TypeError, match="uid"):
        App("ids").stream("a").window(Count(2), uid=3)  # type: ignore[arg-type]


# -- restore plans --------------------------------------------------------------------------


def _saved(app: App, own: tuple[str, ...] = ("totals", "lockgate.time")) -> dict[str, Any]:
    """The manifest store entries a savepoint of ``app`` has."""
    out: dict[str, Any] = {name: {"kind": "value", "codec": "json"} for name in own}
    for info in app.operators.values():
        for store in info.stores:
            out[store] = {"kind": "value", "codec": "json", **info.store_fields()}
    return out


def test_reordered_windows_restore_each_operators_store_and_timers() -> None:
    saved = _saved(_two_windows(("a", "b")))
    plan = plan_operator_restore(saved, _two_windows(("b", "a")).operators, False)
    assert plan.sources == {
        "totals": "totals",
        "lockgate.time": "lockgate.time",
        "window-1": "window-2",
        "window-2": "window-1",
    }
    assert plan.timers == {"w1": "w2", "w2": "w1"}
    assert not plan.legacy and plan.added == [] and plan.dropped == []


def test_the_same_order_renames_nothing() -> None:
    saved = _saved(_two_windows(("a", "b")))
    plan = plan_operator_restore(saved, _two_windows(("a", "b")).operators, False)
    assert plan.timers == {}
    assert plan.sources["window-1"] == "window-1"


def test_a_saved_operator_the_app_lacks_is_refused_naming_the_ids() -> None:
    saved = _saved(_two_windows(("a", "b")))
    app = App("ids")
    app.stream("a").window(Tumbling(10)).count().to("out")
    app.stream("b").window(Tumbling(10), uid="renamed").count().to("out")
    with pytest.raises(SavepointError) as err:
        plan_operator_restore(saved, app.operators, False)
    msg = str(err.value)
    assert "'window(b)'" in msg and "'renamed'" in msg and "--allow-non-restored-state" in msg


def test_with_allow_non_restored_a_dropped_operators_state_and_timers_go() -> None:
    saved = _saved(_two_windows(("a", "b")))
    app = App("ids")
    app.stream("b").window(Tumbling(10)).count().to("out")  # now window-1
    app.stream("c").window(Tumbling(10)).count().to("out")  # new: window-2
    plan = plan_operator_restore(saved, app.operators, True)
    assert plan.sources == {
        "totals": "totals",
        "lockgate.time": "lockgate.time",
        "window-1": "window-2",
    }
    assert "window-2" not in plan.sources  # the new operator starts empty
    assert plan.timers == {"w1": None, "w2": "w1"}
    assert plan.dropped == ["window(a)"] and plan.added == ["window(c)"]


def test_an_id_moved_to_an_operator_of_another_shape_is_refused() -> None:
    app = App("ids")
    app.stream("a").window(Count(2), uid="op").count().to("out")
    saved = _saved(app)
    other = App("ids")
    other.stream("a").interval_join(other.stream("b"), lower_ms=0, upper_ms=1, uid="op").to("o")
    with pytest.raises(SavepointError, match="'op'"):
        plan_operator_restore(saved, other.operators, True)


def test_a_savepoint_without_ids_restores_by_name_and_says_it_is_legacy() -> None:
    saved = {
        name: {"kind": "value", "codec": "json"} for name in ("window-1", "window-2", "totals")
    }
    plan = plan_operator_restore(saved, _two_windows(("b", "a")).operators, False)
    assert plan == OperatorPlan({n: n for n in saved}, legacy=True)
    # no operator stores saved at all: not legacy, the app's operators start empty
    plan = plan_operator_restore(
        {"totals": saved["totals"]}, _two_windows(("a", "b")).operators, False
    )
    assert not plan.legacy and plan.added == ["window(a)", "window(b)"]


def test_rename_timers_swaps_owner_prefixes_and_keeps_the_users() -> None:
    renames: dict[str, str | None] = {"w1": "w2", "w2": "w1", "w3": None}
    assert rename_timers(["w1:f", "w2:c", "w3:f", "uafter-0", "w4:f"], renames) == [
        "w2:f",
        "w1:c",
        "uafter-0",
        "w4:f",
    ]
    assert rename_timers(["w3:f"], renames) == []


# -- restarts from changelogs ---------------------------------------------------------------


def _registered(app: App) -> dict[str, list[str]]:
    return {uid: list(info.stores) for uid, info in app.operators.items()}


def test_a_restart_into_reordered_declarations_names_the_moved_stores() -> None:
    before = _registered(_two_windows(("a", "b")))
    assert moved_operator_state(before, _two_windows(("b", "a")).operators) == (
        [
            "window-1 (state of 'window(a)', now 'window(b)')",
            "window-2 (state of 'window(b)', now 'window(a)')",
        ],
        [],
    )
    assert moved_operator_state(before, _two_windows(("a", "b")).operators) == ([], [])


def test_an_operator_in_the_store_of_a_removed_one_is_named_and_an_added_one_is_not() -> None:
    before = _registered(_two_windows(("a", "b")))
    app = App("ids")
    app.stream("b").window(Tumbling(10)).count().to("out")  # window-1: was window(a)'s
    assert moved_operator_state(before, app.operators) == (
        ["window-1 (state of 'window(a)', now 'window(b)')"],
        [],
    )
    grown = _two_windows(("a", "b"))
    grown.stream("c").window(Count(2)).count().to("out")  # window-3: new, no changelog yet
    assert moved_operator_state(before, grown.operators) == ([], [])


def test_an_id_changed_in_place_keeps_the_store_by_name() -> None:
    """A derived id after its input topic was renamed (a supported subscription change)."""
    before = _registered(_two_windows(("a", "b")))
    app = App("ids")
    app.stream("a2").window(Tumbling(10)).count().to("out")  # window-1, was window(a)
    app.stream("b").window(Tumbling(10)).count().to("out")  # window-2, as before
    assert moved_operator_state(before, app.operators) == (
        [],
        ["window-1 (state of 'window(a)', now 'window(a2)')"],
    )


@pytest.mark.parametrize("registered", [None, {}, "x", {"window(a)": "window-1"}])
def test_registrations_without_operators_check_nothing(registered: object) -> None:
    assert moved_operator_state(registered, _two_windows(("b", "a")).operators) == ([], [])
