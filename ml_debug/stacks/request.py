"""What `mldebug dump-stacks` is asked to do: its options (cheap to import)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ml_debug.core.enums import Word
from ml_debug.core.options import option, parse_out_dir
from ml_debug.procs.selectors import env_option, pattern_option, user_option

SEL = "Which processes"
HOW = "How to dump"


class Dumper(Word):
    """``--dumper``: which tool reads the stacks (a misspelt one is refused when the command line is read,
    before any node is reached)."""

    AUTO = "auto"  # py-spy, then py-spy --nonblocking, pystack, gdb
    PY_SPY = "py-spy"
    PYSTACK = "pystack"
    GDB = "gdb"


@dataclass
class DumpRequest:
    """Which processes to dump and how: the options of `mldebug dump-stacks`."""

    pids: list[int] = option(flags=("--pid",), default_factory=list, min=1, metavar="PID", panel=SEL,
                             help="Dump this process (repeatable); a launcher's pid means its ranks.")
    pattern: str | None = pattern_option(SEL, "Dump", instead=False)
    user: str | None = user_option(SEL)
    gpu: bool = option(False, flags=("--gpu-holders",), renamed_from=("--gpu",), panel=SEL,
                       help="Dump the processes holding a GPU (NVML; nvidia-smi --query-compute-apps=pid).")
    env: list[tuple[str, str]] = env_option(SEL, " to pick one job among several.")
    include_launcher: bool = option(False, panel=SEL, help="Dump the launchers (torchrun, ...) too.")
    world_size: int | None = option(None, min=1, metavar="N", panel=SEL,
                                    help="Expected number of ranks (default: WORLD_SIZE from the ranks' environment, "
                                         "except when --pid names single ranks); ranks not found are reported "
                                         "missing.")
    samples: int = option(1, min=1, max=100, metavar="K", panel=HOW,
                          help="Dump K times to tell stuck ranks (same stack) from moving ones.")
    interval: float = option(1.0, min=0.0, max=600.0, metavar="S", panel=HOW,
                             help="Seconds from the start of one sample to the start of the next.")
    native: bool = option(False, panel=HOW, help="Include C/C++ frames (py-spy --native; slower).")
    kernel: bool = option(True, flags=("--kernel/--no-kernel",), panel=HOW,
                          help="Also say what the kernel sees below each Python stack: the system call and the "
                               "file, FIFO, lock or socket peer it waits on, the state, spinning (cat "
                               "/proc/PID/syscall, ls -l /proc/PID/fd; half a second per node).")
    strace: float = option(0.0, min=0.0, max=60.0, metavar="S", panel=HOW,
                           help="Also count each rank's system calls for S seconds (strace -c -p PID, main thread; "
                                "every rank at once): 'no system call completed in 2 s' tells a spin from a "
                                "slow loop. Needs strace and ptrace rights.")
    locals: bool = option(False, panel=HOW, help="Include local variables (py-spy --locals).")
    dumper: Dumper = option(Dumper.AUTO, metavar="NAME", panel=HOW,
                         help="auto (py-spy, then py-spy --nonblocking, pystack, gdb), py-spy, pystack or gdb.")
    timeout: float = option(10.0, flags=("--attach-timeout",), renamed_from=("--timeout",), min=0.5, metavar="S",
                            panel=HOW,
                            help="Seconds per py-spy/pystack attach before the next dumper is tried.")
    gdb_timeout: float = option(60.0, min=1.0, metavar="S", panel=HOW,
                                help="Seconds for gdb (it loads every library's symbols).")
    flight_recorder: bool = option(
        True, flags=("--flight-recorder/--no-flight-recorder",), panel=HOW,
        help="Where a rank's environment allows it (MLDEBUG_FR_DIR with ml_debug.flight_recorder.enable(), or "
             "TORCH_NCCL_DEBUG_INFO_PIPE_FILE), trigger a PyTorch Flight Recorder dump and report each rank's "
             "last completed/enqueued collective.")
    # 15, not 5: on an H100 (torch 2.11) the first dump through NCCL's pipe of a job arrived after about 5 s
    # (later ones in 0.6 s), so a 5 s wait could miss it; the wait ends as soon as every dump is read.
    fr_timeout: float = option(15.0, min=0.1, metavar="S", panel=HOW,
                               help="Seconds to wait for the Flight Recorder dumps (the first dump through "
                                    "NCCL's pipe can take about 5 s).")
    all_threads: bool = option(False, forward=False, help="Also list every thread (watchdog, data loader, ...), "
                                                         "not only the main thread.")
    full: bool = option(False, forward=False,
                        help="Show every frame in the tree (long chains are shortened otherwise).")
    out_dir: Path | None = option(None, metavar="DIR", parse=parse_out_dir, forward=False,
                                  help="Also write results here as they arrive, so nothing is lost on Ctrl-C or "
                                       "a crash.")
    html: Path | None = option(None, metavar="FILE.html", dir_okay=False, forward=False,
                               help="Also write the report as one self-contained HTML page (the merged stack tree "
                                    "with the suspect opened, the Flight Recorder, the nodes) to share.")
    speedscope: Path | None = option(None, metavar="FILE.json", dir_okay=False, forward=False,
                                     help="Also write the merged stacks in speedscope's format "
                                          "(https://www.speedscope.app, as py-spy record --format speedscope).")

    @property
    def env_filter(self) -> dict[str, str]:
        return dict(self.env)

    def node_budget(self) -> float:
        """How long one node may take before the remote layer gives up on it."""
        per_sample = self.timeout * 2 + self.timeout + (self.gdb_timeout if self.dumper in ("auto", "gdb") else 0)
        fr = self.fr_timeout + 2 if self.flight_recorder else 0
        below = (1.0 + (self.strace + 10 if self.strace else 0)) if self.kernel else 0
        return 30.0 + self.samples * self.interval + self.samples * per_sample + fr + below
