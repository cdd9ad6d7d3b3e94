"""`mldebug health`: GPU and host health checks with verdicts, on this node or many."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from ml_debug.cli import targets as tg
from ml_debug.cli.options import Json, OutDir

if TYPE_CHECKING:
    from ml_debug.health.runner import HealthOptions

HELP = """Is the hardware healthy? NVML checks (ECC, row remapping, throttling, temperature, power,
PCIe, NVLink, leftover processes, Xid events), host checks (swap, D-state processes, /dev/shm,
open-file limit, disk and inodes, clock sync, CPU governor) and, with --level 2/3, a matmul
stress test with result checking, a memory pattern test and copy bandwidth, flagging the GPU
slower than the median of its identical siblings.

Exit codes: 0 healthy (also a node without NVIDIA GPU when none was expected); 1 a check
failed; 3 --expect-gpus N>0 or --require-gpu but no NVIDIA GPU; 4 some nodes never answered."""

PANEL_TESTS = "Tests"


def health(
    level: Annotated[int, typer.Option("--level", "-l", min=1, max=3, rich_help_panel=PANEL_TESTS,
                                       help="1 quick checks (seconds); 2 adds matmul stress, memory pattern "
                                            "and copy bandwidth tests (~1 min); 3 longer stress.")] = 1,
    expect_gpus: Annotated[int | None, typer.Option("--expect-gpus", min=0, metavar="N", rich_help_panel=PANEL_TESTS,
                                                    help="GPUs this node must have; fewer fails, none exits 3.")] = None,
    require_gpu: Annotated[bool, typer.Option("--require-gpu", rich_help_panel=PANEL_TESTS,
                                              help="Exit 3 when there is no NVIDIA GPU.")] = False,
    path: Annotated[list[str] | None, typer.Option("--path", metavar="DIR", rich_help_panel=PANEL_TESTS,
                                                   help="Check free disk and inodes here (repeatable; default: "
                                                        "the working directory and the temp dir).")] = None,
    stress_seconds: Annotated[float | None, typer.Option("--stress-seconds", min=0.1, rich_help_panel=PANEL_TESTS,
                                                         help="Matmul stress per GPU (default: 15 at level 2, "
                                                              "120 at level 3, 5 on CPU).")] = None,
    memtest_fraction: Annotated[float | None, typer.Option("--memtest-fraction", rich_help_panel=PANEL_TESTS,
                                                           help="Share of free GPU memory the pattern test "
                                                                "covers (default 0.5 at level 2, 0.9 at 3).")] = None,
    dtype: Annotated[str, typer.Option("--dtype", rich_help_panel=PANEL_TESTS,
                                       help="Matmul dtype on GPU: bfloat16, float16, float32.")] = "bfloat16",
    matmul_size: Annotated[int | None, typer.Option("--matmul-size", min=16, metavar="N", rich_help_panel=PANEL_TESTS,
                                                    help="Square matmul size (default 8192 on GPU, 1024 on CPU).")] = None,
    no_cpu_stress: Annotated[bool, typer.Option("--no-cpu-stress", rich_help_panel=PANEL_TESTS,
                                                help="Without a GPU, skip the CPU matmul stress at level >= 2.")] = False,
    outlier_pct: Annotated[float, typer.Option("--outlier-pct", min=0.1, max=90, rich_help_panel=PANEL_TESTS,
                                               help="Fail a GPU this % below the median of identical GPUs.")] = 10.0,
    corrected_ecc_max: Annotated[int, typer.Option("--corrected-ecc-max", min=0, rich_help_panel=PANEL_TESTS,
                                                   help="Warn above this many volatile corrected ECC errors.")] = 1000,
    brief: Annotated[bool, typer.Option("--brief", help="Show only the rows that are not PASS/INFO/SKIP.")] = False,
    json_: Json = False,
    out_dir: OutDir = None,
    timeout: Annotated[float | None, typer.Option("--timeout", min=1, metavar="SECONDS",
                                                  help="Per node with --hosts/--slurm-job (default: 120 s at level 1, "
                                                       "more with the stress time).")] = None,
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
) -> None:
    from ml_debug.cli.options import use_json
    from ml_debug.core import output
    from ml_debug.health.gpu_checks import Thresholds
    from ml_debug.health.runner import HealthOptions

    as_json = use_json(json_)
    opts = HealthOptions(level=level, expect_gpus=expect_gpus, require_gpu=require_gpu, paths=path,
                         thresholds=Thresholds(corrected_ecc_max=corrected_ecc_max, outlier_pct=outlier_pct),
                         stress_seconds=stress_seconds, memtest_fraction=memtest_fraction, dtype=dtype,
                         matmul_n=matmul_size, cpu_stress=not no_cpu_stress)
    opts.validate()
    if hosts is None and slurm_job is None:
        from ml_debug.core.output import to_jsonable
        from ml_debug.health.runner import run_local

        node = to_jsonable(run_local(opts))
        result = {"ok": node["ok"], "summary": node["summary"], "level": level, "exit_code": node["exit_code"],
                  "nodes": [node], "unreachable": [], "cluster_checks": []}
        if out_dir is not None:
            out_dir.mkdir(parents=True, exist_ok=True)
            (out_dir / "health.json").write_text(output.dumps(output.document("mldebug.health", 1, result)) + "\n")
    else:
        result = _run_many(opts, brief, out_dir, timeout, dict(
            hosts=hosts, slurm_job=slurm_job, local=local, ssh_config=ssh_config, identity=identity,
            insecure_no_host_key_check=insecure_no_host_key_check, connect_timeout=connect_timeout,
            remote_python=remote_python, remote_prefix=remote_prefix, max_parallel=max_parallel))

    def human(console: object) -> None:
        from ml_debug.health.render import draw

        draw(console, result, verbose=not brief)  # type: ignore[arg-type]

    output.emit("mldebug.health", 1, result, human, as_json=as_json)
    if result["exit_code"]:
        raise typer.Exit(result["exit_code"])


def _forward_args(opts: HealthOptions, paths: list[str] | None) -> list[str]:
    """The same health options for the nodes (each runs with --local --json)."""
    o = opts
    args = ["health", "--level", str(o.level), "--dtype", o.dtype,
            "--outlier-pct", str(o.thresholds.outlier_pct),
            "--corrected-ecc-max", str(o.thresholds.corrected_ecc_max)]
    if o.expect_gpus is not None:
        args += ["--expect-gpus", str(o.expect_gpus)]
    if o.require_gpu:
        args.append("--require-gpu")
    for p in paths or []:
        args += ["--path", p]
    for flag, value in (("--stress-seconds", o.stress_seconds), ("--memtest-fraction", o.memtest_fraction),
                        ("--matmul-size", o.matmul_n)):
        if value is not None:
            args += [flag, str(value)]
    if not o.cpu_stress:
        args.append("--no-cpu-stress")
    return args


def _run_many(opts: HealthOptions, brief: bool, out_dir: Path | None, timeout: float | None, target_opts: dict) -> dict:
    from ml_debug.core.output import log
    from ml_debug.health.cluster import merge
    from ml_debug.remote.runner import run_mldebug_everywhere

    spec = tg.resolve_targets(**target_opts)
    level = opts.level
    stress = opts.stress_seconds or {1: 0, 2: 15, 3: 120}[level]
    per_node = timeout or (120.0 + 4 * stress + (60 if level >= 2 else 0))
    log(f"mldebug health: level {level} on {len(spec.targets)} node(s), {per_node:.0f} s timeout per node")
    agents = run_mldebug_everywhere(spec, _forward_args(opts, opts.paths), timeout_s=per_node,
                                    out_dir=out_dir)
    return merge(agents, level, opts.thresholds.outlier_pct)


def register(app: typer.Typer) -> None:
    app.command("health", help=HELP)(health)
