"""The options of `mldebug drill` (cheap to import: the CLI builds its options from them)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ml_debug.core.errors import UsageError
from ml_debug.core.options import option, parse_bundle_dir

SLURM = "Slurm"

DRILLS = ("hang", "straggler", "crash", "segfault", "nan", "desync", "exit", "missing-rank", "slow-link")
"""Every drill, in the order they run."""


def parse_partition(word: str) -> str:
    """--slurm-partition: a partition's name; an empty word (an unset shell variable) would run on this node."""
    if not word.strip():
        raise UsageError("--slurm-partition is empty", "name a partition (sinfo lists them), or leave the option "
                                                       "out to run the drills on this node")
    return word.strip()


def parse_only(text: str) -> tuple[str, ...]:
    """``hang,crash`` -> ("hang", "crash"), in the catalogue's order; an unknown name is a usage error."""
    names = [n.strip() for n in text.split(",") if n.strip()]
    unknown = [n for n in names if n not in DRILLS]
    if unknown or not names:
        raise UsageError(f"--only {text!r}: unknown drill {', '.join(unknown) or '(none given)'}",
                         f"drills: {','.join(DRILLS)}")
    return tuple(d for d in DRILLS if d in names)


@dataclass(frozen=True)
class DrillOptions:
    """Which drills run, on how many ranks, with which randomness, and where the evidence goes."""

    only: tuple[str, ...] = option(DRILLS, metavar="DRILL,...", parse=parse_only, format=",".join,
                                   help="Run only these drills (comma-separated).")
    nproc_per_node: int = option(2, min=1, max=64, metavar="N",
                                 help="Ranks per node of each drill's job (at least 2 on this node; slow-link uses at "
                                      "least 4 there: a slow pair needs peers to compare with).")
    max_nproc_per_node: int | None = option(
        None, min=1, metavar="N", envvar="MLDEBUG_MAX_NPROC_PER_NODE",
        help="Refuse drills of more ranks on this node than this (default: what the node can run: 4 per CPU "
             "core, and no more than fit in the available memory at 0.5 GB a rank).")
    seed: int | None = option(None, metavar="N",
                              help="Seed for the injected rank and step of each drill (default: a random seed, "
                                   "printed so that a run can be repeated).")
    out_dir: Path | None = option(None, flags=("--bundle-dir",), renamed_from=("--out-dir",), parse=parse_bundle_dir,
                                  metavar="DIR",
                                  help="Where each drill keeps its evidence (job logs, the diagnosis' JSON) "
                                       "(default: ./mldebug-drill-<time>/).")
    slurm_partition: str | None = option(None, metavar="P", panel=SLURM, parse=parse_partition,
                                         help="Run each drill as a Slurm batch job in partition P (over --slurm-nodes "
                                              "nodes) instead of on this node; --bundle-dir must be on a file system "
                                              "every node shares.")
    slurm_nodes: int = option(2, min=2, max=1024, metavar="N", panel=SLURM,
                              help="Nodes of each drill's Slurm job (slow-link uses at least 3: its units are nodes).")
    sbatch_arg: list[str] = option(default_factory=list, metavar="ARG", panel=SLURM,
                                   help="Another sbatch option for every drill's job, as one word (repeatable), "
                                        "e.g. --sbatch-arg=--account=ops --sbatch-arg=--gres=gpu:8.")
    timeout: float = option(240.0, flags=("--drill-timeout",), renamed_from=("--timeout",), min=30.0, max=3600.0,
                            metavar="S",
                            help="Seconds one drill may take, job and diagnosis together; then it is stopped and "
                                 "reported as an error.")
