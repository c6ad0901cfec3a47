"""The errors ``state`` raises (re-exported where they are used: ``state.savepoint``)."""

from __future__ import annotations

__all__ = ["SavepointError"]


class SavepointError(Exception):
    """A savepoint cannot be written, read or restored.

    The message names the savepoint, file or store concerned and, where there is one,
    what to do about it. The runtime wraps it in its own error type.
    """
