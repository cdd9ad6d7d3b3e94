"""The options of `mldebug top` (cheap to import: the CLI builds its options from them)."""

from __future__ import annotations

from dataclasses import dataclass

from ml_debug.core.errors import UsageError
from ml_debug.core.options import option
from ml_debug.procs.selectors import env_option, pattern_option, user_option
from ml_debug.sampling.options import SamplerOptions, parse_pattern

WHAT = "What to show"
WHICH = "Which processes"
TIMING = "Timing"

SORT_KEYS = ("node", "cpu", "gpu", "rate", "flags")
"""Orders of the node rows: by name, node CPU % (highest first), mean GPU utilisation (highest
first), median step rate (slowest first), or nodes with something to look at first."""


def parse_sort(word: str) -> str:
    if word not in SORT_KEYS:
        raise UsageError(f"--sort {word!r} is not a sort key", f"one of: {', '.join(SORT_KEYS)}")
    return word


@dataclass(frozen=True)
class TopOptions:
    """What `mldebug top` samples, how often, and how it shows it."""

    interval: float = option(1.0, min=0.1, max=3600.0, metavar="S", panel=TIMING,
                             help="Seconds between samples. Every node samples on the same wall-clock tick.")
    timeout: float = option(10.0, flags=("--node-timeout",), renamed_from=("--timeout",), min=0.5, max=3600.0,
                            metavar="S", panel=TIMING, forward=False,
                            help="A node that sends nothing for --interval plus this long is shown as not answering "
                                 "(greyed, with the age of its last values); the others keep updating.")
    once: bool = option(False, panel=WHAT, forward=False,
                        help="Print one snapshot and exit (exit 4 when a node did not answer in time).")
    count: int = option(0, min=0, metavar="N", panel=WHAT, forward=False,
                        help="Print N snapshots, one per interval, then exit (0: until Ctrl-C). Used when stdout is "
                             "not a terminal, or with --json (one JSON document per line).")
    gpus: bool = option(False, flags=("--gpu-rows", "-g"), renamed_from=("--gpus",), panel=WHAT, forward=False,
                        help="Show one row per GPU under each node (key g toggles it in the live view).")
    ranks: bool = option(False, flags=("--rank-rows", "-r"), renamed_from=("--ranks",), panel=WHAT, forward=False,
                         help="Show one row per rank process under each node (key r toggles it).")
    sort: str = option("node", metavar="KEY", panel=WHAT, forward=False, parse=parse_sort,
                       help=f"Order of the node rows: {', '.join(SORT_KEYS)} (key s cycles through them).")
    progress_files: list[str] = option(
        flags=("--progress-file",), default_factory=list, metavar="PATTERN", panel=WHICH, parse=parse_pattern,
        help="A file whose growth is the job's progress (repeatable; a glob on each node). {rank} stands for a "
             "rank's number ({local_rank}: its local rank), e.g. 'run/metrics/rank-{rank}.jsonl' (mldebug train "
             "--metrics-dir). The step is the 'step' field of the last JSON line, else the count of new lines; its rate is shown per rank.")
    pattern: str | None = pattern_option(WHICH, "Show")
    user: str | None = user_option(WHICH)
    env: list[tuple[str, str]] = env_option(WHICH, ". With --slurm-job, SLURM_JOB_ID is added for you.")
    agent: bool = option(False, hidden=True, forward=False,
                         help="Internal: sample this node and print one JSON line per interval until stdin closes.")

    @property
    def env_filter(self) -> dict[str, str]:
        return dict(self.env)

    def sampler(self) -> SamplerOptions:
        """What each node's agent samples (its command line is built from these)."""
        return SamplerOptions(interval=self.interval, progress_files=list(self.progress_files), pattern=self.pattern,
                              user=self.user, env=list(self.env))

    @property
    def grace_s(self) -> float:
        """How long a node may stay silent before it is "not answering"."""
        return self.interval + self.timeout
