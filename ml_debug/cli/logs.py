"""`mldebug logs`: which rank failed first, and why, from the logs of every rank."""

from __future__ import annotations

import typer

from ml_debug.logs.options import LogsOptions
from ml_debug.postmortem.options import PostmortemOptions

HELP = """Read a job's logs and name the rank that failed first, and why.

Reads every rank's lines from the common shapes: `srun --label` consoles, torchrun --tee/--role
prefixes, torchrun --log-dir trees and their error.json files, `mldebug launch` directories,
per-rank files (*rank*N*), mldebug train metrics, a container runtime's files (/var/log/pods, Docker's
*-json.log); compressed files (.gz .xz .bz2 .zst .lz4), archives (.tar.gz
.zip ...) and - (standard input) too.
Failures are classed: a rank whose error is a consequence of a peer (connection reset or closed,
broken pipe, NCCL watchdog or gloo timeout, stopped by torchrun's SIGTERM) is secondary; the first
other failure (an exception, a CUDA error, an out-of-memory, a crash by signal) is the verdict.
Then: identical tracebacks with their rank sets, a timeline, and what NCCL_DEBUG=INFO lines say
(version, transports, rings and trees, slow-path causes such as sockets instead of InfiniBand).

With --slurm-job J, no path is needed: the job's output files, the torchrun and `mldebug launch`
log directories under its WorkDir, its Slurm accounting (sacct per step and node), the kernel logs of
its nodes since it started (Xid, the OOM killer, segfaults, hung tasks) and its Flight Recorder dumps
(nccl_trace_rank_N, fr-N.json, --fr-prefix) feed one verdict that says where the sources disagree.
Flight Recorder dumps among the paths are read the same way without --slurm-job.

Exit codes: 0 no failure found; 1 a failure found (named in the first line); 2 no logs to read,
bad options, or no line of the given --rank/--node; 4 no failure found but some files (or a node's
kernel log) could not be read."""

EXAMPLES = (
    "mldebug logs slurm-12345.out",
    "mldebug logs mldebug-logs/               # what `mldebug launch` wrote",
    "mldebug logs /tmp/torchelastic_x/ 'logs/*.log.gz'",
    "mldebug logs job.log --rank 37           # rank 37's own lines, labels removed",
    "srun --label python train.py 2>&1 | mldebug logs -",
    "mldebug logs --slurm-job 12345          # everything the job left, from its id alone",
    "mldebug logs /scratch/fr/ --fr-prefix /scratch/fr/trace_   # Flight Recorder dumps",
)


def register(app: typer.Typer) -> None:
    from ml_debug.cli.params import command

    command(app, "logs", logs, help=HELP, examples=EXAMPLES, opts=LogsOptions, pm=PostmortemOptions)


def logs(opts: LogsOptions, pm: PostmortemOptions | None = None) -> int:
    from ml_debug.core import output
    from ml_debug.core.errors import ExitCode, UsageError
    from ml_debug.logs.render import render
    from ml_debug.logs.result import SCHEMA, SCHEMA_VERSION
    from ml_debug.logs.triage import triage

    if pm is not None and (pm.wanted or _has_dumps(opts, pm)):
        from ml_debug.cli.logs_postmortem import postmortem

        return postmortem(opts, pm)
    if not opts.paths:
        raise UsageError("no logs given", "mldebug logs PATH... (files, directories, globs, or - for standard input)"
                         " or --slurm-job ID")
    if opts.rank is not None or opts.node is not None:
        return _demux(opts)
    if opts.html is not None:
        from ml_debug.page.build import check_target

        check_target("--html", opts.html)
    with output.progress(None, "reading logs") as bar:
        report = triage(list(opts.paths), jobs=opts.jobs,
                        on_source=lambda i, n: bar.advance(1, f"reading logs ({i + 1}/{n})"))
    output.emit(SCHEMA, SCHEMA_VERSION, report,
                lambda console: render(report, console, full=opts.full, tracebacks=opts.tracebacks))
    if opts.html is not None:
        from ml_debug.page.build import logs_page, write_logged

        write_logged("--html", opts.html, logs_page(report))
    if report.verdict.failed:
        from ml_debug.cli.history import record_logs_incident

        record_logs_incident(report, list(opts.paths))
        return ExitCode.PROBLEM
    return ExitCode.PARTIAL if report.skipped else ExitCode.OK


def _has_dumps(opts: LogsOptions, pm: PostmortemOptions) -> bool:
    """Flight Recorder dumps among the paths (by name, prefix or content, or named so in an archive) make the run a
    post-mortem."""
    if opts.rank is not None or opts.node is not None or not opts.paths:
        return False
    from ml_debug.postmortem.frdumps import find, in_archives

    paths = [p for p in opts.paths if p != "-"]
    return bool(find(paths, prefix=pm.fr_prefix)) or in_archives(paths, pm.fr_prefix)


def _demux(opts: LogsOptions) -> int:
    import os
    import sys

    from ml_debug.core import output
    from ml_debug.core.errors import UsageError
    from ml_debug.core.visible import visible
    from ml_debug.logs.result import SCHEMA, SCHEMA_VERSION
    from ml_debug.logs.triage import MAX_DEMUX_LINES, demux

    lines: list[dict[str, object]] = []
    # like tail: a "==> file <==" header where the lines may come from several files
    several = len(opts.paths) > 1 or any(p != "-" and not os.path.isfile(p) for p in opts.paths)
    shown: list[str] = []

    def emit(source: str, line: int, text: str) -> None:
        if output.MODE.json:
            lines.append({"source": source, "line": line, "text": text})
            return
        if several and (not shown or shown[-1] != source):
            sys.stdout.write(f"==> {visible(source)} <==\n")
            shown.append(source)
        sys.stdout.write(visible(text, keep="\t") + "\n")  # a job's \r, \b, ESC, U+009B shown, not obeyed

    # the text view streams every line; a JSON document is built in memory, so it holds at most a bound
    got = demux(list(opts.paths), rank=opts.rank, node=opts.node, emit=emit, jobs=opts.jobs,
                limit=MAX_DEMUX_LINES if output.MODE.json else None)
    if not got["lines"]:
        raise UsageError(f"no line of {who_of(opts)} in {' '.join(opts.paths)}",
                         f"ranks seen: {got['ranks_seen'] or 'none'}; nodes: {', '.join(got['nodes']) or 'none'}")
    if output.MODE.json:
        summary = f"{len(lines)} line(s) of {who_of(opts)}"
        if got["truncated"]:
            cut = (f"only the first {len(lines)} line(s) of {who_of(opts)} are in the JSON document; "
                   f"the text view (without --json) streams them all")
            output.warn(cut)
            summary += f" (TRUNCATED: {cut})"
        output.emit(SCHEMA, SCHEMA_VERSION, {"ok": True, "summary": summary,
                                             "demux": {**got, "text": lines}})
    sys.stdout.flush()
    return 0


def who_of(opts: LogsOptions) -> str:
    """'rank 3', 'node n1', or both: the writer --rank/--node picks."""
    return " ".join(x for x in (f"rank {opts.rank}" if opts.rank is not None else "",
                                f"node {opts.node}" if opts.node else "") if x)
