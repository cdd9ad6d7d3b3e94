"""`mldebug dump-stacks`: every rank's stack on every node, merged, with the odd rank named."""

from __future__ import annotations

import typer

from ml_debug.core.errors import ExitCode
from ml_debug.remote.options import TargetOptions
from ml_debug.stacks.request import DumpRequest

HELP = """Dump the Python stack of every rank of a hung job and name the odd one out.

Finds the ranks (children of torchrun/deepspeed/accelerate/srun/mpirun, or --pid/--pattern/--user/--gpu-holders),
dumps them all at once with py-spy (falling back to pystack, then gdb), groups identical stacks into a
tree with rank ranges and prints a verdict such as
"suspect: rank 3 (node2, pid 4242) in load_batch (data.py:88) while 3 ranks wait in all_reduce".


  mldebug dump-stacks                        # this node
  mldebug dump-stacks --hosts node[01-08]    # over ssh, each node dumps its own ranks
  mldebug dump-stacks --slurm-job 12345      # inside a Slurm job's allocation
  mldebug dump-stacks --samples 3            # stuck or still moving?

Exit codes: 0 no suspect; 1 a suspect named; 2 bad options; 3 nothing could be attached (no py-spy,
no ptrace permission, no process found: the summary says why); 4 some processes or nodes were not
dumped; 130 Ctrl-C (during --samples on this node, the rounds taken are printed and kept in --out-dir)."""

EXAMPLES = (
    "mldebug dump-stacks                        # this node",
    "mldebug dump-stacks --hosts node[01-08]    # over ssh, each node dumps its own ranks",
    "mldebug dump-stacks --slurm-job 12345      # inside a Slurm job's allocation",
    "mldebug dump-stacks --samples 3            # stuck or still moving?",
)


def register(app: typer.Typer) -> None:
    from ml_debug.cli.params import command

    command(app, "dump-stacks", dump_stacks, help=HELP, examples=EXAMPLES, req=DumpRequest, targets=TargetOptions)


def dump_stacks(req: DumpRequest, targets: TargetOptions) -> int:
    from ml_debug.core import output
    from ml_debug.page import build
    from ml_debug.stacks.render import render
    from ml_debug.stacks.run import dump_stacks_result
    from ml_debug.stacks.verdict import SCHEMA, SCHEMA_VERSION

    for flag, path in (("--html", req.html), ("--speedscope", req.speedscope)):
        if path is not None:
            build.check_target(flag, path)
    spec = targets.resolve()
    result = dump_stacks_result(spec, req, out_dir=req.out_dir)
    output.emit(SCHEMA, SCHEMA_VERSION, result,
                lambda console: render(result, console, full=req.full, all_threads=req.all_threads))
    if req.html is not None:
        build.write_logged("--html", req.html, build.stacks_page(result))
    if req.speedscope is not None:
        build.write_logged("--speedscope", req.speedscope, build.speedscope_text(result))
    if result.exit_code == ExitCode.ENVIRONMENT and result.hint:
        output.log(f"hint: {result.hint}")
    return result.exit_code
