"""The options of `mldebug health --slurm-check` (the node health hook Slurm calls)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ml_debug.core.options import option
from ml_debug.history.options import HISTORY_HELP, parse_history

HOOK = "Slurm health hook"


@dataclass
class SlurmCheckOptions:
    """How the health check acts on Slurm: drain a failing node, resume one it drained that is healthy again."""

    slurm_check: bool = option(False, forward=False, panel=HOOK,
                               help="Run as Slurm's HealthCheckProgram / Prolog / Epilog: level 1 checks of this "
                                    "node; on a failure drain it (reason 'mldebug: <check> ...'); when healthy, "
                                    "resume it if mldebug drained it. One line out. See docs/slurm-health.md.")
    dry_run: bool = option(False, forward=False, panel=HOOK,
                           help="With --slurm-check: say what it would drain or resume, change nothing.")
    node: str | None = option(None, metavar="NAME", forward=False, panel=HOOK,
                              help="With --slurm-check: this node's Slurm name (default: $SLURMD_NODENAME, which "
                                   "slurmd sets, else the short host name).")
    exit_zero: bool = option(False, forward=False, panel=HOOK,
                             help="With --slurm-check: exit 0 after draining (for an Epilog: a non-zero Epilog "
                                  "makes Slurm drain the node under its own reason, which mldebug never resumes).")
    record: bool = option(True, flags=("--record/--no-record",), forward=False, panel=HOOK,
                          help="With --slurm-check: record the checks and any drain/resume in the history.")
    history: Path | None = option(None, metavar="FILE", envvar="MLDEBUG_HISTORY", parse=parse_history, format=str,
                                  forward=False, panel=HOOK, help=HISTORY_HELP)
