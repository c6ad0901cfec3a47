"""Probe logic, metrics exposition and the HTTP server (no Kafka)."""

from __future__ import annotations

import json
import socket
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator

import pytest
from prometheus_client.parser import text_string_to_metric_families

from processors._runtime.health import (
    DURATION_BUCKETS,
    HealthServer,
    Histogram,
    Metrics,
    MetricsCollector,
    livez,
    metrics_registry,
    readyz,
    startupz,
)
from processors.exceptions import ConfigError

TIMEOUT = 60.0


def _m(now: float = 1000.0) -> Metrics:
    m = Metrics("app", "app-0")
    m.heartbeat = now
    return m


# -- /livez -----------------------------------------------------------------------------------


def test_livez_ok_while_progress_is_recent() -> None:
    m = _m(1000.0)
    p = livez(m, 1000.0 + TIMEOUT - 0.01, TIMEOUT)
    assert p.ok and p.status == 200
    assert p.body == {"status": "ok", "last_progress_s": 59.99}


def test_livez_stalled_at_the_timeout() -> None:
    m = _m(1000.0)
    p = livez(m, 1000.0 + TIMEOUT, TIMEOUT)
    assert not p.ok and p.status == 503
    assert p.body["status"] == "stalled"
    assert p.body["last_progress_s"] == TIMEOUT


def test_livez_restore_without_progress_is_stalled() -> None:
    # A restore counts as alive through its progress (beat per batch), not by itself.
    m = _m(1000.0)
    m.restoring = 3
    p = livez(m, 1000.0 + TIMEOUT + 1, TIMEOUT)
    assert not p.ok
    assert p.body["restoring"] == 3


def test_livez_restore_with_progress_is_alive() -> None:
    m = _m(1000.0)
    m.restoring = 3
    assert livez(m, 1000.0 + 5, TIMEOUT).ok


def test_livez_bounded_blocking_call_alive_until_its_deadline() -> None:
    m = _m(1000.0)
    m.blocked_since = 1000.0
    m.blocked_deadline = 1000.0 + 120  # beyond the liveness timeout
    m.blocked_in = "commit_transaction"
    p = livez(m, 1000.0 + 90, TIMEOUT)  # heartbeat is 90 s old
    assert p.ok
    assert p.body == {
        "status": "blocked",
        "in": "commit_transaction",
        "blocked_s": 90.0,
        "deadline_in_s": 30.0,
    }
    assert livez(m, 1000.0 + 120, TIMEOUT).ok  # the deadline itself still counts


def test_livez_bounded_blocking_call_dead_after_its_deadline() -> None:
    m = _m(1000.0)
    m.blocked_since = 1000.0
    m.blocked_deadline = 1010.0  # shorter than the liveness timeout: still enforced
    m.blocked_in = "send_offsets_to_transaction"
    p = livez(m, 1012.5, TIMEOUT)
    assert not p.ok
    assert p.body == {
        "status": "overdue",
        "in": "send_offsets_to_transaction",
        "blocked_s": 12.5,
        "overdue_s": 2.5,
    }


def test_livez_unbounded_blocking_call_gets_no_exemption() -> None:
    m = _m(1000.0)
    m.blocked_since = 1000.0
    m.blocked_deadline = None
    m.blocked_in = "flush"
    assert livez(m, 1030.0, TIMEOUT).ok
    p = livez(m, 1000.0 + TIMEOUT + 1, TIMEOUT)
    assert not p.ok
    assert p.body["status"] == "stalled"
    assert p.body["in"] == "flush"


def test_livez_stale_deadline_ignored_once_the_call_returned() -> None:
    m = _m(1000.0)
    m.enter_blocking("commit_transaction", 1.0)
    m.exit_blocking()
    assert m.blocked_in is None
    assert livez(m, time.monotonic() + 5, TIMEOUT).ok  # past the old deadline


def test_blocked_context_manager_sets_and_clears() -> None:
    m = _m(0.0)
    before = time.monotonic()
    with m.blocked("init_transactions", 20.0):
        assert m.blocked_in == "init_transactions"
        assert m.blocked_deadline is not None
        assert before + 20.0 <= m.blocked_deadline <= time.monotonic() + 20.0
        assert livez(m, time.monotonic(), TIMEOUT).body["status"] == "blocked"
    assert m.blocked_in is None
    assert m.heartbeat >= before  # returning counts as progress


def test_blocked_context_manager_clears_on_error() -> None:
    m = _m(0.0)
    with pytest.raises(RuntimeError), m.blocked("commit_transaction", 5.0):
        raise RuntimeError("boom")
    assert m.blocked_in is None


# -- /readyz and /startupz ---------------------------------------------------------------------


def test_readyz_not_ready_until_joined() -> None:
    m = _m()
    m.started = True
    assert readyz(m) == (False, {"status": "joining"})
    m.joined = True
    assert readyz(m) == (True, {"status": "ready", "key_groups": 0})


def test_readyz_joined_with_no_key_groups_is_ready() -> None:
    # More instances than partitions: an idle instance must not block a rollout.
    m = _m()
    m.joined = True
    assert readyz(m).ok


def test_readyz_an_assignment_implies_joined() -> None:
    m = _m()
    m.assigned = 2
    assert readyz(m) == (True, {"status": "ready", "key_groups": 2})


def test_readyz_not_ready_while_restoring() -> None:
    m = _m()
    m.joined = True
    m.assigned = 4
    m.restoring = 2
    p = readyz(m)
    assert p.status == 503
    assert p.body == {"status": "restoring", "key_groups": 2}


def test_readyz_not_ready_while_halted_and_says_how_to_resume() -> None:
    m = _m()
    m.joined = True
    m.assigned = 3
    m.halted = ((0, "sp-a"), (2, "sp-a"))
    p = readyz(m)
    assert p.status == 503
    assert p.body == {
        "status": "halted",
        "key_groups": [0, 2],
        "savepoints": ["sp-a"],
        "resume": "start the app with --from-savepoint sp-a",
    }
    m.halted = ()
    assert readyz(m) == (True, {"status": "ready", "key_groups": 3})


def test_halted_key_groups_gauge() -> None:
    m = _m()
    m.halted = ((1, "sp-b"), (3, "sp-b"))
    from prometheus_client import generate_latest

    text = generate_latest(metrics_registry(m)).decode()
    families = {f.name: f for f in text_string_to_metric_families(text)}
    assert families["lockgate_key_groups_halted"].samples[0].value == 2


def test_startupz() -> None:
    m = _m()
    assert startupz(m) == (False, {"status": "starting"})
    m.started = True
    assert startupz(m) == (True, {"status": "started"})


# -- histograms and exposition -----------------------------------------------------------------


def test_histogram_buckets_are_upper_bounds_inclusive() -> None:
    h = Histogram((0.01, 0.1, 1.0))
    for v in (0.0, 0.01, 0.010001, 0.1, 5.0):
        h.observe(v)
    assert h.counts == [2, 2, 0, 1]
    assert h.count == 5
    buckets, total = h.cumulative()
    assert buckets == [("0.01", 2.0), ("0.1", 4.0), ("1.0", 4.0), ("+Inf", 5.0)]
    assert total == pytest.approx(5.120001)


def test_histogram_rejects_bad_bounds() -> None:
    with pytest.raises(ValueError):
        Histogram(())
    with pytest.raises(ValueError):
        Histogram((1.0, 1.0))


def test_duration_buckets_span_5ms_to_60s() -> None:
    assert DURATION_BUCKETS[0] == 0.005
    assert DURATION_BUCKETS[-1] == 60.0


def _families(m: Metrics) -> dict[str, object]:
    from prometheus_client import generate_latest

    text = generate_latest(metrics_registry(m)).decode()
    return {f.name: f for f in text_string_to_metric_families(text)}


def _value(m: Metrics, sample: str, **labels: str) -> float:
    from prometheus_client import generate_latest

    text = generate_latest(metrics_registry(m)).decode()
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            if s.name == sample and all(s.labels.get(k) == v for k, v in labels.items()):
                assert s.labels["app"] == "app" and s.labels["lockgate_instance"] == "app-0"
                return float(s.value)
    raise AssertionError(f"{sample} {labels} missing from:\n{text}")


def test_exposition_names_and_values() -> None:
    m = _m()
    m.records_in, m.records_out, m.dlq_records = 10, 7, 1
    m.records_in_attempts, m.records_out_attempts = 15, 9
    m.epochs_committed, m.epochs_aborted, m.last_checkpoint_id = 3, 1, 42
    m.assigned, m.restoring = 4, 1
    m.restore_records, m.restore_remaining, m.consumer_lag = 100, 50, 7
    m.joined = True
    expected = {
        "lockgate_records_in_total": 10,
        "lockgate_records_out_total": 7,
        "lockgate_dlq_records_total": 1,
        "lockgate_records_in_attempts_total": 15,
        "lockgate_records_out_attempts_total": 9,
        "lockgate_epochs_committed_total": 3,
        "lockgate_epochs_aborted_total": 1,
        "lockgate_last_checkpoint_id": 42,
        "lockgate_key_groups_assigned": 4,
        "lockgate_key_groups_restoring": 1,
        "lockgate_restore_records_total": 100,
        "lockgate_restore_remaining_records": 50,
        "lockgate_consumer_lag_records": 7,
        "lockgate_joined": 1,
    }
    for name, value in expected.items():
        assert _value(m, name) == value, name


def test_exposition_histograms() -> None:
    m = _m()
    m.observe_commit(0.02)
    m.observe_commit(0.3)
    m.observe_restore(200.0)
    m.observe_alignment(0.001)
    assert _value(m, "lockgate_epoch_commit_seconds_count") == 2
    assert _value(m, "lockgate_epoch_commit_seconds_sum") == pytest.approx(0.32)
    assert _value(m, "lockgate_epoch_commit_seconds_bucket", le="0.025") == 1
    assert _value(m, "lockgate_epoch_commit_seconds_bucket", le="0.5") == 2
    assert _value(m, "lockgate_epoch_commit_seconds_bucket", le="+Inf") == 2
    assert _value(m, "lockgate_epoch_commit_seconds_max") == pytest.approx(0.3)
    assert _value(m, "lockgate_restore_seconds_bucket", le="120.0") == 0
    assert _value(m, "lockgate_restore_seconds_bucket", le="300.0") == 1
    assert _value(m, "lockgate_alignment_seconds_bucket", le="0.005") == 1
    assert _families(m)["lockgate_epoch_commit_seconds"].type == "histogram"  # type: ignore[attr-defined]


def test_legacy_sum_writes_record_observations() -> None:
    # The pre-histogram runtime did `m.commit_seconds_sum += took`.
    m = _m()
    m.commit_seconds_sum += 0.2
    m.commit_seconds_sum += 0.03
    m.alignment_seconds_sum += 1.5
    assert m.commit_seconds.counts[DURATION_BUCKETS.index(0.25)] == 1
    assert m.commit_seconds.count == 2
    assert m.commit_seconds_sum == pytest.approx(0.23)
    assert m.alignment_seconds_sum == pytest.approx(1.5)
    assert _value(m, "lockgate_epoch_commit_seconds_count") == 2


def test_exposition_progress_age_and_blocked_call() -> None:
    m = _m(100.0)
    m.blocked_since = 95.0
    m.blocked_deadline = 130.0
    m.blocked_in = "commit_transaction"
    registry_text = _text(MetricsCollector(m, clock=lambda: 110.0))
    assert (
        'lockgate_last_progress_age_seconds{app="app",lockgate_instance="app-0"} 10.0'
        in registry_text
    )
    assert (
        'lockgate_blocked_seconds{app="app",call="commit_transaction",'
        'lockgate_instance="app-0"} 15.0' in registry_text
    )
    m.blocked_in = None
    assert "lockgate_blocked_seconds{" not in _text(MetricsCollector(m, clock=lambda: 110.0))


def _text(collector: MetricsCollector) -> str:
    from prometheus_client import CollectorRegistry, generate_latest

    registry = CollectorRegistry()
    registry.register(collector)
    return generate_latest(registry).decode()


def test_private_registries_do_not_collide() -> None:
    a, b = _m(), _m()
    a.records_in = 1
    b.records_in = 2
    assert _value(a, "lockgate_records_in_total") == 1
    assert _value(b, "lockgate_records_in_total") == 2


# -- HTTP server ---------------------------------------------------------------------------------


def _get(port: int, path: str) -> tuple[int, str, str]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as r:  # noqa: S310
            return r.status, r.headers["Content-Type"], r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.headers["Content-Type"], e.read().decode()


@pytest.fixture
def served() -> Iterator[tuple[Metrics, int]]:
    m = Metrics("app", "app-0")
    server = HealthServer(m, "127.0.0.1", 0, 60_000)
    server.start()
    try:
        yield m, server.port
    finally:
        server.stop()


def test_server_probes_answer_json(served: tuple[Metrics, int]) -> None:
    m, port = served
    code, ctype, body = _get(port, "/readyz")
    assert (code, ctype, json.loads(body)) == (503, "application/json", {"status": "joining"})
    m.started, m.joined, m.assigned, m.restoring = True, True, 2, 2
    assert _get(port, "/readyz")[0] == 503
    assert json.loads(_get(port, "/readyz")[2]) == {"status": "restoring", "key_groups": 2}
    m.restoring = 0
    assert _get(port, "/readyz")[0] == 200
    assert _get(port, "/startupz")[0] == 200
    assert _get(port, "/livez?verbose=1")[0] == 200
    assert _get(port, "/nope")[0] == 404
    m.heartbeat -= 61
    code, _, body = _get(port, "/livez")
    assert code == 503
    assert json.loads(body)["status"] == "stalled"


def test_server_metrics(served: tuple[Metrics, int]) -> None:
    m, port = served
    m.records_in = 5
    code, ctype, body = _get(port, "/metrics")
    assert code == 200
    assert ctype.startswith("text/plain")
    assert 'lockgate_records_in_total{app="app",lockgate_instance="app-0"} 5.0' in body
    assert "# TYPE lockgate_records_in_total counter" in body
    if sys.platform == "linux":  # the process collector reads /proc
        assert "process_resident_memory_bytes" in body


def test_port_in_use_raises_config_error() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        server = HealthServer(Metrics("app", "app-0"), "127.0.0.1", port, 60_000)
        with pytest.raises(ConfigError) as info:
            server.start()
        server.stop()  # no-op, must not hang
    msg = str(info.value)
    assert f"LOCKGATE_HTTP_PORT={port}" in msg
    assert "already in use" in msg
    assert "LOCKGATE_HTTP_PORT=0" in msg


def test_port_is_released_after_stop() -> None:
    m = Metrics("app", "app-0")
    first = HealthServer(m, "127.0.0.1", 0, 60_000)
    first.start()
    port = first.port
    first.stop()
    again = HealthServer(m, "127.0.0.1", port, 60_000)
    again.start()
    again.stop()


def test_stop_without_start_returns() -> None:
    HealthServer(Metrics("app", "app-0"), "127.0.0.1", 0, 60_000).stop()


def test_exposition_checkpoint_time_watermark_and_partition_lag() -> None:
    m = _m()
    before = time.time()
    # The start time (rounded to ms in the exposition).
    assert _value(m, "lockgate_last_checkpoint_timestamp_seconds") <= before + 0.001
    assert _value(m, "lockgate_last_checkpoint_timestamp_seconds") > before - 60
    m.last_checkpoint_time = 1_700_000_123.5
    assert _value(m, "lockgate_last_checkpoint_timestamp_seconds") == 1_700_000_123.5
    # No event time: the watermark series is absent.
    with pytest.raises(AssertionError):
        _value(m, "lockgate_watermark_timestamp_seconds")
    m.watermark_ms = 1_700_000_000_250
    assert _value(m, "lockgate_watermark_timestamp_seconds") == 1_700_000_000.25
    m.partition_lag = {("in", 1): 5, ("in", 0): 3}
    assert _value(m, "lockgate_partition_lag_records", topic="in", partition="0") == 3
    assert _value(m, "lockgate_partition_lag_records", topic="in", partition="1") == 5
