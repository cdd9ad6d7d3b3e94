"""`mldebug exporter`: node health and job progress as Prometheus metrics, where operators already look."""

from __future__ import annotations

import typer

from ml_debug.exporter.options import ExporterOptions

HELP = """Serve this node's health and its jobs' progress as Prometheus metrics (/metrics).

Per rank process of a job on this node: its step and step rate (--progress-file), seconds since its
last progress, whether it is stalled or a straggler (the decisions of `mldebug watch`, made by the
same code), its CPU and GPU utilisation. Per GPU and check: the verdicts of `mldebug health --level
1`, Xid counts, ECC and row-remap counters, throttle reasons, PCIe and NVLink state, refreshed every
--health-interval in the background: a scrape always gets the last values at once, and a health run
that hangs is reported as hung. Alert rules, a Grafana dashboard, a Slurm template and a systemd
unit ship in deploy/ and slurm/.

Exit codes: 0 stopped by SIGTERM; 2 bad usage (--listen not an address, its port in use);
130 interrupted. With --once: 0 nothing wrong; 1 a rank stalled or a straggler, or a check failed;
4 the health checks did not return in --health-timeout."""

EXAMPLES = (
    "mldebug exporter                                          # http://127.0.0.1:9477/metrics",
    "mldebug exporter --listen 0.0.0.0:9477 --progress-file '/scratch/run/metrics/rank-{rank}.jsonl'",
    "mldebug exporter --env SLURM_JOB_ID=12345 --stall 600     # one job among several",
    "mldebug exporter --once | grep mldebug_rank_stalled",
)


def register(app: typer.Typer) -> None:
    from ml_debug.cli.params import command

    command(app, "exporter", exporter, help=HELP, examples=EXAMPLES, opts=ExporterOptions)


def exporter(opts: ExporterOptions) -> int:
    from ml_debug.core.extras import require

    require("prometheus_client", "mldebug exporter")  # before the samplers start, not at the first scrape
    from ml_debug.exporter.run import once, serve

    return once(opts) if opts.once else serve(opts)
