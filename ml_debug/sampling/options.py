"""What a node sampler samples: the few options top and watch share (cheap to import)."""

from __future__ import annotations

import re
from dataclasses import dataclass

from ml_debug.core.errors import UsageError
from ml_debug.core.options import option

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


@dataclass(frozen=True)
class SamplerOptions:
    """How often a node's agent samples and which processes and files it reads.

    The fields carry the flags of ``mldebug top``'s options of the same name, so
    :func:`ml_debug.core.options.to_argv` gives the words of the agent's command line
    (``mldebug top --agent <words>``) in the order top declares them.
    """

    interval: float = option(1.0, min=0.1, max=3600.0, metavar="S", help="Seconds between samples.")
    progress_files: list[str] = option(flags=("--progress-file",), default_factory=list, metavar="PATTERN",
                                       parse=parse_pattern, help="Progress files (a glob; {rank}, {local_rank}).")
    pattern: str | None = option(None, metavar="REGEX", help="Processes whose command line matches.")
    user: str | None = option(None, metavar="USER", help="Only processes of this user.")
    env: list[tuple[str, str]] = option(default_factory=list, metavar="KEY=VALUE", format="=".join,
                                        help="Only processes whose environment has KEY=VALUE.")

    @property
    def env_filter(self) -> dict[str, str]:
        return dict(self.env)
