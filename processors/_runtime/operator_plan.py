"""Operator ids: how saved operator state maps onto an app's operators.

Window and interval-join stores and timers are numbered by declaration order
(``window-<n>``, ``w<n>:...``). A savepoint's manifest names, for each of their stores, its
operator's id (``operator``, and ``timers`` for the owner prefix), so a restore gives every
operator the state saved under its id (:func:`plan_operator_restore`) and reordered
declarations keep their state. A restart restores from changelogs, which are numbered, not
named: :func:`check_operator_layout` refuses a start whose operators would get another's
state. Pure functions of a manifest, a registration and the app's operators: no client,
no runner state.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from processors._dsl.definition import OperatorInfo
from processors.exceptions import ConfigError
from state.savepoint import SavepointError

log = logging.getLogger("lockgate.savepoint")

#: The names operator stores get (declaration-numbered); a saved store with such a name
#: and no ``operator`` field was saved before operator ids were recorded.
_OPERATOR_STORE = re.compile(r"^(window-\d+|interval-join-\d+\.(left|right))$")


@dataclass
class OperatorPlan:
    """How a savepoint's stores and timers map onto the app's (see :func:`plan_operator_restore`).

    Attributes:
        sources: app store name -> the saved store restored into it; every saved store
            but those of dropped operators is here (stores of the app's own map to
            themselves, whether the app still declares them or not).
        timers: saved timer owner prefix -> the app's (``None``: dropped with its
            operator); empty when nothing is renamed.
        legacy: the savepoint records no operator ids (taken before they were
            recorded): stores restore by name, i.e. by declaration order.
        added: ids of the app's operators without state in the savepoint (they start
            empty).
        dropped: ids of saved operators the app does not have (their state is dropped;
            only with ``allow_non_restored``).
    """

    sources: dict[str, str]
    timers: dict[str, str | None] = field(default_factory=dict)
    legacy: bool = False
    added: list[str] = field(default_factory=list)
    dropped: list[str] = field(default_factory=list)


def _suffix(store: str) -> str:
    """The part of an operator store's name that says which of its stores it is."""
    return store.partition(".")[2]


def plan_operator_restore(
    saved: Mapping[str, Mapping[str, Any]],
    operators: Mapping[str, OperatorInfo],
    allow_non_restored: bool,
) -> OperatorPlan:
    """Map a savepoint's stores and timers onto the app's by operator id.

    Contract: a saved operator store (its entry has ``operator``) is restored into the
    store of the app's operator with the same id, wherever the declaration order put
    it; its timers' owner prefix (``timers``) is renamed to that operator's. An app
    operator whose id the savepoint lacks starts empty (as a new store does); a saved
    operator the app lacks is refused, or with ``allow_non_restored`` its state and
    timers are dropped (as a dropped store's). A savepoint without any ``operator``
    field is *legacy*: every store restores by name, as before operator ids existed.

    Args:
        saved: the manifest's stores (name -> entry with ``kind``, ``codec`` and, for
            operator stores, ``operator`` and ``timers``).
        operators: the app's operators by id (:attr:`processors.App.operators`).
        allow_non_restored: accept saved operators that the app no longer has.

    Raises:
        SavepointError: saved operator ids the app does not have (without
            ``allow_non_restored``), or an operator whose stores changed shape (a
            window id now on an interval join); the message names the ids.
    """
    ids: dict[str, list[str]] = {}
    prefixes: dict[str, str] = {}
    for name, entry in saved.items():
        uid = entry.get("operator")
        if uid is not None:
            ids.setdefault(str(uid), []).append(name)
            if entry.get("timers"):
                prefixes[str(uid)] = str(entry["timers"])
    if not ids:
        legacy = any(_OPERATOR_STORE.match(name) for name in saved)
        added = [] if legacy else list(operators)  # legacy: restored by name, not added
        return OperatorPlan({name: name for name in saved}, legacy=legacy, added=added)
    sources = {name: name for name, entry in saved.items() if entry.get("operator") is None}
    timers: dict[str, str | None] = {}
    problems: list[str] = []
    dropped = sorted(uid for uid in ids if uid not in operators)
    if dropped and not allow_non_restored:
        problems.append(
            f"operator id(s) {dropped} are in the savepoint but not in the app (its operator "
            f"ids: {sorted(operators)}); give those operators the uid= they were saved with "
            "(a derived id changes with the topics or operator it reads), or drop their state "
            "with --allow-non-restored-state"
        )
    for uid in dropped:
        if uid in prefixes:
            timers[prefixes[uid]] = None
    for uid, info in operators.items():
        if uid not in ids:
            continue
        old = {_suffix(n): n for n in ids[uid]}
        new = {_suffix(n): n for n in info.stores}
        if old.keys() != new.keys() or (uid in prefixes) != (info.timers is not None):
            problems.append(
                f"operator {uid!r} was saved with the stores {sorted(ids[uid])}, the app's "
                f"{info.kind} with that id has {list(info.stores)}; give it another uid="
            )
            continue
        for suffix, name in new.items():
            sources[name] = old[suffix]
        if info.timers is not None:
            timers[prefixes[uid]] = info.timers
    if problems:
        raise SavepointError("; ".join(problems))
    if all(old == new for old, new in timers.items()):
        timers = {}
    added = [uid for uid in operators if uid not in ids]
    return OperatorPlan(sources, timers, added=added, dropped=dropped)


def moved_operator_state(
    registered: object, operators: Mapping[str, OperatorInfo]
) -> tuple[list[str], list[str]]:
    """Return the app's stores whose changelog holds another operator's state.

    ``registered`` is the ``operators`` of the app's last registration (id -> its
    stores, as the process that wrote it declared them; anything else: unknown, nothing
    returned). Each store of the app's operators that belonged to another id then is
    described as ``"window-1 (state of 'a', now 'b')"``, in one of two lists:

    * *moved*: one of the two ids is on the other side too (declarations reordered, or
      an operator removed before this one): the store would restore state that belongs
      to another operator of the app;
    * *renamed*: neither is (the id changed in place, e.g. a derived id after its input
      topic was renamed): restored by store name, as before operator ids.
    """
    if not isinstance(registered, Mapping):
        return [], []
    owner: dict[str, str] = {}
    for uid, stores in registered.items():
        if isinstance(stores, list):
            owner.update({str(store): str(uid) for store in stores})
    moved: list[str] = []
    renamed: list[str] = []
    for uid, info in operators.items():
        for store in info.stores:
            before = owner.get(store)
            if before is not None and before != uid:
                known = before in operators or uid in registered
                (moved if known else renamed).append(f"{store} (state of {before!r}, now {uid!r})")
    return moved, renamed


def rename_timers(names: list[str], renames: Mapping[str, str | None]) -> list[str]:
    """Return the timer names of one timer entry with their owner prefixes renamed.

    ``renames`` maps a saved owner prefix (``w<n>``) to the app's, or to ``None`` to
    drop the operator's timers; other names (the app's own ``u...`` timers) stay.
    """
    out: list[str] = []
    for name in names:
        prefix, sep, rest = name.partition(":")
        if sep and prefix in renames:
            new = renames[prefix]
            if new is not None:
                out.append(f"{new}:{rest}")
        else:
            out.append(name)
    return out


def savepoint_to_seed(
    *,
    seeding: str | None,
    from_savepoint: str | None,
    origin: str | None,
    halted: str | None,
    resume_halted: bool,
) -> str | None:
    """Return the savepoint a key group must be seeded from at its assignment, or ``None``.

    In order: a restore under way (its checkpoint record names it) is finished; then an
    explicit ``--from-savepoint`` the key group does not descend from yet; then, with
    ``LOCKGATE_RESUME_FROM_STOP_SAVEPOINT``, the savepoint a stop-with-savepoint halted it
    at. A key group whose state already descends from the savepoint found is not seeded
    again (a restart).

    Args:
        seeding: the savepoint a cut-short restore was seeding, if any.
        from_savepoint: the ``--from-savepoint`` setting.
        origin: the savepoint the key group's state descends from, if any.
        halted: the savepoint a stop-with-savepoint halted the key group at, if any.
        resume_halted: the ``resume_from_stop_savepoint`` setting.

    Returns:
        The savepoint id to seed from, or ``None`` to keep the key group's state.

    Raises:
        ConfigError: the key group is to resume from its halt while ``--from-savepoint``
            (restored from already) is still set: once it descends from the halt's
            savepoint, the next start would restore the older one over it.
    """
    if seeding is not None:
        return seeding
    if from_savepoint is not None and origin != from_savepoint:
        return from_savepoint
    if resume_halted and halted is not None and origin != halted:
        if from_savepoint is not None:  # restored from it already (else returned above)
            raise ConfigError(
                f"key group halted at savepoint {halted} and LOCKGATE_RESUME_FROM_STOP_SAVEPOINT "
                f"is set, but LOCKGATE_FROM_SAVEPOINT={from_savepoint} is still set too: after "
                f"resuming from {halted}, the next start would restore the older "
                f"{from_savepoint} over it. Remove LOCKGATE_FROM_SAVEPOINT (--from-savepoint); "
                "the key group descends from it already"
            )
        return halted
    return None


def check_operator_layout(
    app: str,
    registration: Mapping[str, Any] | None,
    operators: Mapping[str, OperatorInfo],
    *,
    from_savepoint: str | None,
    allow_non_restored_state: bool,
) -> None:
    """Refuse to restore operator state from changelogs numbered for other operators.

    Window and interval-join stores are numbered by declaration order, and a restart
    restores them from their changelogs by that number: after reordered (or removed)
    declarations an operator would get another's state. A savepoint restore maps
    state by operator id, so it is not checked.

    Args:
        app: the app's name (in the message).
        registration: the app's last registration in the registry (``None``: first run).
        operators: the app's operators by id.
        from_savepoint: the ``--from-savepoint`` setting.
        allow_non_restored_state: warn instead of refusing.

    Raises:
        ConfigError: a store's changelog holds another operator's state (the message
            names the stores and ids, and how to deploy the change), unless
            ``allow_non_restored_state`` (then a warning).
    """
    if from_savepoint is not None or registration is None:
        return
    moved, renamed = moved_operator_state(registration.get("operators"), operators)
    if renamed:
        log.warning(
            f"operator ids changed in place since the last run: {', '.join(renamed)}; "
            "their state is restored by store name"
        )
    if not moved:
        return
    what = (
        f"app {app!r}: the changelogs of {', '.join(moved)} hold the state of "
        "another operator (window and interval-join stores are numbered by declaration "
        "order, and declarations were reordered or removed since the last run)"
    )
    if allow_non_restored_state:
        log.warning(what + "; starting anyway (LOCKGATE_ALLOW_NON_RESTORED_STATE)")
        return
    raise ConfigError(
        f"{what}. Deploy such a change through a savepoint, which maps state by operator "
        "id: lockgate savepoint trigger --app ... --stop with the previous code, then "
        "lockgate run ... --from-savepoint ID; after lockgate reset (no state left), set "
        "LOCKGATE_ALLOW_NON_RESTORED_STATE=true for one start"
    )


def log_operator_plan(sp_id: str, g: int, plan: OperatorPlan, has_operators: bool) -> None:
    """Say how the savepoint's operators map onto the app's (``has_operators``: any)."""
    extra = {"savepoint": sp_id, "key_group": g}
    if plan.legacy and has_operators:
        log.warning(
            "the savepoint records no operator ids (it was taken before lockgate "
            "recorded them): window and interval-join state is restored by declaration "
            "order (window-<n>, interval-join-<n>); if declarations were reordered since, "
            "restore with the previous code and take a new savepoint",
            extra=extra,
        )
        return
    if plan.added:
        log.warning(
            f"operators {plan.added} have no state in the savepoint: they start empty",
            extra=extra,
        )
    if plan.dropped:
        log.warning(
            f"the state of the savepoint's operators {plan.dropped} is dropped "
            "(--allow-non-restored-state)",
            extra=extra,
        )
