"""The options of `mldebug core-bt` (cheap to import: the CLI builds its options from them)."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from ml_debug.core.errors import UsageError
from ml_debug.core.options import argument, option


def _path(word: str) -> Path:
    """A path word: an empty one (an unset variable in a job script) would mean '.', searched silently."""
    if not word:
        raise UsageError("an empty path was given", "name a core file or a directory (use . for this one)")
    return Path(word)


def _executable(word: str) -> str:
    """--exe: gdb and pystack take whatever they are given and then show no symbols; say so up front."""
    if not os.path.isfile(word) or not os.access(word, os.X_OK):
        what = "does not exist" if not os.path.lexists(word) else "is not an executable file"
        raise UsageError(f"--exe {word!r} {what}",
                         "give the program that crashed, e.g. --exe /opt/venv/bin/python3 (see the core's "
                         "command line: mldebug core-bt --json)")
    return word


@dataclass(frozen=True)
class CoreBtOptions:
    """The options of `mldebug core-bt`."""

    cores: list[Path] = argument(default_factory=list, metavar="CORE", parse=_path,
                                 help="Core files, or directories to search (every core file under them).")
    dirs: list[Path] = option(flags=("--dir",), default_factory=list, metavar="DIR", parse=_path,
                              help="Directory to search for core files, whatever their names, subdirectories "
                                   "too (repeatable; default: where core_pattern puts them).")
    exe: str | None = option(None, metavar="PATH", parse=_executable,
                             help="The executable that crashed, when the core's own record of it is wrong "
                                  "(a container path, a deleted venv).")
    newest: int | None = option(None, min=1, metavar="N", help="Only the N most recent cores.")
    timeout: float = option(120.0, flags=("--core-timeout",), renamed_from=("--timeout",), min=1.0, metavar="S",
                            help="Seconds per core for gdb/pystack.")
    all_threads: bool = option(False, help="Print every thread, not only the one that crashed.")
