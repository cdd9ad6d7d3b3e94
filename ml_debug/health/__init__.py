"""GPU and host health: one guarded NVML gateway, checks with verdicts, active stress tests.

``runner.run_local`` is the library entry point behind ``mldebug health``; ``cluster`` merges
the per-node JSON that ``mldebug health --local --json`` prints on every node.
Nothing here imports torch at module import time (only ``stress`` does, when it runs).
"""
