"""What a person debugging a cluster asks first: versions, GPUs, launcher variables,
NCCL/TORCH/CUDA settings, network interfaces, tools on PATH and ptrace permission.

:func:`summary` is the cheap block embedded in every command's JSON (no torch import);
:func:`collect` is the full report behind ``mldebug env``.
"""

from __future__ import annotations

import os
import platform
import socket
from collections.abc import Mapping
from importlib import metadata
from typing import Any

from ml_debug import __version__

WORLD_VARS = (
    "RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "ROLE_RANK", "NODE_RANK",
    "MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_RUN_ID", "TORCHELASTIC_RESTART_COUNT",
)
WORLD_PREFIXES = ("SLURM_", "OMPI_COMM_WORLD_", "PMI_", "PMIX_", "MV2_")
SETTING_PREFIXES = ("NCCL_", "TORCH_", "CUDA_", "PYTORCH_")


def package_version(name: str) -> str | None:
    """Installed version of a distribution, without importing it."""
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def world_variables(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """Launcher and world variables that are set (torchrun, Slurm, OpenMPI, PMI)."""
    env = os.environ if environ is None else environ
    keys = [k for k in env if k in WORLD_VARS or k.startswith(WORLD_PREFIXES)]
    return {k: env[k] for k in sorted(keys)}


def setting_variables(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """Every NCCL_*, TORCH_*, CUDA_*, PYTORCH_* variable that is set."""
    env = os.environ if environ is None else environ
    return {k: env[k] for k in sorted(env) if k.startswith(SETTING_PREFIXES)}


def summary() -> dict[str, Any]:
    """The environment block every command embeds in its JSON: cheap, no torch import."""
    return {
        "host": socket.gethostname(),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "mldebug": __version__,
        "torch": package_version("torch"),
        "world": world_variables(),
        "settings": setting_variables(),
    }
