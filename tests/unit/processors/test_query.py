"""The /state hand-off between the HTTP thread and the loop (no broker: the loop is a thread)."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest

from processors._config.settings import load_settings
from processors._runtime.query import (
    MAX_PENDING,
    Answer,
    QueryService,
    StateQuery,
    to_json,
    valid_owner,
)
from processors.exceptions import ConfigError


def _service(token: str | None = None, timeout_s: float = 2.0) -> QueryService:
    return QueryService(lambda text: text.encode(), token, timeout_s)


def _loop(svc: QueryService, answer: Any, stop: threading.Event) -> threading.Thread:
    def run() -> None:
        while not stop.is_set():
            if svc.pending:
                svc.serve(answer)
            time.sleep(0.005)

    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t


def test_the_loop_answers_and_the_http_side_returns_it() -> None:
    svc = _service()
    seen: list[StateQuery] = []

    def answer(q: StateQuery) -> Answer:
        seen.append(q)
        return Answer(200, {"value": {"n": 1}, "key": q.key_text})

    stop = threading.Event()
    _loop(svc, answer, stop)
    try:
        code, body, extra = svc.handle("/state/totals/a%2Fb", "", {})
    finally:
        stop.set()
    assert (code, body, extra) == (200, b'{"value":{"n":1},"key":"a/b"}\n', {})
    assert (seen[0].store, seen[0].key, seen[0].forwarded) == ("totals", b"a/b", False)


def test_token_is_required_when_configured() -> None:
    svc = _service(token="s3cret")
    code, _, extra = svc.handle("/state/totals/a", "", {})
    assert code == 401 and extra["WWW-Authenticate"].startswith("Bearer")
    assert svc.handle("/state/totals/a", "", {"Authorization": "Bearer wrong"})[0] == 401
    assert svc.handle("/state/totals/a", "", {"Authorization": "Basic s3cret"})[0] == 401
    assert not svc.pending  # refused before reaching the loop


def test_bad_paths_and_keys_are_400_and_never_reach_the_loop() -> None:
    svc = QueryService(lambda text: int(text).to_bytes(4, "big"), None, 1.0)
    assert svc.handle("/state/totals", "", {})[0] == 400
    assert svc.handle("/state//k", "", {})[0] == 400
    assert svc.handle("/state/totals/not-an-int", "", {})[0] == 400
    assert svc.handle("/state/totals/!!", "encoding=base64", {})[0] == 400
    assert svc.handle("/state/totals/k", "encoding=hex", {})[0] == 400
    assert not svc.pending


def test_a_loop_that_does_not_answer_in_time_is_a_503_with_retry_after() -> None:
    svc = _service(timeout_s=0.2)
    code, body, extra = svc.handle("/state/totals/a", "", {})
    assert code == 503 and extra == {"Retry-After": "1"} and b"busy" in body


def test_an_exception_in_the_answer_is_a_500_and_the_loop_goes_on() -> None:
    svc = _service()

    def answer(q: StateQuery) -> Answer:
        if q.key == b"bad":
            raise ValueError("boom")
        return Answer(404, {"status": "no value"})

    stop = threading.Event()
    _loop(svc, answer, stop)
    try:
        assert svc.handle("/state/s/bad", "", {})[:2] == (
            500,
            b'{"status":"error","error":"ValueError"}\n',
        )
        assert svc.handle("/state/s/ok", "", {})[0] == 404
    finally:
        stop.set()


def test_forwarded_requests_are_marked_and_unreachable_owners_are_502() -> None:
    svc = _service(timeout_s=1.0)
    marks: list[bool] = []

    def answer(q: StateQuery) -> Answer:
        marks.append(q.forwarded)
        return Answer(200, {}, forward_to="http://127.0.0.1:9")  # nothing listens on 9

    stop = threading.Event()
    _loop(svc, answer, stop)
    try:
        code, body, _ = svc.handle("/state/s/k", "", {"X-Lockgate-Forwarded": "1"})
        code2, _, _ = svc.handle("/state/s/k", "", {})
    finally:
        stop.set()
    assert marks == [True, False]
    assert code == 502 == code2 and b"did not answer" in body


def test_values_of_any_codec_become_json() -> None:
    assert to_json({"v": b"\x00\x01", "s": {3, 1}}) == b'{"v":"AAE=","s":[1,3]}\n'


def test_query_settings_are_checked_and_the_token_never_printed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("LOCKGATE_QUERY_PEER_URL", "http://no-placeholder:8080")
    monkeypatch.setenv("LOCKGATE_QUERY_TOKEN", "tok-with-newline\n")
    with pytest.raises(ConfigError) as exc:
        load_settings()
    text = str(exc.value)
    assert "LOCKGATE_QUERY_PEER_URL" in text and "{instance}" in text
    assert "LOCKGATE_QUERY_TOKEN" in text and "tok-with-newline" not in text
    monkeypatch.setenv("LOCKGATE_QUERY_PEER_URL", "http://{instance}.svc:8080")
    monkeypatch.setenv("LOCKGATE_QUERY_TOKEN", "tok-8f3a2c")
    s = load_settings()
    assert s.query_peer_url == "http://{instance}.svc:8080"
    assert s.query_token is not None and "tok-8f3a2c" not in repr(s.query_token)


def test_deferred_queries_wait_for_the_owner_lookup() -> None:
    svc = _service(timeout_s=3.0)
    owners: dict[str, str] = {}

    def answer(q: StateQuery) -> Answer | None:
        owner = owners.get(q.key_text)
        return None if owner is None else Answer(200, {"owner": owner})

    results: list[tuple[int, bytes, dict[str, str]]] = []
    t = threading.Thread(target=lambda: results.append(svc.handle("/state/s/k", "", {})))
    t.start()
    while not svc.pending:
        time.sleep(0.005)
    svc.serve(answer)  # no owner yet: deferred, not answered
    assert svc.deferred and not results
    owners["k"] = "i2"  # the lookup finished
    svc.retry_deferred(answer)
    t.join(5)
    assert results == [(200, b'{"owner":"i2"}\n', {})] and not svc.deferred
    # Still unknown after a lookup: 503 with Retry-After, never a hang.
    t2 = threading.Thread(target=lambda: results.append(svc.handle("/state/s/x", "", {})))
    t2.start()
    while not svc.pending:
        time.sleep(0.005)
    svc.serve(answer)
    svc.retry_deferred(answer)
    t2.join(5)
    assert results[1][0] == 503 and results[1][2] == {"Retry-After": "1"}


def test_timed_out_queries_are_skipped_and_the_inbox_is_bounded() -> None:
    svc = _service(timeout_s=0.05)
    assert svc.handle("/state/s/k", "", {})[0] == 503  # the loop never came
    calls: list[bytes] = []
    svc.serve(lambda q: calls.append(q.key) or Answer(200, {}))  # type: ignore[func-returns-value]
    assert calls == []  # the client gave up: not answered late
    for _ in range(MAX_PENDING):
        svc._inbox.append(StateQuery("s", b"k", "k", False))  # noqa: SLF001 - filling the inbox
    code, body, extra = svc.handle("/state/s/k", "", {})
    assert (code, extra) == (503, {"Retry-After": "1"}) and b"too many" in body


def test_handle_never_raises_and_unencodable_values_still_render() -> None:
    def broken(text: str) -> bytes:
        raise KeyError(text)  # a codec failing in an unexpected way

    svc = QueryService(broken, None, 1.0)
    assert svc.handle("/state/s/k", "", {})[0] == 400
    assert svc.handle("/state/s/%ff", "", {})[0] == 400  # not UTF-8
    assert to_json({"big": 2**70, "m": {b"k": 1, (1, 2): 2}}) == (
        b'{"big": 1180591620717411303424, "m": {"b\'k\'": 1, "(1, 2)": 2}}\n'
    )


def test_owner_ids_cannot_inject_url_syntax() -> None:
    assert valid_owner("lockgate-0") and valid_owner("127.0.0.2")
    for bad in ("evil.example/x?", "a b", "", ".hidden", "x@y", "h:1"):
        assert not valid_owner(bad), bad


def test_an_empty_or_short_token_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LOCKGATE_QUERY_TOKEN", "")
    with pytest.raises(ConfigError, match="LOCKGATE_QUERY_TOKEN"):
        load_settings()


def test_unprefixed_variables_are_not_treated_as_secrets(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KAFKA", "broker-host:9092")
    monkeypatch.setenv("LOCKGATE_CHECKPOINT_INTERVAL_MS", "broker-host:9092")
    with pytest.raises(ConfigError) as exc:
        load_settings()
    assert "broker-host:9092" in str(exc.value)  # shown: neither is a secret
