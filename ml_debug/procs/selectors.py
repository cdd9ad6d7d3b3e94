"""The options that pick processes by command line, user and environment, declared once for the
commands that take them (dump-stacks, top, watch), with their checks, made when the command line is
read. Cheap to import: the CLI builds its options from these fields."""

from __future__ import annotations

import re
from typing import Any

from ml_debug.core.errors import UsageError
from ml_debug.core.options import option


def parse_env_filter(item: str) -> tuple[str, str]:
    """``KEY=VALUE`` -> (KEY, VALUE)."""
    key, sep, value = item.partition("=")
    if not sep or not key:
        raise UsageError(f"--env {item!r} is not KEY=VALUE", "e.g. --env SLURM_JOB_ID=123")
    return key, value


def compile_pattern(pattern: str) -> re.Pattern[str]:
    """--pattern as a regular expression, or a usage error (exit 2) that says what is wrong with it."""
    try:
        return re.compile(pattern)
    except re.error as e:
        raise UsageError(f"--pattern {pattern!r} is not a valid regular expression: {e}",
                         "use Python re syntax, e.g. --pattern 'train\\.py'") from None


def checked_pattern(pattern: str) -> str:
    """--pattern as given, once it is known to compile: a bad one is said once, up front, rather than as
    every node's agent failing to start."""
    compile_pattern(pattern)
    return pattern


def pattern_option(panel: str, verb: str, instead: bool = True) -> Any:
    """``--pattern REGEX``; ``verb`` says what the command does with the processes ("Dump", "Watch")."""
    tail = " instead of the ranks found under launchers." if instead else "."
    return option(None, metavar="REGEX", panel=panel, parse=checked_pattern,
                  help=f"{verb} processes whose command line matches (like pgrep -f){tail}")


def user_option(panel: str) -> Any:
    """``--user USER``."""
    return option(None, metavar="USER", panel=panel, help="Only processes of this user (name or uid).")


def env_option(panel: str, note: str) -> Any:
    """``--env KEY=VALUE`` (repeatable); ``note`` follows the example in the help."""
    return option(default_factory=list, metavar="KEY=VALUE", panel=panel, parse=parse_env_filter, format="=".join,
                  help=f"Only processes whose environment has KEY=VALUE (repeatable), e.g. --env SLURM_JOB_ID=123{note}")


PLACEHOLDERS = ("{rank}", "{local_rank}")
BRACES = re.compile(r"\{[^{}]*\}")


def parse_pattern(word: str) -> str:
    """``--progress-file PATTERN``: refuse a ``{...}`` that is no placeholder (``{rnk}``, ``{a,b}``: glob
    has no braces), which would otherwise match no file and leave no trace."""
    if not word.strip():  # an unset shell variable: the file would be "" and match nothing, silently
        raise UsageError("--progress-file is empty", "give a file or glob, e.g. 'run/metrics/rank-{rank}.jsonl'")
    if word.count("{") != word.count("}") or "{" in BRACES.sub("", word) or "}" in BRACES.sub("", word):
        raise UsageError(f"--progress-file {word!r}: an unclosed {{ or }}",
                         "the placeholders are {rank} and {local_rank}, each in braces")
    unknown = [m for m in BRACES.findall(word) if m not in PLACEHOLDERS]
    if unknown:
        raise UsageError(f"--progress-file {word!r}: {unknown[0]} is not a placeholder",
                         "the placeholders are {rank} (a rank's global rank) and {local_rank} (its local "
                         "rank), e.g. 'run/metrics/rank-{rank}.jsonl'; the rest is a glob (*, ?, [...])")
    return word
