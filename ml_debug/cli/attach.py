"""`mldebug attach`: a debugger (debugpy) in a live rank, read through mldebug's own DAP client."""

from __future__ import annotations

from typing import TYPE_CHECKING

import typer

from ml_debug.debugger.options import AttachOptions
from ml_debug.remote.options import TargetOptions

if TYPE_CHECKING:
    from ml_debug.debugger.result import AttachResult
    from ml_debug.debugger.session import Session

HELP = """Attach a debugger to a running Python process (a hung rank) and look inside it.

Injects debugpy into the process (its attach-by-pid, with gdb: ptrace permission as for dump-stacks),
stops it, shows the threads, the stack and the chosen frame's locals, evaluates --eval EXPR, and
detaches: the process resumes and keeps running. With neither --eval nor --json a small pdb-like prompt
opens (threads, bt, up/down, locals, p EXPR, continue, quit), also for a rank on another node (--rank R
with --hosts/--slurm-job): the debugger runs on the rank's node and speaks to the prompt through the
ssh session or a step of the Slurm job. Nothing listens on the network. The debugger can run any code
in the process: only the job's owner (or root) can attach.

Exit codes: 0 read and detached; 1 --eval raised an error; 2 bad options, no such pid or rank, not a
Python process; 3 no debugpy, no gdb, no ptrace permission, or debugpy could not start in the process;
4 the thread never stopped (it sits in native code) or a node was not reached: what was read is shown."""

EXAMPLES = (
    "mldebug attach --pid 4242                              # the prompt: bt, locals, p batch['input_ids'].shape",
    "mldebug attach --rank 3 --eval 'step'                  # rank 3 on this node, one value",
    "mldebug attach --slurm-job 12345 --rank 3 --eval 'step' --json",
    "mldebug attach --hosts node[01-04] --rank 5 --eval 'len(batch)'",
    "mldebug attach --slurm-job 12345 --rank 3                # the prompt here, the debugger on rank 3's node",
)


def register(app: typer.Typer) -> None:
    from ml_debug.cli.params import command

    command(app, "attach", attach, help=HELP, examples=EXAMPLES, opts=AttachOptions, targets=TargetOptions)


def attach(opts: AttachOptions, targets: TargetOptions) -> int:
    from ml_debug.core import output
    from ml_debug.core.errors import MLDebugError
    from ml_debug.debugger.render import render
    from ml_debug.debugger.result import SCHEMA, SCHEMA_VERSION

    if opts.dap_agent:  # the rank's node, for a prompt elsewhere: stdout carries DAP, not a document
        from ml_debug.debugger.agent import serve

        return serve(opts)
    prompt = None
    if opts.eval is None and not output.MODE.json:
        from ml_debug.core.visible import visible
        from ml_debug.debugger.prompt import run_prompt

        def write(text: str) -> None:  # every line of the prompt: a job's string shown, never obeyed
            print(visible(text, keep="\n"), flush=True)

        def prompt(s: Session, r: AttachResult) -> None:
            run_prompt(s, r, input, write)
    if targets.remote:
        from ml_debug.debugger.remote import attach_remote, prompt_remote

        spec = targets.resolve()
        # the prompt: here, on the user's terminal, with the debugger on the rank's node
        result = prompt_remote(opts, spec, prompt) if prompt is not None else attach_remote(opts, spec)
    else:
        from ml_debug.debugger.run import attach_local, failed

        try:
            result = attach_local(opts, prompt=prompt)
        except MLDebugError as e:
            if not output.MODE.json:
                raise
            result = failed(opts, e)  # the document says why: a remote caller reads it
    # After the prompt the person has seen the process: only the detach is left to say.
    output.emit(SCHEMA, SCHEMA_VERSION, result, lambda console: render(result, console, brief=prompt is not None))
    if result.hint and not result.ok:
        output.log(f"hint: {result.hint}")
    return result.exit_code
