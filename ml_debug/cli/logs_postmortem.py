"""`mldebug logs --slurm-job J` (and logs with Flight Recorder dumps among the paths): every source a job
left, one verdict (the library is :mod:`ml_debug.postmortem`)."""

from __future__ import annotations

import dataclasses

from ml_debug.logs.options import LogsOptions
from ml_debug.postmortem.options import PostmortemOptions


def postmortem(opts: LogsOptions, pm: PostmortemOptions) -> int:
    from ml_debug.core import output
    from ml_debug.core.errors import ExitCode
    from ml_debug.logs.render import render as render_logs
    from ml_debug.logs.result import SCHEMA, SCHEMA_VERSION
    from ml_debug.logs.triage import triage
    from ml_debug.postmortem.collect import run
    from ml_debug.postmortem.render import render

    if opts.rank is not None or opts.node is not None:
        return _demux(opts, pm)
    if opts.html is not None:
        from ml_debug.page.build import check_target

        check_target("--html", opts.html)
    with output.progress(None, "post-mortem") as bar:
        report, result = run(pm, list(opts.paths), lambda paths: triage(paths, jobs=opts.jobs),
                             on_step=lambda what: bar.advance(0, what))
    v = result.verdict
    summary = v.summary + (f"; {len(result.files_unreadable)} file(s) not read" if result.files_unreadable else "")
    if report is not None:
        doc = {**output.to_jsonable(report), "ok": not v.failed and not result.partial, "summary": summary,
               "postmortem": result.to_json()}
    else:
        doc = _empty_report(not v.failed and not result.partial, summary, result.to_json())

    def human(console: object) -> None:
        if report is not None:
            render_logs(report, console, full=opts.full, tracebacks=opts.tracebacks)  # type: ignore[arg-type]
        render(result, console)  # type: ignore[arg-type]

    output.emit(SCHEMA, SCHEMA_VERSION, doc, human)
    if opts.html is not None:
        from ml_debug.page.build import postmortem_page, write_logged

        write_logged("--html", opts.html, postmortem_page(report, output.to_jsonable(result.to_json())))
    if v.failed:
        _record(result, opts)
        return ExitCode.PROBLEM
    return ExitCode.PARTIAL if result.partial or (report is not None and report.skipped) else ExitCode.OK


def _empty_report(ok: bool, summary: str, block: dict[str, object]) -> dict[str, object]:
    """The logs' document when no log file could be read: an empty report, and the post-mortem."""
    from ml_debug.core.output import to_jsonable
    from ml_debug.logs.result import LogsReport, Verdict

    empty = LogsReport(verdict=Verdict(status="none", summary="no log file read"), sources=[], events=[],
                       tracebacks=[], timeline=[], ranks_seen="", world_size=None, nodes=[], progress={}, nccl=None)
    return {**to_jsonable(empty), "ok": ok, "summary": summary, "postmortem": block}


def _record(result: object, opts: LogsOptions) -> None:
    """The failed job into the node history, as `mldebug logs` records a run (named by its Slurm id)."""
    from ml_debug.core import output
    from ml_debug.history.store import record_incident
    from ml_debug.postmortem.collect import Postmortem

    assert isinstance(result, Postmortem)
    v = result.verdict
    nodes = list((result.slurm or {}).get("nodes") or []) + [f.node for f in v.findings if f.node]
    job = f"slurm:{result.job_id}" if result.job_id else ",".join(sorted(opts.paths))
    note = record_incident("logs", job, nodes, v.node, v.summary)
    if note:
        output.warn(f"logs: {note}")


def _demux(opts: LogsOptions, pm: PostmortemOptions) -> int:
    """--rank/--node with --slurm-job: that writer's lines in the files the job left."""
    from ml_debug.cli.logs import logs
    from ml_debug.postmortem import jobfiles
    from ml_debug.postmortem.collect import slurm_record

    paths = list(opts.paths)
    if pm.slurm_job:
        fields, acc, _ = slurm_record(pm.slurm_job)
        job = acc.job if acc else None
        jf = jobfiles.gather(pm.slurm_job, fields, acc.workdir if acc else None, job.start if job else None,
                             job.end if job else None)
        paths += jf.logs
    return logs(dataclasses.replace(opts, paths=paths), None)
