"""A Ctrl-C or SIGTERM in the instant a child has started and mldebug does not hold it yet.

Loaded through ``MLDEBUG_TEST_HOOKS=tests.fakes.signal_at_start`` (see :func:`env`): when mldebug has
just started a child whose argv holds the word ``MLDEBUG_TEST_SIGNAL_AT_START`` names, this
process sends itself the signal, once, and writes the child's pid to the file ``..._PIDS`` names.
That is the window in which an interrupt raised out of ``subprocess.Popen`` lost the child
(core/lifecycle.py ``held_signals``; tests/cli/test_json_errors.py).
"""

from __future__ import annotations

import os
import signal
from pathlib import Path
from typing import Any

from tests.fakes import hooks_env

HOOK = "tests.fakes.signal_at_start"
ENV = "MLDEBUG_TEST_SIGNAL_AT_START"
"""``SIGNAL:WORD``: send SIGNAL (SIGTERM, SIGINT) when a child with WORD in its argv starts."""
PIDS = "MLDEBUG_TEST_SIGNAL_AT_START_PIDS"
"""A file: the pid of the child at whose start the signal was sent."""
SKIP = "MLDEBUG_TEST_SIGNAL_AT_START_SKIP"
"""Let this many matching children start unsignalled first (the signal comes at the next)."""
GONE = "MLDEBUG_TEST_SIGNAL_AT_START_GONE"
"""``1``: the child has ended, and been reaped, when the signal comes (the instant after a tool finished,
before mldebug saw it: its process group no longer exists)."""

_sent: list[int] = []
_skipped: list[int] = []


def env(sig: str, word: str, pids: Path, skip: int = 0, gone: bool = False) -> dict[str, str]:
    return hooks_env(HOOK, {ENV: f"{sig}:{word}", PIDS: str(pids), SKIP: str(skip), GONE: "1" if gone else "0"})


def child_started(pid: int, argv: Any) -> None:
    sig, _, word = os.environ.get(ENV, "").partition(":")
    words = [argv] if isinstance(argv, (str, bytes, os.PathLike)) else list(argv)
    if not sig or _sent or not any(word in os.fsdecode(w) for w in words):  # `bash -c 'sleep 60'` too
        return
    if len(_skipped) < int(os.environ.get(SKIP) or 0):
        _skipped.append(pid)
        return
    _sent.append(pid)
    if os.environ.get(GONE) == "1":
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)  # reaped behind subprocess's back: its group is gone, Popen copes with ECHILD
    Path(os.environ[PIDS]).write_text(f"{pid}\n")
    os.kill(os.getpid(), signal.Signals[sig])
