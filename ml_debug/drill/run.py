"""Run the chosen drills one after the other and score them."""

from __future__ import annotations

import random
import socket
import time
from collections.abc import Callable
from pathlib import Path

from ml_debug.core import output
from ml_debug.drill.catalog import CATALOG, Plan, judge
from ml_debug.drill.model import CORRECT, ERROR, MISSED, DrillOutcome, DrillResult, Injected, Named
from ml_debug.drill.options import DrillOptions
from ml_debug.drill.workspace import DrillError, Workspace

SLOW_LINK_RANKS = 4


def plan_for(drill: str, rng: random.Random, nproc: int, host: str) -> Plan:
    """The rank (any; missing-rank: not 0, which hosts the rendezvous) and step (2-4) to inject at."""
    if drill == "slow-link":
        n = max(SLOW_LINK_RANKS, nproc)
        a, b = rng.sample(range(n), 2)
        return Plan(rank=min(a, b), step=0, nproc=n, host=host, peer=max(a, b))
    rank = rng.randrange(1, nproc) if drill == "missing-rank" else rng.randrange(nproc)
    return Plan(rank=rank, step=rng.randint(2, 4), nproc=nproc, host=host)


def run_one(drill: str, plan: Plan, folder: Path, timeout_s: float) -> DrillOutcome:
    """One drill, start to teardown; never raises for what the drill itself ran into."""
    fn, diagnosis = CATALOG[drill]
    ws = Workspace(folder, time.monotonic() + timeout_s)
    injected = Injected(drill, plan.rank, plan.host, plan.step or None, None, plan.peer)
    try:
        injected, verdict = fn(ws, plan)
    except DrillError as e:
        return DrillOutcome(drill, ERROR, injected, diagnosis, Named(), None, None, str(folder), why=str(e))
    finally:
        ws.teardown()
    why = judge(injected, verdict.named)
    return DrillOutcome(drill, MISSED if why else CORRECT, injected, verdict.ran.shown, verdict.named,
                        round(verdict.seconds, 2), round(verdict.job_s, 2), str(folder), why=why)


def run_drills(opts: DrillOptions, on_outcome: Callable[[DrillOutcome], None] | None = None) -> DrillResult:
    started = time.monotonic()
    seed = opts.seed if opts.seed is not None else random.SystemRandom().randrange(1 << 31)
    rng = random.Random(seed)
    host = socket.gethostname()
    root = opts.out_dir or Path(f"mldebug-drill-{time.strftime('%Y%m%d-%H%M%S')}")
    root.mkdir(parents=True, exist_ok=True)
    outcomes: list[DrillOutcome] = []
    with output.progress(len(opts.only), "drills") as bar:
        for i, drill in enumerate(opts.only):
            bar.advance(0, f"drill {i + 1}/{len(opts.only)}: {drill}")
            plan = plan_for(drill, rng, opts.nproc_per_node, host)
            outcome = run_one(drill, plan, root / drill, opts.timeout)
            outcomes.append(outcome)
            if on_outcome is not None:
                on_outcome(outcome)
            bar.advance(1)
    correct = sum(o.status == CORRECT for o in outcomes)
    missed = [o.drill for o in outcomes if o.status == MISSED]
    errors = [o.drill for o in outcomes if o.status == ERROR]
    summary = f"{correct}/{len(outcomes)} drills named the injected rank"
    if missed:
        summary += f"; missed: {', '.join(missed)}"
    if errors:
        summary += f"; could not run: {', '.join(errors)}"
    return DrillResult(ok=not missed and not errors, summary=summary, seed=seed, nproc_per_node=opts.nproc_per_node,
                       host=host, drills=outcomes, correct=correct, missed=len(missed), errors=len(errors),
                       out_dir=str(root), wall_s=round(time.monotonic() - started, 2),
                       notes=[f"repeat with: mldebug drill --seed {seed}"
                              + (f" --only {','.join(opts.only)}" if len(opts.only) < len(CATALOG) else "")])
