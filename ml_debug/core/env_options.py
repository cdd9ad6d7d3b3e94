"""The options of `mldebug env` (cheap to import: the CLI builds its options from them)."""

from __future__ import annotations

from dataclasses import dataclass

from ml_debug.core.options import option


@dataclass(frozen=True)
class EnvOptions:
    """The options of `mldebug env`."""

    no_torch: bool = option(False, help="Skip importing torch (faster; no CUDA/NCCL/cuDNN versions).")
