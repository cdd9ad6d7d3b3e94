"""`mldebug train` throughput and MFU on one GPU: the 125m and 1b presets in bf16, fp8 (torchao
float8) and MX (our quantiser; emulated before Blackwell), each as the command a user runs.

    python benchmarks/gpu_train_mfu.py [--out FILE.json] [--budget-s 150] [--quick]

MFU = model FLOPs per token (6N + 12 L d T, torchtitan's) x tokens/s / the GPU's dense peak for the
numerics (bf16 peak for bf16, fp8 peak for fp8 and MX), median over the steps after the first, as
`mldebug train` reports it. Goal: bf16 MFU of the 1b preset on one H100 >= 40 %. Runs that would not
fit the time budget are skipped and listed, never cut off.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.gpu_common import Budget, Figure, Report, json_result, run, shell  # noqa: E402

# (preset, numerics, compiled, batch, seq, steps, seconds it needs on an H100 incl. start-up and 1b init)
RUNS = [
    ("1b", "bf16", False, 4, 2048, 12, 60),
    ("1b", "bf16", True, 4, 2048, 12, 100),
    ("125m", "bf16", False, 8, 1024, 12, 25),
    ("125m", "fp8", True, 8, 1024, 12, 70),
    ("1b", "fp8", True, 4, 2048, 12, 110),
    ("1b", "fp8", False, 4, 2048, 10, 70),
    ("125m", "fp8", False, 8, 1024, 10, 30),
    ("125m", "mx", False, 8, 1024, 6, 40),
    ("1b", "mx", False, 2, 2048, 4, 90),
]
QUICK = {("1b", "bf16", False), ("125m", "bf16", False)}


def run_name(preset: str, numerics: str, compiled: bool) -> str:
    return f"{preset}:{numerics}{':compile' if compiled else ''}"


def one(report: Report, preset: str, numerics: str, compiled: bool, batch: int, seq: int, steps: int,
        timeout: float) -> None:
    argv = [sys.executable, "-m", "ml_debug", "train", "--preset", preset, "--numerics", numerics,
            "--batch-size", str(batch), "--seq-len", str(seq), "--steps", str(steps), "--warmup-steps", "2",
            "--lr", "1e-3", "--stats-every", "0", "--log-every", "100", "--json", *(["--compile"] if compiled else [])]
    rc, out, err, took = run(argv, timeout)
    r = json_result(out)
    name = f"train {preset} {numerics}{' compiled' if compiled else ''} MFU (1 GPU, batch {batch}x{seq})"
    if r is None or rc != 0:
        report.error(f"{shell(argv)}: exit {rc}, {'no JSON' if r is None else r.get('summary')}: {err[-1500:]}")
        report.add(Figure(name, None, "", shell(argv), "", None, f"failed: exit {rc} after {took:.0f} s"))
        return
    goal, met = "", None
    if (preset, numerics) == ("1b", "bf16"):
        goal = ">= 40% on one H100"
        met = None if r["mfu"] is None else r["mfu"] >= 0.40
    detail = (f"{r['tokens_per_s']:,.0f} tok/s, {r['tflops']:.1f} model TFLOP/s, step {r['step_time_s'] * 1e3:.0f} ms, "
              f"loss {r['losses'][min(r['losses'], key=int)]:.3f} -> {r['final_loss']:.3f}, "
              f"{r['n_params'] / 1e6:.0f}M non-embedding params; run {took:.0f} s")
    report.add(Figure(name, None if r["mfu"] is None else r["mfu"], "of peak" if r["mfu"] is not None else "(no peak)",
                      shell(argv), goal, met, detail))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", help="write the figures as JSON here")
    ap.add_argument("--budget-s", type=float, default=300.0, help="stop starting new runs after this long")
    ap.add_argument("--quick", action="store_true", help="only the eager bf16 runs")
    ap.add_argument("--only", default="", metavar="RUN,...",
                    help="only these runs, in this order: PRESET:NUMERICS[:compile], e.g. 1b:bf16,125m:fp8:compile")
    args = ap.parse_args(argv)
    runs = RUNS
    if args.only:
        by_name = {run_name(*r[:3]): r for r in RUNS}
        unknown = [w for w in args.only.split(",") if w not in by_name]
        if unknown:
            ap.error(f"unknown run(s) {', '.join(unknown)}; known: {', '.join(by_name)}")
        runs = [by_name[w] for w in args.only.split(",")]
    report = Report("gpu_train_mfu")
    budget = Budget(args.budget_s)
    try:
        import torch
    except ImportError as e:
        report.error(f"torch is not importable: {e}")
        return report.write(args.out)
    if not torch.cuda.is_available():
        report.error("torch sees no CUDA device: nothing to measure")
        return report.write(args.out)
    skipped = []
    for preset, numerics, compiled, batch, seq, steps, need in runs:
        if args.quick and (preset, numerics, compiled) not in QUICK:
            continue
        if numerics == "fp8":
            try:
                import torchao  # noqa: F401
            except ImportError as e:
                report.note(f"skipped {preset} fp8: torchao is not installed ({e})")
                continue
        if not budget.allows(need):
            skipped.append(run_name(preset, numerics, compiled))
            continue
        one(report, preset, numerics, compiled, batch, seq, steps, min(budget.left() - 2, 3 * need))
    if skipped:
        report.note(f"skipped for the time budget: {', '.join(skipped)}")
    return report.write(args.out)


if __name__ == "__main__":
    sys.exit(main())
