"""The options of `mldebug allreduce-bench` and the default sweeps (cheap to import: no torch)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from ml_debug.bench import bandwidth as bw
from ml_debug.core.errors import UsageError
from ml_debug.core.options import option, output_file
from ml_debug.dist.options import backend_option, device_option

# Default sweeps: a meaningful curve in seconds on 2 CPU ranks; up to 1G on GPUs (nccl-tests users
# often go to 8G with -e 8G). Quick mode is what `mldebug check` runs.
CPU_DEFAULT = (1024, 16 * 2**20, 2.0)
GPU_DEFAULT = (1024, 2**30, 2.0)
CPU_QUICK = (256 * 1024, 4 * 2**20, 4.0)
GPU_QUICK = (2**20, 256 * 2**20, 16.0)
DEFAULT_ITERS, DEFAULT_WARMUP = 20, 5
QUICK_ITERS, QUICK_WARMUP = 5, 2


def _size(flag: str) -> Callable[[str], int]:
    return lambda text: bw.parse_size(text, flag)


def _average(text: str) -> str:
    if text not in bw.AVERAGES:
        raise UsageError(f"unknown --average {text!r}", f"choose one of: {', '.join(bw.AVERAGES)}")
    return text


@dataclass
class BenchConfig:
    """What to measure and report: the options of `mldebug allreduce-bench`.

    Sizes and iterations left None are filled from the device's defaults by :meth:`resolved`.
    """

    collectives: list[str] = option(
        flags=("--collective", "-C"), default_factory=lambda: ["all_reduce"], multiple=False,
        parse=bw.parse_collectives, format=",".join,
        help="all_reduce, all_gather, reduce_scatter, broadcast, reduce, all_to_all, sendrecv (ring: send to "
             "rank+1, receive from rank-1); comma-separated, or all.")
    min_bytes: int | None = option(
        None, flags=("--min-bytes", "-b"), metavar="SIZE", parse=_size("--min-bytes"),
        help="Smallest size, binary K/M/G suffixes (default 1K; --quick 256K on CPU, 1M on GPU).")
    max_bytes: int | None = option(
        None, flags=("--max-bytes", "-e"), metavar="SIZE", parse=_size("--max-bytes"),
        help="Largest size (default 16M on CPU, 1G on GPU; capped to what fits in memory, with a note). With "
             "--pairwise: the exchange size (default 4M CPU, 256M GPU).")
    step_factor: float | None = option(None, flags=("--step-factor", "-f"), metavar="F", parse=bw.parse_factor,
                                       help="Multiply the size by F each step (default 2).")
    iters: int | None = option(None, flags=("--iters", "-n"), min=1,
                               help="Timed iterations per size (default 20; --quick 5).")
    warmup: int | None = option(None, flags=("--warmup", "-w"), min=0,
                                help="Untimed iterations before each size (default 5; --quick 2).")
    dtype: str = option("float32", flags=("--dtype", "-d"), parse=bw.parse_dtype,
                        help="float32, float16, bfloat16, float64, int32, int64, int8, uint8.")
    op: str = option("sum", flags=("--op", "-o"), parse=bw.parse_op,
                     help="Reduction for all_reduce/reduce/reduce_scatter: sum, prod, max, min, avg.")
    root: int = option(0, flags=("--root", "-r"), min=0, help="Root rank of broadcast and reduce.")
    average: str = option("avg", flags=("--average", "-a"), parse=_average,
                          help="How the table's time combines ranks (nccl-tests -a): avg (default, as nccl-tests), "
                               "max, min, rank0. Each rank's own time is always in the JSON.")
    check: bool = option(True, flags=("--check/--no-check",), help="Verify every element after timing (#wrong).")
    quick: bool = option(False, help="A few sizes and iterations: a health check in seconds (used by mldebug check).")
    pairwise: bool = option(False, help="Measure every pair of nodes (or of ranks on one node) instead of a sweep.")
    straggler_threshold: float = option(
        0.5, min=0.0, help="A rank is a straggler when its own time exceeds the others' median by more than this "
                           "fraction in more than half of the large sizes (sizes >= 1/8 of the largest).")
    slow_threshold: float = option(
        0.3, min=0.0, max=1.0, help="--pairwise: a link or node is slow below the median by more than this fraction.")
    expect_busbw: float | None = option(
        None, min=0.0, metavar="GB/s", help="Fail (exit 1) when the average busbw over the large sizes is below this.")
    plot: Path | None = option(None, metavar="FILE.png", dir_okay=False,
                               help="Write busbw vs size (or the --pairwise heatmap) as PNG. Needs mldebug[plot].")
    csv: str | None = option(None, metavar="FILE",
                             help="Also write the rows as CSV; '-' prints CSV instead of the table.")
    timeout: float = option(120.0, flags=("--collective-timeout",), renamed_from=("--timeout",), min=0.1, metavar="S",
                            help="Seconds before init or any one collective gives up.")
    backend: str = backend_option()
    device: str = device_option()

    def validate(self, as_json: bool) -> None:
        """Cross-option checks, before any rank starts: a typo costs no launch."""
        if self.op == "avg" and bw.DTYPES[self.dtype][2] is None:
            raise UsageError(f"--op avg needs a floating-point dtype, not {self.dtype}",
                             "use --dtype float32 (or bfloat16/float16), or --op sum")
        if self.min_bytes is not None and self.max_bytes is not None:
            bw.sweep(self.min_bytes, self.max_bytes, self.step_factor or 2.0)  # min > max and friends
        from ml_debug.core import safefs

        if self.csv == "-" and as_json:
            raise UsageError("--csv - and --json both want stdout", "give --csv a file name, or drop --json")
        if self.plot is not None:
            from ml_debug.bench.plot import require_matplotlib

            require_matplotlib()
            if self.plot.suffix.lower() != ".png":
                raise UsageError(f"--plot {self.plot} must end in .png", "e.g. --plot busbw.png")
            safefs.check_out_file("--plot", self.plot)
            output_file("--plot", self.plot)
        if self.csv not in (None, "-"):
            safefs.check_out_file("--csv", self.csv)
            output_file("--csv", self.csv)

    def check_world(self, world_size: int) -> None:
        """Checks that need the number of ranks: before launching them when it is known, else on each rank."""
        if self.pairwise and world_size < 2:
            raise UsageError(f"--pairwise measures pairs of ranks, and this run has {world_size}",
                             "use --nproc-per-node 2 or more (or several nodes)")
        if not 0 <= self.root < world_size:
            raise UsageError(f"--root {self.root} is outside the {world_size} ranks", "use 0 .. world size - 1")

    def resolved(self, on_gpu: bool) -> BenchConfig:
        """Fill sizes/iterations from the defaults for this device; explicit values win."""
        lo, hi, f = (GPU_QUICK if self.quick else GPU_DEFAULT) if on_gpu else (
            CPU_QUICK if self.quick else CPU_DEFAULT)
        if self.min_bytes is not None and self.max_bytes is None:
            hi = max(hi, self.min_bytes)
        if self.max_bytes is not None and self.min_bytes is None:
            lo = min(lo, self.max_bytes)
        iters, warmup = (QUICK_ITERS, QUICK_WARMUP) if self.quick else (DEFAULT_ITERS, DEFAULT_WARMUP)
        from dataclasses import replace

        return replace(self, min_bytes=self.min_bytes if self.min_bytes is not None else lo,
                       max_bytes=self.max_bytes if self.max_bytes is not None else hi,
                       step_factor=self.step_factor if self.step_factor is not None else f,
                       iters=self.iters if self.iters is not None else iters,
                       warmup=self.warmup if self.warmup is not None else warmup)

    def sizes(self) -> list[int]:
        assert self.min_bytes is not None and self.max_bytes is not None and self.step_factor is not None
        return bw.sweep(self.min_bytes, self.max_bytes, self.step_factor)


