"""The options of `mldebug watch` (cheap to import: the CLI builds its options from them)."""

from __future__ import annotations

import os
import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ml_debug.core.errors import UsageError
from ml_debug.core.options import option, parse_bundle_dir
from ml_debug.procs.selectors import env_option, pattern_option, user_option
from ml_debug.sampling.options import parse_pattern

WHICH = "Which job"
WHEN = "When to act"
ACT = "What to do then"
HOW = "Sampling"


def incident_argv(text: str) -> list[str]:
    """``--on-incident CMD`` as an argument list (split like a shell would, never run by one)."""
    try:
        argv = shlex.split(text)
    except ValueError as e:
        raise UsageError(f"--on-incident {text!r}: {e}", "quote it as one word: --on-incident 'scancel 123'") from None
    if not argv:
        raise UsageError("--on-incident is empty", "give a command, e.g. --on-incident 'scancel 123'")
    return argv


# --stall, --grace and --straggler-factor: the decisions of watch, which the exporter makes the same way.
# Declared here once (defaults, limits); each command words its own help.

def stall_option(panel: str, help: str) -> Any:
    """``--stall S``: how long without progress makes a rank stalled."""
    return option(300.0, min=1.0, metavar="S", panel=panel, help=help)


def grace_option(panel: str, help: str) -> Any:
    """``--grace S``: the first seconds in which no rank is judged."""
    return option(60.0, min=0.0, metavar="S", panel=panel, help=help)


def straggler_factor_option(panel: str, help: str) -> Any:
    """``--straggler-factor F``: a step rate below the median divided by F is a straggler's (0: never)."""
    return option(2.0, min=0.0, metavar="F", panel=panel, help=help)


def check_straggler_factor(factor: float, hint: str) -> None:
    """A usage error (exit 2) for F in (0, 1]: it would call half the ranks or more stragglers."""
    if 0 < factor <= 1:
        raise UsageError(f"--straggler-factor {factor:g} is not above 1", hint)


@dataclass(frozen=True)
class WatchOptions:
    """What `mldebug watch` watches, when it calls a rank stalled or a straggler, and what it does then."""

    pids: list[int] = option(flags=("--pid",), default_factory=list, min=1, metavar="PID", panel=WHICH,
                             help="Watch this process (repeatable; a launcher's pid means its ranks). This node "
                                  "only: on many nodes pick the job with --env or --pattern.")
    pattern: str | None = pattern_option(WHICH, "Watch")
    user: str | None = user_option(WHICH)
    env: list[tuple[str, str]] = env_option(WHICH, ". With --slurm-job, SLURM_JOB_ID is added for you.")
    progress_files: list[str] = option(
        flags=("--progress-file",), default_factory=list, metavar="PATTERN", panel=WHICH, parse=parse_pattern,
        help="A file whose growth is the job's progress (repeatable; a glob on each node; {rank} stands for a "
             "rank's number), e.g. 'run/metrics/rank-{rank}.jsonl' (mldebug train --metrics-dir). The step is the "
             "'step' field of the last JSON line. With it, a rank stalls when its file stops growing, whatever "
             "its CPU does, and step rates name stragglers.")
    stall: float = stall_option(WHEN, "A rank that makes no progress for this long is stalled: an incident.")
    grace: float = grace_option(WHEN, "No rank is called stalled or a straggler in the first S seconds of watching "
                                      "(start-up, compilation, loading a checkpoint).")
    straggler_factor: float = straggler_factor_option(
        WHEN, "A rank whose step rate is below the median rate divided by F (F > 1), or that computes while its "
              "peers wait for it in collectives, is a straggler: an incident (0: never).")
    now: bool = option(False, panel=ACT, help="Collect the incident bundle at once, without waiting for a stall.")
    keep_watching: bool = option(False, panel=ACT,
                                 help="After an incident, keep watching (a new bundle for each new incident) instead "
                                      "of exiting 1.")
    on_incident: str | None = option(
        None, metavar="CMD", panel=ACT,
        help="Run CMD after each incident's bundle is complete (split into words like a shell would, but not run "
             "by one), with MLDEBUG_INCIDENT=<bundle directory> in its environment: scancel, requeue, page.")
    out_dir: Path | None = option(
        None, flags=("--bundle-dir",), renamed_from=("--out-dir",), parse=parse_bundle_dir, metavar="DIR", panel=ACT,
        help="Where the incident bundle goes (default: ./mldebug-incident-<job>-<time>/; with --keep-watching, "
             "one numbered subdirectory per incident).")
    html: Path | None = option(None, metavar="FILE.html", dir_okay=False, forward=False, panel=ACT,
                               help="Also write each incident's page here (the bundle always has incident.html).")
    samples: int = option(3, min=1, max=20, metavar="K", panel=ACT,
                          help="Stack samples per rank in the bundle's dump-stacks (stuck or moving?).")
    duration: float = option(0.0, min=0.0, metavar="S", panel=ACT,
                             help="Stop watching after S seconds (exit 0 when nothing happened; 0: until the job ends "
                                  "or Ctrl-C).")
    interval: float = option(5.0, min=0.2, max=600.0, metavar="S", panel=HOW,
                             help="Seconds between samples of the ranks' CPU, state, GPUs and progress files.")
    stack_every: float = option(60.0, min=0.0, max=3600.0, metavar="S", panel=HOW,
                                help="Seconds between py-spy stack samples of every rank (0: none; then CPU, GPU and "
                                     "progress files alone decide).")
    node_timeout: float = option(20.0, min=1.0, metavar="S", panel=HOW,
                                 help="A node that sends nothing for --interval plus this long is reported as not "
                                      "answering (its ranks are not waited for).")

    @property
    def env_filter(self) -> dict[str, str]:
        return dict(self.env)

    def validate(self, remote: bool) -> None:
        """Raise UsageError (exit 2) for impossible combinations, before anything starts."""
        if self.pids and remote:
            raise UsageError("--pid names a process on this node only",
                             "on many nodes pick the job with --env KEY=VALUE or --pattern REGEX "
                             "(with --slurm-job the job's own processes are picked for you)")
        missing = [str(pid) for pid in self.pids if not os.path.exists(f"/proc/{pid}")]
        if missing:  # the words of dump-stacks --pid; waiting --grace for a typo helps no one
            raise UsageError(f"--pid {', '.join(missing)}: no such process on this node",
                             "give the pid of a rank or of its launcher on this node (pgrep -af python); "
                             "for a job on other nodes use --hosts or --slurm-job with --env or --pattern")
        if self.now and self.keep_watching:
            raise UsageError("--now collects one bundle and exits: --keep-watching would be ignored",
                             "drop --now to watch and write a bundle per incident, or drop --keep-watching")
        check_straggler_factor(self.straggler_factor,
                               "a straggler's step rate is below the median rate divided by F, so F <= 1 calls "
                               "half the ranks or more stragglers: e.g. 2 (below half the median), or 0 for never")
        if self.on_incident is not None:
            incident_argv(self.on_incident)
        if self.stack_every and self.stack_every < self.interval:
            raise UsageError(f"--stack-every {self.stack_every:g} is shorter than --interval {self.interval:g}",
                             "stack samples are taken on sampling rounds: use --stack-every >= --interval")
