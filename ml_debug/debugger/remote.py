"""`mldebug attach --rank R --hosts ...|--slurm-job J`: the one local primitive on every node.

Every node runs ``mldebug --json attach --rank R [--eval EXPR] --local``; the node that runs rank R
attaches, reads and detaches on its own, so no debugger port crosses the network. The others
answer "rank R is not on this node" with the ranks they do run, which makes a wrong rank a clear
error ("rank 9 not found: node1 runs 0, node2 runs 1").

The prompt (no --eval) needs a person here and the debugger there: every node first answers
``--locate-only`` (where rank R is, and whether it can be attached there: debugpy, gdb, ptrace),
then the rank's node runs mldebug's agent and the DAP conversation travels through the ssh session
or the Slurm step (ml_debug/debugger/tunnel.py).
"""

from __future__ import annotations

import dataclasses

from ml_debug.core.errors import PartialResult, UsageError
from ml_debug.debugger.options import AttachOptions
from ml_debug.debugger.result import AttachResult, from_dict
from ml_debug.debugger.run import Prompt
from ml_debug.remote.targets import TargetSpec


def attach_remote(opts: AttachOptions, spec: TargetSpec) -> AttachResult:
    """The result of the node that runs rank `opts.rank` (UsageError when none does)."""
    return _on_the_rank_node(opts, spec)[0]


def prompt_remote(opts: AttachOptions, spec: TargetSpec, prompt: Prompt) -> AttachResult:
    """The prompt here on rank `opts.rank`, the debugger on its node; MLDebugError when it cannot be attached."""
    from ml_debug.debugger.run import read_process
    from ml_debug.debugger.tunnel import NodeRefused, opener

    found, label = _on_the_rank_node(dataclasses.replace(opts, locate_only=True, eval=None), spec)
    if not found.ok or found.pid is None:
        raise NodeRefused(f"{found.host}: {found.error or found.summary}", found.hint, found.exit_code)
    target = next(t for t in spec.targets if t.label == label)
    return read_process(opts, found.pid, found.rank, found.ranks_here, found.host, prompt=prompt,
                        link=opener(spec, target, found.pid, opts.attach_timeout))


def _on_the_rank_node(opts: AttachOptions, spec: TargetSpec) -> tuple[AttachResult, str]:
    """Every node runs the attach; (the result of the node that runs rank R, that node's target label)."""
    from ml_debug.remote.runner import on_every_node

    if opts.rank is None or opts.pid is not None:
        raise UsageError("with --hosts or --slurm-job, name the process by --rank R (a pid means one node)",
                         hint="mldebug attach --slurm-job 12345 --rank 3 --eval 'step'")
    if spec.kind == "slurm" and spec.slurm_job and "SLURM_JOB_ID" not in opts.env_filter:
        # srun --overlap lands beside the job's tasks: only that job's ranks count on each node
        opts = dataclasses.replace(opts, env=[*opts.env, ("SLURM_JOB_ID", spec.slurm_job)])
    results = on_every_node("attach", opts, spec, timeout_s=opts.node_budget())
    seen: list[str] = []
    unreached: list[str] = []
    for r in results:
        body = r.document.get("result") if isinstance(r.document, dict) else None
        if not isinstance(body, dict) or "found" not in body:
            unreached.append(f"{r.node.host} ({r.error or 'no attach result'})")
            continue
        part = from_dict(body)
        if part.found:
            return part, r.node.host
        seen.append(f"{r.node.host} runs {', '.join(map(str, part.ranks_here)) or 'no rank'}")
    where = "; ".join(seen) or "no node answered"
    if unreached:
        raise PartialResult(f"rank {opts.rank} not found on the nodes that answered ({where}); not reached: "
                            + "; ".join(unreached))
    raise UsageError(f"rank {opts.rank} not found: {where}",
                     hint="check the rank and the job (--slurm-job ID, or --env KEY=VALUE with --hosts)")
