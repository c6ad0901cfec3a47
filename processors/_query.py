"""Queryable state: read-only ``GET /state/<store>/<key>`` on the probe server.

Contract (docs/operations.md, "Queryable state"):
    * Off unless ``LOCKGATE_QUERY_ENABLED=true``. With ``LOCKGATE_QUERY_TOKEN`` every request
      must carry ``Authorization: Bearer <token>`` (401 otherwise).
    * Answers come from the *committed* state: the local database of the key group, which
      receives an epoch's changes only after its transaction committed (and a restored key
      group's database holds only committed changelog records). Writes of the open epoch are
      not visible; a value is at most one checkpoint interval old on a busy instance.
    * Only the instance that owns the key's key group answers with the value. Another
      instance forwards the request once (``X-Lockgate-Forwarded``) to the owner it learned
      from the group's assignment, when ``LOCKGATE_QUERY_PEER_URL`` tells how to reach it;
      otherwise (or while the owner is unknown, e.g. during a rebalance) it answers 421 or
      503 with ``Retry-After``.

Threading contract: the HTTP thread never touches a database or a key group. It queues a
:class:`StateQuery` and waits (at most ``LOCKGATE_QUERY_TIMEOUT_MS``) until the processing
loop, between two batches, answered it with :meth:`QueryService.serve`. Forwarding to a peer
happens on the HTTP thread, after the loop decided who owns the key.
"""

from __future__ import annotations

import base64
import binascii
import hmac
import threading
import urllib.error
import urllib.parse
import urllib.request
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import orjson

#: Header a forwarded request carries: the receiver answers it itself, never forwards again.
FORWARDED_HEADER = "X-Lockgate-Forwarded"


@dataclass
class Answer:
    """What the loop decided for one query.

    Attributes:
        status: HTTP status (200 value, 404 unknown store or no value, 400 bad key, 421 not
            the owner and no way to forward, 503 owner unknown for now).
        body: the JSON body.
        forward_to: the owner's base URL; the HTTP thread forwards the request there.
    """

    status: int
    body: dict[str, Any]
    forward_to: str | None = None


@dataclass
class StateQuery:
    """One ``/state`` request handed from the HTTP thread to the loop.

    Attributes:
        store: the store name.
        key: the serialized key (what the app's state is keyed by).
        key_text: the key as the client wrote it (echoed in answers).
        forwarded: the request was forwarded by a peer (never forward it again).
    """

    store: str
    key: bytes
    key_text: str
    forwarded: bool
    answer: Answer | None = None
    done: threading.Event = field(default_factory=threading.Event)


def _json_default(obj: Any) -> Any:
    dump = getattr(obj, "model_dump", None)  # pydantic models
    if callable(dump):
        return dump(mode="json")
    asdict = getattr(obj, "asdict", None)  # faust.Record
    if callable(asdict):
        return asdict()
    if isinstance(obj, (bytes, bytearray, memoryview)):
        return base64.b64encode(bytes(obj)).decode()
    if isinstance(obj, (set, frozenset)):
        return sorted(obj, key=repr)
    return str(obj)


def to_json(body: dict[str, Any]) -> bytes:
    """Encode an answer body (state values of any codec: models, bytes, sets become JSON)."""
    return orjson.dumps(body, default=_json_default, option=orjson.OPT_NON_STR_KEYS) + b"\n"


class QueryService:
    """The hand-off between the HTTP thread and the processing loop.

    Args:
        encode_key: turns the key text of a URL into the serialized key (the app's key
            codec); a ``ValueError``/``TypeError`` from it is a 400.
        token: the bearer token requests must carry, or ``None``.
        timeout_s: how long a request waits for the loop.
    """

    def __init__(
        self, encode_key: Callable[[str], bytes], token: str | None, timeout_s: float
    ) -> None:
        self._encode_key = encode_key
        self._token = None if token is None else token.encode()
        self._timeout_s = timeout_s
        self._inbox: deque[StateQuery] = deque()
        #: Set by the loop when a query missed the owner map: refresh it soon.
        self.owners_wanted = False

    # -- loop side ------------------------------------------------------------------------

    @property
    def pending(self) -> bool:
        """Whether queries wait (one attribute read; called every loop iteration)."""
        return bool(self._inbox)

    def serve(self, answer: Callable[[StateQuery], Answer]) -> None:
        """Answer every queued query with ``answer`` (the loop thread only).

        An exception in ``answer`` becomes a 500 for that query; the loop goes on.
        """
        inbox = self._inbox
        while inbox:
            query = inbox.popleft()
            try:
                query.answer = answer(query)
            except Exception as exc:  # noqa: BLE001 - reported to the client, not fatal
                query.answer = Answer(500, {"status": "error", "error": f"{exc}"})
            query.done.set()

    # -- HTTP side ------------------------------------------------------------------------

    def handle(
        self, path: str, query_string: str, headers: Any
    ) -> tuple[int, bytes, dict[str, str]]:
        """Answer ``GET /state/<store>/<key>[?encoding=base64]`` (the HTTP thread).

        Returns:
            (status, JSON body, extra response headers).
        """
        if self._token is not None:
            auth = str(headers.get("Authorization") or "")
            scheme, _, given = auth.partition(" ")
            if scheme.lower() != "bearer" or not hmac.compare_digest(
                given.strip().encode(), self._token
            ):
                return (
                    401,
                    to_json({"status": "unauthorized"}),
                    {"WWW-Authenticate": 'Bearer realm="lockgate"'},
                )
        parts = path.split("/", 3)  # "", "state", store, key
        if len(parts) != 4 or not parts[2] or not parts[3]:
            return 400, to_json({"status": "use GET /state/<store>/<key>"}), {}
        store = urllib.parse.unquote(parts[2])
        key_text = urllib.parse.unquote(parts[3])
        params = urllib.parse.parse_qs(query_string)
        encoding = (params.get("encoding") or ["codec"])[0]
        try:
            if encoding == "base64":
                key = base64.b64decode(key_text, validate=True)
            elif encoding == "codec":
                key = self._encode_key(key_text)
            else:
                return 400, to_json({"status": "encoding must be codec or base64"}), {}
        except (ValueError, TypeError, binascii.Error) as exc:
            return 400, to_json({"status": "cannot encode the key", "error": str(exc)}), {}
        forwarded = headers.get(FORWARDED_HEADER) is not None
        query = StateQuery(store, key, key_text, forwarded)
        self._inbox.append(query)
        if not query.done.wait(self._timeout_s) or query.answer is None:
            return (
                503,
                to_json({"status": "the instance is busy (commit, restore or rebalance)"}),
                {"Retry-After": "1"},
            )
        ans = query.answer
        if ans.forward_to is not None:
            return self._forward(ans.forward_to, path, query_string, headers)
        extra = {"Retry-After": "1"} if ans.status == 503 else {}
        return ans.status, to_json(ans.body), extra

    def _forward(
        self, base: str, path: str, query_string: str, headers: Any
    ) -> tuple[int, bytes, dict[str, str]]:
        url = base.rstrip("/") + path + (f"?{query_string}" if query_string else "")
        fwd = {FORWARDED_HEADER: "1"}
        auth = headers.get("Authorization")
        if auth:
            fwd["Authorization"] = str(auth)
        req = urllib.request.Request(url, headers=fwd, method="GET")  # noqa: S310 - configured
        try:
            with urllib.request.urlopen(req, timeout=self._timeout_s) as resp:  # noqa: S310
                return resp.status, resp.read(), {}
        except urllib.error.HTTPError as exc:
            extra = {"Retry-After": "1"} if exc.code == 503 else {}
            return exc.code, exc.read(), extra
        except (urllib.error.URLError, OSError) as exc:
            return (
                502,
                to_json({"status": "the owner did not answer", "owner": base, "error": str(exc)}),
                {"Retry-After": "1"},
            )
