"""One error family and the exit codes every command uses.

The library raises subclasses of :class:`MLDebugError`; the CLI's single
handler prints ``mldebug: error: <message>`` and ``hint: <hint>`` (one line
each) and exits with the error's code. Tracebacks only with ``--debug``.
"""

from __future__ import annotations

import re
from enum import IntEnum


class ExitCode(IntEnum):
    OK = 0
    PROBLEM = 1  # a check failed, a culprit was named
    USAGE = 2  # bad usage or bad input
    ENVIRONMENT = 3  # the environment lacks something: no GPU, no py-spy, no ptrace permission
    PARTIAL = 4  # some nodes/ranks were unreachable or timed out
    INTERRUPTED = 130


class MLDebugError(Exception):
    """Base of every error mldebug raises on purpose."""

    exit_code: ExitCode = ExitCode.PROBLEM
    details: dict[str, object] | None = None  # what a --json error document carries beside the message

    def __init__(self, message: str, hint: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint

    def __str__(self) -> str:
        return self.message


class UsageError(MLDebugError):
    """Bad usage or bad input (a malformed hostfile, a bad size, an unknown job)."""

    exit_code = ExitCode.USAGE


class EnvironmentProblem(MLDebugError):
    """Something the command needs is missing here (a tool, a permission, a GPU)."""

    exit_code = ExitCode.ENVIRONMENT


class PartialResult(MLDebugError):
    """Some targets never answered; what was gathered has already been reported."""

    exit_code = ExitCode.PARTIAL


class ProblemFound(MLDebugError):
    """A check failed (used where there is no report to render)."""

    exit_code = ExitCode.PROBLEM


_CPP_LOCATION = re.compile(r"^\[[^\]]*\.(?:cc|cpp|h|hpp):\d+\]\s*")


def first_line(e: BaseException, limit: int = 300) -> str:
    """What an exception says, in one line: c10d/gloo's C++ source location and boilerplate advice
    dropped, the exception's type name when it says nothing."""
    text = str(e).strip()
    if not text:
        return type(e).__name__
    line = _CPP_LOCATION.sub("", text.splitlines()[0])
    line = line.split(" This is typically")[0].split(" GLHF")[0]
    return line[:limit]
