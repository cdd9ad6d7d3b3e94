"""Merge many processes' stacks STAT-style and name the odd ones out.

1. Normalise each process's main-thread stack to (function, short file, line) tuples.
2. Group processes with identical stacks; with several samples, mark each process stuck
   (same stack every time) or moving.
3. Build a prefix tree (outermost frame first) whose nodes carry compressed rank ranges.
4. Suspects, strongest first: ranks outside any collective while others wait in one; ranks in a
   different collective or call site than the majority; ranks that are missing or could not be
   dumped; finally the smallest groups. The verdict line names the first.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

from ml_debug.core.ranges import compress
from ml_debug.stacks import gpu_waits
from ml_debug.stacks.result import Frame, ProcessDump, is_library_path, short_path

# Calls where a rank waits for its peers. Matched on the function name in torch.distributed
# (or deepspeed.comm) files; `wait` covers Work.wait() on async handles.
COLLECTIVES = frozenset({
    "all_reduce", "all_reduce_coalesced", "all_gather", "all_gather_object", "all_gather_into_tensor",
    "all_gather_single", "all_gather_coalesced", "_all_gather_base", "reduce_scatter", "reduce_scatter_tensor",
    "reduce_scatter_single", "_reduce_scatter_base", "broadcast", "broadcast_object_list", "reduce", "gather",
    "gather_object", "scatter", "scatter_object_list", "all_to_all", "all_to_all_single", "barrier",
    "monitored_barrier", "send", "recv", "isend", "irecv", "batch_isend_irecv", "send_object_list",
    "recv_object_list", "wait", "wait_tensor", "init_process_group", "_store_based_barrier", "new_group",
    "rendezvous", "next_rendezvous", "_barrier", "synchronize",
})
_COMM_FILES = ("torch/distributed/", "deepspeed/comm/", "torch/cuda/")
_NATIVE_WAIT = ("ProcessGroupNCCL", "ProcessGroupGloo", "gloo::", "ncclGroupEnd", "c10d::", "nccl")

StackKey = tuple[tuple[str, str, int | None], ...]


@dataclass
class Member:
    """One process in the analysis: where it lives, which rank it is, and its samples."""

    host: str
    pid: int
    rank: int | None = None
    local_rank: int | None = None
    world_size: int | None = None
    samples: list[ProcessDump] = field(default_factory=list)

    @property
    def id(self) -> str:
        return f"{self.host}:{self.pid}"

    def last_ok(self) -> ProcessDump | None:
        """The last sample, when it succeeded: a process that exited between samples is not current."""
        if self.samples and self.samples[-1].ok:
            return self.samples[-1]
        return None

    def error(self) -> str | None:
        for d in reversed(self.samples):
            if not d.ok:
                earlier = [s for s in self.samples if s.ok]
                if earlier:
                    loc = location_frame(main_frames(earlier[-1]))
                    seen = f"; last seen in {loc.where(brief=True)}" if loc else ""
                    return f"{d.error} (after {len(earlier)} good sample{'s' if len(earlier) > 1 else ''}{seen})"
                return d.error
        return "no sample taken" if not self.samples else None


def main_frames(dump: ProcessDump) -> list[Frame]:
    """The main thread's stack, innermost first: Python frames, or native ones when there are none."""
    t = dump.main_thread()
    if t is None:
        return []
    return t.python_frames() or [f for f in t.frames if f.kind == "native"] or t.native_frames


def all_main_frames(dump: ProcessDump) -> list[Frame]:
    """Every frame of the main thread, innermost first: py-spy's (Python, and native with --native),
    then gdb's or pystack's native ones."""
    t = dump.main_thread()
    return [*t.frames, *t.native_frames] if t is not None else []


@lru_cache(maxsize=4096)
def _short(filename: str) -> str:
    """Frame.short, once per file: 16k ranks x 20 frames x samples name the same few files."""
    return short_path(filename)


def stack_key(frames: list[Frame]) -> StackKey:
    """Outermost first; no addresses, no absolute paths: identical on every node."""
    return tuple((f.name, _short(f.filename) if f.filename else (f.library or "").rsplit("/", 1)[-1], f.line)
                 for f in reversed(frames))


def _base_name(name: str) -> str:
    return name.rsplit(".", 1)[-1]


def collective_frame(frames: list[Frame]) -> Frame | None:
    """The innermost frame where this stack waits for peers (all_reduce, barrier, recv, ...), if any."""
    for f in frames:
        if f.kind == "py":
            path = f.filename.replace("\\", "/")
            if _base_name(f.name) in COLLECTIVES and any(p in path for p in _COMM_FILES):
                return f
        elif any(word in f.name for word in _NATIVE_WAIT):
            return f
    return None


def location_frame(frames: list[Frame]) -> Frame | None:
    """Where a stack 'is' for a person: the innermost frame of their own code, else the innermost frame."""
    for f in frames:
        if f.kind == "py" and not is_library_path(f.filename):
            return f
    return frames[0] if frames else None


@dataclass
class Group:
    """Processes whose main-thread stacks are identical."""

    id: str
    members: list[Member]
    frames: list[Frame]  # innermost first, from one representative
    collective: Frame | None
    location: Frame | None
    state: str  # "single" (one sample), "stuck", "moving", "mixed"
    gpu_wait: Frame | None = None  # the CUDA call that holds the host until the GPU catches up

    def wait_where(self) -> str | None:
        """What the group waits in, as a verdict says it: on the GPU first, else the collective."""
        if self.gpu_wait is not None:
            via = f" via {self.collective.where(brief=True)}" if self.collective is not None \
                and self.collective is not self.gpu_wait else ""
            return f"on the GPU in {gpu_waits.describe(self.gpu_wait)}{via}"
        return self.collective.where(brief=True) if self.collective is not None else None

    @property
    def size(self) -> int:
        return len(self.members)


@dataclass
class Suspect:
    kind: str  # outside-collective | moving | different-collective | missing | not-dumped | smallest-group
    members: list[str]  # member ids (host:pid); empty for missing ranks
    ranks: list[int]
    where: str | None
    reason: str
    group: str | None = None


@dataclass
class Analysis:
    groups: list[Group]
    suspects: list[Suspect]
    missing_ranks: list[int]
    not_dumped: list[Member]
    tree: list[dict[str, Any]]
    verdict: str
    ok: bool  # True: no suspect and nothing missing


def member_state(m: Member) -> str:
    return _state(m, lambda d: stack_key(main_frames(d)))


def _state(m: Member, key_of: Callable[[ProcessDump], StackKey]) -> str:
    oks = [d for d in m.samples if d.ok]
    if len(oks) <= 1:
        return "single"
    keys = {key_of(d) for d in oks}
    return "stuck" if len(keys) == 1 else "moving"


def _ids_unique_ranks(members: list[Member]) -> bool:
    """Ranks name processes only when no two processes claim the same rank (two jobs on one node)."""
    ranks = [m.rank for m in members if m.rank is not None]
    return len(set(ranks)) == len(ranks)


def _waits(n: int, stuck: bool) -> str:
    if stuck:
        return f"{_count(n)} {'is' if n == 1 else 'are'} stuck in"
    return f"{_count(n)} {'waits' if n == 1 else 'wait'} in"


def describe(members: list[Member], unique_ranks: bool, *, with_where: bool = True) -> str:
    """`rank 3 (node2, pid 4242)` / `ranks 4-7 (4 ranks on node2)` / `pid 123 (node1)`."""
    if len(members) == 1:
        m = members[0]
        who = f"rank {m.rank}" if unique_ranks and m.rank is not None else f"pid {m.pid}"
        if not with_where:
            return who
        return f"{who} ({m.host}, pid {m.pid})" if who.startswith("rank") else f"{who} ({m.host})"
    if unique_ranks and all(m.rank is not None for m in members):
        who = f"ranks {compress(m.rank for m in members if m.rank is not None)}"
    else:
        who = ", ".join(f"rank {m.rank}" if unique_ranks and m.rank is not None else f"pid {m.pid}"
                        for m in members)
    if not with_where:
        return who
    hosts = sorted({m.host for m in members})
    return f"{who} ({len(members)} ranks on {', '.join(hosts)})"


def _count(n: int, word: str = "rank") -> str:
    return f"{n} {word}" if n == 1 else f"{n} {word}s"


def build_tree(groups: list[Group], unique_ranks: bool) -> list[dict[str, Any]]:
    """Prefix tree over the groups' stacks, outermost frame at the root, each node with its ranks."""
    roots: list[dict[str, Any]] = []
    # each level's nodes by label, and each node's groups as a set: thousands of groups (ranks
    # spread over many lines) would otherwise cost groups x siblings
    index: dict[int, dict[str, dict[str, Any]]] = {}
    for g in groups:
        level = roots
        for f in reversed(g.frames):
            label = f.where(brief=True)
            by_label = index.setdefault(id(level), {})
            node = by_label.get(label)
            if node is None:
                node = {"frame": label, "children": [], "groups": [], "group_set": set()}
                level.append(node)
                by_label[label] = node
            if g.id not in node["group_set"]:
                node["group_set"].add(g.id)
                node["groups"].append(g.id)
            level = node["children"]

    # a node's processes are its groups' members, in group order; the nodes of a common stem share
    # their groups, so each group set is described once rather than once per frame
    group_of = {g.id: g for g in groups}
    described: dict[tuple[str, ...], tuple[str, int]] = {}

    def finish(node: dict[str, Any]) -> dict[str, Any]:
        key = tuple(node["groups"])
        if key not in described:
            members = [m for gid in key for m in group_of[gid].members]
            described[key] = (describe(members, unique_ranks, with_where=False), len(members))
        ranks, count = described[key]
        return {"frame": node["frame"], "ranks": ranks, "count": count, "groups": node["groups"],
                "children": [finish(c) for c in node["children"]]}

    return [finish(r) for r in roots]


def analyse(members: list[Member], expected_world: int | None = None, infer_world: bool = True) -> Analysis:
    """Group, find suspects, and write the verdict line. Ranks of the world (``expected_world``, else the
    ranks' WORLD_SIZE when ``infer_world``) that no member is are missing."""
    unique = _ids_unique_ranks(members)
    dumped = [m for m in members if m.last_ok() is not None]
    not_dumped = [m for m in members if m.last_ok() is None]

    keys: dict[int, StackKey] = {}  # each sample's key once (by id: the samples live through this call)

    def key_of(d: ProcessDump) -> StackKey:
        k = keys.get(id(d))
        if k is None:
            k = keys[id(d)] = stack_key(main_frames(d))
        return k

    by_key: dict[StackKey, list[Member]] = {}
    for m in dumped:
        by_key.setdefault(key_of(m.last_ok()), []).append(m)  # type: ignore[arg-type]
    ordered = sorted(by_key.items(), key=lambda kv: (-len(kv[1]), min((m.rank if m.rank is not None else 1 << 30,
                                                                          m.pid) for m in kv[1])))
    groups: list[Group] = []
    for i, (_, ms) in enumerate(ordered):
        ms.sort(key=lambda m: (m.rank if m.rank is not None else 1 << 30, m.host, m.pid))
        frames = main_frames(ms[0].last_ok())  # type: ignore[arg-type]
        states = {_state(m, key_of) for m in ms}
        state = states.pop() if len(states) == 1 else "mixed"
        groups.append(Group(id=_group_id(i), members=ms, frames=frames, collective=collective_frame(frames),
                            location=location_frame(frames), state=state,
                            gpu_wait=gpu_waits.gpu_wait_frame(all_main_frames(ms[0].last_ok()))))  # type: ignore[arg-type]

    inferred = max((m.world_size or 0 for m in members), default=0) if infer_world else 0
    world = expected_world or inferred or None
    seen_ranks = {m.rank for m in members if m.rank is not None}
    missing = sorted(set(range(world)) - seen_ranks) if world and unique else []

    suspects = _suspects(groups, not_dumped, missing, unique)
    verdict = _verdict(groups, suspects, not_dumped, missing, unique, len(members))
    return Analysis(groups=groups, suspects=suspects, missing_ranks=missing, not_dumped=not_dumped,
                    tree=build_tree(groups, unique), verdict=verdict,
                    ok=not suspects and not not_dumped and not missing)


def _group_id(i: int) -> str:
    letters = "ABCDEFGHIJKLMNOPQRSTUVWXYZ"
    return letters[i] if i < 26 else f"G{i}"


def _ranks(members: list[Member]) -> list[int]:
    return sorted(m.rank for m in members if m.rank is not None)


def _majority_wait(groups: list[Group]) -> Group | None:
    """The largest group that waits in a collective and is not moving."""
    waiting = [g for g in groups if g.collective is not None and g.state != "moving"]
    return max(waiting, key=lambda g: g.size) if waiting else None


def _suspects(groups: list[Group], not_dumped: list[Member], missing: list[int], unique: bool) -> list[Suspect]:
    out: list[Suspect] = []
    major = _majority_wait(groups)
    if major is not None:
        outside = [g for g in groups if g.collective is None]
        outside.sort(key=lambda g: (g.state != "moving", g.size))  # a busy rank first, then the smallest
        for g in outside:
            where = g.location.where(brief=True) if g.location else None
            kind = "moving" if g.state == "moving" else "outside-collective"
            if kind == "moving":
                where = _places(g.members)
            reason = ("keeps running outside any collective" if kind == "moving"
                      else "is outside any collective")
            out.append(Suspect(kind, [m.id for m in g.members], _ranks(g.members), where,
                               f"{reason} while {_waits(major.size, False)} "
                               f"{major.collective.where(brief=True) if major.collective else '?'}", g.id))
        for g in sorted((g for g in groups if g.collective is not None and g is not major), key=lambda g: g.size):
            if g.state == "moving":
                continue  # passing through collectives: it is making progress
            assert g.collective is not None and major.collective is not None
            same_call = g.collective.name == major.collective.name
            what = "at a different call site of" if same_call else "in a different collective:"
            out.append(Suspect("different-collective", [m.id for m in g.members], _ranks(g.members),
                               g.collective.where(brief=True),
                               f"waits {what} {g.collective.name} while {_waits(major.size, False)} "
                               f"{major.collective.where(brief=True)}", g.id))
    for r in missing:
        out.append(Suspect("missing", [], [r], None, "no process found for this rank on any node dumped"))
    if major is not None and len(groups) == 1:
        for m in not_dumped:
            out.append(Suspect("not-dumped", [m.id], _ranks([m]), None,
                               f"could not be dumped ({m.error()}) while every other rank waits in "
                               f"{major.collective.where(brief=True) if major.collective else '?'}"))
    if major is None and len(groups) > 1:
        moving = [g for g in groups if g.state == "moving"]
        if not moving:
            largest = groups[0]
            if largest.size > 1 and all(g.size < largest.size for g in groups[1:]):
                for g in sorted(groups[1:], key=lambda g: g.size):
                    out.append(Suspect("smallest-group", [m.id for m in g.members], _ranks(g.members),
                                       g.location.where(brief=True) if g.location else None,
                                       f"differs from the {_count(largest.size)} in "
                                       f"{largest.location.where(brief=True) if largest.location else '?'}", g.id))
    return out


def _places(members: list[Member], limit: int = 3) -> str:
    """Where moving processes were seen across their samples: `spin (x.py:9), load_batch (x.py:40)`."""
    seen: list[str] = []
    for m in members:
        for d in m.samples:
            if d.ok:
                loc = location_frame(main_frames(d))
                text = loc.where(brief=True) if loc else "?"
                if text not in seen:
                    seen.append(text)
    more = f" and {len(seen) - limit} more places" if len(seen) > limit else ""
    return ", ".join(seen[:limit]) + more


def _verdict(groups: list[Group], suspects: list[Suspect], not_dumped: list[Member], missing: list[int],
             unique: bool, total: int) -> str:
    by_id = {m.id: m for g in groups for m in g.members} | {m.id: m for m in not_dumped}
    tail = ""
    if not_dumped and not any(s.kind == "not-dumped" for s in suspects):
        if len(not_dumped) == 1:
            m = not_dumped[0]
            tail = f"; 1 process not dumped: {describe([m], unique, with_where=False)} ({m.error()})"
        else:
            tail = f"; {len(not_dumped)} processes not dumped (reasons in the 'not dumped' list)"
    if suspects:
        s = suspects[0]
        more = f" (+{len(suspects) - 1} more suspect{'s' if len(suspects) > 2 else ''})" if len(suspects) > 1 else ""
        if s.kind == "missing":
            ranks = compress(r for x in suspects if x.kind == "missing" for r in x.ranks)
            head = f"suspect: rank{'s' if ',' in ranks or '-' in ranks else ''} {ranks} missing (no process " \
                   "found on the nodes dumped)"
            major = _majority_wait(groups)
            if major and major.collective:
                head += f" while {_waits(major.size, major.state == 'stuck')} {major.collective.where(brief=True)}"
            return head + tail
        who = describe([by_id[i] for i in s.members], unique)
        if s.kind == "moving":
            n = max(len(by_id[i].samples) for i in s.members)
            line = f"suspect: {who} keeps running (its stack changed across {n} samples: {s.where})"
        elif s.kind == "not-dumped":
            line = f"suspect: {who} {s.reason}"
            return line + more + tail
        elif s.kind == "different-collective":
            line = f"suspect: {who} {s.reason.replace('waits ', 'waits ', 1)}"
            return line + more + tail
        else:
            g = next((g for g in groups if g.id == s.group), None)
            line = f"suspect: {who} {'stuck in' if g is not None and g.state == 'stuck' else 'in'} {s.where}"
            if g is not None and g.gpu_wait is not None:
                line += f", waiting {g.wait_where()}"
        major = _majority_wait(groups)
        if major is not None and major.collective is not None:
            line += f" while {_waits(major.size, major.state == 'stuck')} {major.collective.where(brief=True)}"
        else:
            line += f" ({s.reason})"
        return line + more + tail
    if not groups:
        return "no stacks: nothing could be dumped" + tail
    if all(g.state == "moving" for g in groups):
        return f"no suspect: all {_count(total)} are moving (their stacks change between samples): running, " \
               "not hung" + tail
    if len(groups) == 1:
        g = groups[0]
        if g.gpu_wait is not None:
            return f"no suspect: all {_count(g.size)} wait {g.wait_where()} with the same stack (a kernel still " \
                   "running, or a collective whose peers never came: nvidia-smi, the Flight Recorder)" + tail
        if g.collective is not None:
            return f"no suspect: all {_count(g.size)} wait in {g.collective.where(brief=True)} with the same stack " \
                   "(look below Python: network/NCCL, or a peer outside this job)" + tail
        where = g.location.where(brief=True) if g.location else "?"
        return f"no suspect: all {_count(g.size)} are in {where} with the same stack" + tail
    sampled = max(len(m.samples) for g in groups for m in g.members)
    advice = "use --samples to tell moving ranks from stuck ones" if sampled < 2 else \
        f"across {sampled} samples: " + ", ".join(f"{_count(g.size)} {g.state}" for g in groups)
    return f"no single suspect: {len(groups)} groups of ranks with different stacks (largest: " \
           f"{_count(groups[0].size)} in {groups[0].location.where(brief=True) if groups[0].location else '?'}); " \
           + advice + tail
