"""processors/_runtime/kubernetes.py: the scale-down verdict from a StatefulSet read over TLS."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from processors._runtime.kubernetes import scaled_down
from tests.support.k8s_api import FakeStatefulSetAPI


@pytest.fixture
def api(tmp_path: Path):  # type: ignore[no-untyped-def]
    with FakeStatefulSetAPI(tmp_path) as fake:
        yield fake


def test_ordinal_at_or_above_replicas_leaves(api: FakeStatefulSetAPI) -> None:
    api.set_replicas("orders", 1)
    verdict = scaled_down("orders-1", sa_dir=api.sa_dir, api=api.url)
    assert verdict.leave, verdict
    assert "scaled to 1" in verdict.reason
    assert api.requests == ["/apis/apps/v1/namespaces/apps/statefulsets/orders"]


def test_ordinal_below_replicas_stays(api: FakeStatefulSetAPI) -> None:
    api.set_replicas("orders", 3)
    verdict = scaled_down("orders-2", sa_dir=api.sa_dir, api=api.url)
    assert not verdict.leave
    assert "keeps 3 replicas" in verdict.reason


def test_a_statefulset_being_deleted_leaves(api: FakeStatefulSetAPI) -> None:
    api.set_replicas("orders", 3, deleting=True)
    assert scaled_down("orders-0", sa_dir=api.sa_dir, api=api.url).leave


def test_refused_read_stays_and_says_what_is_missing(api: FakeStatefulSetAPI) -> None:
    api.set_replicas("orders", 1)
    api.status = 403
    verdict = scaled_down("orders-1", sa_dir=api.sa_dir, api=api.url)
    assert not verdict.leave
    assert "HTTP 403" in verdict.reason and "get on its StatefulSet" in verdict.reason


def test_a_statefulset_that_no_longer_exists_leaves(api: FakeStatefulSetAPI) -> None:
    """helm uninstall deletes the StatefulSet before its pods stop (the Role names it only)."""
    verdict = scaled_down("other-1", sa_dir=api.sa_dir, api=api.url)
    assert verdict.leave and "no longer exists" in verdict.reason


def test_ordinals_start_is_honoured(api: FakeStatefulSetAPI) -> None:
    api.set_replicas("orders", 2, start=5)  # pods orders-5, orders-6
    assert not scaled_down("orders-6", sa_dir=api.sa_dir, api=api.url).leave
    api.set_replicas("orders", 1, start=5)
    assert scaled_down("orders-6", sa_dir=api.sa_dir, api=api.url).leave


def test_the_bound_covers_the_whole_request(api: FakeStatefulSetAPI) -> None:
    api.set_replicas("orders", 1)
    api.trickle_s = 0.2  # ~100 bytes: 20 s, each read well within the timeout
    started = time.monotonic()
    verdict = scaled_down("orders-1", sa_dir=api.sa_dir, api=api.url, timeout_s=1.0)
    assert time.monotonic() - started < 2.0
    assert not verdict.leave and "no answer within 1s" in verdict.reason


def test_untrusted_certificate_stays(api: FakeStatefulSetAPI, tmp_path: Path) -> None:
    api.set_replicas("orders", 1)
    other = tmp_path / "other"
    other.mkdir()
    for name in ("token", "namespace"):
        (other / name).write_text((api.sa_dir / name).read_text())
    (other / "ca.crt").write_text(
        FakeStatefulSetAPI(tmp_path / "x").sa_dir.joinpath("ca.crt").read_text()
    )
    verdict = scaled_down("orders-1", sa_dir=other, api=api.url)
    assert not verdict.leave and "CERTIFICATE_VERIFY_FAILED" in verdict.reason


def test_outside_kubernetes_or_odd_names_stay(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    assert "not running in Kubernetes" in scaled_down("orders-1").reason
    verdict = scaled_down("laptop", api="https://127.0.0.1:1")
    assert not verdict.leave and "not a StatefulSet pod name" in verdict.reason
    verdict = scaled_down("orders-1", sa_dir=tmp_path / "missing", api="https://127.0.0.1:1")
    assert not verdict.leave and "no service-account credentials" in verdict.reason


def test_unreachable_api_stays_within_the_timeout(api: FakeStatefulSetAPI) -> None:
    verdict = scaled_down("orders-1", sa_dir=api.sa_dir, api="https://127.0.0.1:9", timeout_s=1)
    assert not verdict.leave and "GET https://127.0.0.1:9" in verdict.reason
