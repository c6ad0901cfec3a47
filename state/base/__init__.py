"""Contracts every state backend implements."""

from state.base.store import KeyGroupStore, StateBackend, Writes

__all__ = ["KeyGroupStore", "StateBackend", "Writes"]
