"""The options of `mldebug health` (cheap to import: the CLI builds its options from them)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from ml_debug.core.errors import UsageError
from ml_debug.core.options import option, parse_out_dir

if TYPE_CHECKING:
    from ml_debug.health.gpu_checks import Thresholds

LEVEL_DEFAULTS = {  # stress seconds, memtest fraction of free memory, copy bytes
    1: (0.0, 0.0, 0),
    2: (15.0, 0.5, 256 << 20),
    3: (120.0, 0.9, 1 << 30),
}


TESTS = "Tests"


def parse_path(word: str) -> str:
    """--path: a directory to check; an empty word would be a check with no name."""
    if not word.strip():
        raise UsageError("--path is empty", "give the directory the job writes to, e.g. --path /scratch")
    return word


@dataclass
class HealthOptions:
    """What to run and what passes: the options of `mldebug health`."""

    level: int = option(1, flags=("--level", "-l"), min=1, max=3, panel=TESTS,
                        help="1 quick checks (seconds); 2 adds matmul stress, memory pattern and copy bandwidth "
                             "tests (~1 min); 3 longer stress.")
    expect_gpus: int | None = option(None, min=0, metavar="N", panel=TESTS,
                                     help="GPUs this node must have; fewer fails, none exits 3.")
    require_gpu: bool = option(False, panel=TESTS, help="Exit 3 when there is no NVIDIA GPU.")
    paths: list[str] = option(flags=("--path",), default_factory=list, metavar="DIR", panel=TESTS, parse=parse_path,
                              help="Check free disk and inodes here (repeatable; default: the working directory "
                                   "and the temp dir).")
    stress_seconds: float | None = option(None, min=0.1, metavar="S", panel=TESTS,
                                          help="Matmul stress per GPU (default: 15 at level 2, 120 at level 3, "
                                               "5 on CPU).")
    memtest_fraction: float | None = option(None, panel=TESTS,
                                            help="Share of free GPU memory the pattern test covers (default 0.5 "
                                                 "at level 2, 0.9 at 3).")
    dtype: str = option("bfloat16", panel=TESTS, help="Matmul dtype on GPU: bfloat16, float16, float32 "
                                                     "(the CPU always uses float32).")
    matmul_n: int | None = option(None, flags=("--matmul-size",), min=16, metavar="N", panel=TESTS,
                                  help="Square matmul size (default 8192 on GPU, 1024 on CPU).")
    cpu_stress: bool = option(True, flags=("--cpu-stress/--no-cpu-stress",), panel=TESTS,
                              help="Without a GPU, run the matmul stress on the CPU at level >= 2.")
    outlier_pct: float = option(10.0, min=0.1, max=90, panel=TESTS,
                                help="Fail a GPU this % below the median of identical GPUs.")
    corrected_ecc_max: int = option(1000, min=0, panel=TESTS,
                                    help="Warn above this many volatile corrected ECC errors.")
    brief: bool = option(False, forward=False, help="Show only the rows that are not PASS/INFO/SKIP.")
    out_dir: Path | None = option(None, metavar="DIR", forward=False, parse=parse_out_dir,
                                  help="Also write the JSON document here: health.json when this node's checks end; "
                                       "with --hosts/--slurm-job each node's as it arrives, so a Ctrl-C keeps the "
                                       "nodes already done.")
    timeout: float | None = option(None, flags=("--node-timeout",), renamed_from=("--timeout",), min=1, metavar="S",
                                   forward=False,
                                   help="Per node with --hosts/--slurm-job (default: 120 s at level 1, more with "
                                        "the stress time).")

    @property
    def thresholds(self) -> Thresholds:
        from ml_debug.health.gpu_checks import Thresholds

        return Thresholds(corrected_ecc_max=self.corrected_ecc_max, outlier_pct=self.outlier_pct)

    def validate(self) -> None:
        if self.level not in LEVEL_DEFAULTS:
            raise UsageError(f"--level must be 1, 2 or 3, not {self.level}", "1 quick checks, 2 + stress (~1 min), 3 long")
        if self.expect_gpus is not None and self.expect_gpus < 0:
            raise UsageError("--expect-gpus must be >= 0", "the number of GPUs this node should have, e.g. 8")
        if self.dtype not in ("bfloat16", "float16", "float32"):
            raise UsageError(f"unknown --dtype {self.dtype!r}", "use bfloat16, float16 or float32")
        if self.memtest_fraction is not None and not 0 < self.memtest_fraction <= 0.95:
            raise UsageError("--memtest-fraction must be in (0, 0.95]", "e.g. 0.5 tests half of the free memory")

    @property
    def gpu_expected(self) -> bool:
        return self.require_gpu or bool(self.expect_gpus)


