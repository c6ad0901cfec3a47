"""Kafka's Java-compatible murmur2 key partitioner, as the app's declarations use it.

The implementation lives in :mod:`state.partitioning` (the savepoint tools need it
too, and ``state`` never imports ``processors``).
"""

from __future__ import annotations

from state.partitioning import key_group, murmur2

__all__ = ["key_group", "murmur2"]
