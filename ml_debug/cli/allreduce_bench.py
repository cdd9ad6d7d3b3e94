"""`mldebug allreduce-bench`: collective bandwidth like nccl-tests, and the slow link named."""

from __future__ import annotations

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
from ml_debug.cli.options import Json

HELP = """Measure collective bandwidth (algbw, busbw) over a size sweep, with nccl-tests' definitions.

Alone it starts its own ranks (one per GPU, or 2 CPU ranks); it also runs under
`torchrun --nproc-per-node N --no-python mldebug allreduce-bench -- [options]`, srun and mpirun.
Every size is checked for wrong elements after timing; a straggler rank is named.
`--pairwise` measures every pair of nodes (or ranks) and names slow links and nodes.

Exit codes: 0 all good; 1 wrong data, a straggler, a slow link or busbw below --expect-busbw;
2 bad options; 3 something missing (matplotlib for --plot, a GPU for --backend nccl);
4 some ranks never answered."""



def register(app: typer.Typer) -> None:
    @app.command("allreduce-bench", help=HELP, no_args_is_help=False)
    def allreduce_bench(
        collective: Annotated[str, typer.Option(
            "--collective", "-C", help="all_reduce, all_gather, reduce_scatter, broadcast, reduce, all_to_all, "
            "sendrecv (ring: send to rank+1, receive from rank-1); comma-separated, or all.")] = "all_reduce",
        min_bytes: Annotated[str | None, typer.Option(
            "--min-bytes", "-b", metavar="SIZE", help="Smallest size, binary K/M/G suffixes "
            "(default 1K; --quick 256K on CPU, 1M on GPU).")] = None,
        max_bytes: Annotated[str | None, typer.Option(
            "--max-bytes", "-e", metavar="SIZE", help="Largest size (default 16M on CPU, 1G on GPU; capped to "
            "what fits in memory, with a note). With --pairwise: the exchange size (default 4M CPU, 256M GPU).")] = None,
        step_factor: Annotated[str | None, typer.Option(
            "--step-factor", "-f", metavar="F", help="Multiply the size by F each step (default 2).")] = None,
        iters: Annotated[int | None, typer.Option(
            "--iters", "-n", min=1, help="Timed iterations per size (default 20; --quick 5).")] = None,
        warmup: Annotated[int | None, typer.Option(
            "--warmup", "-w", min=0, help="Untimed iterations before each size (default 5; --quick 2).")] = None,
        dtype: Annotated[str, typer.Option(
            "--dtype", "-d", help="float32, float16, bfloat16, float64, int32, int64, int8, uint8.")] = "float32",
        op: Annotated[str, typer.Option(
            "--op", "-o", help="Reduction for all_reduce/reduce/reduce_scatter: sum, prod, max, min, avg.")] = "sum",
        root: Annotated[int, typer.Option("--root", "-r", min=0, help="Root rank of broadcast and reduce.")] = 0,
        average: Annotated[str, typer.Option(
            "--average", "-a", help="How the table's time combines ranks (nccl-tests -a): avg (default, as "
            "nccl-tests), max, min, rank0. Each rank's own time is always in the JSON.")] = "avg",
        check: Annotated[bool, typer.Option(
            "--check/--no-check", help="Verify every element after timing (#wrong).")] = True,
        quick: Annotated[bool, typer.Option(
            "--quick", help="A few sizes and iterations: a health check in seconds (used by mldebug check).")] = False,
        pairwise: Annotated[bool, typer.Option(
            "--pairwise", help="Measure every pair of nodes (or of ranks on one node) instead of a sweep.")] = False,
        slow_threshold: Annotated[float, typer.Option(
            "--slow-threshold", min=0.0, max=1.0,
            help="--pairwise: a link or node is slow below the median by more than this fraction.")] = 0.3,
        straggler_threshold: Annotated[float, typer.Option(
            "--straggler-threshold", min=0.0,
            help="A rank is a straggler when its own time exceeds the others' median by more than this "
                 "fraction in more than half of the large sizes (sizes >= 1/8 of the largest).")] = 0.5,
        expect_busbw: Annotated[float | None, typer.Option(
            "--expect-busbw", min=0.0, metavar="GB/s",
            help="Fail (exit 1) when the average busbw over the large sizes is below this.")] = None,
        plot: Annotated[Path | None, typer.Option(
            "--plot", metavar="FILE.png", dir_okay=False,
            help="Write busbw vs size (or the --pairwise heatmap) as PNG. Needs mldebug[plot].")] = None,
        csv: Annotated[str | None, typer.Option(
            "--csv", metavar="FILE", help="Also write the rows as CSV; '-' prints CSV instead of the table.")] = None,
        timeout: Annotated[float, typer.Option(
            "--timeout", min=0.1, help="Seconds before init or any one collective gives up.")] = 120.0,
        nproc_per_node: NprocPerNode = None,
        nnodes: Nnodes = 1,
        node_rank: NodeRank = 0,
        master_addr: MasterAddr = None,
        master_port: MasterPort = None,
        backend: Backend = "auto",
        device: Device = "auto",
        json: Json = False,
    ) -> None:
        from ml_debug.bench import bandwidth as bw
        from ml_debug.bench.faults import faults_from_env
        from ml_debug.bench.sweep import BenchConfig
        from ml_debug.cli.options import use_json
        from ml_debug.core.errors import UsageError

        as_json = use_json(json)
        # Every option is checked here, before any rank starts: a typo costs no launch.
        collectives = bw.parse_collectives(collective)
        dtype_name = bw.parse_dtype(dtype)
        op_name = bw.parse_op(op)
        if op_name == "avg" and bw.DTYPES[dtype_name][2] is None:
            raise UsageError(f"--op avg needs a floating-point dtype, not {dtype_name}",
                             "use --dtype float32 (or bfloat16/float16), or --op sum")
        if average not in bw.AVERAGES:
            raise UsageError(f"unknown --average {average!r}", f"choose one of: {', '.join(bw.AVERAGES)}")
        lo = bw.parse_size(min_bytes, "--min-bytes") if min_bytes is not None else None
        hi = bw.parse_size(max_bytes, "--max-bytes") if max_bytes is not None else None
        factor = bw.parse_factor(step_factor) if step_factor is not None else None
        if lo is not None and hi is not None:
            bw.sweep(lo, hi, factor or 2.0)  # min > max and friends fail here
        if csv == "-" and as_json:
            raise UsageError("--csv - and --json both want stdout", "give --csv a file name, or drop --json")
        if plot is not None:
            from ml_debug.bench.plot import require_matplotlib

            require_matplotlib()
            if plot.suffix.lower() != ".png":
                raise UsageError(f"--plot {plot} must end in .png", "e.g. --plot busbw.png")
        faults = faults_from_env()
        cfg = BenchConfig(collectives=collectives, min_bytes=lo, max_bytes=hi, step_factor=factor, iters=iters,
                          warmup=warmup, dtype=dtype_name, op=op_name, root=root, average=average, check=check,
                          quick=quick, pairwise=pairwise, straggler_threshold=straggler_threshold,
                          slow_threshold=slow_threshold, expect_busbw=expect_busbw, faults=faults)

        from ml_debug.dist import is_launched

        if not is_launched():
            worker = ["allreduce-bench", "--collective", ",".join(collectives), "--dtype", dtype_name, "--op",
                      op_name, "--root", str(root), "--average", average,
                      "--slow-threshold", repr(slow_threshold), "--straggler-threshold", repr(straggler_threshold),
                      "--timeout", repr(timeout), "--backend", backend, "--device", device]
            for flag, value in (("--min-bytes", lo), ("--max-bytes", hi), ("--step-factor", factor),
                                ("--iters", iters), ("--warmup", warmup), ("--expect-busbw", expect_busbw),
                                ("--plot", str(plot.resolve()) if plot else None), ("--csv", csv)):
                if value is not None:
                    worker += [flag, str(value)]
            worker += ["--check" if check else "--no-check"] + (["--quick"] if quick else []) + (
                ["--pairwise"] if pairwise else []) + (["--json"] if as_json else [])
            code = _self_launch(worker, nproc_per_node, nnodes, node_rank, master_addr, master_port,
                                backend, device, timeout)
            if code:
                raise typer.Exit(code)
            return

        code = _run_rank(cfg, backend, device, timeout, plot, csv, as_json)
        if code:
            raise typer.Exit(code)


def _self_launch(argv: list[str], nproc: int | None, nnodes: int, node_rank: int, master_addr: str | None,
                 master_port: int | None, backend: str, device: str, timeout: float) -> int:
    from ml_debug.core import output
    from ml_debug.core.errors import ExitCode
    from ml_debug.dist import LaunchSpec, launch

    if nproc is None:
        gpus = 0
        if device.lower() != "cpu" and backend.lower() != "gloo":
            from ml_debug.dist.device import visible_gpus

            gpus = visible_gpus()
        nproc = gpus or 2
    result = launch(argv, LaunchSpec(nproc_per_node=nproc, nnodes=nnodes, node_rank=node_rank,
                                     master_addr=master_addr, master_port=master_port,
                                     rdzv_timeout_s=max(timeout, 30.0)))
    code = result.code
    if code == ExitCode.PARTIAL:
        missing = sorted(r for r, c in result.exit_codes.items() if c < 0)
        output.warn("some ranks did not finish" + (f" (killed: {missing})" if missing else "")
                    + ("; the run timed out" if result.timed_out else ""))
    return int(code)


def _run_rank(cfg: object, backend: str, device: str, timeout: float, plot: Path | None, csv: str | None,
              as_json: bool) -> int:
    """One rank's part under a launcher; rank 0 reports. Returns this rank's exit code."""
    import sys

    from ml_debug.bench.sweep import SCHEMA, SCHEMA_VERSION, BenchConfig
    from ml_debug.core import output
    from ml_debug.core.errors import UsageError
    from ml_debug.dist import choose_device, detect_world, distributed

    assert isinstance(cfg, BenchConfig)
    world = detect_world()
    if not 0 <= cfg.root < world.world_size:
        raise UsageError(f"--root {cfg.root} is outside the {world.world_size} ranks", "use 0 .. world size - 1")
    choice = choose_device(world, device, backend)
    with distributed(world, choice, timeout):
        if cfg.pairwise:
            from ml_debug.bench.pairwise import run_pairwise

            result = run_pairwise(cfg, world, choice.device, choice.backend)
        else:
            from ml_debug.bench.sweep import run_sweep

            result = run_sweep(cfg, world, choice.device, choice.backend)
    if world.rank != 0:
        return 0 if result.ok else 1

    from ml_debug.bench.report import render, to_csv
    from ml_debug.core.environment import summary

    env = summary()
    if plot is not None:
        from ml_debug.bench.plot import plot as draw

        draw(result, plot)
        result.notes.append(f"plot written to {plot}")
    if csv is not None:
        text = to_csv(result)
        if csv == "-":
            sys.stdout.write(text)
            sys.stdout.flush()
        else:
            Path(csv).write_text(text)
            result.notes.append(f"CSV written to {csv}")
    if csv != "-":
        output.emit(SCHEMA, SCHEMA_VERSION, result, lambda console: render(result, env, console),
                    environment=env, as_json=as_json)
    return 0 if result.ok else 1
