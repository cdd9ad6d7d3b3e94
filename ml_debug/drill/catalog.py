"""The drills: for each classic failure, the job that has it and the diagnosis a user would run.

Each drill starts a real job with the fault on a chosen rank (``mldebug train --inject``, gpu-test with
a rank never started, allreduce-bench with one slow link), waits until the fault is in effect, runs the
mldebug command that the docs name for it, and reads back which rank (node, function) that command
blamed. The caller judges the answer (:func:`judge`) and tears the job down.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ml_debug.core.ranges import expand
from ml_debug.core.testhooks import ENV as HOOKS_ENV
from ml_debug.drill.injectors import ENV as FAULT_ENV
from ml_debug.drill.injectors import slow_pair_spec
from ml_debug.drill.model import Injected, Named
from ml_debug.drill.workspace import DrillError, Ran, Workspace, free_port, last_step, result_of

TRAIN = ["--preset", "tiny", "--steps", "100000"]


@dataclass
class Plan:
    """What one drill injects: the rank (and peer for a link), the step, the job's size and host."""

    rank: int
    step: int
    nproc: int
    host: str
    peer: int | None = None


@dataclass
class Verdict:
    """The diagnosis as run, and what it named."""

    ran: Ran
    named: Named
    seconds: float  # time to verdict, retries included
    job_s: float


Drill = Callable[[Workspace, Plan], tuple[Injected, Verdict]]


# -- helpers -----------------------------------------------------------------------------------------
def _train(ws: Workspace, plan: Plan, fault: str, extra_env: dict[str, str] | None = None) -> Any:
    """A long `mldebug train` with one fault and per-rank metrics; returns the job once it reached the step
    before the fault on every rank."""
    job = ws.start(["train", "--nproc-per-node", str(plan.nproc), *TRAIN, "--timeout", f"{max(ws.left(), 30):.0f}",
                    "--metrics-dir", "metrics", "--inject", fault], "job.log", extra_env)

    def reached() -> bool | None:
        ws.alive(job, "job.log")
        steps = [last_step(ws.dir / "metrics" / f"rank-{r}.jsonl") for r in range(plan.nproc)]
        return True if all(s is not None and s >= plan.step - 1 for s in steps) else None

    ws.wait_for(f"every rank to reach step {plan.step - 1}", reached, limit_s=180)
    return job


def _until_named(ws: Workspace, argv: list[str], save_as: str, read: Callable[[dict[str, Any]], Named],
                 limit_s: float = 60.0, extra_env: dict[str, str] | None = None) -> tuple[Ran, Named, float]:
    """Run the diagnosis, again until it names someone (a user looks again when the first look is too
    early); the time to verdict counts every try."""
    t0 = time.monotonic()
    end = t0 + min(limit_s, ws.left())
    while True:
        ran = ws.mldebug(argv, save_as, extra_env)
        named = read(ran.result) if ran.result is not None else Named(verdict=_no_result(ran))
        if named.ranks or time.monotonic() >= end:
            return ran, named, time.monotonic() - t0
        time.sleep(1.0)


def _no_result(ran: Ran) -> str:
    last = ran.stderr.strip().splitlines()[-1:] if ran.stderr.strip() else []
    return f"no result (exit {ran.code}){': ' + last[0] if last else ''}"


def _host_of(member: str) -> str | None:
    return member.rsplit(":", 1)[0] if ":" in member else None


# -- the drills --------------------------------------------------------------------------------------
def hang(ws: Workspace, plan: Plan) -> tuple[Injected, Verdict]:
    t0 = time.monotonic()
    job = _train(ws, plan, f"hang@step={plan.step},rank={plan.rank}")
    job_s = time.monotonic() - t0

    def read(result: dict[str, Any]) -> Named:
        suspects = result.get("suspects") or []
        first = suspects[0] if suspects else {}
        return Named(ranks=sorted(first.get("ranks") or []),
                     node=_host_of((first.get("members") or [""])[0]), where=first.get("where"),
                     verdict=str(result.get("summary", "")))

    ran, named, seconds = _until_named(ws, ["dump-stacks", "--pid", str(job.pid)], "dump-stacks.json", read)
    return (Injected("hang", plan.rank, plan.host, plan.step, "injected_hang"), Verdict(ran, named, seconds, job_s))


def desync(ws: Workspace, plan: Plan) -> tuple[Injected, Verdict]:
    t0 = time.monotonic()
    fr = ws.dir / "flight-recorder"
    fr.mkdir(exist_ok=True)
    job = _train(ws, plan, f"desync@step={plan.step},rank={plan.rank}",
                 {"TORCH_FR_BUFFER_SIZE": "2000", "MLDEBUG_FR_DIR": str(fr)})
    job_s = time.monotonic() - t0

    def read(result: dict[str, Any]) -> Named:
        analysis = (result.get("flight_recorder") or {}).get("analysis") or {}
        culprits = [c for c in analysis.get("culprits") or [] if c.get("why") == "desync"]
        odd = [side for pg in analysis.get("process_groups") or [] for side in (pg.get("mismatch") or {}).get("sides", [])
               if side.get("odd")]
        return Named(ranks=sorted({int(c["rank"]) for c in culprits if c.get("rank") is not None}),
                     node=culprits[0].get("host") if culprits else None,
                     where=odd[0].get("op") if odd else None, verdict=str(result.get("summary", "")))

    ran, named, seconds = _until_named(ws, ["dump-stacks", "--pid", str(job.pid)], "dump-stacks.json", read)
    return (Injected("desync", plan.rank, plan.host, plan.step, "all_reduce"),
            Verdict(ran, named, seconds, job_s))


def straggler(ws: Workspace, plan: Plan) -> tuple[Injected, Verdict]:
    t0 = time.monotonic()
    job = _train(ws, plan, f"straggler@step={plan.step},rank={plan.rank},factor=4")
    job_s = time.monotonic() - t0
    argv = ["watch", "--pid", str(job.pid), "--progress-file", str(ws.dir / "metrics" / "rank-{rank}.jsonl"),
            "--stall", "10", "--grace", "0", "--interval", "1", "--stack-every", "1", "--out-dir", "incident"]

    def read(result: dict[str, Any]) -> Named:
        culprit = result.get("culprit") or {}
        is_straggler = culprit.get("why") == "straggler"
        return Named(ranks=[int(culprit["rank"])] if culprit.get("rank") is not None else [],
                     node=culprit.get("host"), where="straggler" if is_straggler else culprit.get("why"),
                     verdict=str(result.get("summary", "")))

    ran, named, seconds = _until_named(ws, argv, "watch.json", read, limit_s=0)
    return (Injected("straggler", plan.rank, plan.host, plan.step, "straggler"), Verdict(ran, named, seconds, job_s))


def _launched(kind: str, where: str | None, silent: bool = False) -> Drill:
    """A fault that ends the job by itself: run it under `mldebug launch`, then read its logs."""

    def drill(ws: Workspace, plan: Plan) -> tuple[Injected, Verdict]:
        t0 = time.monotonic()
        job = ws.start([sys.executable, "-m", "ml_debug", "launch", "--nproc-per-node", str(plan.nproc),
                        "--log-dir", "logs", "--", sys.executable, "-m", "ml_debug.train", "--preset", "tiny",
                        "--steps", str(plan.step + 3), "--timeout", "30",
                        "--inject", f"{kind}@step={plan.step},rank={plan.rank}"], "launch.log")
        ws.finish(job, "the launched job")
        job_s = time.monotonic() - t0

        def read(result: dict[str, Any]) -> Named:
            verdict = result.get("verdict") or {}
            if silent:  # the rank that left without a word: the one no failure came from
                ranks = expand(verdict["silent_ranks"]) if verdict.get("silent_ranks") else []
                return Named(ranks=ranks, node=None, where=None, verdict=str(verdict.get("summary", "")))
            primary = verdict.get("primary") or {}
            who = primary.get("who") or {}
            return Named(ranks=[int(who["rank"])] if who.get("rank") is not None else [], node=who.get("node"),
                         where=primary.get("message"), verdict=str(verdict.get("summary", "")))

        ran, named, seconds = _until_named(ws, ["logs", "logs"], "logs.json", read, limit_s=0)
        return Injected(kind, plan.rank, plan.host, plan.step, where), Verdict(ran, named, seconds, job_s)

    return drill


def missing_rank(ws: Workspace, plan: Plan) -> tuple[Injected, Verdict]:
    """gpu-test on a world with one rank never started: the others must name it. Rank 0 hosts the
    rendezvous store, so the missing rank is one of the others."""
    port = free_port()
    t0 = time.monotonic()
    procs = {}
    for r in range(plan.nproc):
        if r == plan.rank:
            continue
        env = {"RANK": str(r), "WORLD_SIZE": str(plan.nproc), "LOCAL_RANK": str(r),
               "LOCAL_WORLD_SIZE": str(plan.nproc), "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}
        procs[r] = ws.start([sys.executable, "-m", "ml_debug", "gpu-test", "--json", "--timeout", "5",
                             "--backend", "gloo", "--device", "cpu"], f"rank{r}.log", env)
    for r, proc in procs.items():
        ws.finish(proc, f"gpu-test rank {r}")
    seconds = time.monotonic() - t0
    text = (ws.dir / "rank0.log").read_text(errors="replace")
    (ws.dir / "gpu-test.json").write_text(text)
    result = result_of(text)
    argv = ["gpu-test", "--timeout", "5", f"({plan.nproc - 1} of {plan.nproc} ranks started)"]
    ran = Ran(argv, procs[0].returncode if 0 in procs else -1, result, "", seconds)
    if result is None:
        raise DrillError(f"rank 0 of gpu-test printed no verdict (exit {ran.code})")
    named = Named(ranks=sorted(result.get("missing_ranks") or []), node=None, where=None,
                  verdict=str(result.get("summary", "")))
    return Injected("missing-rank", plan.rank, plan.host, None, None), Verdict(ran, named, seconds, 0.0)


def slow_link(ws: Workspace, plan: Plan) -> tuple[Injected, Verdict]:
    assert plan.peer is not None
    spec = slow_pair_spec(plan.rank, plan.peer, 20)
    argv = ["allreduce-bench", "--pairwise", "--nproc-per-node", str(plan.nproc), "--backend", "gloo",
            "--device", "cpu", "-e", "256K", "-n", "5", "-w", "1", "--slow-threshold", "0.7"]
    hooks = ",".join(filter(None, [os.environ.get(HOOKS_ENV, ""), "ml_debug.drill.injectors"]))
    ran = ws.mldebug(argv, "allreduce-bench.json", {HOOKS_ENV: hooks, FAULT_ENV: spec}, limit_s=180)
    if ran.result is None:
        raise DrillError(_no_result(ran))
    links = (ran.result.get("pairwise") or {}).get("slow_links") or []
    ranks = sorted({int(link[k]) for link in links for k in ("a", "b")})
    named = Named(ranks=ranks, node=None, where=", ".join(f"{x['a']}<->{x['b']}" for x in links) or None,
                  verdict=str(ran.result.get("summary", "")))
    injected = Injected("slow-link", plan.rank, plan.host, None, f"{min(plan.rank, plan.peer)}<->"
                        f"{max(plan.rank, plan.peer)}", peer=plan.peer)
    return injected, Verdict(ran, named, ran.seconds, 0.0)


CATALOG: dict[str, tuple[Drill, str]] = {
    "hang": (hang, "dump-stacks"),
    "straggler": (straggler, "watch"),
    "crash": (_launched("crash", "InjectedCrash"), "logs"),
    "segfault": (_launched("segfault", "Segmentation fault"), "logs"),
    "nan": (_launched("nan", "non-finite"), "logs"),
    "desync": (desync, "dump-stacks (Flight Recorder)"),
    "exit": (_launched("exit", None, silent=True), "logs"),
    "missing-rank": (missing_rank, "gpu-test"),
    "slow-link": (slow_link, "allreduce-bench --pairwise"),
}
"""drill -> (what runs it, the diagnosis command it proves)."""


def judge(injected: Injected, named: Named) -> str:
    """Why the diagnosis is wrong, or "" when it named exactly the injected rank(s), node and place."""
    expected = sorted({injected.rank, injected.peer} - {None})  # type: ignore[type-var]
    if not named.ranks:
        return "named no rank"
    if named.ranks != expected:
        return f"named rank(s) {','.join(map(str, named.ranks))}, not {','.join(map(str, expected))}"
    if named.node is not None and named.node != injected.node:
        return f"named node {named.node}, not {injected.node}"
    if injected.where and (named.where is None or injected.where not in named.where):
        return f"named {named.where or 'no place'}, not {injected.where}"
    return ""
