"""Queryable state: GET /state/<store>/<key> on two real instances of running_sum.

Two instances share the group; their HTTP servers listen on 127.0.0.2 and 127.0.0.3 (same
port), and their instance ids are those addresses, so ``LOCKGATE_QUERY_PEER_URL`` =
``http://{instance}:PORT`` reaches the owner of a key: a request to either instance
answers every key (the non-owner forwards once). Values are checked against an
independent model of the input, and against the *committed* output: a query never shows
a count the committed output does not have yet, while the instance visibly processed
more (read_uncommitted sees the open epoch's records).
"""

from __future__ import annotations

import base64
import json
import socket
import urllib.error
import urllib.parse
import urllib.request
from collections import Counter
from pathlib import Path

from tests.support.kafka import create_topic, produce_numbers, read_all, unique
from tests.support.procs import AppProcess, wait_until

TOKEN = "q-token-5e3f"  # noqa: S105 - a test token
HOSTS = ("127.0.0.2", "127.0.0.3")


def _port() -> int:
    """A port free on both addresses."""
    while True:
        with socket.socket() as s:
            s.bind((HOSTS[0], 0))
            port = int(s.getsockname()[1])
        try:
            with socket.socket() as s2:
                s2.bind((HOSTS[1], port))
            return port
        except OSError:
            continue


def _get(
    host: str, port: int, path: str, token: str | None = TOKEN, **headers: str
) -> tuple[int, dict[str, object]]:
    req = urllib.request.Request(f"http://{host}:{port}{path}")  # noqa: S310 - test URL
    if token is not None:
        req.add_header("Authorization", f"Bearer {token}")
    for name, value in headers.items():
        req.add_header(name.replace("_", "-"), value)
    try:
        with urllib.request.urlopen(req, timeout=10) as r:  # noqa: S310
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read() or b"{}")
    except OSError:
        return 0, {}


def _counts(bootstrap: str, topic: str, isolation: str, at_least: int) -> Counter[str]:
    """Output records per key, read until ``at_least`` arrived and 0.5 s passed idle."""
    msgs = read_all(bootstrap, topic, expected=at_least, timeout=20, idle=0.5, isolation=isolation)
    return Counter(m.key().decode() for m in msgs)


def test_state_queries_answer_committed_state_from_the_owner(
    kafka_bootstrap: str, tmp_path: Path
) -> None:
    port = _port()
    inp, out, name = unique("q-in"), unique("q-out"), unique("qstate")
    create_topic(kafka_bootstrap, inp, 4)
    keys = [f"k{i}" for i in range(12)]
    first = [(keys[i % len(keys)], i, i) for i in range(240)]
    produce_numbers(kafka_bootstrap, inp, first)
    apps = []
    for host in HOSTS:
        env = {
            "LOCKGATE_BOOTSTRAP_SERVERS": kafka_bootstrap,
            "LOCKGATE_APP_NAME": name,
            "LOCKGATE_INPUT_TOPIC": inp,
            "LOCKGATE_OUTPUT_TOPIC": out,
            "LOCKGATE_STATE_DIR": str(tmp_path / host),
            "LOCKGATE_INSTANCE_ID": host,
            "LOCKGATE_HTTP_HOST": host,
            "LOCKGATE_HTTP_PORT": str(port),
            "LOCKGATE_CHECKPOINT_INTERVAL_MS": "4000",
            "LOCKGATE_QUERY_ENABLED": "true",
            "LOCKGATE_QUERY_TIMEOUT_MS": "15000",  # a loaded CI machine starts probes slowly
            "LOCKGATE_QUERY_TOKEN": TOKEN,
            "LOCKGATE_QUERY_PEER_URL": f"http://{{instance}}:{port}",
        }
        apps.append(AppProcess("examples.running_sum:app", env, tmp_path / f"{host}.log").start())
    try:

        def assigned(host: str) -> int:
            req = urllib.request.Request(f"http://{host}:{port}/readyz")  # noqa: S310
            try:
                with urllib.request.urlopen(req, timeout=5) as r:  # noqa: S310
                    return int(json.loads(r.read())["key_groups"])
            except (OSError, ValueError, KeyError):
                return 0

        wait_until(
            lambda: all(assigned(h) >= 1 for h in HOSTS) and sum(map(assigned, HOSTS)) == 4,
            90,
            what="both instances own key groups",
        )
        assert len(read_all(kafka_bootstrap, out, expected=len(first), idle=0.5)) == len(first)

        # Independent model of the committed state.
        model: dict[str, list[int]] = {}
        for key, v, _ in first:
            s, c = model.get(key, [0, 0])
            model[key] = [s + v, c + 1]

        # Every key, asked at either instance, answers the owner's committed value.
        answered_by: dict[str, set[str]] = {h: set() for h in HOSTS}
        for host in HOSTS:
            for key in keys:
                # The first miss waits for the group description: no retry needed.
                code, body = _get(host, port, f"/state/totals/{key}")
                assert code == 200, (host, key, body)
                assert body["value"] == model[key], (host, key, body)
                assert body["store"] == "totals" and body["key"] == key
                answered_by[host].add(str(body["instance"]))
        # Each instance answered some keys itself and forwarded the others.
        assert answered_by[HOSTS[0]] == set(HOSTS) == answered_by[HOSTS[1]]

        # The non-owner does not forward a forwarded request again: 421 naming the owner.
        key = keys[0]
        owner = str(_get(HOSTS[0], port, f"/state/totals/{key}")[1]["instance"])
        other = HOSTS[1] if owner == HOSTS[0] else HOSTS[0]
        code, body = _get(other, port, f"/state/totals/{key}", X_Lockgate_Forwarded="1")
        assert (code, body["owner"]) == (421, owner)

        # Refusals: token, store, key, path.
        assert _get(owner, port, f"/state/totals/{key}", token=None)[0] == 401
        assert _get(owner, port, f"/state/totals/{key}", token="wrong")[0] == 401
        code, body = _get(owner, port, f"/state/nope/{key}")
        assert code == 404 and body["stores"] == ["totals"]
        assert _get(owner, port, "/state/totals/never-seen")[0] in (404, 421)
        assert _get(owner, port, "/state/totals")[0] == 400
        raw = urllib.parse.quote(base64.b64encode(key.encode()).decode(), safe="")
        code, body = _get(owner, port, f"/state/totals/{raw}?encoding=base64")
        assert code == 200 and body["value"] == model[key]

        # Committed state only: while an epoch is open (its outputs visible to
        # read_uncommitted), the query shows the last committed count, never the open one.
        saw_open_epoch = False
        seq = total = len(first)
        for _ in range(4):
            produce_numbers(kafka_bootstrap, inp, [(key, 1, seq)])
            seq += 1
            wait_until(
                lambda n=total + 1: (
                    _counts(kafka_bootstrap, out, "read_uncommitted", n)[key] == model[key][1] + 1
                ),
                30,
                what="the new record processed",
            )
            code, body = _get(owner, port, f"/state/totals/{key}")
            assert code == 200, body
            shown = body["value"][1]  # type: ignore[index]
            committed = _counts(kafka_bootstrap, out, "read_committed", total)[key]
            assert shown <= committed, (shown, committed)
            if shown == model[key][1]:
                saw_open_epoch = True  # processed, not committed, not shown
            model[key] = [model[key][0] + 1, model[key][1] + 1]
            total += 1
            wait_until(
                lambda: _get(owner, port, f"/state/totals/{key}")[1].get("value") == model[key],
                30,
                what="the committed value shown",
            )
            if saw_open_epoch:
                break
        assert saw_open_epoch, "never queried inside an open epoch"
    finally:
        for app in apps:
            app.terminate(60)
    for app in apps:
        assert "Traceback" not in app.log_text()
