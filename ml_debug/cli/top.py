"""`mldebug top`: one live view of a whole job across nodes: GPUs, ranks and progress."""

from __future__ import annotations

import dataclasses
from typing import Any

import typer

from ml_debug.remote.options import TargetOptions
from ml_debug.top.options import TopOptions

HELP = """Watch a whole job at once: a row per node, and per GPU and per rank process on request.

Each node runs one small sampling agent for as long as the view is open (one ssh session, or one
`srun --jobid ID --overlap` step per node) and streams a line of values every interval: CPU and
memory, per GPU utilisation, power as % of its limit, memory, temperature and throttle/ECC/Xid
badges, per rank its CPU %, RSS, state and step rate (--progress-file). What stands out is
highlighted: a rank or GPU far from the median of its peers, a GPU busy at low power (a spinning
NCCL kernel), a process in D state, a node that stopped answering (its last values greyed, with
their age). Keys: q quit, g GPU rows, r rank rows, s sort, j/k select, d dump-stacks of the
selected node. Without a terminal it prints plain text; --once prints one snapshot.

Exit codes: 0 nothing stands out; 1 an outlier was found (--once/--count); 2 bad usage;
4 some node did not answer in time; 130 interrupted (Ctrl-C)."""

EXAMPLES = (
    "mldebug top --slurm-job 12345 --gpu-rows",
    "mldebug top --hosts 'node[01-16]' --rank-rows --progress-file '/scratch/run/metrics/rank-{rank}.jsonl'",
    "mldebug top --local --once --json",
    "mldebug top --hosts hostfile --count 10 > top.log",
)


def register(app: typer.Typer) -> None:
    from ml_debug.cli.params import command

    command(app, "top", top, help=HELP, examples=EXAMPLES, opts=TopOptions, targets=TargetOptions)


def top(opts: TopOptions, targets: TargetOptions) -> int:
    if opts.agent:
        from ml_debug.sampling.agent import run_agent

        return run_agent(opts.sampler())
    from ml_debug.core.errors import UsageError
    from ml_debug.top.run import run_top

    if opts.once and opts.count:
        raise UsageError(f"--once and --count {opts.count} both say how many snapshots to print",
                         "give one of them (--once is --count 1)")
    spec = targets.resolve()
    return run_top(spec, opts, dump=dump_stacks_callback(spec, opts))


def dump_stacks_callback(spec: Any, opts: TopOptions) -> Any:
    """The `d` key: dump-stacks' own library call on one node's ranks (the same selectors as top's)."""

    def dump(label: str) -> dict[str, Any]:
        from ml_debug.stacks.request import DumpRequest
        from ml_debug.stacks.run import dump_stacks_report

        one = dataclasses.replace(spec, targets=[t for t in spec.targets if t.label == label])
        req = DumpRequest(pattern=opts.pattern, user=opts.user, env=list(opts.env))
        return dump_stacks_report(one, req)

    return dump
