"""What the GPU benchmarks share: one figure per measurement with the command that produced it,
written as JSON for benchmarks/gpu_session.sh's report, and a time budget every script respects.

A figure is a number a person can rerun: ``{"name", "value", "unit", "goal", "met", "command",
"detail"}``. ``goal`` is a sentence such as ">= 0.97"; ``met`` is True/False, or None when the figure
has no goal or could not be judged.
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]


@dataclass
class Figure:
    name: str
    value: float | None
    unit: str
    command: str
    goal: str = ""
    met: bool | None = None
    detail: str = ""

    def line(self) -> str:
        v = "n/a" if self.value is None else f"{self.value:.4g}"
        verdict = "" if self.met is None else ("  [goal met]" if self.met else "  [GOAL MISSED]")
        goal = f" (goal {self.goal})" if self.goal else ""
        return f"{self.name:<58} {v:>10} {self.unit}{goal}{verdict}\n    {self.detail}\n    $ {self.command}"


@dataclass
class Report:
    """One benchmark script's results."""

    benchmark: str
    figures: list[Figure] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    started: float = field(default_factory=time.monotonic)

    def add(self, fig: Figure) -> Figure:
        self.figures.append(fig)
        print(fig.line(), flush=True)
        return fig

    def note(self, text: str) -> None:
        self.notes.append(text)
        print(f"note: {text}", flush=True)

    def error(self, text: str) -> None:
        self.errors.append(text)
        print(f"ERROR: {text}", file=sys.stderr, flush=True)

    def write(self, path: str | None) -> int:
        """Write the JSON (when asked) and return the exit code: 1 when something failed to run."""
        doc: dict[str, Any] = {"benchmark": self.benchmark, "figures": [asdict(f) for f in self.figures],
                               "notes": self.notes, "errors": self.errors,
                               "seconds": round(time.monotonic() - self.started, 1)}
        if path:
            Path(path).write_text(json.dumps(doc, indent=2))
        return 1 if self.errors else 0


class Budget:
    """Seconds left for a script, so a whole GPU session fits its lease: steps that would not fit
    are skipped and said so, never cut in the middle."""

    def __init__(self, seconds: float) -> None:
        self.deadline = time.monotonic() + seconds

    def left(self) -> float:
        return self.deadline - time.monotonic()

    def allows(self, seconds: float) -> bool:
        return self.left() >= seconds


def shell(argv: list[str]) -> str:
    """The command as a person would paste it (relative to the repository root)."""
    words = [("python" if a == sys.executable else a) for a in argv]
    return " ".join(shlex.quote(w) for w in words)


def env_with_repo(**extra: str) -> dict[str, str]:
    """This environment with the repository importable (mldebug need not be installed)."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH", "")) if p)
    env.update(extra)
    return env


def run(argv: list[str], timeout: float, **extra_env: str) -> tuple[int, str, str, float]:
    """(exit code, stdout, stderr, seconds); exit code 124 when the timeout hit."""
    t0 = time.monotonic()
    try:
        p = subprocess.run(argv, capture_output=True, text=True, timeout=max(1.0, timeout), cwd=REPO,
                           env=env_with_repo(**extra_env))
        return p.returncode, p.stdout, p.stderr, time.monotonic() - t0
    except subprocess.TimeoutExpired as e:
        out = e.stdout.decode(errors="replace") if isinstance(e.stdout, bytes) else (e.stdout or "")
        err = e.stderr.decode(errors="replace") if isinstance(e.stderr, bytes) else (e.stderr or "")
        return 124, out, err + f"\n(timed out after {timeout:.0f} s)", time.monotonic() - t0


def json_result(stdout: str) -> dict[str, Any] | None:
    """The `result` of a command's --json document, or None when it printed none."""
    text = stdout.strip()
    if not text.startswith("{"):
        return None
    try:
        return json.loads(text).get("result")
    except ValueError:
        return None


def gpu_name(index: int = 0) -> str | None:
    try:
        import torch

        return torch.cuda.get_device_name(index) if torch.cuda.is_available() else None
    except Exception:
        return None
