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
import hmac
import json
import re
import threading
import urllib.error
import urllib.parse
import urllib.request
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import orjson

from state.codecs import CodecUnavailable

#: Header a forwarded request carries: the receiver answers it itself, never forwards again.
FORWARDED_HEADER = "X-Lockgate-Forwarded"
#: Queries waiting for the loop at most; more are answered 503 at once.
MAX_PENDING = 64
#: /state requests handled at once at most (each holds an HTTP thread while it waits).
MAX_CONCURRENT = 32
#: An owner id forwarded to must look like a Kafka group instance id (no URL syntax).
_OWNER_ID = re.compile(r"[A-Za-z0-9._-]{1,249}")


def valid_owner(owner: str) -> bool:
    """Whether ``owner`` may be put into the peer URL template (Kafka's id alphabet)."""
    return _OWNER_ID.fullmatch(owner) is not None and not owner.startswith(".")


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
    #: The HTTP side gave up waiting: the loop skips it.
    cancelled: bool = False


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
    """Encode an answer body (state values of any codec: models, bytes, sets become JSON).

    What orjson refuses (integers beyond 64 bits, dict keys that are bytes or tuples) is
    rendered by the standard library, unknown objects as their ``str``.
    """
    try:
        return orjson.dumps(body, default=_json_default, option=orjson.OPT_NON_STR_KEYS) + b"\n"
    except TypeError:
        return (json.dumps(_plain(body), default=str) + "\n").encode()


def _plain(obj: Any) -> Any:
    if isinstance(obj, dict):
        return {k if isinstance(k, str) else str(k): _plain(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_plain(v) for v in obj]
    if isinstance(obj, (str, int, float, bool, type(None))):
        return obj
    try:
        return _plain(_json_default(obj))
    except Exception:  # noqa: BLE001 - a model that cannot dump itself
        return str(obj)


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    """A forwarded request never follows a redirect (it carries the client's token)."""

    def redirect_request(self, *args: Any, **kwargs: Any) -> None:
        return None


#: No proxies from the environment and no redirects for forwarded requests.
_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}), _NoRedirect)


def _settle(
    query: StateQuery,
    answer: Callable[[StateQuery], Answer | None],
    otherwise: Answer | None = None,
) -> bool:
    """Answer ``query`` with ``answer`` (``otherwise`` when it defers); False: still deferred.

    An exception in ``answer`` becomes a 500 for that query (the loop goes on).
    """
    try:
        result = answer(query) or otherwise
    except Exception as exc:  # noqa: BLE001 - reported to the client, not fatal
        result = Answer(500, {"status": "error", "error": type(exc).__name__})
    if result is None:
        return False
    query.answer = result
    query.done.set()
    return True


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
        #: Queries whose key group's owner is being looked up (loop thread only).
        self._deferred: list[StateQuery] = []
        self._slots = threading.BoundedSemaphore(MAX_CONCURRENT)
        #: Set by the loop when a query missed the owner map: refresh it soon.
        self.owners_wanted = False

    # -- loop side ------------------------------------------------------------------------

    @property
    def pending(self) -> bool:
        """Whether queries wait (one attribute read; called every loop iteration)."""
        return bool(self._inbox)

    @property
    def deferred(self) -> bool:
        """Whether queries wait for an owner lookup (loop thread only)."""
        return bool(self._deferred)

    def serve(self, answer: Callable[[StateQuery], Answer | None]) -> None:
        """Answer the queued queries with ``answer`` (the loop thread only).

        ``answer`` returns ``None`` to defer a query until the owners are known
        (:meth:`retry_deferred`). An exception in ``answer`` becomes a 500 for that query;
        the loop goes on. Serves at most the queries queued when called.
        """
        inbox = self._inbox
        for _ in range(len(inbox)):
            query = inbox.popleft()
            if not query.cancelled and not _settle(query, answer):
                self._deferred.append(query)

    def retry_deferred(self, answer: Callable[[StateQuery], Answer | None]) -> None:
        """Answer the deferred queries again once the owner lookup finished (loop thread).

        A query still without an owner gets a 503 (``Retry-After``).
        """
        deferred, self._deferred = self._deferred, []
        for query in deferred:
            if not query.cancelled:
                _settle(
                    query, answer, Answer(503, {"status": "owner unknown (rebalancing?); retry"})
                )

    # -- HTTP side ------------------------------------------------------------------------

    def handle(
        self, path: str, query_string: str, headers: Any
    ) -> tuple[int, bytes, dict[str, str]]:
        """Answer ``GET /state/<store>/<key>[?encoding=base64]`` (the HTTP thread).

        Never raises: an unexpected error is a 500. At most :data:`MAX_CONCURRENT` requests
        are handled at once and :data:`MAX_PENDING` wait for the loop; more get a 503.

        Returns:
            (status, JSON body, extra response headers).
        """
        if not self._slots.acquire(blocking=False):
            return 503, to_json({"status": "too many state requests"}), {"Retry-After": "1"}
        try:
            return self._handle(path, query_string, headers)
        except Exception as exc:  # noqa: BLE001 - the client gets an answer, always
            return 500, to_json({"status": "error", "error": type(exc).__name__}), {}
        finally:
            self._slots.release()

    def _handle(
        self, path: str, query_string: str, headers: Any
    ) -> tuple[int, bytes, dict[str, str]]:
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
        try:
            store = urllib.parse.unquote(parts[2], errors="strict")
            key_text = urllib.parse.unquote(parts[3], errors="strict")
        except UnicodeDecodeError:
            return 400, to_json({"status": "the path is not UTF-8 (use ?encoding=base64)"}), {}
        params = urllib.parse.parse_qs(query_string)
        encoding = (params.get("encoding") or ["codec"])[0]
        try:
            if encoding == "base64":
                key = base64.b64decode(key_text, validate=True)
            elif encoding == "codec":
                key = self._encode_key(key_text)
            else:
                return 400, to_json({"status": "encoding must be codec or base64"}), {}
        except CodecUnavailable:
            return (
                503,
                to_json({"status": "the key codec's service is unavailable"}),
                {"Retry-After": "1"},
            )
        except Exception as exc:  # noqa: BLE001 - any codec failure: the key is bad
            return 400, to_json({"status": "cannot encode the key", "error": str(exc)}), {}
        forwarded = headers.get(FORWARDED_HEADER) is not None
        query = StateQuery(store, key, key_text, forwarded)
        if len(self._inbox) >= MAX_PENDING:
            return 503, to_json({"status": "too many state requests"}), {"Retry-After": "1"}
        self._inbox.append(query)
        if not query.done.wait(self._timeout_s) or query.answer is None:
            query.cancelled = True
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
            with _OPENER.open(req, timeout=self._timeout_s) as resp:
                return resp.status, resp.read(), {}
        except urllib.error.HTTPError as exc:
            if 300 <= exc.code < 400:
                return 502, to_json({"status": "the owner answered a redirect"}), {}
            extra = {"Retry-After": "1"} if exc.code == 503 else {}
            return exc.code, exc.read(), extra
        except Exception as exc:  # noqa: BLE001 - unreachable, reset, bad answer: all 502
            return (
                502,
                to_json({"status": "the owner did not answer", "owner": base, "error": str(exc)}),
                {"Retry-After": "1"},
            )
