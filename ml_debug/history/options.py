"""The options of `mldebug history` and the ``--history`` option the health hook shares."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ml_debug.core.errors import UsageError
from ml_debug.core.options import option

HISTORY_HELP = ("The history database (SQLite). Default: $MLDEBUG_HISTORY, else /var/lib/mldebug/history.db as "
                "root, ~/.local/state/mldebug/history.db otherwise; put it on shared storage to see every node.")


def parse_history(word: str) -> Path:
    if not word.strip():
        raise UsageError("--history is empty", "name the database file, e.g. --history /shared/mldebug/history.db")
    path = Path(word)
    if path.is_dir() or word.endswith("/"):
        raise UsageError(f"--history {word} is a directory", f"name a file in it, e.g. --history {path / 'history.db'}")
    return path


def parse_since(word: str) -> float:
    """--since: 90m, 12h, 7d, or an ISO date/time -> unix time."""
    import datetime as dt
    import re
    import time

    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([smhd])\s*", word)
    if m:
        return time.time() - float(m.group(1)) * {"s": 1, "m": 60, "h": 3600, "d": 86400}[m.group(2)]
    try:
        when = dt.datetime.fromisoformat(word.strip())
    except ValueError:
        raise UsageError(f"--since {word!r} is neither a duration nor a date",
                         "e.g. --since 24h, --since 7d or --since 2026-11-01T08:00") from None
    return when.timestamp()


@dataclass
class HistoryOptions:
    """What to ask the history database: the options of `mldebug history`."""

    node: str | None = option(None, metavar="NAME", help="Show this node's timeline: failed checks, drains and "
                                                         "resumes, failed jobs that named it.")
    since: float | None = option(None, metavar="WHEN", parse=parse_since, format=str,
                                 help="Only what happened since then: 90m, 24h, 7d, or a date (2026-11-01T08:00).")
    jobs: int = option(20, flags=("--failed-jobs",), renamed_from=("--jobs",), min=1, max=1_000_000, metavar="N",
                       help="How many of the latest failed jobs to look at for recurring nodes.")
    history: Path | None = option(None, metavar="FILE", envvar="MLDEBUG_HISTORY", parse=parse_history, format=str,
                                  help=HISTORY_HELP)
