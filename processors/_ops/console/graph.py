"""The pipeline graph of the console: apps and their topics, from the registry (pure).

Nodes are apps and topics; an edge goes from a topic to each app that reads it and from
an app to each topic it writes (outputs and internal outputs). Control topics, changelogs
and dead-letter topics are left out: they belong to one app each and are shown with it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

__all__ = ["Edge", "Graph", "Node", "pipeline_graph"]

#: Horizontal and vertical distance between the nodes of the SVG layout (px).
COLUMN_WIDTH = 200
ROW_HEIGHT = 56


@dataclass(frozen=True)
class Node:
    """One node of the graph.

    Attributes:
        id: ``app:<name>`` or ``topic:<name>``.
        kind: ``app``, ``input`` (no registered writer), ``internal`` or ``output``.
        label: the app's or topic's name.
        level: column of the layout (longest path from a source topic).
        row: row within the column.
    """

    id: str
    kind: str
    label: str
    level: int
    row: int

    @property
    def x(self) -> int:
        """Left edge in the SVG layout."""
        return 10 + self.level * COLUMN_WIDTH

    @property
    def y(self) -> int:
        """Top edge in the SVG layout."""
        return 10 + self.row * ROW_HEIGHT


@dataclass(frozen=True)
class Edge:
    """A directed edge between two node ids."""

    source: str
    target: str


@dataclass(frozen=True)
class Graph:
    """The laid-out graph.

    Attributes:
        nodes: every node, by column then row.
        edges: every edge.
    """

    nodes: tuple[Node, ...]
    edges: tuple[Edge, ...]

    @property
    def width(self) -> int:
        """Width of the SVG canvas."""
        return 20 + (max((n.level for n in self.nodes), default=0) + 1) * COLUMN_WIDTH

    @property
    def height(self) -> int:
        """Height of the SVG canvas."""
        return 20 + (max((n.row for n in self.nodes), default=0) + 1) * ROW_HEIGHT

    def node(self, node_id: str) -> Node:
        """Return the node ``node_id``.

        Raises:
            KeyError: no such node.
        """
        for n in self.nodes:
            if n.id == node_id:
                return n
        raise KeyError(node_id)

    def to_json(self) -> dict[str, Any]:
        """Return a JSON-able form (nodes with their layout, edges)."""
        return {
            "nodes": [
                {"id": n.id, "kind": n.kind, "label": n.label, "level": n.level, "row": n.row}
                for n in self.nodes
            ],
            "edges": [{"source": e.source, "target": e.target} for e in self.edges],
        }


def _topics(reg: Mapping[str, Any], field: str) -> list[str]:
    return [str(t) for t in reg.get(field) or ()]


def pipeline_graph(registry: Mapping[str, Mapping[str, Any]]) -> Graph:
    """Return the graph of every registered app, laid out in columns.

    A topic with no registered writer is an ``input``; one an app registered as an
    internal output is ``internal``; any other written topic is an ``output``. The
    column of a node is the length of the longest path to it from a topic without a
    writer (cycles are cut after as many rounds as there are nodes).

    Args:
        registry: app name -> registration record (``inputs``, ``outputs``,
            ``internal_outputs``).
    """
    edges: list[Edge] = []
    kinds: dict[str, str] = {}
    writers: dict[str, list[str]] = {}
    for app in sorted(registry):
        reg = registry[app]
        for topic in _topics(reg, "inputs"):
            kinds.setdefault(topic, "input")
            edges.append(Edge(f"topic:{topic}", f"app:{app}"))
        for field, kind in (("outputs", "output"), ("internal_outputs", "internal")):
            for topic in _topics(reg, field):
                writers.setdefault(topic, []).append(app)
                edges.append(Edge(f"app:{app}", f"topic:{topic}"))
                if kinds.get(topic) != "internal":
                    kinds[topic] = kind
    level: dict[str, int] = {f"app:{a}": 0 for a in registry}
    level.update({f"topic:{t}": 0 for t in kinds})
    for _ in range(len(level)):
        changed = False
        for e in edges:
            if level[e.target] < level[e.source] + 1:
                level[e.target] = level[e.source] + 1
                changed = True
        if not changed:
            break
    labels = {f"app:{a}": (a, "app") for a in registry}
    labels.update({f"topic:{t}": (t, k) for t, k in kinds.items()})
    nodes: list[Node] = []
    for lvl in sorted(set(level.values())):
        column = sorted(i for i, v in level.items() if v == lvl)
        for row, node_id in enumerate(column):
            label, kind = labels[node_id]
            nodes.append(Node(node_id, kind, label, lvl, row))
    unique = tuple(dict.fromkeys(edges))
    return Graph(tuple(nodes), unique)
