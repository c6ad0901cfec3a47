"""In-memory state backend (tests, and apps that rebuild state from the changelog)."""

from state.memory.store import MemoryBackend, MemoryKeyGroupStore

__all__ = ["MemoryBackend", "MemoryKeyGroupStore"]
