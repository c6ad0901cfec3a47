"""The error of every operator command: :class:`OpsError` and its exit code.

2 for usage and configuration problems, 1 for runtime failures and timeouts.
"""

from __future__ import annotations

from processors.exceptions import LockgateError


class OpsError(LockgateError):
    """An operator command failed.

    Args:
        message: what went wrong and, where there is one, what to do.
        exit_code: 2 for usage/configuration problems, 1 for runtime failures.
    """

    def __init__(self, message: str, exit_code: int = 1) -> None:
        super().__init__(message)
        self.exit_code = exit_code
