"""`mldebug exec`: run a plain command on many nodes (pdsh / clush, with reasons and timeouts)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from ml_debug.cli import options as opt
from ml_debug.cli import targets as tg

HELP = """Run a command on every target and show each node's output, prefixed [host].

\b
  mldebug exec --hosts 'node[01-16]' -- nvidia-smi -L
  mldebug exec --slurm-job 12345 --group -- python -c 'import torch; print(torch.__version__)'
  mldebug exec --hosts hostfile --json -- uptime

Put the command after `--`. Its arguments are quoted for the remote shell, so `;`, `$()` and
quotes reach the command literally. Exit codes: 0 every node exited 0; 1 the command failed on
some node; 4 some node was unreachable, refused us, or timed out; 2 bad input."""


def register(app: typer.Typer) -> None:
    app.command("exec", help=HELP, no_args_is_help=True)(exec_command)


def exec_command(
    command: Annotated[list[str], typer.Argument(metavar="CMD...", show_default=False,
                                                 help="The command and its arguments.")],
    hosts: tg.Hosts = None,
    slurm_job: tg.SlurmJob = None,
    local: tg.Local = False,
    ssh_config: tg.SshConfig = None,
    identity: tg.Identity = None,
    insecure_no_host_key_check: tg.InsecureNoHostKeyCheck = False,
    connect_timeout: tg.ConnectTimeout = 10.0,
    remote_python: tg.RemotePython = None,
    remote_prefix: tg.RemotePrefix = None,
    max_parallel: tg.MaxParallel = 64,
    timeout: opt.Timeout = 60.0,
    group: Annotated[bool, typer.Option("--group", "-g",
                                        help="Group nodes with identical output (like dshbak -c) "
                                             "instead of printing lines as they arrive.")] = False,
    out_dir: opt.OutDir = None,
    json_flag: opt.Json = False,
) -> None:
    from ml_debug.core import output
    from ml_debug.remote import execview
    from ml_debug.remote.runner import run_everywhere

    as_json = opt.use_json(json_flag)
    spec = tg.resolve_targets(hosts=hosts, slurm_job=slurm_job, local=local, ssh_config=ssh_config,
                              identity=identity, insecure_no_host_key_check=insecure_no_host_key_check,
                              connect_timeout=connect_timeout, remote_python=remote_python,
                              remote_prefix=remote_prefix, max_parallel=max_parallel)
    stream = None if (as_json or group) else execview.print_prefixed
    results = run_everywhere(spec, command, timeout_s=timeout, out_dir=Path(out_dir) if out_dir else None,
                             on_result=stream)
    report = execview.build_report(spec, command, results)
    if as_json:
        output.emit("mldebug.exec", 1, report, as_json=True)
    else:
        if group:
            execview.print_grouped(results)
        execview.print_summary(report)
    code = execview.exit_code(results)
    if code:
        raise typer.Exit(code)
