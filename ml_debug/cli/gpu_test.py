"""`mldebug gpu-test`: can every rank and GPU talk, and which one cannot."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Annotated

import typer

from ml_debug.cli.launch_options import (
    Backend,
    Device,
    MasterAddr,
    MasterPort,
    Nnodes,
    NodeRank,
    NprocPerNode,
)
from ml_debug.cli.options import Json, OutDir

SCHEMA = "mldebug.gpu-test"

HELP = """Check that every rank and GPU can talk: device, allocation, rendezvous, init, an all_reduce with an
exactly known sum, an all_gather of identities (two ranks on one GPU, wrong layout), broadcast, a p2p
ring and a barrier that names absent ranks. Every stage has a timeout; rank 0 prints one verdict.

Runs under torchrun (torchrun --nproc-per-node 8 --no-python mldebug gpu-test), srun (one task per
GPU) or mpirun; alone it launches one rank per visible GPU, or 2 CPU ranks without a GPU.
Exit: 0 all OK, 1 a stage failed, 4 some ranks never answered."""


def register(app: typer.Typer) -> None:
    app.command("gpu-test", help=HELP)(gpu_test)


def gpu_test(
    json_: Json = False,
    out_dir: OutDir = None,
    timeout: Annotated[float, typer.Option("--timeout", min=0.5, help="Seconds each stage may take on each rank.")] = 30.0,
    init_timeout: Annotated[float | None, typer.Option(
        "--init-timeout", min=0.5, help="Seconds for all ranks to check in and init the group (default: --timeout).")] = None,
    mem_gb: Annotated[float, typer.Option("--mem-gb", min=0.0, help="Also allocate and fill this many GiB per device.")] = 0.0,
    isolate: Annotated[bool, typer.Option("--isolate", help="Test every GPU alone, then in pairs, then the shifted "
                                          "pairs, to find one bad GPU or link (CPU: the same over rank slots).")] = False,
    nproc_per_node: NprocPerNode = None,
    nnodes: Nnodes = 1,
    node_rank: NodeRank = 0,
    master_addr: MasterAddr = None,
    master_port: MasterPort = None,
    backend: Backend = "auto",
    device: Device = "auto",
    report_to: Annotated[Path | None, typer.Option("--report-to", hidden=True,
                                                   help="Internal (--isolate): write the verdict document here.")] = None,
) -> None:
    from ml_debug.cli.options import use_json
    from ml_debug.core.errors import UsageError
    from ml_debug.dist.world import detect_world, is_launched

    as_json = use_json(json_)
    if is_launched():
        if isolate:
            raise UsageError("--isolate launches its own ranks and cannot run under torchrun/srun/mpirun",
                             "run `mldebug gpu-test --isolate` once per node, without a launcher")
        _run_as_rank(detect_world(), as_json, out_dir, timeout, init_timeout, mem_gb, backend, device, report_to)
        return
    _self_launch(as_json, out_dir, timeout, init_timeout, mem_gb, isolate, nproc_per_node, nnodes, node_rank,
                 master_addr, master_port, backend, device)


def _run_as_rank(world, as_json: bool, out_dir: Path | None, timeout: float, init_timeout: float | None,  # type: ignore[no-untyped-def]
                 mem_gb: float, backend: str, device: str, report_to: Path | None) -> None:
    from ml_debug.core import output
    from ml_debug.gputest.stages import GpuTestConfig, run_rank
    from ml_debug.gputest.view import render

    cfg = GpuTestConfig(timeout_s=timeout, init_timeout_s=init_timeout, mem_gb=mem_gb, device=device,
                        backend=backend, out_dir=out_dir)
    outcome = run_rank(cfg, world)
    result = outcome.result
    if result is not None:
        if report_to is not None or out_dir is not None:
            doc = output.dumps(output.document(SCHEMA, 1, result)) + "\n"
            for path in [p for p in (report_to, out_dir / "gpu-test.json" if out_dir else None) if p]:
                path.write_text(doc)
        if report_to is None:
            output.emit(SCHEMA, 1, result, lambda console: render(result, console), as_json=as_json)
    sys.stdout.flush()
    sys.stderr.flush()
    if world.world_size > 1 and not os.environ.get("MLDEBUG_LAUNCH_DIR"):
        # The verdict is out. Skip interpreter finalisation, where a gloo worker thread can still
        # abort the process (FIELD-NOTES "exit crash") and turn a clean result into rc 134.
        os._exit(outcome.exit_code)
    if outcome.exit_code:
        raise typer.Exit(outcome.exit_code)


def _self_launch(as_json: bool, out_dir: Path | None, timeout: float, init_timeout: float | None, mem_gb: float,
                 isolate: bool, nproc: int | None, nnodes: int, node_rank: int, master_addr: str | None,
                 master_port: int | None, backend: str, device: str) -> None:
    from ml_debug.core import output
    from ml_debug.dist.device import choose_device, visible_gpus
    from ml_debug.dist.launch import LaunchSpec, launch
    from ml_debug.dist.world import detect_world

    wants_cpu = device == "cpu" or (backend == "gloo" and device == "auto")
    gpus = 0 if wants_cpu else visible_gpus()
    choose_device(detect_world(), device, backend, gpu_count=gpus)  # bad options fail here, not in N ranks
    n = nproc or (gpus if gpus else 2)
    argv = ["--timeout", str(timeout), "--mem-gb", str(mem_gb), "--backend", backend, "--device", device]
    if init_timeout:
        argv += ["--init-timeout", str(init_timeout)]
    init_s = init_timeout or timeout
    run_timeout = init_s * 2 + (timeout + 5) * 8 + 60
    if isolate:
        from ml_debug.gputest.isolate import render, run_isolation, visible_members

        members = visible_members(n) if gpus else list(range(n))
        result = run_isolation(members, bool(gpus), argv, rdzv_timeout_s=max(30.0, init_s),
                               run_timeout_s=run_timeout)
        if out_dir is not None:
            out_dir.mkdir(parents=True, exist_ok=True)
            (out_dir / "gpu-test-isolate.json").write_text(output.dumps(output.document(SCHEMA, 1, result)) + "\n")
        output.emit(SCHEMA, 1, result, lambda console: render(result, console), as_json=as_json)
        if result.exit_code:
            raise typer.Exit(result.exit_code)
        return
    if out_dir is not None:
        argv += ["--out-dir", str(out_dir)]
    if as_json:
        argv.append("--json")
    spec = LaunchSpec(n, nnodes=nnodes, node_rank=node_rank, master_addr=master_addr, master_port=master_port,
                      rdzv_timeout_s=max(30.0, init_s) if nnodes > 1 else 30.0, run_timeout_s=run_timeout,
                      cpu_ranks=not gpus)
    launched = launch(["gpu-test", *argv], spec)
    if launched.timed_out:
        output.warn(f"gpu-test ranks did not finish within {run_timeout:g} s; they were stopped")
    if launched.code:
        raise typer.Exit(launched.code)
