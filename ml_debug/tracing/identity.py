"""Who wrote a trace file: rank detection, per-process file names, elapsed-time stamps, the header.

Standard library only: :mod:`ml_debug.nicertrace` imports it into user programs.
"""

from __future__ import annotations

import os
import socket
import sys

from ml_debug.core.rankvars import RANK_VARS, rank_from_env

__all__ = ["RANK_VARS", "detect_rank", "trace_file_name"]


def detect_rank() -> str:
    """The global rank from the launcher's environment, or ``"na"``."""
    found = rank_from_env()
    return "na" if found is None else str(found[0])


def trace_file_name(pid: int | None = None, host: str | None = None, rank: str | None = None) -> str:
    """``trace-{host}-{rank}-{pid}.txt`` for this process (or the given parts)."""
    host = host if host is not None else socket.gethostname()
    host = "".join(c if c.isalnum() or c in ".-_" else "_" for c in host) or "unknown"
    return f"trace-{host}-{rank if rank is not None else detect_rank()}-{pid if pid is not None else os.getpid()}.txt"


def format_elapsed(seconds: float) -> str:
    """``H:MM:SS.mmm``: readable when a job has run for hours."""
    ms = int(seconds * 1000)
    s, ms = divmod(ms, 1000)
    m, s = divmod(s, 60)
    h, m = divmod(m, 60)
    return f"{h}:{m:02d}:{s:02d}.{ms:03d}"


def format_elapsed_seconds(seconds: float) -> str:
    """``H:MM:SS``, whole seconds (the hours keep counting past a day)."""
    s = int(seconds)
    m, s = divmod(s, 60)
    h, m = divmod(m, 60)
    return f"{h}:{m:02d}:{s:02d}"


class Header:
    """The ``# nicertrace ...`` first line of a trace file.

    Its parts are computed when tracing starts (and again in a forked child), so that writing a
    dump later runs no library code the tracer itself would record.
    """

    __slots__ = ("_ident", "_tail")

    def __init__(self, start_unix: float, extra: str = "") -> None:
        argv = " ".join(sys.argv)[:300]
        self._ident = (f"pid={os.getpid()} host={socket.gethostname()} rank={detect_rank()} "
                       f"start_unix={start_unix:.6f} python={sys.version.split()[0]}")
        self._tail = f"{extra} argv={argv}\n"  # argv last: it may contain spaces

    def line(self, mode: str) -> str:
        return f"# nicertrace {self._ident} mode={mode}{self._tail}"
