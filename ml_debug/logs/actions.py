"""One line, read. ``detect`` tries, in order: NCCL (its tallies, its WARN lines), a traceback's header
(blocks.py reads the rest), c10d's watchdog timeout, the catalogue's launcher lines (engine.launcher_lines, in
catalogue order, each made an event by its action below or by :func:`says`; the first action that takes the
line ends it), then a line of no launcher that names an exception or a failure class, last one that only looks
like a failure (a suspect).
"""

from __future__ import annotations

import re
import string
from collections.abc import Callable
from typing import TYPE_CHECKING

from ml_debug.core.ranges import expand as expand_ranks
from ml_debug.logs import blocks, engine
from ml_debug.logs.engine import LineRule
from ml_debug.logs.labels import Label, find_time, split_label, srun_task_node
from ml_debug.logs.result import PRIMARY, SECONDARY, TIME_LAUNCHER, TIME_LINE, TIME_ORDER, WARNING, Who
from ml_debug.logs.text import classify, clean_message, short_exception

if TYPE_CHECKING:
    from ml_debug.logs.events import Collector

_WATCHDOG = re.compile(engine.WATCHDOG)
_WATCHDOG_RANK = re.compile(engine.WATCHDOG_RANK)
_LAST_WORK = re.compile(engine.LAST_WORK)
_MISSING_RANK = re.compile(r"(\d{1,7})(!?): \[")  # Horovod's "3: [tensor, ...]", "3!: [...]"
_MPI_PROCESS = re.compile(r"Process name: \[(?:\[\d+,\d+\],|[^\]]{0,200}@\d+,)(\d+)\]")
# a line that starts with an exception (anchored), or names one in its middle (a logger reporting it)
_INLINE_EXCEPTION = re.compile(r"(?<![\w.])(?:[A-Za-z_]\w{0,100}\.){0,10}\w{0,100}(?:Error|Exception): \S")
_KILLED = re.compile(r"(?:^|\s)Killed(?:\s|$)")
_GLOG_PID = re.compile(r"[EWIF]\d{4} \d\d:\d\d:\d\d\.\d{1,9} +(\d+) ")  # glog's prefix: its pid after the time
_WARNED = re.compile(r"\[?[WI]\d{4} \d\d:\d\d:\d\d")  # glog's warning or info line (c10d's C++ lines)
LINE_CLASSES = ("cuda-error", "oom", "shm", "gpu-fault")
"""Failure classes that are a failure on a line of their own (no exception named): a CUDA error in c10d's log,
the kernel's Xid, an out-of-memory message."""


def detect(c: Collector, lab: Label, who: Who, line: int, offset: int) -> None:
    rest = lab.rest
    if "NCCL" in rest and _nccl(c, rest, who, line, offset):
        return
    if blocks.opens(rest):
        blocks.open_block(c, lab, who, line, offset)
        return
    if "Watchdog caught" in rest and _watchdog(c, rest, who, line, offset):
        return
    if "last enqueued NCCL work" in rest:
        m = _LAST_WORK.search(rest)
        if m:
            r = _WATCHDOG_RANK.search(rest)
            rank = who.rank if who.rank is not None else (int(r.group(1)) if r else None)
            if rank is not None:
                c.last_work[rank] = (int(m.group(1)), int(m.group(2)))
            # c10d's "Exception ... detected by watchdog at work: 1580, ...", "Timeout at NCCL work: 254, ...": timeouts
            if "detected by watchdog" not in rest and "Timeout at NCCL work" not in rest:
                return
    present = engine.needles_in(rest)
    if engine.says_nothing(present):
        return  # none of the words of anything below (engine.DETECT_WORDS), or a warning's: not even a suspect
    if engine.suspect_at_most(present):
        _suspect(c, rest, who, line, offset, present)
        return
    for name in engine.marks(rest, present):
        c._mark(name)
    for rule, m in engine.launcher_lines(rest, present):
        if (says if rule.line.says else ACTIONS[rule.line.action])(c, rule, m, lab, who, line, offset):
            return
    _failure_line(c, rest, who, line, offset, present)


def _nccl(c: Collector, rest: str, who: Who, line: int, offset: int) -> bool:
    got = c.nccl.feed(rest, who.rank)
    if got is None:
        return False
    level, host, msg = got
    c.nccl_lines += 1
    if host:
        c.nodes_seen.add(host)
    if "libibverbs" in msg and ("Failed" in msg or "failed" in msg):
        # NCCL goes on over TCP sockets: the job runs, slowly, without InfiniBand/RoCE
        c._one("nccl-fallback", WARNING, "NCCL could not load libibverbs: it falls back to TCP sockets "
               "(no InfiniBand/RoCE)", "NCCL fell back to sockets (libibverbs failed to load)",
               Who(who.rank, who.node or host, who.local_rank), line, offset, rest)
        return True
    if level == "WARN":
        cls, label, kind = classify(msg)
        if kind == "exception":
            cls, label, kind = WARNING, "NCCL WARN", "nccl-warn"
        c._one(kind, cls, f"NCCL WARN {clean_message(msg)}", label, who, line, offset, rest, strong=cls != WARNING)
    return True


def _watchdog(c: Collector, rest: str, who: Who, line: int, offset: int) -> bool:
    m = _WATCHDOG.search(rest)
    if not m:
        return False
    r = _WATCHDOG_RANK.search(rest)
    if r and who.rank is None:
        who = Who(int(r.group(1)), who.node, who.local_rank)
    work = dict(kv.split("=", 1) for kv in m.group("work").split(", ") if "=" in kv)
    msg = (f"NCCL watchdog timeout: {work.get('OpType', '?')} SeqNum={work.get('SeqNum', '?')} ran for "
           f"{int(m.group('ms')) / 1000:g} s")
    c._one("watchdog", SECONDARY, msg, "NCCL watchdog timeout", who, line, offset, rest,
           detail={"op": work.get("OpType"), "seq": work.get("SeqNum")})
    return True


def _failure_line(c: Collector, rest: str, who: Who, line: int, offset: int, present: frozenset[str]) -> None:
    """An exception or failure line of no launcher; a suspect when it only looks like one."""
    if rest.startswith("frame #"):
        return  # a C++ stack frame (c10::Error's "frame #2: c10::DistNetworkError::DistNetworkError(...)"): code
    stripped = rest.strip()
    m = blocks.EXCEPTION_TYPE.match(stripped) if ("rror" in rest or "xception" in rest or "Exit" in rest
                                                  or "Interrupt" in rest or "Fail" in rest or "Fault" in rest) \
        else None
    inline = None
    if m is None and ("Error: " in rest or "Exception: " in rest):
        inline = _INLINE_EXCEPTION.search(rest)
    got = None if m or inline else engine.failure_class(rest, PRIMARY, present)
    # a line at a level below ERROR: glog's W or I (c10d's C++ lines), a logger's WARNING, INFO or DEBUG record
    warned = _WARNED.match(rest) or blocks.LOGGED.match(rest)
    if m or inline or (got is not None and got[0].kind in LINE_CLASSES):
        text = rest[inline.start():].strip() if inline else stripped
        cls, label, kind = classify(text)
        message = short_exception(text) if (m or inline) else clean_message(text)
        # an exception named in the middle of a line (a logger reporting one) may have been handled; below ERROR
        # ("[WARNING] loader: got OSError: ..., retrying") it was, as a traceback a logging call prints is
        handled = inline is not None and warned is not None and kind == "exception"
        c._one(kind, WARNING if handled else cls, message, label or message.split(":", 1)[0], who, line, offset, rest,
               strong=m is not None or kind != "exception",
               detail={"handled": "named by a log line below ERROR: the program caught it and went on"} if handled else None)
        return
    # a peer's consequence said by a warning is no failure (c10d's "[W1128 ... socket.cpp:755] [c10d] The client socket
    # has failed to connect to [node1]:29500 (errno: 111 - Connection refused)." while the first node starts: it
    # retries; a logger's "WARNING ... Connection reset by peer, retrying")
    got = None if warned else engine.failure_class(rest, SECONDARY, present)
    if got is not None:
        c._one(got[0].kind, SECONDARY, clean_message(rest), got[0].label, who, line, offset, rest)
        return
    if "Killed" in rest and _KILLED.search(rest):
        c._one("signal", PRIMARY, "Killed (SIGKILL)", "killed (SIGKILL)", who, line, offset, rest, strong=False)
        return
    _suspect(c, rest, who, line, offset, present)


def _suspect(c: Collector, rest: str, who: Who, line: int, offset: int, present: frozenset[str]) -> None:
    """A line that only looks like a failure: kept as the last resort."""
    if not c.suspects_full and engine.SUSPECT in present and engine.NOT_SUSPECT not in present:
        c.suspects.append(c.event("suspect", PRIMARY, clean_message(rest), "a line that looks like a failure",
                                  who, line, offset, t=c.line_time(rest), strong=False))


# ----------------------------------------------------------------------------- the catalogue's actions

Action = Callable[["Collector", LineRule, "re.Match[str]", Label, Who, int, int], bool]


class _Fields(string.Formatter):
    """A catalogue format's fields; ``{name!c}``: the text made one readable line (clean_message)."""

    def convert_field(self, value: object, conversion: str | None) -> object:
        return clean_message(str(value)) if conversion == "c" else super().convert_field(value, conversion)


_FIELDS = _Fields()


def says(c: Collector, rule: LineRule, m: re.Match[str], lab: Label, who: Who, line: int, offset: int) -> bool:
    """A line whose catalogue entry says the event it means (``Line.says``): that event, its message and label
    formatted from the match."""
    said = rule.line.says
    assert said is not None and c.ctx is not None
    fields = {**m.groupdict(), "match": m.group(0), "line": lab.rest}
    if said.who == "node":
        who = Who(None, fields.get("node") or who.node, None)
    elif said.who == "source":
        who = Who(None, c.ctx.who.node, None)
    detail = {k: int(v) if v and v.isdecimal() else v for k, v in fields.items() if k in said.detail}
    c._one(said.kind, said.cls, _FIELDS.vformat(said.message, (), fields), _FIELDS.vformat(said.label, (), fields),
           who, line, offset, lab.rest, strong=said.strong, detail=detail)
    return True


def _exit(c: Collector, rule: LineRule, m: re.Match[str], lab: Label, who: Who, line: int, offset: int) -> bool:
    """A launcher's line that says a worker ended: its exit code (or signal), and whose it is, as the catalogue's
    entry says (the groups ``code``/``sig``, ``rank``, ``local``, ``node``, ``pid``; its ``who`` and ``time``)."""
    assert c.ctx is not None
    g = m.groupdict()
    code = int(g["code"]) if g.get("code") else -int(g["sig"])
    rank = int(g["rank"]) if g.get("rank") else None
    local = int(g["local"]) if g.get("local") else None
    pid = int(g["pid"]) if g.get("pid") else None
    node = g.get("node")
    if rule.line.who == "agent":  # under srun --label, the task is the agent: one per node
        node = node or c.ctx.who.node or lab.who.node or (
            srun_task_node(lab.srun_task) if lab.srun_task is not None else None)
    else:
        rank, node = rank if rank is not None else who.rank, node or who.node
    if node:
        c.nodes_seen.add(node)
        if rank is not None:
            c.rank_node.setdefault(rank, node)
    t = find_time(lab.rest, c.ctx.day) if rule.line.time != "order" else None
    source = TIME_LAUNCHER if rule.line.time == "launcher" else TIME_LINE
    agent = _GLOG_PID.match(lab.rest)  # the process that printed it (an agent reports one failure per attempt)
    _ended(c, rule, code, Who(rank, node, local), line, offset, t, source, pid, cut="local" in g and local is None,
           agent=int(agent.group(1)) if agent else None)
    return True


def _ended(c: Collector, rule: LineRule, code: int, who: Who, line: int, offset: int, t: float | None = None,
           time_source: str = TIME_ORDER, pid: int | None = None, cut: bool = False, agent: int | None = None) -> None:
    """``who`` ended with ``code`` (nothing when 0), as ``rule``'s launcher says, with its entry's note;
    ``cut``: the line is cut short before the local rank it would say; ``agent``: the pid of the launcher's process."""
    name = rule.launcher.name
    detail: dict[str, object] = {"via": name, **({"agent_pid": agent} if agent else {})}
    if rule.line.note:
        detail["note"] = rule.line.note
    if cut:
        detail["cut"] = f"{name}'s line is cut short: its local rank is not there"
    c.exited(code, who, line, offset, f"{name}:{who.node}:{who.rank}:{who.local_rank}:{pid}", t=t,
             time_source=time_source, pid=pid, weak=rule.line.weak, detail=detail)


def _mpirun_exit(c: Collector, rule: LineRule, m: re.Match[str], lab: Label, who: Who, line: int,
                 offset: int) -> bool:
    """Open MPI's ``Exit code: N``: the rank is the ``Process name: [[job,1],rank]`` a few lines above."""
    r = _MPI_PROCESS.search(blocks.lines_before(c, 3))
    return r is not None and _exit(c, rule, m, lab, Who(int(r.group(1)), None, None), line, offset)


def _opens(opens: Callable[[Collector, Label, Who, int, int], None]) -> Action:
    """The action of a line that opens torchrun's failure summary with ``opens`` (its header alone, an entry's
    exitcode line), unless a block of its stream is open: a traceback that holds it reads it."""
    def action(c: Collector, rule: LineRule, m: re.Match[str], lab: Label, who: Who, line: int, offset: int) -> bool:
        if lab.key in c._blocks:
            return False
        opens(c, lab, who, line, offset)
        return True
    return action


def _missing_ranks(c: Collector, rule: LineRule, m: re.Match[str], lab: Label, who: Who, line: int,
                   offset: int) -> bool:
    """Horovod's stall inspector (horovod/common/stall_inspector.cc, 0.21+): after its warning, ``Missing ranks:``,
    then a line per rank that had not submitted the tensors the others wait for (``3: [allreduce.grad_a, ...]``: read
    here, ahead, since unlabelled they look like srun --label's task 3), a ``!`` after those stalled past
    HOROVOD_STALL_SHUTDOWN_TIME_SECONDS and ``... Will shutdown.`` for them. The ranks waited for: a finding (a
    warning); those it shut the job down for: each a failure of its own."""
    block, pos = c.here
    ranks: list[str] = []
    shut = False
    for raw in block[block.find(b"\n", pos) + 1:].split(b"\n", 1000)[:1000]:
        text = raw.decode("utf-8", "replace").strip()
        got = _MISSING_RANK.match(split_label(text).rest) or _MISSING_RANK.match(text)
        if got is None:
            shut = "Will shutdown" in text
            break
        ranks.append(got.group(1) + got.group(2))
    if not ranks:
        return True
    names = ",".join(r.rstrip("!") for r in ranks)
    c._add(c.event("stall", WARNING, f"Horovod: ranks waited for rank(s) {names}, which had not submitted the same "
                   "tensors (its stall inspector)", "ranks waited for others (Horovod)", who, line, offset, strong=False,
                   detail={"missing": names}), f"missing:{line}")
    for rank in (int(r[:-1]) for r in ranks if shut and r.endswith("!")):
        c._add(c.event("stall", PRIMARY, f"Horovod shut the job down: rank {rank} stalled (it had not submitted the "
                       "tensors the others waited for, past HOROVOD_STALL_SHUTDOWN_TIME_SECONDS)", "stalled rank (Horovod)",
                       Who(rank, who.node, None), line, offset), f"missing:{line}:{rank}")
    return True


def _first_exit(c: Collector, rule: LineRule, m: re.Match[str], lab: Label, who: Who, line: int,
                offset: int) -> bool:
    """horovodrun's exception naming the first process to exit non-zero, outside a traceback (a paste cut above its
    header, a log shipper's prefix on each line): the process name (its rank) and exit code on the lines after it."""
    block, pos = c.here
    code, first = blocks.runner_first([raw.decode("utf-8", "replace")
                                       for raw in block[block.find(b"\n", pos) + 1:].split(b"\n", 2)[:2]])
    if code is None or first is None:
        return False
    c.exited(code, Who(first.rank, who.node, None), line, offset, f"horovodrun:{first.rank}", t=c.line_time(lab.rest),
             time_source=TIME_LAUNCHER, detail={"via": "horovodrun", "rank_by": "horovodrun's report of the first "
                                                f"process to exit non-zero ({first.rank})"})
    return True


def _agent_ranks(c: Collector, rule: LineRule, m: re.Match[str], lab: Label, who: Who, line: int,
                 offset: int) -> bool:
    """torchrun's rendezvous result: ``group_rank=G ... global_ranks=[8, 9, 10, 11]``, local rank i is the i-th."""
    assert c.ctx is not None
    pairs = c.local_rank_pairs.setdefault(c.ctx.index, {})
    for local, rank in enumerate(int(x) for x in m.group("ranks").replace(",", " ").split()):
        pairs.setdefault(local, rank)
        c.ranks_seen.add(rank)
        if who.node:
            c.node_local_rank.setdefault((who.node, local), rank)
    if m.group("group"):
        c.agent_groups.setdefault(c.ctx.index, int(m.group("group")))
    return True


def _srun_task(c: Collector, rule: LineRule, m: re.Match[str], lab: Label, who: Who, line: int,
               offset: int) -> bool:
    node, what = m.group("node"), m.group("what").strip()
    c.nodes_seen.add(node)
    code = re.search(r"exit code (\d+)", what)
    for task in expand_ranks(m.group("tasks")):
        twho = Who(task, node, None)
        c.rank_node.setdefault(task, node)
        c.ranks_seen.add(task)
        if code:
            _ended(c, rule, int(code.group(1)), twho, line, offset)
        elif "Out Of Memory" in what:
            c._one("oom", PRIMARY, "out of memory (Slurm)", "out of host memory", twho, line, offset, lab.rest)
        elif what.startswith(("Killed", "Terminated")):
            c._one("signal", SECONDARY, f"{what.lower()} by srun after another task failed",
                   f"{what.lower()} by srun", twho, line, offset, lab.rest, strong=False)
    return True


def _slurm_cancel(c: Collector, rule: LineRule, m: re.Match[str], lab: Label, who: Who, line: int,
                  offset: int) -> bool:
    assert c.ctx is not None
    why = (m.group("why") or "").strip()
    strong = bool(why) and why != "CANCELLED"
    what = m.group("what").lower()
    text = f"Slurm cancelled the {what} {m.group('id')} on {m.group('node')}" + (f" due to {why.lower()}" if why else "")
    c._one("slurm", PRIMARY if strong else SECONDARY, text,
           f"Slurm: {what} cancelled" + (f" ({why.lower()})" if why else ""), Who(None, m.group("node"), None), line,
           offset, lab.rest, strong=strong, t=find_time(m.group("at"), c.ctx.day))
    return True


def _tool_error(c: Collector, rule: LineRule, m: re.Match[str], lab: Label, who: Who, line: int,
                offset: int) -> bool:
    msg = m.group("msg")
    cls, label, kind = classify(msg)
    c._one("error-line" if kind == "exception" else kind, cls, clean_message(msg), label or clean_message(msg), who,
           line, offset, lab.rest)
    return True


ACTIONS: dict[str, Action] = {
    "exit": _exit, "mpirun-exit": _mpirun_exit, "summary-alone": _opens(blocks.summary_alone),
    "summary-opens": _opens(blocks.summary_opens), "stall-missing": _missing_ranks, "first-exit": _first_exit,
    "agent-ranks": _agent_ranks,
    "srun-task": _srun_task, "slurm-cancel": _slurm_cancel, "tool-error": _tool_error,
}
"""The catalogue's actions: what a launcher line's match means (each returns False to let the next rule try); a line
whose entry says its event (``Line.says``) is read by :func:`says`."""
