"""The post-mortem options of `mldebug logs` (cheap to import: no torch, no rich)."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from ml_debug.core.errors import UsageError
from ml_debug.core.options import option

PANEL = "What the job left (post-mortem)"


def parse_job(word: str) -> str:
    """--slurm-job: a job id as squeue and sacct show it (12345, or 12345_7 for an array task)."""
    word = word.strip()
    if not re.fullmatch(r"\d+(_\d+)?", word):
        raise UsageError(f"--slurm-job {word!r} is not a Slurm job id",
                         "give the number squeue or sacct shows, e.g. --slurm-job 12345")
    return word


def parse_prefix(word: str) -> str:
    """--fr-prefix: what TORCH_FR_DUMP_TEMP_FILE was in the job (dumps are <prefix><rank>)."""
    if not word.strip():
        raise UsageError("--fr-prefix is empty", "give the job's TORCH_FR_DUMP_TEMP_FILE, e.g. /scratch/fr/trace_")
    return word


@dataclass(frozen=True)
class PostmortemOptions:
    """Where a failed job's other evidence is: its Slurm record, its nodes, its Flight Recorder dumps."""

    slurm_job: str | None = option(
        None, metavar="JOBID", panel=PANEL, parse=parse_job, forward=False,
        help="Read everything this Slurm job left, running or ended: its output files (from scontrol, else "
             "sacct's WorkDir), torchrun and `mldebug launch` log directories under its WorkDir, Slurm accounting "
             "per step and node, the kernel logs of its nodes since it started, and its Flight Recorder dumps.")
    hosts: str | None = option(
        None, metavar="FILE|HOSTLIST", panel=PANEL, forward=False,
        help="Read the kernel logs and Flight Recorder dumps of these hosts over ssh (a hostfile or a hostlist "
             "like 'node[01-04]'); with --slurm-job, instead of a Slurm step on the job's nodes.")
    ssh_config: Path | None = option(
        None, metavar="FILE", panel=PANEL, envvar="MLDEBUG_SSH_CONFIG", dir_okay=False, forward=False,
        help="With --hosts: the ssh config to use instead of ~/.ssh/config.")
    fr_prefix: str | None = option(
        None, metavar="PREFIX", panel=PANEL, parse=parse_prefix, forward=False,
        help="Flight Recorder dumps are PREFIX<rank> (the job's TORCH_FR_DUMP_TEMP_FILE); looked for among the "
             "paths and on the nodes, beside nccl_trace_rank_<rank> and fr-<rank>.json.")
    kernel_logs: bool = option(True, flags=("--kernel-logs/--no-kernel-logs",), panel=PANEL, forward=False,
                          help="Read the kernel logs (journalctl -k, else dmesg) and dumps on the job's nodes.")
    node_timeout: float = option(
        30.0, min=1.0, metavar="S", panel=PANEL, forward=False,
        help="Give up on a node that has not sent its kernel log and dumps in this time.")

    @property
    def wanted(self) -> bool:
        """A post-mortem beyond the logs was asked for."""
        return self.slurm_job is not None or self.hosts is not None
