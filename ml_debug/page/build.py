"""A command's page put together from its report, and the files written: what the CLI and the watch
bundle call (``--html FILE``, ``--speedscope FILE``, the bundle's ``incident.html``)."""

from __future__ import annotations

import json
import os
from typing import TYPE_CHECKING, Any

from ml_debug.page import flight, nodes, shell, stacks, timeline

if TYPE_CHECKING:
    from ml_debug.logs.result import LogsReport
    from ml_debug.stacks.verdict import DumpStacksResult

TONE = {0: "ok", 1: "problem", 3: "partial", 4: "partial"}


def check_target(flag: str, path: str | os.PathLike[str]) -> None:
    """Refuse (exit 2) a FILE that cannot be written, before any work is done."""
    from ml_debug.core import safefs
    from ml_debug.core.options import output_file

    output_file(flag, path)
    safefs.check_out_file(flag, path)


def write(flag: str, path: str | os.PathLike[str], text: str) -> str | None:
    """Write the page (or the export) the operator named; a note when a planted link was replaced."""
    from ml_debug.core import safefs
    from ml_debug.core.errors import UsageError

    try:
        return safefs.write_file(flag, path, text)
    except OSError as e:  # checked up front, yet refused now (/proc, a full disk): the report above stands
        raise UsageError(f"{flag} {path}: cannot write it: {e.strerror or e}",
                         "choose another path; the report was printed above") from None


def write_logged(flag: str, path: str | os.PathLike[str], text: str) -> None:
    """:func:`write`, saying on stderr where the file went (and what was replaced)."""
    from ml_debug.core import output

    note = write(flag, path, text)
    output.log(f"{flag}: wrote {path} ({len(text.encode()) / 1e6:.2f} MB)")
    if note:
        output.warn(note)


def stacks_page(result: DumpStacksResult, *, title: str = "mldebug dump-stacks", command: str = "dump-stacks",
                created: float | None = None) -> str:
    """The page of one dump-stacks result: the verdict, the merged tree, the Flight Recorder, the nodes."""
    dumped = sum(1 for p in result.processes if p.state != "not-dumped")
    facts = [f"{len(result.processes)} processes on {len(result.nodes)} node(s)", f"{dumped} dumped",
             f"{result.options.get('samples', 1)} sample(s)"]
    if result.missing_ranks:
        from ml_debug.core.ranges import compress

        facts.append(f"missing ranks {compress(result.missing_ranks)}")
    parts = stacks.sections(result)
    fr = flight.section(result.flight_recorder)
    if fr is not None:
        parts.insert(2, fr)
    return shell.render(shell.Page(title=title, command=command, verdict=result.summary,
                                   tone=TONE.get(int(result.exit_code), "partial"), facts=facts, sections=parts,
                                   created=created))


def logs_page(report: LogsReport, *, created: float | None = None) -> str:
    """The page of `mldebug logs`: the first failure, the timeline per node, the tracebacks."""
    v = report.verdict
    tone = "problem" if v.failed else "partial" if report.skipped else "ok"
    facts = [f"{len(report.sources)} source(s)", f"ranks {report.ranks_seen or '?'}",
             f"{len(report.nodes)} node(s)", *(f"launcher: {x}" for x in report.launchers[:3])]
    return shell.render(shell.Page(title="mldebug logs", command="logs", verdict=report.summary or v.summary,
                                   tone=tone, facts=facts, sections=timeline.sections(report), created=created))


def postmortem_page(report: LogsReport | None, postmortem: dict[str, Any], *, created: float | None = None) -> str:
    """The page of `mldebug logs` as a post-mortem (``--slurm-job``, or Flight Recorder dumps among the paths):
    the verdict over every source and what each one says, then the logs' timeline and tracebacks when logs were read,
    and the Flight Recorder's grid when dumps were."""
    from ml_debug.page.text import esc

    v = postmortem["verdict"]
    unread = postmortem.get("files_unreadable") or []
    tone = "problem" if v.get("failed") else "partial" if unread else "ok"
    facts = [f"job {postmortem['job_id']}" if postmortem.get("job_id") else "",
             f"named by {v['named_by']}" if v.get("named_by") else "",
             f"{len(postmortem.get('files_read') or [])} file(s) read", f"{len(unread)} not read" if unread else ""]
    said = "".join(f"<li><b>{esc(f['source'])}</b>: {esc(f['sentence'])}"
                   + (f" [rank {esc(f['rank'])}]" if f.get("rank") is not None else "")
                   + (f" [{esc(f['node'])}]" if f.get("node") else "") + "</li>" for f in v.get("findings") or [])
    said += "".join(f"<li><b>sources disagree</b>: {esc(d)}</li>" for d in v.get("disagreements") or [])
    said += "".join(f"<li><b>not read</b>: {esc(u['path'])}: {esc(u['reason'])}</li>" for u in unread[:50])
    parts = [shell.Section("sources", "What each source says", f"<ul>{said}</ul>" if said else
                           '<p class="dim">no source names a failure</p>')]
    if report is not None:
        parts += timeline.sections(report)
    fr = flight.section(postmortem.get("flight_recorder"))
    if fr is not None:
        parts.append(fr)
    return shell.render(shell.Page(title="mldebug logs: post-mortem", command="logs", verdict=str(v["summary"]),
                                   tone=tone, facts=[f for f in facts if f], sections=parts, created=created))


def incident_page(summary: dict[str, Any], result: DumpStacksResult | None, snapshot: dict[str, Any] | None,
                  health: dict[str, Any] | None, *, created: float | None = None) -> str:
    """The watch bundle's ``incident.html``: the bundle's sentence, the ranks as watched, the stacks, health."""
    incident = summary.get("incident") or {}
    facts = [f"incident: {incident.get('kind', '?')}", str(incident.get("detail") or "")]
    facts += [f"next: {n}" for n in (summary.get("next") or [])[:2]]
    parts = nodes.sections(snapshot, incident, None, summary.get("culprit"))
    if result is not None:
        parts += stacks.sections(result)
        fr = flight.section(result.flight_recorder)
        if fr is not None:
            parts.append(fr)
    parts += nodes.sections(None, incident, health)
    return shell.render(shell.Page(title="mldebug watch: incident", command="watch", verdict=str(summary["summary"]),
                                   tone="problem", facts=[f for f in facts if f], sections=parts, created=created))


def speedscope_text(result: DumpStacksResult) -> str:
    from ml_debug.page.speedscope import export

    return json.dumps(export(result), separators=(",", ":"), allow_nan=False) + "\n"
