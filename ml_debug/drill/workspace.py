"""One drill's folder and processes: start a job, run a diagnosis like a user would, leave nothing behind.

Every process a drill starts carries ``MLDEBUG_DRILL_TOKEN=<token>`` in its environment, so the drill
finds and stops all of them at the end (torchrun's ranks run in sessions of their own, out of reach of
a process-group kill), whatever happened in between.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from ml_debug.core import lifecycle
from ml_debug.procs.tree import pids_with_env

TOKEN_VAR = "MLDEBUG_DRILL_TOKEN"
# a drill's job must not think it is a rank of the job that runs `mldebug drill`
_LAUNCHER_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK", "MASTER_ADDR", "MASTER_PORT",
                  "TORCHELASTIC_RUN_ID", "MLDEBUG_FR_DIR", "MLDEBUG_TEST_FAULT", "MLDEBUG_DRILL_FAULT")

T = TypeVar("T")


class DrillError(Exception):
    """The drill could not reach a verdict (the job ended early, a wait ran out, ...): its status is error."""


@dataclass
class Ran:
    """One mldebug command run by the drill: its exit code, its JSON result and how long it took."""

    argv: list[str]
    code: int
    result: dict[str, Any] | None
    stderr: str
    seconds: float
    command: str | None = None  # how it was started, when not as `mldebug <argv>` (srun, ranks by hand)

    @property
    def shown(self) -> str:
        """The command line as a user would type it."""
        return self.command or " ".join(["mldebug", *self.argv])


class Workspace:
    def __init__(self, folder: Path, deadline: float) -> None:
        from ml_debug.core import safefs

        # never resolved by following links: a drill folder in a shared --bundle-dir is made by safefs's
        # rules (a link planted at its name is refused), and is ours, so what the drill writes in it
        # by name stays in it
        self.dir = Path(os.path.abspath(folder))
        self.deadline = deadline
        self.token = uuid.uuid4().hex[:16]
        self.jobs: list[subprocess.Popen[bytes]] = []
        safefs.make_out_dir(self.dir, "--bundle-dir")

    # -- time ------------------------------------------------------------------------------------
    def left(self) -> float:
        return max(0.0, self.deadline - time.monotonic())

    def wait_for(self, what: str, check: Callable[[], T | None], limit_s: float | None = None,
                 period_s: float = 0.5) -> T:
        """Poll ``check`` until it returns something (not None); DrillError after the limit."""
        end = time.monotonic() + min(self.left(), limit_s if limit_s is not None else self.left())
        while True:
            value = check()
            if value is not None:
                return value
            if time.monotonic() >= end:
                raise DrillError(f"gave up waiting for {what}")
            time.sleep(period_s)

    # -- processes -------------------------------------------------------------------------------
    def env(self, extra: dict[str, str] | None = None) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if k not in _LAUNCHER_VARS}
        env.update({"OMP_NUM_THREADS": env.get("OMP_NUM_THREADS", "1"), "PYTHONUNBUFFERED": "1", TOKEN_VAR: self.token})
        env.update(extra or {})
        return env

    def start(self, argv: Sequence[str], log: str, extra_env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
        """Start ``mldebug <argv>`` (or a full command line when argv[0] is a path) in the background."""
        full = list(argv) if os.path.isabs(argv[0]) else [sys.executable, "-m", "ml_debug", *argv]
        # an mldebug job dies with the drill, even a SIGKILLed one (only mldebug itself reads the tie)
        tie = lifecycle.child_env() if full[:3] == [sys.executable, "-m", "ml_debug"] else {}
        # a Ctrl-C while it starts comes once it is among the jobs, which teardown stops
        with open(self.dir / log, "wb") as out, lifecycle.held_signals() as held:
            proc = held.popen(full, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                              env=self.env({**(extra_env or {}), **tie}), cwd=self.dir, start_new_session=True)
            self.jobs.append(proc)
        return proc

    def alive(self, proc: subprocess.Popen[bytes], log: str) -> None:
        """DrillError when the job already ended (with the end of its log)."""
        if proc.poll() is not None:
            tail = (self.dir / log).read_text(errors="replace")[-600:].strip().splitlines()[-3:]
            raise DrillError(f"the job ended early (exit {proc.returncode}): {' | '.join(tail)}")

    def finish(self, proc: subprocess.Popen[bytes], what: str) -> int:
        """Wait for a job that ends by itself (a crash drill); DrillError when it outlives the drill."""
        try:
            return proc.wait(timeout=self.left())
        except subprocess.TimeoutExpired:
            raise DrillError(f"{what} did not end in time") from None

    def mldebug(self, argv: Sequence[str], save_as: str, extra_env: dict[str, str] | None = None,
                limit_s: float = 120.0) -> Ran:
        """Run ``mldebug <argv> --json`` to its end; its JSON is kept in ``save_as`` as evidence."""
        t0 = time.monotonic()
        try:
            proc = subprocess.run([sys.executable, "-m", "ml_debug", *argv, "--json"], capture_output=True, text=True,
                                  env=self.env({**(extra_env or {}), **lifecycle.child_env()}), cwd=self.dir,
                                  timeout=max(1.0, min(limit_s, self.left())),
                                  start_new_session=True)
        except subprocess.TimeoutExpired:
            raise DrillError(f"`mldebug {' '.join(argv)}` did not finish in time") from None
        seconds = time.monotonic() - t0
        (self.dir / save_as).write_text(proc.stdout)
        if proc.stderr:
            (self.dir / (Path(save_as).stem + ".stderr")).write_text(proc.stderr)
        return Ran(list(argv), proc.returncode, result_of(proc.stdout), proc.stderr, seconds)

    def teardown(self) -> None:
        """Stop every process this drill started, wherever it runs now; nothing is left behind."""
        for proc in self.jobs:
            if proc.poll() is None:
                try:
                    os.killpg(proc.pid, signal.SIGTERM)
                except (ProcessLookupError, PermissionError):
                    pass
        end = time.monotonic() + 10
        while time.monotonic() < end and (self._tokened() or any(p.poll() is None for p in self.jobs)):
            time.sleep(0.2)
        for pid in self._tokened():
            try:
                os.kill(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        for proc in self.jobs:
            if proc.poll() is None:
                try:
                    os.killpg(proc.pid, signal.SIGKILL)
                except (ProcessLookupError, PermissionError):
                    pass
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                pass

    def _tokened(self) -> list[int]:
        return pids_with_env(TOKEN_VAR, self.token)


def result_of(text: str) -> dict[str, Any] | None:
    """The ``result`` of the first mldebug JSON document in ``text`` (other lines around it are skipped)."""
    decoder = json.JSONDecoder()
    start = text.find("{")
    while start >= 0:
        try:
            doc, _ = decoder.raw_decode(text, start)
        except json.JSONDecodeError:
            start = text.find("{", start + 1)
            continue
        result = doc.get("result") if isinstance(doc, dict) else None
        return result if isinstance(result, dict) else None
    return None


def last_step(path: Path) -> int | None:
    """The last ``step`` in an `mldebug train` metrics file, or None before the first step."""
    try:
        lines = path.read_text(errors="replace").splitlines()
    except OSError:
        return None
    for line in reversed(lines):
        try:
            step = json.loads(line).get("step")
        except (json.JSONDecodeError, AttributeError):
            continue
        if isinstance(step, int):
            return step
    return None


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])
