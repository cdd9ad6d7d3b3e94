"""What an install without the optional extras lacks, said before a command needs it.

`pip install mldebug` gives every command that does not need PyTorch (health level 1 and the Slurm
hook, history, dump-stacks, core-bt, top, watch, logs, exec, env, trace); gpu-test, allreduce-bench,
train, drill and health's stress levels need the ``torch`` extra.
"""

from __future__ import annotations

import importlib.util

from ml_debug.core.errors import EnvironmentProblem

TORCH_EXTRA = "mldebug[torch]"


def require_torch(what: str) -> None:
    """Exit 3 with one line naming the extra when PyTorch is not importable here."""
    try:
        found = importlib.util.find_spec("torch") is not None
    except (ImportError, ValueError):
        found = False
    if not found:
        raise EnvironmentProblem(f"{what} needs PyTorch, which is not installed here",
                                 f"pip install '{TORCH_EXTRA}' (or the torch build you train with), "
                                 "then run it again")
