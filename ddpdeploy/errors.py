"""The errors a command ends with: one line, no traceback, a fixed exit code. Bad input the
user can fix (exit 2) and an outside system that refused (exit 1) are two kinds, not one."""

from __future__ import annotations


class DdpdeployError(Exception):
    """A command's end: printed as one line, no traceback, with ``exit_code``."""

    exit_code = 1

    def __init__(self, message: str, exit_code: int | None = None) -> None:
        super().__init__(message)
        if exit_code is not None:
            self.exit_code = exit_code


class UserError(DdpdeployError):
    """Bad input the user can fix: exit code 2."""

    exit_code = 2


class OperationError(DdpdeployError):
    """An outside system refused or failed (engine down, apply failed): exit code 1."""

    exit_code = 1


class LogUnavailable(OperationError):
    """A container's log the kubelet no longer has (the container is gone): it answered
    with its own error text as the log. Callers say so, never show it as the pod's line."""


class ApiUnreachable(OperationError):
    """The Kubernetes API did not answer (refused, reset, timed out): no call will."""


class ApiSilent(ApiUnreachable):
    """The API server stopped answering while a log was followed (its connection open, no
    bytes): a followed log ends on it, rather than wait for ever."""
