"""`python -m ml_debug` is the same as the `mldebug` command."""

from ml_debug.cli.app import main

if __name__ == "__main__":
    main()
