"""Which apps an operator command covers: the pipeline graph of the app registry.

Pure functions over registry records (app name -> registration with its ``inputs`` and
``internal_outputs``): the writers of internal topics, a pipeline's closure, the apps
upstream first, the source apps a savepoint request goes to, and :func:`resolve_apps`
(``--app`` / ``--pipeline``). Unit-tested without Kafka.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from processors._ops.errors import OpsError


def writers_by_topic(registry: Mapping[str, Mapping[str, Any]]) -> dict[str, list[str]]:
    """Return internal topic -> the apps that registered it as an internal output."""
    out: dict[str, list[str]] = {}
    for name in sorted(registry):
        for topic in registry[name].get("internal_outputs") or ():
            out.setdefault(str(topic), []).append(name)
    return out


def _edges(registry: Mapping[str, Mapping[str, Any]]) -> dict[str, set[str]]:
    """Return app -> the registered apps directly downstream of it."""
    writers = writers_by_topic(registry)
    down: dict[str, set[str]] = {name: set() for name in registry}
    for name, reg in registry.items():
        for topic in reg.get("inputs") or ():
            for writer in writers.get(str(topic), ()):
                if writer != name:
                    down[writer].add(name)
    return down


def pipeline_closure(registry: Mapping[str, Mapping[str, Any]], app: str) -> list[str]:
    """Return ``app`` and every app connected to it through internal topics, sorted.

    App X is upstream of Y when one of X's ``internal_outputs`` is among Y's
    ``inputs``; the closure follows these edges both ways, transitively (so apps that
    share an upstream are in the same pipeline).

    Raises:
        OpsError: ``app`` is not registered (exit code 2).
    """
    if app not in registry:
        raise OpsError(_unknown_app(registry, app), exit_code=2)
    down = _edges(registry)
    neighbours: dict[str, set[str]] = {name: set(nxt) for name, nxt in down.items()}
    for name, nxt in down.items():
        for other in nxt:
            neighbours[other].add(name)
    seen = {app}
    todo = [app]
    while todo:
        for other in neighbours[todo.pop()]:
            if other not in seen:
                seen.add(other)
                todo.append(other)
    return sorted(seen)


def topo_order(registry: Mapping[str, Mapping[str, Any]], apps: Iterable[str]) -> list[str]:
    """Return ``apps`` upstream first (ties and cycles by name)."""
    wanted = set(apps)
    down = _edges({k: v for k, v in registry.items() if k in wanted})
    indeg = {name: 0 for name in wanted}
    for nxt in down.values():
        for other in nxt:
            indeg[other] += 1
    order: list[str] = []
    ready = sorted(n for n, d in indeg.items() if d == 0)
    while ready:
        name = ready.pop(0)
        order.append(name)
        for other in sorted(down.get(name, ())):
            indeg[other] -= 1
            if indeg[other] == 0:
                ready.append(other)
                ready.sort()
    order.extend(sorted(wanted - set(order)))  # a cycle: whatever is left, by name
    return order


def source_apps(registry: Mapping[str, Mapping[str, Any]], apps: Iterable[str]) -> list[str]:
    """Return the apps among ``apps`` none of whose inputs is a registered internal output.

    These receive the savepoint request; the others get the savepoint's barrier from
    their upstream apps.
    """
    internal = set(writers_by_topic(registry))
    return sorted(
        name
        for name in set(apps)
        if not any(str(t) in internal for t in registry.get(name, {}).get("inputs") or ())
    )


def unnamed_upstreams(
    registry: Mapping[str, Mapping[str, Any]], apps: Iterable[str]
) -> dict[str, list[tuple[str, str]]]:
    """Return app -> [(internal topic, writer app)] for writers that are not in ``apps``.

    A savepoint of an app that reads an internal topic needs the topic's writers in
    the same savepoint (the barrier comes from them).
    """
    named = set(apps)
    writers = writers_by_topic(registry)
    out: dict[str, list[tuple[str, str]]] = {}
    for name in sorted(named):
        for topic in registry.get(name, {}).get("inputs") or ():
            for writer in writers.get(str(topic), ()):
                if writer not in named and writer != name:
                    out.setdefault(name, []).append((str(topic), writer))
    return out


def _unknown_app(registry: Mapping[str, Any], app: str) -> str:
    known = ", ".join(sorted(registry)) or "none"
    return (
        f"app {app!r} is not in the registry (lockgate.registry); registered apps: {known} "
        "(an app registers when an instance starts)"
    )


def resolve_apps(
    registry: Mapping[str, Mapping[str, Any]],
    apps: Sequence[str] = (),
    pipeline: str | None = None,
) -> list[str]:
    """Return the apps of a savepoint, upstream first.

    Args:
        registry: app name -> registration record.
        apps: exactly these apps (``--app``).
        pipeline: this app's pipeline (``--pipeline``); exclusive with ``apps``.

    Raises:
        OpsError: (exit code 2) neither or both given, an app is not registered, or a
            named app reads an internal topic whose writer is not named.
    """
    if bool(apps) == (pipeline is not None):
        raise OpsError("give either --app NAME (repeatable) or --pipeline NAME", exit_code=2)
    if pipeline is not None:
        return topo_order(registry, pipeline_closure(registry, pipeline))
    for name in apps:
        if name not in registry:
            raise OpsError(_unknown_app(registry, name), exit_code=2)
    missing = unnamed_upstreams(registry, apps)
    if missing:
        parts = [
            f"{app} reads {topic}, written by {writer}"
            for app, pairs in missing.items()
            for topic, writer in pairs
        ]
        raise OpsError(
            "; ".join(parts) + ": use --pipeline " + sorted(missing)[0] + " or name the "
            "upstream app(s) with --app too",
            exit_code=2,
        )
    return topo_order(registry, dict.fromkeys(apps))
