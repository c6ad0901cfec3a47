"""What the Spark savepoint tools share.

The :class:`App` protocol (what the tools use of an app: ``state`` never imports
``processors``), :data:`TIME_STORE` and the layout of its keys, :data:`OffsetSpec` and
its check, JSON and key display for messages, the runtime's state version of store
schemas, and running a Spark action so that a task's :class:`SavepointError` surfaces
as one line.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol, TypeVar

import orjson

from state.codecs import Codec
from state.primitives import StateHandle
from state.savepoint import SavepointError


class _Output(Protocol):
    @property
    def internal(self) -> bool: ...


class App(Protocol):
    """What the savepoint tools use of an app (a :class:`processors.App` is one).

    ``state`` never imports ``processors``: this says what is needed instead.
    """

    @property
    def name(self) -> str:
        """The app's declared name."""

    @property
    def key_codec(self) -> Codec:
        """The codec of the app's keys."""

    @property
    def stores(self) -> Mapping[str, StateHandle]:
        """The app's state stores by name."""

    @property
    def input_topics(self) -> tuple[str, ...]:
        """The app's input topics, in declaration order."""

    @property
    def outputs(self) -> Mapping[str, _Output]:
        """The app's outputs by topic (``internal``: read by another lockgate app)."""

    def run_as(self, name: str) -> None:
        """Name the app's per-app topics after ``name`` (its ``LOCKGATE_APP_NAME``)."""


#: The store of watermarks and timers (the same name as ``processors._task.time.TIME_STORE``).
TIME_STORE = "lockgate.time"
#: Where a restored app starts reading one input, given as one offset for every key group (an
#: int >= 0, or ``"earliest"`` for 0), a sequence with one offset per key group, or a
#: mapping key group -> offset covering every key group.
OffsetSpec = int | str | Sequence[int] | Mapping[int, int]

_WM_KEY = b"w"
_TIMER_PREFIX = b"t"
_TIMER_HEAD = 10  # b"t" + kind (1 byte) + be64(time + 2**63)
_NO_WATERMARK = -(2**63)
#: Fields of the watermark record that only inputs written by other lockgate apps fill;
#: they describe the upstream writers of one key group and cannot be merged.
_UPSTREAM_FIELDS = ("writers", "expected", "internal", "pending")
_WORKER_ERROR = re.compile(r"SavepointError: (.+)")

T = TypeVar("T")


# --------------------------------------------------------------------- helpers


def _json_default(value: Any) -> Any:
    """Return a JSON stand-in for a decoded value orjson has no type for."""
    if isinstance(value, bytes | bytearray | memoryview):
        return bytes(value).hex()
    if isinstance(value, set | frozenset | tuple):
        return list(value)
    return repr(value)


def _to_json(value: Any) -> str:
    return orjson.dumps(value, default=_json_default, option=orjson.OPT_NON_STR_KEYS).decode()


def _show_key(raw: bytes, codec: Codec | None) -> str:
    """A key for an error message: decoded when possible, else its bytes."""
    if codec is not None:
        try:
            return repr(codec.decode(raw))
        except Exception:  # noqa: BLE001, S110 - any codec error: show the bytes
            pass
    return repr(raw[:64])


def _check_key_groups(what: str, key_groups: object) -> int:
    if isinstance(key_groups, bool) or not isinstance(key_groups, int) or key_groups < 1:
        raise SavepointError(f"{what}: key_groups must be an int >= 1, got {key_groups!r}")
    return key_groups


def _offsets_by_group(
    offsets: Mapping[str, OffsetSpec], topics: Sequence[str], key_groups: int
) -> dict[int, dict[str, int]]:
    """Return key group -> {input topic -> offset} (see :data:`OffsetSpec`).

    Raises:
        SavepointError: an input has no offset, a topic is not an input, or an offset
            is not an int >= 0 or does not cover exactly key groups ``0..P-1``.
    """
    if not isinstance(offsets, Mapping):
        raise SavepointError(
            f"offsets must map each input topic to its start offsets, got {type(offsets).__name__}"
        )
    missing = [t for t in topics if t not in offsets]
    extra = sorted(t for t in offsets if t not in topics)
    if missing or extra:
        parts = []
        if missing:
            parts.append(f"no offsets for input topic(s) {', '.join(missing)}")
        if extra:
            parts.append(f"{', '.join(extra)} is not an input of the app")
        raise SavepointError(
            f"offsets: {'; '.join(parts)} (the app's inputs: {', '.join(topics)}; a restore "
            "needs a start offset for every input)"
        )

    def checked(topic: str, value: object) -> int:
        if value == "earliest":
            return 0
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise SavepointError(
                f"offsets[{topic!r}]: {value!r} is not an offset (an int >= 0 or 'earliest')"
            )
        return value

    out: dict[int, dict[str, int]] = {g: {} for g in range(key_groups)}
    for topic in topics:
        spec = offsets[topic]
        if isinstance(spec, int | str):
            value = checked(topic, spec)
            for g in range(key_groups):
                out[g][topic] = value
        elif isinstance(spec, Mapping):
            if sorted(spec) != list(range(key_groups)):
                raise SavepointError(
                    f"offsets[{topic!r}] has key groups {sorted(spec)}, expected exactly "
                    f"0..{key_groups - 1} (key_groups={key_groups})"
                )
            for g in range(key_groups):
                out[g][topic] = checked(topic, spec[g])
        elif isinstance(spec, Sequence):
            if len(spec) != key_groups:
                raise SavepointError(
                    f"offsets[{topic!r}] has {len(spec)} offsets, expected one per key group "
                    f"(key_groups={key_groups})"
                )
            for g in range(key_groups):
                out[g][topic] = checked(topic, spec[g])
        else:
            raise SavepointError(f"offsets[{topic!r}]: unsupported value {spec!r}")
    return out


def _run_job(what: str, action: Callable[[], T]) -> T:
    """Run a Spark action; a :class:`SavepointError` raised in a task is raised here.

    Spark reports a task's exception as its own error with the worker's traceback in
    the message; the lockgate message is taken out of it so callers see one clear line.
    """
    try:
        return action()
    except SavepointError:
        raise
    except Exception as exc:
        found = _WORKER_ERROR.findall(str(exc))
        if found:
            raise SavepointError(f"{what}: {found[-1].strip()}") from exc
        raise


def _spark_context(spark: Any) -> Any:
    return spark.sparkContext
