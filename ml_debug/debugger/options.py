"""The options of `mldebug attach` (cheap to import: no debugpy, no rich)."""

from __future__ import annotations

from dataclasses import dataclass

from ml_debug.core.options import option
from ml_debug.procs.selectors import env_option

WHICH, WHAT = "Which process", "What to show"


@dataclass(frozen=True)
class AttachOptions:
    """Which process to attach to, and what to read from it."""

    pid: int | None = option(None, min=1, metavar="PID", panel=WHICH,
                             help="Attach to this Python process (this node only).")
    rank: int | None = option(None, min=0, metavar="R", panel=WHICH,
                              help="Attach to the process of global rank R (found as dump-stacks finds ranks: "
                                   "under torchrun/srun/..., by RANK or SLURM_PROCID), here or on the node that "
                                   "runs it with --hosts/--slurm-job.")
    env: list[tuple[str, str]] = env_option(WHICH, " to pick one job's ranks among several (--rank).")
    eval: str | None = option(None, metavar="EXPR", panel=WHAT,
                              help="Evaluate EXPR in the chosen frame (or, when it names nothing there, in the "
                                   "first caller where it does), print its value and detach.")
    thread: str | None = option(None, metavar="NAME|ID", panel=WHAT,
                                help="The thread to stop and read (default: MainThread).")
    frame: int | None = option(None, min=0, metavar="N", panel=WHAT,
                               help="The frame to read, 0 = innermost (default: 0; --eval then searches callers).")
    attach_timeout: float = option(60.0, min=1.0, metavar="S", panel=WHAT,
                                   help="Seconds to attach: for debugpy to start in the process (gdb injects it: "
                                        "several seconds; more on a loaded node).")
    timeout: float = option(10.0, flags=("--request-timeout",), renamed_from=("--timeout",), min=0.5, metavar="S",
                            panel=WHAT,
                            help="Seconds for each debugger request, and for the thread to stop.")

    # The two halves of the prompt on a remote rank (ml_debug/debugger/remote.py): every node answers
    # where rank R is and whether it can be attached (--locate-only); then the rank's node serves DAP
    # on its stdin and stdout for the prompt here (--dap-agent). Internal words, not for people.
    locate_only: bool = option(False, hidden=True, help="Only find the process and check that it can be attached.")
    dap_agent: bool = option(False, hidden=True, forward=False,
                             help="Serve debugpy's adapter for --pid on stdin/stdout (mldebug's node agent).")

    @property
    def env_filter(self) -> dict[str, str]:
        return dict(self.env)

    def node_budget(self) -> float:
        """How long one node may take (inject, attach, stop, read, detach) before it is given up."""
        return 30.0 + self.attach_timeout + 4 * self.timeout
