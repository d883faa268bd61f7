"""The one error type the CLI turns into a single line and exit code 2."""

from __future__ import annotations


class UserError(Exception):
    """Bad input the user can fix: printed as one line, exit code 2, no traceback."""

    exit_code = 2

    def __init__(self, message: str, exit_code: int = 2) -> None:
        super().__init__(message)
        self.exit_code = exit_code


class OperationError(UserError):
    """An outside system refused (engine down, apply failed): one line, exit code 1."""

    def __init__(self, message: str, exit_code: int = 1) -> None:
        super().__init__(message, exit_code)
