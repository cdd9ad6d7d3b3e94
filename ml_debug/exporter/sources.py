"""Where the exporter's values come from: the node sampler of `mldebug top`, the stall and straggler
decisions of `mldebug watch` and the checks of `mldebug health`.

This is the one module of the exporter that imports those packages, so that when they move (the node
sampler into a services layer) only these imports change. Nothing here decides anything: the
exporter reuses their code as it is.
"""

from __future__ import annotations

from typing import Any

from ml_debug.exporter.options import ExporterOptions

NODE_LABEL = "local"
"""The one node a Tracker is fed by the exporter: this one."""


def make_sampler(opts: ExporterOptions) -> Any:
    """The node sampler `mldebug top` and `mldebug watch --local` use, with --pid honoured as watch does."""
    from ml_debug.sampling.options import SamplerOptions
    from ml_debug.sampling.sampler import NodeSampler

    sampling = SamplerOptions(interval=opts.interval, progress_files=list(opts.progress_files), pattern=opts.pattern,
                              user=opts.user, env=list(opts.env))
    return NodeSampler(sampling, pids=opts.pids)


def make_tracker(opts: ExporterOptions) -> Any:
    """`mldebug watch`'s Tracker. Its own --grace counts from the watch's start; the exporter runs for
    days, so the grace is applied per rank instead (:mod:`ml_debug.exporter.result`), and the Tracker judges
    from the start."""
    from ml_debug.watch.verdict import Tracker

    return Tracker(stall=opts.stall, grace=0.0, straggler_factor=opts.straggler_factor, interval=opts.interval,
                   node_timeout=max(60.0, 3 * opts.interval))


def run_health(opts: ExporterOptions) -> Any:
    """One run of the node's level 1 health checks: ``mldebug health --local`` (a NodeReport)."""
    from ml_debug.health.options import HealthOptions
    from ml_debug.health.run import run_local

    return run_local(HealthOptions(level=1, expect_gpus=opts.expect_gpus, paths=list(opts.paths)))


def is_exited(status: str) -> bool:
    """A Tracker status for a rank that has no live process (its series are dropped)."""
    return status in ("exited", "unknown")
