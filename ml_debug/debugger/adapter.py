"""debugpy's adapter, started by mldebug (``python -m ml_debug.debugger.adapter``), whose injector leaves
the process's stderr alone.

debugpy attaches by pid through an injector (``python <debugpy's folder> --pid PID``) that has gdb run
debugpy's server inside the process. That server prints two warnings on the process's own stderr, which
is the job's log: "frozen modules are being used" (every CPython 3.11+) and "the threading module was not
imported" (a process that never imported it). A tool that reads a job must not write into its log, so
the adapter here is debugpy's own, with one change: its injector is :mod:`ml_debug.debugger.injector`,
debugpy's injector with the injected code made quiet (see there).
"""

from __future__ import annotations

import runpy
import types
from pathlib import Path

INJECTOR = Path(__file__).with_name("injector")


def main() -> None:
    from debugpy import adapter  # noqa: F401 - in the order debugpy's own __main__ imports them (a cycle)
    from debugpy.adapter import clients, servers  # noqa: F401

    # servers.inject() starts "python dirname(debugpy.__file__) ...": pointing it at our folder runs our
    # injector's __main__ with the same arguments (tests/cli/test_job_strings.py fails if this stops working)
    servers.debugpy = types.SimpleNamespace(__file__=str(INJECTOR / "__init__.py"))  # type: ignore[assignment]
    runpy.run_module("debugpy.adapter", run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
