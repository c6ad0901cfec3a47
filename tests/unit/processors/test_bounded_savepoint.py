"""A bounded run's final savepoint without a broker: settings, CLI usage, the pure decisions.

The settings' rules (``LOCKGATE_UNTIL_SAVEPOINT`` needs ``LOCKGATE_UNTIL`` and a
location), ``lockgate run --savepoint`` usage errors, the request bookkeeping the runtime
uses (a bounded request noticed, a request re-armed for key groups assigned later), and
:class:`~processors._ops.bounded_savepoint.BoundedSavepoint`'s two judgements: whether a
key group's checkpoint record says it reached this instance's bound, and whether the
newest bounded-run savepoint still is the state (a rerun takes no second savepoint). The
Kafka side is in tests/integration/test_bounded_savepoint.py.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import orjson
import pytest
from click.testing import CliRunner
from pydantic import ValidationError

from processors._checkpoint.control_topics import request_key
from processors._checkpoint.savepoint_requests import SavepointRequests
from processors._config.settings import Settings
from processors._ops.bounded_savepoint import BoundedSavepoint
from processors.cli import main
from state.savepoint import SavepointStore

SP1 = "sp-20261128T010203Z-0a1b2c"
SP2 = "sp-20261128T020304Z-3d4e5f"


@pytest.fixture(autouse=True)
def _env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in list(os.environ):
        if name.upper().startswith("LOCKGATE_"):
            monkeypatch.delenv(name)


# -- settings and CLI ---------------------------------------------------------------------


def test_until_savepoint_needs_until() -> None:
    with pytest.raises(ValidationError, match="LOCKGATE_UNTIL_SAVEPOINT is set without"):
        Settings(until_savepoint="default", savepoint_dir="/sp")


def test_default_location_needs_savepoint_dir() -> None:
    with pytest.raises(ValidationError, match="needs LOCKGATE_SAVEPOINT_DIR"):
        Settings(until="now", until_savepoint="default")


def test_location_is_savepoint_dir_or_the_value() -> None:
    assert Settings(until="now").until_savepoint_dir() is None
    s = Settings(until="now", until_savepoint="default", savepoint_dir="/sp")
    assert s.until_savepoint_dir() == "/sp"
    s = Settings(until="now", until_savepoint="s3://b/final", savepoint_dir="/sp")
    assert s.until_savepoint_dir() == "s3://b/final"


def test_cli_savepoint_without_until_is_a_usage_error(tmp_path: Path) -> None:
    env = {"LOCKGATE_BOOTSTRAP_SERVERS": "127.0.0.1:1", "LOCKGATE_SAVEPOINT_DIR": str(tmp_path)}
    res = CliRunner().invoke(main, ["run", "examples.running_sum:app", "--savepoint"], env=env)
    assert res.exit_code == 2, res.output
    assert "--savepoint needs --until" in res.stderr


def test_cli_savepoint_default_needs_a_savepoint_dir() -> None:
    env = {"LOCKGATE_BOOTSTRAP_SERVERS": "127.0.0.1:1"}
    res = CliRunner().invoke(
        main, ["run", "examples.running_sum:app", "--until", "now", "--savepoint"], env=env
    )
    assert res.exit_code == 2, res.output
    assert "needs LOCKGATE_SAVEPOINT_DIR" in res.stderr


def test_cli_savepoint_location_reaches_the_runtime(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    import processors.cli as cli

    seen: dict[str, Any] = {}

    def fake_run(_app: object, settings: Settings, **kwargs: Any) -> int:  # noqa: ANN401
        seen["settings"] = settings
        seen["factory"] = kwargs.get("final_savepoint")
        return 0

    monkeypatch.setattr(cli, "run_app", fake_run)
    env = {"LOCKGATE_BOOTSTRAP_SERVERS": "127.0.0.1:1", "LOCKGATE_STATE_DIR": str(tmp_path)}
    args = ["run", "examples.running_sum:app", "--until", "now", "--savepoint", str(tmp_path)]
    res = CliRunner().invoke(main, args, env=env)
    assert res.exit_code == 0, res.output
    assert seen["settings"].until == "now"
    assert seen["settings"].until_savepoint_dir() == str(tmp_path)
    assert seen["factory"] is BoundedSavepoint


# -- the request bookkeeping --------------------------------------------------------------


class _Msg:
    def __init__(self, key: bytes, value: bytes) -> None:
        self._key, self._value = key, value

    def key(self) -> bytes:
        return self._key

    def value(self) -> bytes:
        return self._value

    def error(self) -> None:
        return None


class _Reader:
    def __init__(self, *batches: list[_Msg]) -> None:
        self.batches = list(batches)

    def consume(self, n: int, timeout: float) -> list[_Msg]:
        return self.batches.pop(0) if self.batches else []


def _request(sp_id: str, bounded: bool) -> _Msg:
    body: dict[str, Any] = {
        "savepoint": sp_id,
        "checkpoint": 100,
        "expires_ms": int(time.time() * 1000) + 60_000,
    }
    if bounded:
        body["bounded"] = {"until": "now"}
    return _Msg(request_key(sp_id), orjson.dumps(body))


def _poll(requests: SavepointRequests) -> None:
    requests._next_poll = 0.0
    requests.poll()


def test_a_bounded_request_is_noticed() -> None:
    requests = SavepointRequests()
    requests._consumer = _Reader([_request(SP1, bounded=False)], [_request(SP2, bounded=True)])
    _poll(requests)
    assert requests.bounded is None
    _poll(requests)
    assert requests.bounded is not None and requests.bounded["savepoint"] == SP2


def test_rearm_only_when_nothing_is_in_progress_and_not_cancelled() -> None:
    requests = SavepointRequests()
    request = {"savepoint": SP1, "checkpoint": 100, "bounded": {"until": "now"}}
    assert requests.rearm(request)
    assert requests.current is request
    assert not requests.rearm(dict(request))  # one in progress
    requests.done(request)
    requests.cancel(SP1)
    assert not requests.rearm(request)
    assert requests.current is None


# -- BoundedSavepoint's judgements --------------------------------------------------------


def _component(tmp_path: Path, ends: dict[tuple[str, int], int]) -> BoundedSavepoint:
    settings = Settings(until="now", until_savepoint="default", savepoint_dir=str(tmp_path))
    return BoundedSavepoint("app", settings, ["in"], 2, ends, SavepointRequests())


def test_a_key_group_reached_the_bound_when_its_marker_is_at_or_past_ours(
    tmp_path: Path,
) -> None:
    sp = _component(tmp_path, {("in", 0): 10, ("in", 1): 7})
    assert sp._reached(0, {"bounded": {"in": 10}})
    assert sp._reached(0, {"bounded": {"in": 12}})
    assert not sp._reached(0, {"bounded": {"in": 9}})  # an earlier run's end: records left
    assert not sp._reached(0, {"checkpoint": 5})  # not at its end yet
    assert not sp._reached(1, None)


def test_a_key_group_took_the_savepoint_when_a_committed_manifest_of_it_exists(
    tmp_path: Path,
) -> None:
    # The runtime's rule for a bounded request (not the key group's checkpoint: one taken
    # over and drained in the savepoint phase is past the request's checkpoint).
    sp = _component(tmp_path, {("in", 0): 10, ("in", 1): 7})
    # Not known before the waiter has read the savepoint's manifests to the end once (a
    # restart: the runtime then goes by the checkpoint, as for every savepoint).
    assert sp.has_manifest(SP1, 0) is None
    sp.exported(SP1, {1: {"error": None}})  # the loop's epoch committed key group 1's
    assert sp.has_manifest(SP1, 1) is True and sp.has_manifest(SP1, 0) is None
    sp._read_to_end(SP1)  # the waiter reached the end of the control partitions
    assert sp.has_manifest(SP1, 0) is False
    sp._seen(SP1, (0,))  # the waiter read key group 0's (read_committed)
    assert sp.has_manifest(SP1, 0) is True
    assert sp.has_manifest(SP2, 0) is None  # per savepoint


def test_a_bounded_request_is_rearmed_again_after_its_epoch_committed() -> None:
    requests = SavepointRequests()
    request = {"savepoint": SP1, "checkpoint": 100, "bounded": {"until": "now"}}
    assert requests.rearm(request)
    requests.done(request)
    assert requests.rearm(request)  # key groups assigned since take it
    assert requests.current is request


def _descriptor(sp_id: str, offsets: list[int], bounded: bool) -> dict[str, Any]:
    return {
        "savepoint": sp_id,
        **({"bounded": {"until": "now"}} if bounded else {}),
        "apps": {
            "app": {
                "key_groups": len(offsets),
                "manifests": [
                    {"key_group": g, "offsets": {"in": o}} for g, o in enumerate(offsets)
                ],
            }
        },
    }


def test_a_rerun_at_the_same_offsets_reuses_the_newest_bounded_savepoint(tmp_path: Path) -> None:
    sp = _component(tmp_path, {("in", 0): 10, ("in", 1): 7})
    store = SavepointStore(str(tmp_path))
    latest = {0: {"offsets": {"in": 10}}, 1: {"offsets": {"in": 7}}}
    assert sp._unchanged_since(store, latest) is None  # none yet
    store.write_descriptor(SP1, _descriptor(SP1, [10, 7], bounded=True))
    assert sp._unchanged_since(store, latest) == SP1
    moved = {0: {"offsets": {"in": 11}}, 1: {"offsets": {"in": 7}}}
    assert sp._unchanged_since(store, moved) is None
    # A newer savepoint that is not a bounded run's does not count; a newer bounded one
    # at other offsets does (only the newest bounded one is the run's result).
    store.write_descriptor(SP2, _descriptor(SP2, [10, 7], bounded=False))
    assert sp._unchanged_since(store, latest) == SP1
    store.write_descriptor(SP2, _descriptor(SP2, [11, 7], bounded=True))
    assert sp._unchanged_since(store, latest) is None
    assert sp._unchanged_since(store, moved) == SP2
