"""The Slurm health hook and the node history.

- `mldebug health --slurm-check` wall time (level 1, scontrol read, history written) against
  `mldebug --help`; goal: at most 2x. It reads node1's state from the rig's Slurm when
  /tmp/mldebug-rig is up (--dry-run: it never changes the shared rig), else without scontrol.
- the history's queries over 10,000 recorded check results (100 nodes, 10 runs of 10 checks each, 1 in
  20 failing) and 500 failed jobs; goal: each under 100 ms (the ratio is time / 100 ms).
"""

from __future__ import annotations

import os
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.common import Result, timeit

RIG_CONF = Path("/tmp/mldebug-rig/slurm/etc/slurm.conf")


def _cmd(argv: list[str], env: dict[str, str] | None = None, ok: tuple[int, ...] = (0,)) -> float:
    def once() -> None:
        rc = subprocess.run(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=120,
                            env={**os.environ, **(env or {})}).returncode
        if rc not in ok:
            raise RuntimeError(f"{argv} exited {rc}")

    return timeit(once, repeat=5)


def _fill(path: Path) -> None:
    from ml_debug.history.store import CheckRow, open_history

    rnd = random.Random(7)
    now = time.time() - 86400
    with open_history(path) as h:
        for run in range(10):
            for n in range(100):
                checks = [CheckRow(f"gpu.check{c}", f"gpu{c % 8}", "fail" if rnd.random() < 0.05 else "pass",
                                   "value", "") for c in range(10)]
                h.record_run(f"node{n:03d}", "slurm-check", all(c.status == "pass" for c in checks), "x", checks,
                             0.3, ts=now + run * 300 + n)
        for j in range(500):
            nodes = rnd.sample([f"node{n:03d}" for n in range(100)], 4)
            h.record_incident("logs", f"job{j}", nodes, nodes[0], "boom", ts=now + j)


def run() -> list[Result]:
    from ml_debug.history import queries
    from ml_debug.history.store import open_history

    py = sys.executable
    out: list[Result] = []
    ms = lambda s: f"{s * 1000:.0f} ms"  # noqa: E731
    with tempfile.TemporaryDirectory() as tmp:
        env = {"SLURM_CONF": str(RIG_CONF)} if RIG_CONF.exists() else {"PATH": str(Path(py).parent)}
        where = "rig Slurm, --dry-run" if RIG_CONF.exists() else "no scontrol, --dry-run"
        help_ = _cmd([py, "-m", "ml_debug", "--help"])
        hook = _cmd([py, "-m", "ml_debug", "health", "--slurm-check", "--dry-run", "--node", "node1",
                     "--history", f"{tmp}/hook.db"], env=env, ok=(0, 1))
        out.append(Result("slurm hook: --slurm-check / mldebug --help", hook / help_,
                          f"{ms(hook)} vs {ms(help_)} ({where}; goal <= 2)"))

        db = Path(tmp) / "h" / "history.db"
        _fill(db)
        with open_history(db) as h:
            total = queries.counts(h)["checks"]
            for name, fn in (("failing now", lambda: queries.failing(h)),
                             ("recurring in failed jobs", lambda: queries.recurring(h, 20)),
                             ("node timeline", lambda: queries.timeline(h, "node042"))):
                t = timeit(fn, repeat=5)
                out.append(Result(f"history: {name} / 100 ms", t / 0.1, f"{ms(t)} over {total} check results"))
        cli = _cmd([py, "-m", "ml_debug", "history", "--history", str(db)], ok=(0, 1))
        out.append(Result("history: mldebug history / mldebug --help", cli / help_, f"{ms(cli)} vs {ms(help_)}"))
    return out


if __name__ == "__main__":
    for r in run():
        print(r.line())
