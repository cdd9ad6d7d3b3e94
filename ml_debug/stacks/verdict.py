"""The dump-stacks result: every process with its raw samples, the groups, the suspects and the verdict.

Local and multi-node runs build the same :class:`DumpStacksResult`: a remote node's
`dump-stacks --local --json` document is read back into typed parts (:func:`read_node_document`),
its nodes and processes are concatenated with the others', and the union is analysed again by
:func:`build_report`, which computes the summary, the hint and the Flight Recorder section before it
constructs the result. The JSON document is ``to_jsonable`` of the result, field for field.
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from dataclasses import asdict, dataclass, field
from typing import Any

from ml_debug.core.enums import Word
from ml_debug.core.errors import ExitCode
from ml_debug.procs.find import FoundProcess
from ml_debug.stacks import gpu_waits
from ml_debug.stacks.collect import NodeDump
from ml_debug.stacks.flight import section
from ml_debug.stacks.fr_analysis import EntryPool, share_entries
from ml_debug.stacks.loop_order import LoopOrder, RankFrames, loop_order
from ml_debug.stacks.merge import Analysis, Member, Suspect, analyse, member_state
from ml_debug.stacks.result import Frame, ProcessDump, dump_from_json

SCHEMA = "mldebug.dump-stacks"
SCHEMA_VERSION = 1

NO_TARGETS_HINT = ("name them: --pid PID (a launcher's pid means its ranks), --pattern REGEX, --user USER, "
                   "--gpu-holders; or run on the node where the job runs (--hosts / --slurm-job)")


class ProcessState(Word):
    """Whether one process's main-thread stack changed across its samples."""

    SINGLE = "single"  # one good sample: nothing to compare
    STUCK = "stuck"  # the same stack in every sample
    MOVING = "moving"  # the stack changed between samples
    NOT_DUMPED = "not-dumped"  # the last sample failed (no current stack)


class GroupState(Word):
    """The state shared by a group's members ("mixed" when they differ)."""

    SINGLE = "single"
    STUCK = "stuck"
    MOVING = "moving"
    MIXED = "mixed"


@dataclass(frozen=True)
class BriefFrame:
    """A frame as the groups show it: name, path relative to site-packages, line, and the readable form."""

    name: str
    file: str
    line: int | None
    where: str

    @classmethod
    def of(cls, f: Frame) -> BriefFrame:
        return cls(name=f.name, file=f.short, line=f.line, where=f.where())


def _brief(f: Frame | None) -> BriefFrame | None:
    return None if f is None else BriefFrame.of(f)


@dataclass(frozen=True)
class StackGroup:
    """Processes whose main-thread stacks are identical, with where they are and what they wait in."""

    id: str
    size: int
    state: GroupState
    ranks: list[int | None]
    members: list[str]  # host:pid
    hosts: list[str]
    collective: BriefFrame | None
    location: BriefFrame | None
    frames: list[BriefFrame]  # innermost first
    gpu_wait: BriefFrame | None = None  # the CUDA call holding the host until the GPU catches up (gpu_waits.py)


@dataclass(frozen=True)
class TreeNode:
    """One branch of the STAT-style prefix tree (outermost frame at the root)."""

    frame: str
    ranks: str  # "ranks 0-2", "rank 3", "pid 4242"
    count: int
    groups: list[str]
    children: list[TreeNode]

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> TreeNode:
        return cls(frame=d["frame"], ranks=d["ranks"], count=int(d["count"]), groups=list(d["groups"]),
                   children=[cls.from_json(c) for c in d["children"]])

    def chain(self) -> tuple[list[str], TreeNode]:
        """The frames down a chain of single children with the same ranks (one branch, as the views draw it),
        and the node where the chain ends."""
        node, frames = self, [self.frame]
        while len(node.children) == 1 and node.children[0].count == node.count:
            node = node.children[0]
            frames.append(node.frame)
        return frames, node


@dataclass(frozen=True)
class NodeSummary:
    """What one node did, or why it did nothing (``error``: it was not reached)."""

    host: str
    ok: bool
    error: str | None
    targets: int
    dumped: int
    launchers: list[dict[str, Any]]
    skipped: list[dict[str, Any]]
    notes: list[str]
    ptrace: dict[str, Any]
    seconds: float
    target: str | None = None  # the name it was reached by (--hosts / --slurm-job); its hostname may differ


@dataclass(kw_only=True)
class DumpedProcess(FoundProcess):
    """One process: the target as found, its samples, and what the analysis made of it."""

    samples: list[ProcessDump] = field(default_factory=list)
    group: str | None
    state: ProcessState
    error: str | None  # why its last sample failed (None when it was dumped)
    fix: str | None  # what to do about that error, when there is something to do
    kernel: dict[str, Any] | None = None  # procs.kernel.KernelView as JSON: the call, file or peer, state


@dataclass(frozen=True)
class NotDumped:
    """A process without a current stack, and what to do about it."""

    host: str
    pid: int
    rank: int | None
    error: str | None
    fix: str | None


@dataclass(frozen=True)
class DumpStacksResult:
    """The ``result`` of ``mldebug dump-stacks --json``: one node, or the merge of many.

    ``options`` records the request (its selectors and dump settings); ``flight_recorder`` is the
    section of :func:`ml_debug.stacks.flight.section` (per-rank JSON records, remote ones included),
    None when no rank had any; ``hint`` is the next step when nothing could be dumped."""

    ok: bool
    summary: str
    verdict: str
    exit_code: ExitCode
    options: dict[str, Any]
    nodes: list[NodeSummary]
    processes: list[DumpedProcess]
    groups: list[StackGroup]
    tree: list[TreeNode]
    suspects: list[Suspect]
    missing_ranks: list[int]
    not_dumped: list[NotDumped]
    flight_recorder: dict[str, Any] | None = None
    hint: str | None = None
    interrupted: bool = False
    loop_order: dict[str, Any] | None = None  # stacks.loop_order.LoopOrder: who is an iteration behind (--locals)  # Ctrl-C during --samples: the samples completed are the result


@dataclass(frozen=True)
class ProcessSamples:
    """A process to analyse: the target as found, its dumps in order, and what the kernel said of it."""

    target: FoundProcess
    samples: list[ProcessDump]
    kernel: dict[str, Any] | None = None  # procs.kernel.KernelView as JSON (dump-stacks --kernel)


# ---- the parts of one node ---------------------------------------------------------------------

def node_processes(node: NodeDump) -> list[ProcessSamples]:
    return [ProcessSamples(t, node.samples.get(t.pid, []), node.kernel.get(t.pid)) for t in node.targets]


def node_summary(node: NodeDump) -> NodeSummary:
    dumped = sum(1 for t in node.targets if any(s.ok for s in node.samples.get(t.pid, [])))
    return NodeSummary(host=node.host, ok=node.ok and dumped == len(node.targets), error=node.error,
                       targets=len(node.targets), dumped=dumped, launchers=node.launchers, skipped=node.skipped,
                       notes=node.notes, ptrace=node.ptrace, seconds=node.seconds)


def failed_node(host: str, error: str) -> NodeSummary:
    """A node that never answered (ssh refused, srun timed out, mldebug missing there)."""
    return NodeSummary(host=host, ok=False, error=error, targets=0, dumped=0, launchers=[], skipped=[], notes=[],
                       ptrace={}, seconds=0.0)


def with_node_note(result: DumpStacksResult, note: str) -> DumpStacksResult:
    """A copy of a one-node result whose node carries one more note."""
    if not result.nodes:
        return result
    first = result.nodes[0]
    nodes = [dataclasses.replace(first, notes=[*first.notes, note]), *result.nodes[1:]]
    return dataclasses.replace(result, nodes=nodes)


# ---- another node's document -------------------------------------------------------------------

_TARGET_FIELDS = tuple(f.name for f in dataclasses.fields(FoundProcess))


def _node_from_json(d: dict[str, Any], target: str, note: str | None) -> NodeSummary:
    notes = [str(n) for n in d.get("notes") or []]
    return NodeSummary(host=str(d["host"]), ok=bool(d["ok"]), error=d.get("error"), targets=int(d["targets"]),
                       dumped=int(d["dumped"]), launchers=list(d.get("launchers") or []),
                       skipped=list(d.get("skipped") or []), notes=[*notes, note] if note else notes,
                       ptrace=dict(d.get("ptrace") or {}), seconds=float(d.get("seconds") or 0.0), target=target)


def _process_from_json(d: dict[str, Any]) -> ProcessSamples:
    target = FoundProcess(**{k: d[k] for k in _TARGET_FIELDS if k in d})
    kernel = d.get("kernel")
    return ProcessSamples(target, [dump_from_json(s) for s in d.get("samples") or []],
                          kernel if isinstance(kernel, dict) else None)


@dataclass(frozen=True)
class NodeDocument:
    """What one remote node sent back, read into typed parts."""

    nodes: list[NodeSummary]
    processes: list[ProcessSamples]
    fr_records: list[dict[str, Any]]


def read_node_document(body: dict[str, Any], target: str, note: str | None = None, *,
                       pool: EntryPool | None = None) -> NodeDocument:
    """The parts of a node's `dump-stacks --local --json` result; `target`: the name it was reached by,
    `note`: said on each of its nodes (e.g. that it runs another mldebug version); `pool`: one for all
    the nodes of a run, so that equal Flight Recorder entries of every node are kept once.

    Raises KeyError, TypeError or ValueError when the document lacks what every version writes."""
    nodes = [_node_from_json(n, target, note) for n in body.get("nodes") or []]
    processes = [_process_from_json(p) for p in body["processes"]]
    fr = body.get("flight_recorder") or {}
    fr_records = list(fr.get("ranks") or [])
    share_entries(fr_records, pool)  # the ranks issue the same collectives: kept once (16k ranks: 3 GiB -> 0.8)
    return NodeDocument(nodes=nodes, processes=processes, fr_records=fr_records)


# ---- the analysis ------------------------------------------------------------------------------

def _exit_code(analysis: Analysis, failed_nodes: list[NodeSummary]) -> ExitCode:
    if not analysis.groups:
        return ExitCode.PARTIAL if failed_nodes else ExitCode.ENVIRONMENT
    if analysis.not_dumped or failed_nodes:
        return ExitCode.PARTIAL
    if analysis.suspects:
        return ExitCode.PROBLEM
    return ExitCode.OK


def _summary_and_hint(analysis: Analysis, code: ExitCode, nodes: list[NodeSummary], processes: list[DumpedProcess],
                      flight_recorder: dict[str, Any] | None, local: bool) -> tuple[str, str | None]:
    """The one line a person reads last, and the next step when nothing could be dumped."""
    failed = [n for n in nodes if n.error]
    if not processes and not failed:
        where = ", ".join(n.host for n in nodes)
        passed_over = [f"pid {s['pid']}: {s['reason']}" for n in nodes for s in n.skipped]
        if passed_over:  # what was named or matched, and why it is not dumped (a --pid that does not exist)
            more = f"; and {len(passed_over) - 3} more" if len(passed_over) > 3 else ""
            return f"no processes to dump on {where}: " + "; ".join(passed_over[:3]) + more, NO_TARGETS_HINT
        launchers = " (torchrun, deepspeed, accelerate, srun, mpirun)" if local else ""
        return (f"no processes to dump on {where}: no rank under a launcher{launchers} and no Python process "
                "with a rank in its environment"), NO_TARGETS_HINT
    if local and code == ExitCode.ENVIRONMENT:
        reasons = sorted({p.error for p in processes if p.error})
        fixes = [p.fix for p in processes if p.fix]
        where = nodes[0].host if nodes else "this node"
        return f"could not dump any of {len(processes)} processes on {where}: " + "; ".join(reasons), \
            fixes[0] if fixes else None
    summary = analysis.verdict
    if failed:
        summary += f"; {len(failed)} node(s) not reached: " + ", ".join(f"{n.host} ({n.error})" for n in failed[:3])
    if flight_recorder and (flight_recorder["behind"] or (flight_recorder.get("analysis") or {}).get("culprits")):
        summary += "; " + flight_recorder["evidence"]
    return summary, None


def _loop_order(processes: list[DumpedProcess]) -> LoopOrder | None:
    """Loop counters of the ranks' last main-thread stacks (with --locals), compared where all ranks share a frame."""
    ranks = []
    for p in processes:
        dump = next((s for s in reversed(p.samples) if s.ok), None)
        main = dump.main_thread() if dump else None
        if p.rank is not None and main is not None and any(f.locals for f in main.frames):
            ranks.append(RankFrames(p.rank, list(reversed(main.python_frames()))))
    return loop_order(ranks)


TELLING = ("waiting on the GPU", "blocked in", "spinning", "in uninterruptible", "stopped", "a zombie")


def _gpu_wait_below(process: DumpedProcess, wait: Frame | None) -> None:
    """The kernel's view of a rank that waits on the GPU reads as that: while the CUDA runtime waits it
    spins, yields or sits in an ioctl on /dev/nvidia*, which alone would read as a busy loop or a driver
    call (gpu_waits.py)."""
    if wait is None or not process.kernel or not process.kernel.get("verdict"):
        return
    said = str(process.kernel["verdict"])
    if not said.startswith("waiting on the GPU"):
        process.kernel["verdict"] = f"waiting on the GPU in {gpu_waits.describe(wait)} ({said})"


def _kind(verdict: str) -> str:
    """``blocked in read()`` of ``blocked in read() on /x (fd 3), wait channel ...``: what ranks share."""
    return verdict.split(" on ", 1)[0].split(",", 1)[0].split(":", 1)[0]


def below_python(suspects: list[Suspect], processes: list[DumpedProcess]) -> str:
    """What the kernel says of the suspects (``rank 3 (node2): blocked in read() on /data/x (fd 17)``);
    with no suspect, of the one process whose call differs from all the others' (or of one or two
    processes dumped alone); "" when it adds nothing."""
    seen = [p for p in processes if (p.kernel or {}).get("verdict")]
    if suspects:
        ids = {m for s in suspects for m in s.members}
        named = [p for p in seen if f"{p.host}:{p.pid}" in ids]
    elif len(seen) <= 2:
        named = seen
    else:
        kinds = Counter(_kind(p.kernel["verdict"]) for p in seen if p.kernel)
        odd = [p for p in seen if p.kernel and kinds[_kind(p.kernel["verdict"])] == 1]
        named = odd if len(odd) == 1 else []
    parts = []
    for p in named[:4]:
        said = str((p.kernel or {}).get("verdict"))
        if said.startswith(TELLING) and not (suspects and said.startswith("blocked in futex")):
            who = f"rank {p.rank}" if p.rank is not None else f"pid {p.pid}"
            parts.append(f"{who} ({p.host}): {said.split(', wait channel', 1)[0]}")  # the table has the rest
    return "; ".join(parts)


def build_report(nodes: list[NodeSummary], processes: list[ProcessSamples], options: dict[str, Any],
                 expected_world: int | None = None, *, fr_records: list[dict[str, Any]] | None = None,
                 local: bool = False) -> DumpStacksResult:
    """Analyse all processes of all nodes into the result (the human view draws from it).

    `fr_records`: the Flight Recorder records of every rank (ranks it finds behind are added to the
    summary's evidence); `local`: the result of this node alone, whose summary names the reasons when
    no process could be dumped."""
    members = [Member(host=p.target.host, pid=p.target.pid, rank=p.target.rank, local_rank=p.target.local_rank,
                      world_size=p.target.world_size, samples=p.samples) for p in processes]
    # --pid of single ranks picks some of a job on purpose: the others are not "missing" (unless --world-size)
    picked = bool(processes) and all(p.target.found_by == "pid" for p in processes)
    analysis = analyse(members, expected_world, infer_world=not picked)
    group_of = {m.id: g.id for g in analysis.groups for m in g.members}
    dumped: list[DumpedProcess] = []
    for p, m in zip(processes, members, strict=True):
        ok = m.last_ok() is not None
        fixes = [s.fix for s in p.samples if s.fix]
        dumped.append(DumpedProcess(**asdict(p.target), samples=p.samples, group=group_of.get(m.id),
                                    state=ProcessState(member_state(m)) if ok else ProcessState.NOT_DUMPED,
                                    error=None if ok else m.error(),
                                    fix=None if ok or not fixes else fixes[-1], kernel=p.kernel))
    on_gpu = {g.id: g.gpu_wait for g in analysis.groups if g.gpu_wait is not None}
    for d in dumped:
        _gpu_wait_below(d, on_gpu.get(d.group or ""))
    fix_of = {f"{p.host}:{p.pid}": p.fix for p in dumped}
    groups = [StackGroup(id=g.id, size=g.size, state=GroupState(g.state), ranks=[m.rank for m in g.members],
                         members=[m.id for m in g.members], hosts=sorted({m.host for m in g.members}),
                         collective=_brief(g.collective), location=_brief(g.location),
                         frames=[BriefFrame.of(f) for f in g.frames], gpu_wait=_brief(g.gpu_wait))
              for g in analysis.groups]
    failed_nodes = [n for n in nodes if n.error]
    code = _exit_code(analysis, failed_nodes)
    flight_recorder = section(fr_records or [])
    summary, hint = _summary_and_hint(analysis, code, nodes, dumped, flight_recorder, local)
    below = below_python(analysis.suspects, dumped)
    if below and hint is None:
        summary += "; below Python: " + below
    order = _loop_order(dumped)
    if order is not None:
        summary += "; loop order: " + order.text
    return DumpStacksResult(
        ok=code == ExitCode.OK,
        summary=summary,
        verdict=analysis.verdict,
        exit_code=code,
        options=options,
        nodes=nodes,
        processes=dumped,
        groups=groups,
        tree=[TreeNode.from_json(t) for t in analysis.tree],
        suspects=analysis.suspects,
        missing_ranks=analysis.missing_ranks,
        not_dumped=[NotDumped(host=m.host, pid=m.pid, rank=m.rank, error=m.error(), fix=fix_of.get(m.id))
                    for m in analysis.not_dumped],
        flight_recorder=flight_recorder,
        hint=hint,
        loop_order=asdict(order) if order is not None else None,
    )
