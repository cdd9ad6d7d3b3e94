"""A health step that starts and then holds, as a stuck step would.

Loaded through ``MLDEBUG_TEST_HOOKS=tests.fakes.held_checks``: its NVML hook, which `mldebug health`
calls first thing, leaves a mark that the checks started and, when asked, prints a line on stdout and
stderr and then holds the process (tests/cli/test_check_options.py, tests/unit/health/test_host.py). Only in
`mldebug health` and in the health runs of `mldebug exporter`: the other steps that read NVML run as usual."""

from __future__ import annotations

import os
import sys
import threading
import time
from pathlib import Path

from tests.fakes import hooks_env

HOOK = "tests.fakes.held_checks"
MARK = "MLDEBUG_TEST_CHECKS_STARTED"
"""A file the hook creates when the checks start."""
HOLD = "MLDEBUG_TEST_HOLD"
"""Set: the hook prints, then holds the process for good."""


EXPORTER_HEALTH_THREAD = "mldebug-exporter-health"
"""`mldebug exporter` runs its health checks in threads named so; its rank sampler reads NVML too, and
is left alone (tests/cli/test_exporter.py)."""


def nvml_backend() -> None:
    args = sys.argv[1:]
    if "exporter" in args:
        if not threading.current_thread().name.startswith(EXPORTER_HEALTH_THREAD):
            return
    elif "health" not in args:  # `mldebug env` reads NVML too: only the health step is marked and held
        return
    Path(os.environ[MARK]).touch()
    if os.environ.get(HOLD):
        print("printed before the hold", flush=True)
        print("stuck at the NVML hook", file=sys.stderr, flush=True)
        time.sleep(3600)


def hook_env(tmp_path: Path, hold: bool = False) -> dict[str, str]:
    """The environment that loads this hook; the hook marks ``tmp_path / "started"``."""
    return hooks_env(HOOK, {MARK: str(tmp_path / "started"), **({HOLD: "1"} if hold else {})})
