"""`torchrun -m ml_debug.train [options]` / `python -m ml_debug.train`: the same as `mldebug train`."""

from __future__ import annotations

import os
import sys


def main() -> int:
    from ml_debug.cli.app import run

    return run(["train", *sys.argv[1:]])


if __name__ == "__main__":
    code = main()
    sys.stdout.flush()
    sys.stderr.flush()
    # The process group is already destroyed; skipping interpreter finalisation keeps gloo's worker
    # threads from aborting the exit (FIELD-NOTES "exit crash") and turning success into SIGABRT.
    os._exit(code)
