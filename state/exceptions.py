"""Errors raised by the state package."""

from __future__ import annotations


class StateError(Exception):
    """Base class of every error raised by :mod:`state`."""


class StateFormatError(StateError):
    """A local state database was written in a format this build cannot read.

    The message names the directory and what to do about it.
    """


class StateLockedError(StateError):
    """Another process holds the RocksDB lock of a key group's database."""
