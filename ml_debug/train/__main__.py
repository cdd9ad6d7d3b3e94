"""`torchrun -m ml_debug.train [options]` / `python -m ml_debug.train`: the same as `mldebug train`.

An entry point, so it sits above every layer: it only hands over to the CLI.
"""

from ml_debug.cli.worker import train_main

if __name__ == "__main__":
    train_main()
