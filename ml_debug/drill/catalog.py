"""The drills: for each classic failure, the job that has it and the diagnosis a user would run.

Each drill starts a real job with the fault on a chosen rank (``mldebug train --inject``, gpu-test with
a rank never started, allreduce-bench with one slow link), on this node or as a Slurm job
(:mod:`ml_debug.drill.sites`), waits until the fault is in effect, runs the mldebug command that the docs
name for it, and reads back which rank (node, function) that command blamed. :func:`judge` says whether
that was right; the caller tears the job down.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ml_debug.core.ranges import expand
from ml_debug.core.testhooks import ENV as HOOKS_ENV
from ml_debug.drill.injectors import ENV as FAULT_ENV
from ml_debug.drill.injectors import slow_pair_spec
from ml_debug.drill.result import Injected, Named
from ml_debug.drill.sites import Output, Site, wait_for_step
from ml_debug.drill.workspace import DrillError, Ran, Workspace, result_of

SLOW_LINK_FACTOR = 100
"""How much slower the slow-link drill makes its pair's exchange (see slow_link)."""


@dataclass
class Plan:
    """What one drill injects: the rank (and the peer of a slow link), the step, ranks per node."""

    rank: int
    step: int
    nproc: int
    peer: int | None = None


@dataclass
class DrillVerdict:
    """The diagnosis as run, and what it named."""

    ran: Ran
    named: Named
    seconds: float  # time to verdict, retries included
    job_s: float


Drill = Callable[[Workspace, Site, Plan], tuple[Injected, DrillVerdict]]


def _until_named(ws: Workspace, argv: list[str], save_as: str, read: Callable[[dict[str, Any]], Named],
                 limit_s: float) -> tuple[Ran, Named, float]:
    """Run the diagnosis, again for up to ``limit_s`` until it names someone (a user looks again when the
    first look came before the ranks were stuck); the time to verdict counts every try."""
    t0 = time.monotonic()
    end = t0 + min(limit_s, ws.left())
    while True:
        ran = ws.mldebug(argv, save_as)
        named = read(ran.result) if ran.result is not None else Named(verdict=_no_result(ran))
        if named.ranks or time.monotonic() >= end:
            return ran, named, time.monotonic() - t0
        time.sleep(1.0)


def _no_result(ran: Ran) -> str:
    last = ran.stderr.strip().splitlines()[-1:] if ran.stderr.strip() else []
    return f"no result (exit {ran.code}){': ' + last[0] if last else ''}"


def _host_of(member: str) -> str | None:
    return member.rsplit(":", 1)[0] if ":" in member else None


def _injected(ws: Workspace, site: Site, plan: Plan, fault: str, where: str | None) -> Injected:
    return Injected(fault, plan.rank, site.node_of(ws, plan.rank, plan.nproc), plan.step, where)


# -- faults in a running job: look at its ranks --------------------------------------------------------
def _stuck(fault: str, where: str, diagnosis: Callable[[Workspace, list[str]], list[str]], save_as: str,
           read: Callable[[dict[str, Any]], Named], env: Callable[[Workspace], dict[str, str]] | None = None,
           retry_s: float = 20.0) -> Drill:
    def drill(ws: Workspace, site: Site, plan: Plan) -> tuple[Injected, DrillVerdict]:
        t0 = time.monotonic()
        spec = f"{fault}@step={plan.step},rank={plan.rank}" + (",factor=4" if fault == "straggler" else "")
        job = site.train(ws, plan.nproc, spec, env(ws) if env else {})
        wait_for_step(ws, job, plan.nproc * site.nodes, plan.step - 1)
        job_s = time.monotonic() - t0
        ran, named, seconds = _until_named(ws, diagnosis(ws, job.target), save_as, read, limit_s=retry_s)
        return _injected(ws, site, plan, fault, where), DrillVerdict(ran, named, seconds, job_s)

    return drill


def _read_suspect(result: dict[str, Any]) -> Named:
    suspects = result.get("suspects") or []
    first = suspects[0] if suspects else {}
    return Named(ranks=sorted(first.get("ranks") or []), node=_host_of((first.get("members") or [""])[0]),
                 where=first.get("where"), verdict=str(result.get("summary", "")))


def _read_desync(result: dict[str, Any]) -> Named:
    analysis = (result.get("flight_recorder") or {}).get("analysis") or {}
    culprits = [c for c in analysis.get("culprits") or [] if c.get("why") == "desync"]
    odd = [side for pg in analysis.get("process_groups") or [] for side in (pg.get("mismatch") or {}).get("sides", [])
           if side.get("odd")]
    return Named(ranks=sorted({int(c["rank"]) for c in culprits if c.get("rank") is not None}),
                 node=culprits[0].get("host") if culprits else None,
                 where=odd[0].get("op") if odd else None, verdict=str(result.get("summary", "")))


def _read_culprit(result: dict[str, Any]) -> Named:
    culprit = result.get("culprit") or {}
    return Named(ranks=[int(culprit["rank"])] if culprit.get("rank") is not None else [], node=culprit.get("host"),
                 where=culprit.get("why"), verdict=str(result.get("summary", "")))


def _fr_env(ws: Workspace) -> dict[str, str]:
    fr = ws.dir / "flight-recorder"
    fr.mkdir(exist_ok=True)
    from ml_debug.core.frfiles import BUFFER_VAR, DIR_VAR

    return {BUFFER_VAR: "2000", DIR_VAR: str(fr)}


def _dump_stacks(ws: Workspace, target: list[str]) -> list[str]:
    return ["dump-stacks", *target]


def _watch(ws: Workspace, target: list[str]) -> list[str]:
    # --stall well above a step on a loaded node: the straggler is to be named before any stall is
    return ["watch", *target, "--progress-file", str(ws.dir / "metrics" / "rank-{rank}.jsonl"), "--stall", "30", "--grace", "0",
            "--interval", "1", "--stack-every", "1", "--bundle-dir", "incident"]


# -- faults that end the job: read its logs -------------------------------------------------------------
def _ended(fault: str, where: str | None, silent: bool = False) -> Drill:
    def drill(ws: Workspace, site: Site, plan: Plan) -> tuple[Injected, DrillVerdict]:
        t0 = time.monotonic()
        logs = site.launched(ws, plan.nproc, ["--preset", "tiny", "--steps", str(plan.step + 3), "--collective-timeout", "30",
                                               "--inject", f"{fault}@step={plan.step},rank={plan.rank}"])
        job_s = time.monotonic() - t0

        def read(result: dict[str, Any]) -> Named:
            verdict = result.get("verdict") or {}
            if silent:  # the rank that left without a word: the one no failure came from
                ranks = expand(verdict["silent_ranks"]) if verdict.get("silent_ranks") else []
                return Named(ranks=ranks, verdict=str(verdict.get("summary", "")))
            primary = verdict.get("primary") or {}
            who = primary.get("who") or {}
            return Named(ranks=[int(who["rank"])] if who.get("rank") is not None else [], node=who.get("node"),
                         where=primary.get("message"), verdict=str(verdict.get("summary", "")))

        ran, named, seconds = _until_named(ws, ["logs", str(logs.relative_to(ws.dir))], "logs.json", read, limit_s=0)
        return _injected(ws, site, plan, fault, where), DrillVerdict(ran, named, seconds, job_s)

    return drill


# -- jobs that are their own diagnosis ----------------------------------------------------------------
def _as_ran(out: Output, save_as: str, ws: Workspace) -> Ran:
    result = result_of(out.text)
    (ws.dir / save_as).write_text(out.text)
    if result is None:
        raise DrillError(f"{out.shown}: printed no verdict (see {ws.dir / save_as})")
    return Ran([], 0, result, "", out.seconds, command=out.shown)


def missing_rank(ws: Workspace, site: Site, plan: Plan) -> tuple[Injected, DrillVerdict]:
    """gpu-test on a world with one rank never started: the others must name it. Rank 0 hosts the
    rendezvous store, so the missing rank is one of the others."""
    out = site.missing_rank(ws, plan.nproc, plan.rank)
    ran = _as_ran(out, "gpu-test.json", ws)
    assert ran.result is not None
    named = Named(ranks=sorted(ran.result.get("missing_ranks") or []), verdict=str(ran.result.get("summary", "")))
    injected = Injected("missing-rank", plan.rank, site.node_of(ws, plan.rank, plan.nproc), None, None)
    return injected, DrillVerdict(ran, named, out.seconds, 0.0)


def slow_link(ws: Workspace, site: Site, plan: Plan) -> tuple[Injected, DrillVerdict]:
    """allreduce-bench --pairwise with one pair of units (ranks on one node, nodes on several) SLOW_LINK_FACTOR x
    slow. Ranks on shared CPUs measure a link in milliseconds, and other jobs' ranks there slowed every link of a
    3-node run 3-10x (CI: 0.09-0.11 GB/s beside a 20x link's 0.033), so a 20x link was no longer a third of the
    others; 100x costs the drill a second or two."""
    assert plan.peer is not None
    hooks = ",".join(filter(None, [os.environ.get(HOOKS_ENV, ""), "ml_debug.drill.injectors"]))
    out = site.slow_link(ws, plan.nproc, {HOOKS_ENV: hooks, FAULT_ENV: slow_pair_spec(plan.rank, plan.peer, SLOW_LINK_FACTOR)})
    ran = _as_ran(out, "allreduce-bench.json", ws)
    assert ran.result is not None
    links = (ran.result.get("pairwise") or {}).get("slow_links") or []
    named = Named(ranks=sorted({int(link[k]) for link in links for k in ("a", "b")}),
                  where=", ".join(f"{x['a']}<->{x['b']}" for x in links) or None,
                  verdict=str(ran.result.get("summary", "")))
    injected = Injected("slow-link", plan.rank, "" if site.nodes > 1 else site.node_of(ws, 0, 1), None,
                        f"{plan.rank}<->{plan.peer}", peer=plan.peer)
    return injected, DrillVerdict(ran, named, out.seconds, 0.0)


CATALOG: dict[str, tuple[Drill, str]] = {
    "hang": (_stuck("hang", "injected_hang", _dump_stacks, "dump-stacks.json", _read_suspect),
             "dump-stacks"),
    "straggler": (_stuck("straggler", "straggler", _watch, "watch.json", _read_culprit, retry_s=0), "watch"),
    "crash": (_ended("crash", "InjectedCrash"), "logs"),
    "segfault": (_ended("segfault", "Segmentation fault"), "logs"),
    "nan": (_ended("nan", "non-finite"), "logs"),
    "desync": (_stuck("desync", "all_reduce", _dump_stacks, "dump-stacks.json", _read_desync,
                      env=_fr_env), "dump-stacks (Flight Recorder)"),
    "exit": (_ended("exit", None, silent=True), "logs"),
    "missing-rank": (missing_rank, "gpu-test"),
    "slow-link": (slow_link, "allreduce-bench --pairwise"),
}
"""drill -> (what runs it, the diagnosis command it proves)."""


def judge(injected: Injected, named: Named) -> str:
    """Why the diagnosis is wrong, or "" when it named exactly the injected rank(s), node and place."""
    expected = sorted(r for r in (injected.rank, injected.peer) if r is not None)
    if not named.ranks:
        return "named no rank"
    if named.ranks != expected:
        return f"named rank(s) {','.join(map(str, named.ranks))}, not {','.join(map(str, expected))}"
    if named.node is not None and injected.node and named.node != injected.node:
        return f"named node {named.node}, not {injected.node}"
    if injected.where and (named.where is None or injected.where not in named.where):
        return f"named {named.where or 'no place'}, not {injected.where}"
    return ""
