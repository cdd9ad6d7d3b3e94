"""What one node sent back, and the failure reasons every transport uses."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

Failure = Literal["unreachable", "auth failed", "host key mismatch", "timed out", "command failed", "interrupted"]

UNREACHABLE: Failure = "unreachable"
AUTH_FAILED: Failure = "auth failed"
HOST_KEY_MISMATCH: Failure = "host key mismatch"
TIMED_OUT: Failure = "timed out"
COMMAND_FAILED: Failure = "command failed"
INTERRUPTED: Failure = "interrupted"  # Ctrl-C here while it ran: what it printed until then is kept

# Failures that mean "this node never answered": they make a run partial (exit 4).
NOT_REACHED: frozenset[str] = frozenset({UNREACHABLE, AUTH_FAILED, HOST_KEY_MISMATCH, TIMED_OUT})

# Per stream and node: a runaway command must not exhaust the caller's memory.
MAX_OUTPUT_BYTES = 32 * 1024 * 1024


@dataclass
class NodeResult:
    """One target's outcome. ``failure`` is None when the command ran and exited 0.

    ``exit_code`` is the command's own status (None when it never ran or was cut off);
    ``detail`` says in words why a node failed ("connection refused on 127.0.0.1:2299").
    """

    host: str
    exit_code: int | None
    stdout: str
    stderr: str
    duration_s: float
    failure: Failure | None
    detail: str = ""

    @property
    def ok(self) -> bool:
        return self.failure is None


def failed(host: str, failure: Failure, detail: str, duration_s: float, *,
           stdout: str = "", stderr: str = "", exit_code: int | None = None) -> NodeResult:
    return NodeResult(host=host, exit_code=exit_code, stdout=stdout, stderr=stderr,
                      duration_s=round(duration_s, 4), failure=failure, detail=detail)


def cut_short(r: NodeResult) -> NodeResult:
    """`r` as the result of a run that Ctrl-C ended (its output and status kept, the reason said)."""
    if r.failure == INTERRUPTED:
        return r
    was = r.detail or (f"exit status {r.exit_code}" if r.exit_code is not None else "")
    return dataclasses.replace(r, failure=INTERRUPTED, detail="stopped by Ctrl-C" + (f"; {was}" if was else ""))


class Interrupted(KeyboardInterrupt):
    """Ctrl-C during a run on many nodes; ``results`` holds every target's result, in target order:
    those that finished, and the others cut short (failure ``interrupted``, with what they printed).
    (:func:`ml_debug.remote.runner.run_mldebug_everywhere` puts its parsed ``AgentResult``s there.)"""

    def __init__(self, results: Sequence[Any]) -> None:
        super().__init__()
        self.results = list(results)


def finished(host: str, exit_code: int, stdout: str, stderr: str, duration_s: float) -> NodeResult:
    """A command that ran to its end: ok on status 0, else "command failed"."""
    return NodeResult(host=host, exit_code=exit_code, stdout=stdout, stderr=stderr,
                      duration_s=round(duration_s, 4),
                      failure=None if exit_code == 0 else COMMAND_FAILED,
                      detail="" if exit_code == 0 else _status_words(exit_code))


def _status_words(code: int) -> str:
    if code == 127:
        return "exit status 127 (command not found)"
    if code == 126:
        return "exit status 126 (not executable)"
    if code > 128:
        return f"exit status {code} (killed by signal {code - 128})"
    if code < 0:
        return f"killed by signal {-code}"
    return f"exit status {code}"


def decode(data: bytes) -> str:
    if len(data) > MAX_OUTPUT_BYTES:
        data = data[:MAX_OUTPUT_BYTES] + b"\n[mldebug: output truncated]\n"
    return data.decode("utf-8", errors="replace")
