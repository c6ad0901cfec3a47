"""Errors raised by the processors package."""

from __future__ import annotations


class LockgateError(Exception):
    """Base class of every error raised by :mod:`processors`."""


class ConfigError(LockgateError):
    """The configuration (environment or app definition) is invalid.

    The message names the variable or definition to fix.
    """


class AuthorizationError(ConfigError):
    """The principal lacks an ACL the app needs (the message names the operation and resource).

    Raised at start; exits 2 like other configuration errors (docs/security.md).
    """


class TopicError(LockgateError):
    """An input topic is missing, or topics are not co-partitioned."""


class FatalKafkaError(LockgateError):
    """Kafka reported a fatal error (e.g. this producer was fenced by a newer instance).

    The instance releases its key groups and exits non-zero; the orchestrator restarts it.
    """


class UserCodeError(LockgateError):
    """User code raised while ``LOCKGATE_ON_ERROR=fail``; the app stops with this error."""
