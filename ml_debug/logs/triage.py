"""`mldebug logs` as a library call: read the sources, build the report; or one writer's lines."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any

from ml_debug.core import testhooks
from ml_debug.core.errors import UsageError
from ml_debug.core.ranges import compress
from ml_debug.core.ranges import expand as expand_ranks
from ml_debug.logs import accounting
from ml_debug.logs.catalogue import LAUNCHERS
from ml_debug.logs.ending import attempts, interrupted, launched, restarted, stopped, went_on
from ml_debug.logs.events import Collector
from ml_debug.logs.labels import split_label, strip_ansi
from ml_debug.logs.readers import read_all
from ml_debug.logs.result import JOB_KINDS, PRIMARY, LogsReport, SourceInfo, Who
from ml_debug.logs.scan import BLOCK, MAX_LINE, opened
from ml_debug.logs.sources import Expanded, Source, attempt_of, expand
from ml_debug.logs.text import few
from ml_debug.logs.verdict import collapse_tracebacks, decide, dedupe, placed, progress, timeline

MAX_DEMUX_LINES = 200_000  # the lines a JSON document of one rank's lines holds (built in memory)


@contextmanager
def _expanded(paths: list[str]) -> Iterator[Expanded]:
    """The sources of ``paths``, while they are read (an archive's unpacked files are removed afterwards)."""
    exp = expand(paths)
    try:
        if not exp.sources:
            why = "; ".join(f"{s['path']}: {s['reason']}" for s in exp.skipped[:3]) or "no log file under them"
            raise UsageError(f"no logs to read in {' '.join(paths)} ({why})",
                             "give log files, directories (searched for *.log *.out *.err *.txt error*.json *.jsonl, "
                             ".gz .xz .bz2 .zst .lz4 too), archives of them (.tar.gz, .zip), globs, or - for standard input")
        yield exp
    finally:
        exp.close()


def triage(paths: list[str], *, on_source: Callable[[int, int], None] | None = None,
           jobs: int | None = None) -> LogsReport:
    """Read every source once and name the first failure (see :mod:`ml_debug.logs`); ``jobs`` reader
    processes (None: one per CPU when the input is large, readers.py; 1: all in this process)."""
    with _expanded(paths) as exp:
        return build_report(*_collect(exp, on_source, jobs), exp.manifests)


def _collect(exp: Expanded, on_source: Callable[[int, int], None] | None = None, jobs: int | None = None
             ) -> tuple[Collector, list[SourceInfo], list[dict[str, Any]], list[dict[str, str]]]:
    collector, reads = read_all(exp, on_source, jobs=jobs)
    skipped = list(exp.skipped) + [r.skipped for r in reads if r.skipped is not None]
    metrics = [r.metrics for r in reads if r.metrics is not None]
    return collector, [r.info for r in reads], metrics, skipped


def _agreed(values: Iterable[object]) -> int | None:
    """The one number every `mldebug launch` manifest says, or None (they differ, or one does not say it)."""
    got = set(values)
    one = got.pop() if len(got) == 1 else None
    return one if isinstance(one, int) else None


def _world(man: dict[str, object]) -> int | None:
    """nnodes x nproc-per-node, when the manifest says them as plain numbers."""
    nnodes, nproc = str(man.get("nnodes", "")), str(man.get("nproc_per_node", ""))
    return int(nnodes) * int(nproc) if nnodes.isdigit() and nproc.isdigit() else None


def build_report(collector: Collector, infos: list[SourceInfo], metrics: list[dict[str, Any]],
                 skipped: list[dict[str, str]], manifests: Mapping[str, dict[str, object]] | None = None
                 ) -> LogsReport:
    """The report of what ``collector`` gathered; ``manifests``: the `mldebug launch` manifests by
    directory (sources.Expanded)."""
    launches = list((manifests or {}).values())
    # the job's rank count (a rank that never failed may have no labelled line to count it by), and how
    # `mldebug launch` ended (130: interrupted, by the signal it names: SIGINT is Ctrl-C)
    launch_world = _agreed(_world(man) for man in launches)
    launch_exit = _agreed(man.get("exit_code") for man in launches)
    launch_signal = next((str(man["signal"]) for man in launches if man.get("signal")), None)
    ids = accounting.Identities(collector)
    for ev in collector.events:
        if ev.kind in JOB_KINDS:
            continue
        ev.who = ids.resolve(ev.who, ev.source_index)
        if ids.assumed:
            ev.detail["rank_from"] = "local rank (one node)"
    for i, info in enumerate(infos):
        info.who = ids.resolve(info.who, i)
        info.repairs = list(collector.notes.get(i, [])) + [
            f"{what} cut off {n} line(s)" for what, n in sorted(collector.repairs.get(i, {}).items())]
        marks = collector.launchers.get(i, set()) | ({"mldebug launch"} if info.shape == "launch" else set())
        info.launchers = [name for name in LAUNCHER_ORDER if name in marks]
        info.view = _view(info, collector, i, ids)
    accounting.apply(collector.events, collector.ranks_seen | {e.who.rank for e in collector.events
                                                               if e.who.rank is not None})
    events = dedupe(collector.events)
    nccl = collector.nccl.report()
    sampled = [ids.resolve(who, i) for i, who in collector.sampled]
    ranks = set(collector.ranks_seen) | set(collector.nccl.rank_host) | {
        w.rank for w in (*(e.who for e in events), *(s.who for s in infos), *sampled) if w.rank is not None}
    # NCCL's count of the ranks, else `mldebug launch`'s, else the highest rank seen
    world = (int(nccl["world_size"]) if nccl and nccl.get("world_size")
             else launch_world or (max(ranks) + 1 if ranks else None))
    blamed = {r for e in events for r in e.blames}
    suspects = [dataclasses.replace(e, who=ids.resolve(e.who, e.source_index)) for e in collector.suspects]
    verdict = decide(events, world, blamed, suspects)
    if launch_exit is not None:
        failed = {a for e in collector.events if e.cls == PRIMARY and (a := attempt_of(e.source)) is not None}
        last = max((a for s in infos if (a := attempt_of(s.path)) is not None), default=None)
        verdict = launched(verdict, launch_exit, sorted(failed), last, launch_signal)
    else:
        verdict = went_on(restarted(verdict, collector.events), collector.events, infos, collector.reported)
        verdict = interrupted(verdict, collector.events)
    verdict.findings += attempts(collector.events) + stopped(verdict, infos)
    slow = [f for f in (nccl or {}).get("findings", ()) if f["severity"] == "warning"]
    if slow and verdict.status == "none":  # a job that runs, slowly: the first line says where to look
        verdict.summary += f"; NCCL: {len(slow)} slow-path finding(s), below"
    verdict = testhooks.call(testhooks.LOGS_VERDICT, verdict=verdict) or verdict
    nodes = sorted(collector.nodes_seen | {e.who.node for e in events if e.who.node} | {w.node for w in sampled if w.node})
    launchers = {name for s in infos for name in s.launchers}
    events = placed(events, verdict.primary)  # one story: the rank the verdict placed is the event's in every view
    return LogsReport(launchers=[name for name in LAUNCHER_ORDER if name in launchers],
                      verdict=verdict, sources=infos, events=events, tracebacks=collapse_tracebacks(events),
                      timeline=timeline(events), ranks_seen=compress(ranks), world_size=world, nodes=nodes,
                      progress=progress(collector, metrics), nccl=nccl, skipped=skipped,
                      dropped_events=collector.dropped, ok=not verdict.failed and not skipped,
                      summary=verdict.summary + (f"; {len(skipped)} source(s) not read" if skipped else ""))


LAUNCHER_ORDER = ("mldebug launch", *(launcher.name for launcher in LAUNCHERS if launcher.reported))
"""The order the report names launchers in: `mldebug launch` (it runs the others), then the catalogue's."""


def _view(info: SourceInfo, c: Collector, index: int, ids: accounting.Identities) -> str | None:
    """Whose lines a source holds: 'rank 3', 'local rank 1 on unknown node', or the ranks, local ranks and nodes
    its labels and failures name (a torchrun agent's console is one node's view of the job)."""
    if info.who.rank is not None or info.who.local_rank is not None:
        return info.who.label()
    writers = [ids.resolve(w, i) for i, w in c.sampled if i == index]
    writers += [ids.resolve(e.who, e.source_index) for e in c.events if e.source_index == index]
    ranks = compress({w.rank for w in writers if w.rank is not None})
    local = compress({w.local_rank for w in writers if w.rank is None and w.local_rank is not None})
    nodes = sorted({w.node for w in writers if w.node})
    # torchrun's agent lines and summary: the file is one agent's (one node's) view, or several agents' (srun)
    agents = {e.who.node for e in c.events if e.source_index == index
              and (e.detail.get("via") == "torchrun" or "torchrun_root_cause" in e.detail)}
    lead = {0: "", 1: "one torchrun agent's view:"}.get(len(agents), f"{len(agents)} torchrun agents:")
    parts = [lead, f"ranks {ranks}" if ranks else "", f"local ranks {local}" if local else "",
             f"on {few(nodes, 4)}" if nodes else "of one node (which is not said)" if local else ""]
    return " ".join(filter(None, parts)) or None


def demux(paths: list[str], *, rank: int | None, node: str | None,
          emit: Callable[[str, int, str], None], limit: int | None = None, jobs: int | None = None) -> dict[str, Any]:
    """Every line written by one rank (or one node), labels removed, in order: ``emit(source, line, text)``.

    A first pass learns who is who (local ranks, nodes), so a line labelled only with its node and local
    rank is still found by its global rank. Lines are streamed to ``emit`` as read; only a caller that keeps
    them (JSON) gives a ``limit``, and ``truncated`` then says the rest was not emitted."""
    if rank is None and node is None:
        raise UsageError("demux needs a rank or a node", "--rank R or --node NAME")
    with _expanded(paths) as exp:
        return _demux(exp, rank, node, emit, limit, jobs)


def _demux(exp: Expanded, rank: int | None, node: str | None, emit: Callable[[str, int, str], None],
           limit: int | None, jobs: int | None) -> dict[str, Any]:
    if any(src.stdin for src in exp.sources):
        raise UsageError("--rank/--node cannot read standard input (it is read twice)",
                         "save it to a file first")
    collected = _collect(exp, jobs=jobs)
    ids = accounting.Identities(collected[0])
    report = build_report(*collected, exp.manifests)
    count = 0
    sources_used: set[str] = set()
    truncated = False
    seen_ranks = set(expand_ranks(report.ranks_seen))
    seen_nodes = set(report.nodes)
    lines = ((i, src, n, text, cut) for i, src in enumerate(exp.sources)
             if src.shape not in ("error-file", "train-metrics") for n, text, cut in _all_lines(src))
    at: tuple[int, int] | None = None  # the line read last (source, number)
    for i, src, n, text, cut in lines:
        if (i, n) == at:
            continue  # the rest of a line longer than MAX_LINE: shown cut
        at = (i, n)
        if "\x1b" in text:  # coloured lines: the labels are found (and the text written) without colour
            text = strip_ansi(text)
        lab = split_label(text, i in collected[0].node_prefixed) if src.labelled else None
        who = ids.resolve((lab.who if lab else Who()).merged(src.who), i)
        if who.rank is not None:
            seen_ranks.add(who.rank)
        if who.node:
            seen_nodes.add(who.node)
        if (rank is not None and who.rank != rank) or (node is not None and who.node != node):
            continue
        if limit is not None and count >= limit:
            truncated = True
            break
        emit(src.path, n, (lab.rest if lab else text) + ("…" if cut else ""))
        sources_used.add(src.path)
        count += 1
    return {"rank": rank, "node": node, "lines": count, "sources": sorted(sources_used), "truncated": truncated,
            "ranks_seen": compress(seen_ranks), "nodes": sorted(seen_nodes)}


def _all_lines(src: Source) -> Iterator[tuple[int, str, bool]]:
    """(line number, text, more of the line follows) of every line of a source; one longer than MAX_LINE comes in
    pieces (cut where a block ends), each with the line's number."""
    n = 0
    carry = b""
    goes_on = False  # `carry` is the rest of a line a piece of which was given
    with opened(src) as f:
        for chunk in iter(lambda: f.read(BLOCK), b""):
            *parts, carry = (carry + chunk).split(b"\n")
            cut = len(carry) > MAX_LINE
            if cut:
                parts.append(carry)
                carry = b""
            for k, raw in enumerate(parts):
                n += not (k == 0 and goes_on)
                yield n, raw.decode("utf-8", "replace").rstrip("\r"), cut and k == len(parts) - 1
            goes_on = cut or (goes_on and not parts)
    if carry:
        yield n + (not goes_on), carry.decode("utf-8", "replace").rstrip("\r"), False

