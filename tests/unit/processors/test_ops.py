"""The pure logic of the operator commands (processors/_ops/catalog.py), without Kafka."""

from __future__ import annotations

from collections.abc import Iterable

import pytest

from processors._checkpoint.control_topics import control_topic
from processors._ops.catalog import (
    OpsError,
    cancel_halted,
    checkpoint_summary,
    choose_checkpoint,
    complete_bound,
    complete_checkpoints,
    halted_key_groups,
    manifest_problems,
    missing_key_groups,
    pipeline_closure,
    progress_text,
    resolve_apps,
    savepoint_request,
    savepoint_text,
    source_apps,
    topo_order,
    unnamed_upstreams,
)
from state.savepoint import build_descriptor, ms_to_iso

# clicks -> click-counts -(counts.internal)-> region-totals -(totals.internal)-> alerts
#                                          \-> audit (also reads counts.internal)
# other: unrelated
REGISTRY = {
    "click-counts": {"inputs": ["clicks"], "outputs": [], "internal_outputs": ["counts.i"]},
    "region-totals": {
        "inputs": ["counts.i"],
        "outputs": ["report"],
        "internal_outputs": ["totals.i"],
    },
    "alerts": {"inputs": ["totals.i"], "outputs": ["alerts"], "internal_outputs": []},
    "audit": {"inputs": ["counts.i"], "outputs": ["audit"], "internal_outputs": []},
    "other": {"inputs": ["clicks"], "outputs": ["x"], "internal_outputs": []},
}


@pytest.mark.parametrize("start", ["click-counts", "region-totals", "alerts", "audit"])
def test_pipeline_closure_follows_internal_topics_both_ways(start: str) -> None:
    assert pipeline_closure(REGISTRY, start) == [
        "alerts",
        "audit",
        "click-counts",
        "region-totals",
    ]


def test_pipeline_closure_of_an_unconnected_app_is_itself() -> None:
    assert pipeline_closure(REGISTRY, "other") == ["other"]


def test_pipeline_closure_of_an_unknown_app_is_a_usage_error() -> None:
    with pytest.raises(OpsError, match="not in the registry") as err:
        pipeline_closure(REGISTRY, "nope")
    assert err.value.exit_code == 2
    assert "click-counts" in str(err.value)


def test_topo_order_puts_upstream_first() -> None:
    order = topo_order(REGISTRY, ["alerts", "audit", "click-counts", "region-totals"])
    assert order[0] == "click-counts"
    assert order.index("region-totals") < order.index("alerts")


def test_topo_order_keeps_unregistered_apps() -> None:
    assert topo_order({}, ["b", "a"]) == ["a", "b"]


def test_source_apps_read_no_internal_topic() -> None:
    apps = pipeline_closure(REGISTRY, "alerts")
    assert source_apps(REGISTRY, apps) == ["click-counts"]
    assert source_apps(REGISTRY, ["other", "alerts"]) == ["other"]


def test_unnamed_upstreams_names_the_writer() -> None:
    assert unnamed_upstreams(REGISTRY, ["region-totals"]) == {
        "region-totals": [("counts.i", "click-counts")]
    }
    assert unnamed_upstreams(REGISTRY, ["click-counts", "region-totals"]) == {}


def test_resolve_apps_refuses_a_reader_without_its_writer() -> None:
    with pytest.raises(OpsError, match="--pipeline") as err:
        resolve_apps(REGISTRY, ["region-totals"])
    assert err.value.exit_code == 2
    assert "region-totals reads counts.i, written by click-counts" in str(err.value)


def test_resolve_apps() -> None:
    assert resolve_apps(REGISTRY, ["region-totals", "click-counts"]) == [
        "click-counts",
        "region-totals",
    ]
    assert resolve_apps(REGISTRY, pipeline="audit")[0] == "click-counts"
    with pytest.raises(OpsError) as err:
        resolve_apps(REGISTRY)
    assert err.value.exit_code == 2
    with pytest.raises(OpsError):
        resolve_apps(REGISTRY, ["click-counts"], pipeline="audit")
    with pytest.raises(OpsError, match="not in the registry"):
        resolve_apps(REGISTRY, ["ghost"])


def test_complete_bound() -> None:
    assert complete_bound({0: 5, 1: 3, 2: 9}, 3) == 3
    assert complete_bound({0: 5, 2: 9}, 3) is None  # key group 1 never committed
    assert complete_bound({}, 0) is None


def test_complete_checkpoints_one_app() -> None:
    hist = {"a": {0: [100, 200, 300], 1: [100, 250]}}
    # 300 is not complete: key group 1 is at 250; 250 is (kg 0 reached 300 >= 250).
    assert complete_checkpoints(hist, {"a": 2}) == [250, 200, 100]
    assert complete_checkpoints(hist, {"a": 2}, limit=2) == [250, 200]
    assert complete_checkpoints(hist, {"a": 3}) == []  # key group 2 has none


def test_complete_checkpoints_pipeline_needs_every_app() -> None:
    hist = {"a": {0: [100, 200, 300]}, "b": {0: [100, 200], 1: [100, 200, 300]}}
    assert complete_checkpoints(hist, {"a": 1, "b": 2}) == [200, 100]
    assert complete_checkpoints({"a": {0: [1]}, "b": {}}, {"a": 1, "b": 1}) == []


def test_choose_checkpoint() -> None:
    assert choose_checkpoint(1_000, []) == 61_000
    assert choose_checkpoint(1_000, [5_000, None, 2_000]) == 65_000
    assert choose_checkpoint(9_000, [5_000]) == 69_000


def test_savepoint_request() -> None:
    req = savepoint_request("sp-x", 7, True, ["a", "b"], 1_000)
    assert req == {
        "savepoint": "sp-x",
        "checkpoint": 7,
        "stop": True,
        "apps": ["a", "b"],
        "requested_ms": 1_000,
        "expires_ms": 51_000,
    }


def test_a_savepoint_request_lives_as_long_as_the_trigger_waits() -> None:
    """Issue 25, hole 8: the 50 s request lifetime was shorter than a long restore.

    A request waits while an instance restores; it expired after 50 s even when the
    trigger waited ``--timeout 600``, so a restore longer than 50 s failed the savepoint.
    """
    req = savepoint_request("sp-x", 7, True, ["a"], 1_000, wait_ms=600_000)
    assert req["expires_ms"] == 601_000
    assert savepoint_request("sp-x", 7, True, ["a"], 1_000, wait_ms=10_000)["expires_ms"] == 51_000


def test_progress_text() -> None:
    text = progress_text(
        "sp-1", {"click-counts": 4, "region-totals": 1}, {"click-counts": 4, "region-totals": 4}
    )
    assert text == "savepoint sp-1: 5/8 key groups (click-counts 4/4, region-totals 1/4)"
    assert progress_text("sp-1", {}, {"a": 2}) == "savepoint sp-1: 0/2 key groups (a 0/2)"


def test_missing_and_problems() -> None:
    manifests = {"a": {0: {"error": None}, 2: {"error": "alignment timed out"}}, "b": {}}
    assert missing_key_groups(manifests, {"a": 3, "b": 1}) == {"a": [1], "b": [0]}
    assert manifest_problems(manifests) == ["a key group 2: alignment timed out"]


def test_ms_to_iso() -> None:
    assert ms_to_iso(0) == "1970-01-01T00:00:00.000Z"
    assert ms_to_iso(1_700_000_000_123) == "2023-11-14T22:13:20.123Z"
    assert ms_to_iso(None) is None


def test_build_descriptor() -> None:
    reg = {
        "a": {
            "inputs": ["in"],
            "outputs": ["out"],
            "stores": {"s": {"kind": "value", "codec": "json"}},
        }
    }
    store = {
        "kind": "value",
        "codec": "json",
        "file": "s.lgs",
        "sha256": "0" * 64,
        "entries": 3,
        "bytes": 99,
    }
    manifests = {
        "a": {
            1: {"checkpoint": 7, "offsets": {"in": 5}, "stores": {"s": store}, "ts": 2},
            0: {"checkpoint": 7, "offsets": {"in": 4}, "stores": {}, "ts": 1},
        }
    }
    d = build_descriptor("sp-1", 7, False, 1_000, 900, reg, manifests, ["a"])
    assert d["savepoint"] == "sp-1" and d["checkpoint"] == 7 and d["stop"] is False
    assert d["created"] == "1970-01-01T00:00:01.000Z"
    app = d["apps"]["a"]
    assert app["key_groups"] == 2 and app["source"] is True
    assert app["inputs"] == ["in"] and app["stores"] == reg["a"]["stores"]
    assert [m["key_group"] for m in app["manifests"]] == [0, 1]
    assert app["manifests"][1]["stores"]["s"]["entries"] == 3


def _ck(c: int, **extra: object) -> dict[str, object]:
    return {
        "checkpoint": c,
        "ts": c,
        "aligned": True,
        "instance": "i1",
        "offsets": {"in": c // 10},
        **extra,
    }


def test_checkpoint_summary() -> None:
    hist = {
        "a": {
            0: [_ck(100), _ck(200), _ck(300, halted="sp-h")],
            1: [_ck(100), _ck(250, aligned=False, origin="sp-o")],
        }
    }
    out = checkpoint_summary(hist, {"a": 2}, limit=20)
    assert [r["checkpoint"] for r in out["checkpoints"]] == [250, 200, 100]
    assert out["checkpoints"][0]["aligned"] is False
    assert out["checkpoints"][1]["aligned"] is True
    assert out["apps"]["a"]["halted"] == {"0": "sp-h"}
    assert out["apps"]["a"]["restored"] == {"1": "sp-o"}
    latest = out["apps"]["a"]["latest"]
    assert [r["checkpoint"] for r in latest] == [300, 250]
    newest = out["newest"]
    assert newest["checkpoint"] == 250
    # key group 0 has no record of 250: its first record past it is shown
    assert newest["key_groups"]["a"] == [
        {"key_group": 0, "checkpoint": 300, "offsets": {"in": 30}},
        {"key_group": 1, "checkpoint": 250, "offsets": {"in": 25}},
    ]


def test_checkpoint_summary_incomplete() -> None:
    out = checkpoint_summary({"a": {0: [_ck(100)]}}, {"a": 2}, limit=20)
    assert out["checkpoints"] == [] and out["newest"] is None
    assert out["apps"]["a"]["latest"][1] == {"key_group": 1, "checkpoint": None}


def test_savepoint_text_shows_a_backfill_section() -> None:
    descriptor = {
        "savepoint": "sp-1",
        "checkpoint": 0,
        "created": "2026-11-27T10:00:00.000Z",
        "apps": {
            "sums": {
                "key_groups": 1,
                "inputs": ["numbers"],
                "outputs": ["out"],
                "manifests": [
                    {
                        "key_group": 0,
                        "checkpoint": 0,
                        "offsets": {"numbers": 12},
                        "stores": {"totals": {"entries": 3, "bytes": 40, "sha256": "ab"}},
                    }
                ],
            }
        },
        "backfill": {
            "app_spec": "examples.running_sum:app",
            "records": 12,
            "outputs": 11,
            "dead_letters": 1,
            "seconds": 2.5,
            "archive": "/data/numbers.parquet",
            "output_parquet": None,
        },
    }
    lines = savepoint_text(descriptor)
    assert lines[0] == "savepoint sp-1: checkpoint 0, created 2026-11-27T10:00:00.000Z"
    assert "  key group 0: checkpoint 0 offsets numbers=12" in lines
    assert (
        "backfill of examples.running_sum:app: 12 records, 11 outputs, 1 dead letters, 2.5 s"
        in lines
    )
    assert "  input from the archive /data/numbers.parquet" in lines
    assert not any("Parquet" in line for line in lines)
    del descriptor["backfill"]
    assert not any(line.startswith("backfill") for line in savepoint_text(descriptor))


def test_halted_key_groups_groups_by_savepoint_and_app() -> None:
    latest = {
        "click-counts": {
            2: {"checkpoint": 9, "halted": "sp-b"},
            0: {"checkpoint": 9, "halted": "sp-b"},
            1: {"checkpoint": 9, "halted": None},
        },
        "region-totals": {0: {"checkpoint": 8, "halted": "sp-b"}, 1: {"checkpoint": 8}},
        "audit": {0: {"checkpoint": 7, "halted": "sp-a"}},
    }
    assert halted_key_groups(latest) == {
        "sp-b": {"click-counts": [0, 2], "region-totals": [0]},
        "sp-a": {"audit": [0]},
    }


def test_halted_key_groups_none_halted() -> None:
    assert halted_key_groups({"a": {0: {"checkpoint": 1, "halted": None}}, "b": {}}) == {}


class _FakeOps:
    """The two reads and the writes :func:`cancel_halted` does, in memory."""

    def __init__(self, latest: dict[str, dict[int, dict[str, object]]]) -> None:
        self.latest = latest
        self.written: list[tuple[list[tuple[str, int]], bytes]] = []

    def key_groups(self, app: str, registration: object) -> int:
        return len(self.latest[app])

    def latest_checkpoints(self, app: str, key_groups: int) -> dict[int, dict[str, object]]:
        assert key_groups == len(self.latest[app])
        return self.latest[app]

    def write_records(self, targets: Iterable[tuple[str, int]], value: object, key: bytes) -> None:
        self.written.append((list(targets), key))

    def write_requests(self, apps: Iterable[str], request: object, key: bytes) -> None:
        self.written.append(([(control_topic(a), 0) for a in apps], key))


def test_cancel_halted_cancels_each_halted_savepoint_in_every_app() -> None:
    sp = "sp-20261128T010203Z-0a1b2c"
    ops = _FakeOps(
        {"up": {0: {"halted": sp}, 1: {"halted": sp}}, "down": {0: {"halted": sp}, 1: {}}}
    )
    found = cancel_halted(ops, {}, ["up", "down"])  # type: ignore[arg-type]
    assert found == {sp: {"up": [0, 1], "down": [0]}}
    key = f"savepoint-cancel/{sp}".encode()
    assert ops.written == [
        ([("lockgate.registry", 0)], key),
        ([("up.control", 0), ("down.control", 0)], key),
    ]


def test_cancel_halted_writes_nothing_when_nothing_is_halted() -> None:
    ops = _FakeOps({"up": {0: {"checkpoint": 5, "halted": None}}})
    assert cancel_halted(ops, {}, ["up"]) == {}  # type: ignore[arg-type]
    assert ops.written == []
