"""`mldebug exec`: run a plain command on many nodes (pdsh / clush, with reasons and timeouts)."""

from __future__ import annotations

import typer

from ml_debug.remote.exec_options import ExecOptions
from ml_debug.remote.options import TargetOptions

HELP = """Run a command on every target and show each node's output, prefixed [host].

Put the command after `--`. Its arguments are quoted for the remote shell, so `;`, `$()` and
quotes reach the command literally.

Exit codes: 0 every node exited 0; 1 the command failed on some node; 2 bad input (no command
given, a bad hostlist); 4 some node was unreachable, refused us, or timed out."""

EXAMPLES = (
    "mldebug exec --hosts 'node[01-16]' -- nvidia-smi -L",
    "mldebug exec --slurm-job 12345 --group -- python -c 'import torch; print(torch.__version__)'",
    "mldebug exec --hosts hostfile --json -- uptime",
)


def register(app: typer.Typer) -> None:
    from ml_debug.cli.params import command

    command(app, "exec", exec_command, help=HELP, examples=EXAMPLES, opts=ExecOptions, targets=TargetOptions)


def exec_command(opts: ExecOptions, targets: TargetOptions) -> int:
    from ml_debug.core import output
    from ml_debug.core.errors import UsageError
    from ml_debug.remote import exec_render
    from ml_debug.remote.result import Interrupted
    from ml_debug.remote.runner import run_everywhere

    if not opts.command:
        raise UsageError("no command to run", "put it after --: mldebug exec --hosts H -- uptime")
    spec = targets.resolve()
    as_json = output.MODE.json
    stream = None if (as_json or opts.group) else exec_render.print_prefixed
    try:
        results = run_everywhere(spec, opts.command, timeout_s=opts.timeout, out_dir=opts.out_dir, on_result=stream)
    except Interrupted as e:  # Ctrl-C: the report of what each node did and printed until then
        results = e.results
    report = exec_render.build_report(spec, opts.command, results)
    if as_json:
        output.emit("mldebug.exec", 1, report)
    else:
        if opts.group:
            exec_render.print_grouped(results)
        exec_render.print_summary(report)
    return exec_render.exit_code(results)
