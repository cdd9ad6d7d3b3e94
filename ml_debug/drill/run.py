"""Run the chosen drills one after the other and score them."""

from __future__ import annotations

import dataclasses
import random
import shlex
import socket
import time
from collections.abc import Callable
from pathlib import Path

from ml_debug.core import output, safefs
from ml_debug.core.errors import UsageError
from ml_debug.core.options import to_argv
from ml_debug.dist.limits import check_nproc
from ml_debug.drill.catalog import CATALOG, Plan, judge
from ml_debug.drill.options import DrillOptions
from ml_debug.drill.result import CORRECT, ERROR, MISSED, DrillOutcome, DrillResult, Injected, Named
from ml_debug.drill.sites import LocalSite, Site, SlurmSite, SshSite, check_slurm_request
from ml_debug.drill.workspace import DrillError, Workspace
from ml_debug.remote.options import TargetOptions

SLOW_LINK_RANKS = 4  # on one node: a slow pair of ranks needs other pairs to compare with
SLOW_LINK_NODES = 3  # on several nodes the units are nodes: 3 give 3 pairs


def plan_for(drill: str, rng: random.Random, nproc: int, nodes: int = 1) -> Plan:
    """The rank (any of the job; missing-rank: not 0, which hosts the rendezvous) and step (2-4) to inject at;
    for slow-link, the two units (ranks on one node, nodes on several) of the slow pair."""
    if drill == "slow-link":
        n = max(SLOW_LINK_RANKS, nproc) if nodes == 1 else max(SLOW_LINK_NODES, nodes)
        a, b = rng.sample(range(n), 2)
        return Plan(rank=min(a, b), step=0, nproc=n if nodes == 1 else 1, peer=max(a, b))
    world = nproc * nodes
    rank = rng.randrange(1, world) if drill == "missing-rank" else rng.randrange(world)
    return Plan(rank=rank, step=rng.randint(2, 4), nproc=nproc)


def run_one(drill: str, plan: Plan, site: Site, folder: Path, timeout_s: float) -> DrillOutcome:
    """One drill, start to teardown; never raises for what the drill itself ran into."""
    fn, diagnosis = CATALOG[drill]
    ws = Workspace(folder, time.monotonic() + timeout_s)
    injected = Injected(drill, plan.rank, "", plan.step or None, None, plan.peer)
    try:
        injected, verdict = fn(ws, site, plan)
    except DrillError as e:
        return DrillOutcome(drill, ERROR, injected, diagnosis, Named(), None, None, str(ws.dir), ws.token, why=str(e))
    except Exception as e:  # one broken drill must not cost the others their results
        return DrillOutcome(drill, ERROR, injected, diagnosis, Named(), None, None, str(ws.dir), ws.token,
                            why=f"the drill itself failed: {type(e).__name__}: {e}")
    finally:
        site.teardown(ws)
        ws.teardown()
    why = judge(injected, verdict.named)
    return DrillOutcome(drill, MISSED if why else CORRECT, injected, verdict.ran.shown, verdict.named,
                        round(verdict.seconds, 2), round(verdict.job_s, 2), str(ws.dir), ws.token, why=why)


def site_for(opts: DrillOptions, targets: TargetOptions | None = None) -> Site:
    """This node; a Slurm partition (--slurm-partition); or the hosts of --hosts, over ssh."""
    if targets is not None and targets.slurm_job is not None:
        raise UsageError("--slurm-job names a running job; a drill starts its own jobs",
                         "use --slurm-partition P (and --slurm-nodes N) to run the drills as Slurm jobs")
    if opts.slurm_partition:
        if targets is not None and targets.hosts is not None:
            raise UsageError("--hosts and --slurm-partition both say where the drills run", "give one of them")
        check_slurm_request(opts.slurm_partition, list(opts.sbatch_arg))
        return SlurmSite(opts.slurm_partition, opts.slurm_nodes, list(opts.sbatch_arg))
    if targets is not None and targets.hosts is not None:
        spec = targets.resolve()
        if len(spec.targets) < 2:
            raise UsageError(f"--hosts gives {len(spec.targets)} host; a drill over ssh needs at least 2",
                             "on one node, leave --hosts out")
        return SshSite(spec, to_argv(targets, forwarded_only=False, changed_only=True))
    if opts.nproc_per_node < 2:
        raise UsageError(f"--nproc-per-node {opts.nproc_per_node} on this node leaves the injected rank no peer",
                         "give --nproc-per-node 2 or more, or run the drills over --hosts or --slurm-partition")
    # as every command that starts ranks here: refused now, not found out as a drill scored "missed"
    check_nproc(opts.nproc_per_node, opts.max_nproc_per_node)
    return LocalSite()


def run_drills(opts: DrillOptions, targets: TargetOptions | None = None,
               on_outcome: Callable[[DrillOutcome], None] | None = None) -> DrillResult:
    started = time.monotonic()
    seed = opts.seed if opts.seed is not None else random.SystemRandom().randrange(1 << 31)
    rng = random.Random(seed)
    host = socket.gethostname()
    site = site_for(opts, targets)
    root = opts.out_dir or Path(f"mldebug-drill-{time.strftime('%Y%m%d-%H%M%S')}")
    safefs.make_out_dir(root, "--bundle-dir")  # no link of another user followed; the folder ours or root's
    outcomes: list[DrillOutcome] = []
    interrupted = False
    with output.progress(len(opts.only), "drills") as bar:
        for i, drill in enumerate(opts.only):
            bar.advance(0, f"drill {i + 1}/{len(opts.only)}: {drill}")
            plan = plan_for(drill, rng, opts.nproc_per_node, site.nodes)
            try:
                outcome = run_one(drill, plan, site, root / drill, opts.timeout)
            except KeyboardInterrupt:  # the drill was torn down; keep what the others found
                interrupted = True
                break
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
    if interrupted:
        summary += f"; interrupted before {opts.only[len(outcomes)]}"
    where = {"local": "this node", "slurm": f"Slurm partition {opts.slurm_partition}, {site.nodes} nodes per job",
             "ssh": f"{site.nodes} hosts over ssh"}[site.name]
    return DrillResult(ok=not missed and not errors and not interrupted, summary=summary, seed=seed,
                       nproc_per_node=opts.nproc_per_node, host=host, site=where, nodes=site.nodes, drills=outcomes,
                       correct=correct, missed=len(missed), errors=len(errors), interrupted=interrupted,
                       out_dir=str(root), wall_s=round(time.monotonic() - started, 2),
                       notes=[f"repeat with: mldebug drill {shlex.join(_repeat(opts, seed, targets))}"])


def _repeat(opts: DrillOptions, seed: int, targets: TargetOptions | None) -> list[str]:
    """The options that run the same drills, on the same ranks and steps, again (a new --bundle-dir)."""
    words = to_argv(dataclasses.replace(opts, seed=seed, out_dir=None), changed_only=True)
    if targets is not None:
        words += to_argv(targets, forwarded_only=False, changed_only=True)
    return words
