"""`mldebug top` from options to output: one snapshot, a stream of snapshots, or the live view."""

from __future__ import annotations

import functools
import sys
import time
from collections.abc import Callable
from typing import Any

from ml_debug.core import output
from ml_debug.remote.targets import TargetSpec
from ml_debug.sampling.streams import Client
from ml_debug.top.options import TopOptions
from ml_debug.top.result import SCHEMA, SCHEMA_VERSION, snapshot

DumpFn = Callable[[str], dict[str, Any]]


def once(spec: TargetSpec, opts: TopOptions) -> dict[str, Any]:
    """One snapshot: every node's first sample, or "not answering" after --interval + --node-timeout."""
    with Client(spec, opts.sampler(), retry=False) as client:
        client.wait(client.all_first, client.started + opts.grace_s)
        with client.lock:
            return snapshot(client.feeds, spec, opts, started=client.started, final=True)


def stream_snapshots(spec: TargetSpec, opts: TopOptions, emit: Callable[[dict[str, Any]], None]) -> int:
    """``--count N`` (0: forever) snapshots, one per round; the exit code of the last one."""
    code = 0
    with Client(spec, opts.sampler(), retry=True) as client:
        client.wait(client.all_first, client.started + opts.grace_s)
        shown = 0
        while True:
            with client.lock:
                result = snapshot(client.feeds, spec, opts, started=client.started)
                seqs = {f.label: f.sample.seq for f in client.feeds if f.sample}
            emit(result)
            code = result["exit_code"]
            shown += 1
            if opts.count and shown >= opts.count:
                return code
            # the next round: every node's next sample, or one interval (a silent node is not waited for)
            client.wait(functools.partial(client.all_since, seqs), time.monotonic() + opts.interval + 0.5)


def run_top(spec: TargetSpec, opts: TopOptions, *, dump: DumpFn | None = None) -> int:
    """Show the job and return the exit code (see docs/commands/top.md)."""
    from ml_debug.top.render import LiveView, print_snapshot

    single = opts.once or opts.count == 1
    if single:
        result = once(spec, opts)
        output.emit(SCHEMA, SCHEMA_VERSION, result,
                    lambda console: print_snapshot(console, result, gpus=opts.gpus, ranks=opts.ranks, sort=opts.sort))
        return int(result["exit_code"])
    interactive = sys.stdout.isatty() and sys.stdin.isatty() and not output.MODE.json
    if not interactive:
        if output.MODE.json:
            from ml_debug.core.environment import summary

            env = summary()

            def emit(result: dict[str, Any]) -> None:  # one document per line (the stream's documented form)
                output.write_document(output.document(SCHEMA, SCHEMA_VERSION, result, env), compact=True)
        else:
            console = output.stdout_console()

            def emit(result: dict[str, Any]) -> None:
                print_snapshot(console, result, gpus=opts.gpus, ranks=opts.ranks, sort=opts.sort)
                console.print()
                sys.stdout.flush()
        return stream_snapshots(spec, opts, emit)

    with Client(spec, opts.sampler(), retry=True) as client:
        def current() -> dict[str, Any]:
            with client.lock:
                return snapshot(client.feeds, spec, opts, started=client.started)

        view = LiveView(current, interval=opts.interval, gpus=opts.gpus, ranks=opts.ranks, sort=opts.sort, dump=dump)
        return view.run(output.text_console(sys.stdout, highlight=False))  # job strings: control chars made visible
