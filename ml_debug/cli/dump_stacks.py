"""`mldebug dump-stacks`: every rank's stack on every node, merged, with the odd rank named."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from ml_debug.cli import targets as tg
from ml_debug.cli.options import Json, OutDir

SEL = "Which processes"
HOW = "How to dump"

HELP = """Dump the Python stack of every rank of a hung job and name the odd one out.

Finds the ranks (children of torchrun/deepspeed/accelerate/srun/mpirun, or --pid/--pattern/--user/--gpu),
dumps them all at once with py-spy (falling back to pystack, then gdb), groups identical stacks into a
tree with rank ranges and prints a verdict such as
"suspect: rank 3 (node2, pid 4242) in load_batch (data.py:88) while 3 ranks wait in all_reduce".


  mldebug dump-stacks                        # this node
  mldebug dump-stacks --hosts node[01-08]    # over ssh, each node dumps its own ranks
  mldebug dump-stacks --slurm-job 12345      # inside a Slurm job's allocation
  mldebug dump-stacks --samples 3            # stuck or still moving?

Exit codes: 0 no suspect; 1 a suspect named; 3 nothing could be attached (no py-spy, no ptrace
permission, no process found); 4 some processes or nodes were not dumped."""


def _parse_env(values: list[str] | None) -> dict[str, str]:
    out: dict[str, str] = {}
    for item in values or []:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise typer.BadParameter(f"{item!r} is not KEY=VALUE", param_hint="--env")
        out[key] = value
    return out


def dump_stacks(
    hosts: tg.Hosts = None,
    slurm_job: tg.SlurmJob = None,
    local: tg.Local = False,
    pid: Annotated[list[int] | None, typer.Option("--pid", rich_help_panel=SEL, metavar="PID",
                   help="Dump this process (repeatable); a launcher's pid means its ranks.")] = None,
    pattern: Annotated[str | None, typer.Option("--pattern", rich_help_panel=SEL, metavar="REGEX",
                       help="Dump processes whose command line matches (like pgrep -f).")] = None,
    user: Annotated[str | None, typer.Option("--user", rich_help_panel=SEL, metavar="USER",
                    help="Only processes of this user (name or uid).")] = None,
    gpu: Annotated[bool, typer.Option("--gpu", rich_help_panel=SEL,
                   help="Dump the processes holding a GPU (NVML; nvidia-smi --query-compute-apps=pid).")] = False,
    env: Annotated[list[str] | None, typer.Option("--env", rich_help_panel=SEL, metavar="KEY=VALUE",
                   help="Only processes whose environment has KEY=VALUE (repeatable), e.g. "
                        "--env SLURM_JOB_ID=123 to pick one job among several.")] = None,
    include_launcher: Annotated[bool, typer.Option("--include-launcher", rich_help_panel=SEL,
                                help="Dump the launchers (torchrun, ...) too.")] = False,
    world_size: Annotated[int | None, typer.Option("--world-size", min=1, rich_help_panel=SEL, metavar="N",
                          help="Expected number of ranks (default: WORLD_SIZE from the ranks' "
                               "environment); ranks not found are reported missing.")] = None,
    samples: Annotated[int, typer.Option("--samples", min=1, max=100, rich_help_panel=HOW, metavar="K",
                       help="Dump K times to tell stuck ranks (same stack) from moving ones.")] = 1,
    interval: Annotated[float, typer.Option("--interval", min=0.0, max=600.0, rich_help_panel=HOW, metavar="S",
                        help="Seconds from the start of one sample to the start of the next.")] = 1.0,
    native: Annotated[bool, typer.Option("--native", rich_help_panel=HOW,
                      help="Include C/C++ frames (py-spy --native; slower).")] = False,
    locals_: Annotated[bool, typer.Option("--locals", rich_help_panel=HOW,
                       help="Include local variables (py-spy --locals).")] = False,
    dumper: Annotated[str, typer.Option("--dumper", rich_help_panel=HOW, metavar="NAME",
                      help="auto (py-spy, then py-spy --nonblocking, pystack, gdb), py-spy, pystack or gdb.")
                      ] = "auto",
    timeout: Annotated[float, typer.Option("--timeout", min=0.5, rich_help_panel=HOW, metavar="S",
                       help="Seconds per py-spy/pystack attach before the next dumper is tried.")] = 10.0,
    gdb_timeout: Annotated[float, typer.Option("--gdb-timeout", min=1.0, rich_help_panel=HOW, metavar="S",
                           help="Seconds for gdb (it loads every library's symbols).")] = 60.0,
    flight_recorder: Annotated[bool, typer.Option("--flight-recorder/--no-flight-recorder", rich_help_panel=HOW,
                               help="Where a rank's environment allows it (MLDEBUG_FR_DIR with "
                                    "ml_debug.flight_recorder.enable(), or TORCH_NCCL_DEBUG_INFO_PIPE_FILE), "
                                    "trigger a PyTorch Flight Recorder dump and report each rank's last "
                                    "completed/enqueued collective.")] = True,
    fr_timeout: Annotated[float, typer.Option("--fr-timeout", min=0.1, rich_help_panel=HOW, metavar="S",
                          help="Seconds to wait for the Flight Recorder dumps.")] = 5.0,
    all_threads: Annotated[bool, typer.Option("--all-threads", help="Also list every thread (watchdog, "
                           "data loader, ...), not only the main thread.")] = False,
    full: Annotated[bool, typer.Option("--full", help="Show every frame in the tree (long chains are "
                    "shortened otherwise).")] = False,
    ssh_config: tg.SshConfig = None,
    identity: tg.Identity = None,
    insecure_no_host_key_check: tg.InsecureNoHostKeyCheck = False,
    connect_timeout: tg.ConnectTimeout = 10.0,
    remote_python: tg.RemotePython = None,
    remote_prefix: tg.RemotePrefix = None,
    max_parallel: tg.MaxParallel = 64,
    out_dir: OutDir = None,
    json_: Json = False,
) -> None:
    from ml_debug.cli.options import use_json

    as_json = use_json(json_)
    env_filter = _parse_env(env)
    spec = tg.resolve_targets(hosts=hosts, slurm_job=slurm_job, local=local, ssh_config=ssh_config,
                              identity=identity, insecure_no_host_key_check=insecure_no_host_key_check,
                              connect_timeout=connect_timeout, remote_python=remote_python,
                              remote_prefix=remote_prefix, max_parallel=max_parallel)
    from ml_debug.core import output
    from ml_debug.stacks.command import DumpRequest, dump_stacks_report
    from ml_debug.stacks.render import render
    from ml_debug.stacks.report import SCHEMA, SCHEMA_VERSION

    request = DumpRequest(pids=list(pid or []), pattern=pattern, user=user, gpu=gpu, env=env_filter,
                          include_launcher=include_launcher, world_size=world_size, samples=samples,
                          interval=interval, native=native, locals=locals_, dumper=dumper, timeout=timeout,
                          gdb_timeout=gdb_timeout, flight_recorder=flight_recorder, fr_timeout=fr_timeout)
    result = dump_stacks_report(spec, request, out_dir=Path(out_dir) if out_dir else None)
    output.emit(SCHEMA, SCHEMA_VERSION, result, lambda console: render(result, console, full=full,
                                                                        all_threads=all_threads),
                as_json=as_json)
    code = result["exit_code"]
    if code == 3 and result.get("hint"):
        output.log(f"hint: {result['hint']}")
    if code:
        raise typer.Exit(code)


def register(app: typer.Typer) -> None:
    app.command("dump-stacks", help=HELP, no_args_is_help=False)(dump_stacks)
