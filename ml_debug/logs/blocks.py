"""Tracebacks and torchrun's failure summary, read whole, line by line, from one writer's stream (its labels),
and the events they give when they close.

A traceback's frames are kept (indented, or a pasted traceback's stripped ones), then its exception line and
the message after it; chained exceptions are followed. torchrun's ``ChildFailedError`` opens its failure
summary: an entry per failed rank (rank, local rank, exit code, pid, host, time, the root cause flagged), each
an exit event.
"""

from __future__ import annotations

import re
import signal
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ml_debug.logs import engine, repeats
from ml_debug.logs.labels import Label, find_time, split_label, srun_task_node, stamped
from ml_debug.logs.result import CUT_SHORT, INFO, PRIMARY, TIME_LAUNCHER, TIME_LINE, TIME_NEARBY, WARNING, Who
from ml_debug.logs.text import EXCEPTION_LINE, blamed, classify, raised_in, short_exception, signal_event_text

if TYPE_CHECKING:
    from ml_debug.logs.events import Collector
    from ml_debug.logs.repeats import Frames

MAX_TRACEBACK_LINES = 400
TRAILING_LINES = 8  # message lines kept after an exception line (CUDA's "might be asynchronously reported" ...)
NEARBY_BYTES = 4096  # how far back a traceback without a time stamp looks for one
TRACEBACK = "Traceback (most recent call last):"
HEADER = TRACEBACK.encode()
RICH_HEADER = "─ Traceback (most recent call last) ─"
"""In rich's traceback (rich.traceback.install, typer's): its box's top rule; the frames are the box's lines, the
exception follows the box."""
_BOX = ("│", "╰")  # the lines of rich's box after its top rule
_FRAME_LINE = re.compile(r'(?:  )?File "[^"\n]{1,4096}", line \d+, in ')  # Python's (or stripped): not a paste's
# torch's ExceptionWrapper re-raising another process's exception (a DataLoader worker's, nn.DataParallel's replica's):
# "KeyError: Caught KeyError in DataLoader worker process 1.", then its own traceback under this line
ORIGINAL = "Original Traceback (most recent call last):"
_CAUGHT = re.compile(r"Caught \w{1,100} in (?P<where>DataLoader worker process \d+|replica \d+ on device \d+)")
CHAIN = ("The above exception was the direct cause of the following exception:",
         "During handling of the above exception, another exception occurred:")
# an exception's line: its type by its name's end, or, after a module's name, one of the standard library's in lower
# case ("socket.gaierror: [Errno -3] Temporary failure in name resolution", "socket.timeout: timed out"); Ray's
# "ray.exceptions.RayTaskError(DistBackendError): ray::..."
_TYPE = r"(?:[A-Za-z_]\w{0,100}\.){0,20}(?:\w{0,100}(?:Error|Exception|Exit|Interrupt|Failure|Fault)\w{0,100}|(?<=\.)[a-z]\w{0,100}(?:error|timeout))"
EXCEPTION_TYPE = re.compile(_TYPE + r"(?:\([\w.]{1,100}\))?: (?P<msg>.*)$")
# Ray re-raises a worker's exception in the caller as "ray.exceptions.RayTaskError(DistBackendError): ray::f() (pid=192,
# ip=10.0.0.19, ...)", then the worker's frames and its exception (python/ray/exceptions.py): the cause, on that node
_RAY_WRAPPER = "RayTaskError("
_RAY_NODE = re.compile(r"RayTaskError\(\w+\): [^\n]{0,300}?\(pid=\d+, ip=(?P<ip>[\w.:\-]{1,100})")
# an exception raised without a message (torchrun's agent: "torch.distributed.elastic.rendezvous.api.RendezvousTimeoutError")
_BARE = re.compile(_TYPE + "$")
# a launcher re-raising a child's exit: subprocess's "CalledProcessError: Command '[...]' returned non-zero exit
# status 1." or, killed by a signal, "... died with <Signals.SIGKILL: 9>." (accelerate/commands/launch.py's
# simple_launcher, deepspeed/launcher/launch.py before 0.6, wrapper scripts); torch.multiprocessing.spawn's "process 3
# terminated with signal SIGSEGV" (or "with exit code 1"), its process index a local rank
_CHILD_EXIT = re.compile(r"returned non-zero exit status (?P<code>-?\d+)|died with (?:<Signals\.SIG\w+: |unknown signal )"
                         r"(?P<sig>\d+)|process (?P<local>\d+) terminated with (?:exit code (?P<exit>-?\d+)|signal "
                         r"(?P<name>SIG[A-Z\d]+))")
# horovodrun's report of the first process to exit non-zero (horovod/runner/gloo_run.py: "RuntimeError: Horovod
# detected that one or more processes exited with non-zero status, thus causing the job to be terminated. The first
# process to do so was:\nProcess name: 1\nExit code: 1"; before 0.20 "Gloo job detected ..."): the name is the rank
_RUNNER_FIRST = "detected that one or more processes exited with non-zero status"
_RUNNER_FIELD = re.compile(r"(?:^|\s)(?:Process name: (?P<rank>\d+)|Exit code: (?P<code>-?\d+))\s*$")
# mp.spawn's line before a process's own traceback (the message of its ProcessRaisedException)
_SPAWNED = re.compile(r"-- Process (\d+) terminated with the following error:")
_SUMMARY_FIELD = re.compile(r"\s*(time|host|rank|exitcode|error_file|traceback)\s*: ?(.*)$")
_SUMMARY_ENTRY = re.compile(r"\[(\d+)\]:\s*$")
# an entry copied from a rendered table, its fields run together: "rank2 (local rank: 2)exitcode: -9 (pid: 36071)"
_SUMMARY_GLUED = re.compile(r"rank\s*:?\s*(?P<rank>\d+) \(local[_ ]rank: (?P<local>\d+)\)\s*exitcode\s*:\s*(?P<code>-?\d+)"
                            r"(?: \(pid: (?P<pid>\d+)\))?")
_RANK_LOCAL = re.compile(r"(-?\d+)(?: \(local_rank: (\d+)\))?")
_EXIT_PID = re.compile(r"(-?\d+)(?: \(pid: (\d+)\))?")
_SIGNAL_PID = re.compile(r"(?i)signal (\d+) \(SIG\w+\) received by PID (\d+)")
# a logging call's record just before a traceback (logger.warning(..., exc_info=True)): a level below ERROR at
# its start, after its time stamp ("2025-03-02 01:00:00,000 [WARNING] ...", "WARNING:root:...", absl's
# "W0302 01:00:00.000 123 train.py:88] ..."); not NCCL's "host:pid:tid [0] NCCL INFO", nor c10's C++ glog line
# ("[W1128 04:18:40.186 socket.cpp:207] [c10d] ..."): another thread's warning that happens to come just
# before a rank's traceback
LOGGED = re.compile(r"^(?:\[?\d{4}-\d\d-\d\d[ T_][\d:.,]{8,15}\]?[ |]{1,4}|\d\d:\d\d:\d\d[\d.,]{0,7}[ |]{1,4})?\[?"
                    r"(?P<level>WARNING|WARN|INFO|DEBUG)\b|^(?P<glog>[WID])\d{4} \d\d:[\d:.]{5,15} +(?:\d+ +)?[\w.-]+\.py:\d+\]")
IGNORED = "Exception ignored "
"""Python's line before a traceback it printed and went on from (sys.unraisablehook: "Exception ignored in: <function
X.__del__ ...>", "... on calling ctypes callback function: ...", "... in atexit callback: ...")."""
_LAUNCHER_FRAME = re.compile(r'(?:torch/distributed/(?:run|launch)\.py|torch/distributed/launcher/api\.py|bin/torchrun)"'
                             r'|torch/multiprocessing/spawn\.py", line \d+, in (?:join|start_processes|spawn)\b')
# the agent reading a failed worker's error file (ProcessFailure): an exception there is the launcher failing to
# report it (torch's race: a worker stopped by SIGTERM while writing it leaves it empty, the agent dies of
# "JSONDecodeError: Expecting value"), a consequence, never a rank's own failure
_REPORTING_FRAME = re.compile(r'elastic/multiprocessing/errors/__init__\.py", line \d+, in __post_init__$')
_FRAME_LAUNCHERS = ("deepspeed", "accelerate", "lightning", "torchrun", "mp.spawn")


@dataclass
class Block:
    """A traceback (or torchrun's failure summary) being read, line by line, from one stream."""

    who: Who
    start_line: int
    start_offset: int
    last_line: int
    text: list[str] = field(default_factory=list)
    stage: str = "frames"  # frames, trailing, chain, summary
    trailing_left: int = 0
    exceptions: list[str] = field(default_factory=list)
    time: float | None = None
    nearby: float | None = None
    torch_rank: bool = False
    stamp: str = ""  # the time stamp in front of its header: its other lines have one too
    summary: Summary | None = None
    srun_task: int | None = None  # the srun task whose lines these are (a torchrun agent under srun --label)
    expect_code: bool = False  # the last line was a frame's 'File "..."': its code line comes next
    # the level of the logging call that printed it (the line before: "... [WARNING] retrying"): the program
    # caught the exception and went on; None when no logging call printed it (uncaught)
    logged: str | None = None
    after_report: bool = False  # it follows torchrun's "failed (exitcode: ...)" line: torchrun's own, when cut short
    consumed: int = 1  # its lines read (a repeat is remembered only when all from its header on were its own)
    # the scanned block and where its header starts in it, while repeats.py may remember it (unlabelled lines)
    origin: tuple[bytes, int] | None = None
    reading: Reading | None = None  # what its text said when last this long (a repeat's): not read again
    marked: int = 0  # its first lines whose launchers' marks were taken (a repeat's, when its first was read)
    # while it may be remembered: where its first exception line starts in the scanned block, and its state
    # before that line (or the frames repeats.py knew it by)
    before_exception: tuple[int, Block | Frames] | None = None

    def copy(self) -> Block:
        """A copy to read on: its lists its own (copy.copy's work, in a third of its time)."""
        block: Block = object.__new__(Block)
        block.__dict__.update(self.__dict__)
        block.text, block.exceptions = list(self.text), list(self.exceptions)
        return block


@dataclass
class Summary:
    """torchrun's ChildFailedError report: one entry per failed rank, the root cause flagged."""

    entries: list[dict[str, Any]] = field(default_factory=list)
    root_next: bool = False
    seen_root: bool = False
    field_name: str | None = None


def open_block(c: Collector, lab: Label, who: Who, line: int, offset: int) -> None:
    """A traceback's header (``lab.rest``) opens a block of its writer's stream: its lines' labels, where
    repeats.py may remember it from, the logging call that printed it, its time (else a nearby line's)."""
    assert c.ctx is not None
    block = Block(who=who, start_line=line, start_offset=offset, last_line=line, text=[lab.rest],
                  torch_rank=lab.torch_rank, stamp=lab.stamp, srun_task=lab.srun_task)
    c._blocks[lab.key] = block
    if not lab.key and not lab.stamp and not lab.who.known:
        block.origin = repeats.rememberable(c)
    block.logged = logged_level(c, lab.key)
    before = lines_before(c, 1)
    block.after_report = "failed (exitcode:" in before
    spawned = _SPAWNED.search(before) if "terminated with the following" in before else None
    if spawned and who.rank is None and who.local_rank is None:
        block.who = Who(None, who.node, int(spawned.group(1)))  # mp.spawn's process N: a local rank
    block.time = find_time(lab.key + lab.stamp, c.ctx.day)
    if block.time is None:
        block.nearby = time_before(c)


def opens(rest: str) -> bool:
    """The line (after its labels) is a traceback's header: Python's, or the top of rich's box."""
    return rest.startswith(TRACEBACK) or (RICH_HEADER in rest and rest.startswith("╭"))


def cut_above(c: Collector, lines: list[Label], who: Who, line: int, offset: int) -> None:
    """A source that starts inside a traceback (a paste cut above its header): its first lines, up to a frame's
    (``File "...", line 12, in f``), all indented, open a block at the first one: a traceback without its header."""
    for n, lab in enumerate(lines):
        if _FRAME_LINE.match(lab.rest):
            if all(earlier.key == lab.key for earlier in lines[:n]):
                c._blocks[lab.key] = Block(who=lab.who.merged(who), start_line=line, start_offset=offset,
                                           last_line=line, torch_rank=lab.torch_rank, srun_task=lab.srun_task)
            return
        if not lab.rest[:1].isspace():
            return


def feed_block(c: Collector, key: str, block: Block, rest: str, who: Who, line: int) -> bool:
    """Feed a line of an open block's stream; False when the line is not part of it."""
    block.last_line = line
    took = _take(c, key, block, rest)
    block.consumed += took
    return took


def _take(c: Collector, key: str, block: Block, rest: str) -> bool:
    if block.stage == "summary":
        return summary_line(c, key, block, rest)
    if block.stage == "frames":
        if rest.startswith((" ", "\t", *_BOX)) or not rest:
            block.expect_code = False
            if len(block.text) < MAX_TRACEBACK_LINES:
                block.text.append(rest)
            return True
        # a traceback pasted with its indentation stripped: frames, their code lines, the ^^^ markers
        stripped = rest.strip()
        if stripped.startswith('File "') or (block.expect_code and not EXCEPTION_TYPE.match(stripped)) \
                or not stripped.strip("^~"):
            block.expect_code = stripped.startswith('File "')
            if len(block.text) < MAX_TRACEBACK_LINES:
                block.text.append("  " + rest if block.expect_code else "    " + rest)
            return True
        if rest.startswith(TRACEBACK):
            if len(block.text) == 1:  # two writers' headers at once (their lines interleaved): read as one
                return True
            close_block(c, key)  # a traceback inside the traceback: the outer one was cut short
            return False
        if not EXCEPTION_LINE.match(rest.strip()) and ":" not in rest:
            return True  # noise from an unlabelled writer between the frames
        if block.origin is not None and block.before_exception is None:
            block.before_exception = (c.here[1], block.copy())
        block.text.append(rest)
        block.exceptions.append(rest.strip())
        if "ChildFailedError" in rest:
            block.stage, block.summary = "summary", Summary()
            return True
        block.stage, block.trailing_left = "trailing", TRAILING_LINES
        return True
    if block.stage in ("trailing", "chain"):
        stripped = rest.strip()
        if stripped in CHAIN:
            block.text += ["", rest]
            block.stage = "chain"
            block.trailing_left = TRAILING_LINES
            return True
        if stripped == ORIGINAL:  # the exception where it was raised (a DataLoader worker, a replica) follows
            block.text.append(rest)
            block.stage, block.expect_code = "frames", False
            return True
        if rest.startswith(TRACEBACK) and block.stage == "chain":
            block.text.append(rest)
            block.stage = "frames"
            return True
        if not stripped:
            block.trailing_left -= 1
            if block.trailing_left <= 0:
                close_block(c, key)
            return True
        if block.stage == "chain" or closes(rest):
            close_block(c, key, closer=True)
            return False
        if _FRAME_LINE.match(rest) and _RAY_WRAPPER in block.exceptions[-1]:
            block.text.append(rest)  # Ray's re-raise: the worker's frames, then its own exception, follow at once
            block.stage, block.expect_code = "frames", True
            return True
        # the exception's message goes on (CUDA's advice, NCCL's "Last error:" ...)
        if len(block.text) < MAX_TRACEBACK_LINES:
            block.text.append(rest)
        block.trailing_left -= 1
        if block.trailing_left <= 0:
            close_block(c, key)
        return True
    return False

def time_before(c: Collector) -> float | None:
    """The time stamp of the nearest line before the current one (within a few kB), or None."""
    block, pos = c.here
    assert c.ctx is not None
    end = pos - 1
    lo = max(0, pos - NEARBY_BYTES)
    while end > lo:
        start = block.rfind(b"\n", lo, end) + 1
        if start == 0 and lo > 0:
            return None
        t = find_time(block[start:end].decode("utf-8", "replace")[:200], c.ctx.day)
        if t is not None:
            return t
        end = start - 1
    return None


def closes(rest: str) -> bool:
    """The line (not blank, not a chain's) ends a traceback after its exception: the program's next line."""
    # NCCL's lines (not a message's "invalid usage of NCCL library"), Python logging's default "ERROR:name:..." (torch
    # 1.x's agent: "ERROR:torch.distributed.elastic.multiprocessing.api:failed (exitcode: 1) ...")
    return (rest.startswith((TRACEBACK, "[", "srun:", "slurmstepd:", "ERROR:", "WARNING:", "INFO:", "CRITICAL:"))
            or " NCCL INFO" in rest or " NCCL WARN" in rest or stamped(rest[:40]))


def summary_line(c: Collector, key: str, block: Block, rest: str) -> bool:
    s = block.summary
    assert s is not None
    if len(block.text) < MAX_TRACEBACK_LINES:
        block.text.append(rest)
    stripped = rest.strip()
    if stripped.startswith("=") and set(stripped) == {"="}:
        if s.seen_root:
            close_block(c, key)
        return True
    if stripped.startswith("Root Cause"):
        s.root_next = True
        return True
    m = _SUMMARY_ENTRY.match(stripped)
    if m:
        s.entries.append({"root": s.root_next})
        s.seen_root = s.seen_root or s.root_next
        s.root_next = False
        s.field_name = None
        return True
    f = _SUMMARY_FIELD.match(rest)
    if f and s.entries:
        s.field_name = f.group(1)
        s.entries[-1][f.group(1)] = f.group(2).strip()
        return True
    g = _SUMMARY_GLUED.match(stripped) if s.entries else None
    if g:
        s.field_name = "exitcode"
        s.entries[-1].update(rank=f"{g['rank']} (local_rank: {g['local']})",
                             exitcode=g["code"] + (f" (pid: {g['pid']})" if g["pid"] else ""))
        return True
    if s.field_name == "traceback" and s.entries and rest.startswith("  "):
        s.entries[-1]["traceback"] = s.entries[-1].get("traceback", "") + "\n" + rest[2:]
        return True
    return True

@dataclass(frozen=True)
class Reading:
    """What a traceback's text says: its text alone decides it, so a repeat of it is not read again."""

    launchers: tuple[str, ...]  # launchers whose own frames it holds (accelerate/commands/launch.py ...)
    report: bool  # rule 1: torchrun's (or torch.distributed.launch's) own traceback, reporting a worker's failure
    cls: str
    label: str | None
    cause: str
    message: str
    blames: Any
    exit_code: int | None  # a launcher's report of its child's exit (a CalledProcessError, mp.spawn's, horovodrun's)
    exit_who: Who | None  # whose, where the report says: mp.spawn's process index (a local rank), horovodrun's
    # process name (a rank); a CalledProcessError's command line is the last one its launcher started, whichever
    # failed (torch.distributed.launch 1.x, DeepSpeed)
    length: int  # the number of text lines read
    where: str | None  # the job's own code where it was raised (text.raised_in)
    node: str | None  # the node it was raised on, where a wrapper says (Ray's re-raise of a worker's exception)


def read(block: Block) -> Reading:
    whole = "\n".join(block.text)
    launchers = tuple(name for name in engine.marks(whole) if name in _FRAME_LAUNCHERS)
    final = block.exceptions[-1] if block.exceptions else ""
    # rule 1: a launcher's own traceback reports its workers' failure, as does one damaged, cut short or raised
    # while it read a failed worker's error file; its own exception otherwise (a rendezvous error, a signal) is
    # the agent's failure, read as any other
    report = _launcher_frames(block.text) and (not (EXCEPTION_TYPE.match(final.strip()) or _BARE.match(final.strip()))
                                               or any(_REPORTING_FRAME.search(t) for t in block.text))
    # the exceptions and their messages, not the frames (code lines say anything)
    said = "\n".join(t for t in block.text if t and not t.startswith((" ", "\t", "╭", *_BOX)))
    cls, label, cause = classify(said[-4000:])
    # the exception's line and the lines after it as one: a terminal may have wrapped a long command line
    m = (_CHILD_EXIT.search("".join(block.text[-3:]))
         if "CalledProcessError: Command " in final or " terminated with " in final else None)
    code, who = _child_exit(m) if m else runner_first(block.text[-4:]) if _RUNNER_FIRST in final else (None, None)
    caught = _CAUGHT.search(block.exceptions[-2]) if len(block.exceptions) > 1 else None
    message = (short_exception(final) + (f" (in {caught['where']})" if caught else "")) if final else CUT_SHORT
    return Reading(launchers, report, cls, label, cause, message,
                   blamed(whole), code, who, len(block.text), raised_in(block.text), _ray_node(block.exceptions))


def _ray_node(exceptions: list[str]) -> str | None:
    """The node of the innermost of Ray's re-raises (the worker's; the outer ones are the actors that waited on it)."""
    ray = [m["ip"] for e in exceptions if _RAY_WRAPPER in e and (m := _RAY_NODE.search(e))]
    return ray[-1] if ray else None


def _child_exit(m: re.Match[str]) -> tuple[int | None, Who | None]:
    """(exit code, negative for a signal; mp.spawn's process index) of a launcher's report of its child's exit."""
    g = m.groupdict()
    local = Who(None, None, int(g["local"])) if g["local"] else None
    if g["name"]:
        sig = signal.Signals.__members__.get(g["name"])
        return (-int(sig) if sig is not None else None), local
    code = g["code"] or g["exit"]
    return (int(code) if code else -int(g["sig"])), local


def runner_first(text: list[str]) -> tuple[int | None, Who | None]:
    """horovodrun's exit code and rank of the first process to exit non-zero: the lines after its exception's (in
    either order: a log shipper that sorts the lines of one second may swap them)."""
    said = {k: int(v) for t in text if (m := _RUNNER_FIELD.search(t)) for k, v in m.groupdict().items() if v}
    return said.get("code"), (Who(said["rank"], None, None) if "rank" in said else None)


def _mark_frames(c: Collector, text: list[str]) -> None:
    """The launchers whose own frames (accelerate/commands/launch.py ...) ``text`` holds. No mark spans lines:
    a text's lines marked in parts are marked as the whole."""
    if text:
        for name in _FRAME_MARKS("\n".join(text).encode("utf-8", "surrogatepass")):
            c._mark(name)


_FRAME_MARKS = engine.ByShape(lambda data: tuple(name for name in engine.marks(data.decode("utf-8", "surrogatepass"))
                                                 if name in _FRAME_LAUNCHERS))
"""Per shape: a retry loop's new messages (``OSError: ... shard_00042.tar``) are the same text to the marks."""


def close_block(c: Collector, key: str, closer: bool = False, last: bool = False) -> None:
    """The block of ``key`` ends (``closer``: at a line of its stream that is not its own; ``last``: at the end of
    the source, nothing after it)."""
    assert c.ctx is not None
    block = c._blocks.pop(key)
    if block.summary is not None:
        c.reported.add(c.ctx.index)
        _mark_frames(c, block.text)
        summary_events(c, block)
        return
    reading = block.reading if block.reading is not None and block.reading.length == len(block.text) else None
    stream = key if block.logged is None else f"handled:{key}"  # handled ones never crowd out the last failure
    full = c.full(stream)  # then it is only counted: the work of making its event is saved
    if full and reading is None and not repeats.wanted(c, block, closer):
        _mark_frames(c, block.text[block.marked:])
        return
    reading = reading or read(block)
    for name in reading.launchers:
        c._mark(name)
    if closer:
        repeats.remember(c, block, reading)
    if full:
        return
    if reading.report or (block.after_report and reading.message == CUT_SHORT):
        c.reported.add(c.ctx.index)
        c._add(c.event("launcher", INFO, "the launcher's own traceback (it reports a worker's failure)",
                       "launcher traceback", block.who, block.start_line, block.start_offset, strong=False,
                       text=block.text[:MAX_TRACEBACK_LINES]), stream)
        return
    t, time_source = (block.time, TIME_LINE) if block.time is not None else (block.nearby, TIME_NEARBY)
    ev = c.event("traceback", reading.cls, reading.message, reading.label or reading.message.split(":", 1)[0],
                 block.who, block.start_line, block.start_offset, t=t, time_source=time_source,
                 text=block.text[:MAX_TRACEBACK_LINES], blames=reading.blames,
                 detail={"cause": reading.cause, **({"raised_in": reading.where} if reading.where else {})})
    if reading.node and not ev.who.node:
        ev.who = Who(ev.who.rank, reading.node, ev.who.local_rank)
    code = reading.exit_code
    # handled: a logging call printed it and the program went on. Not the last thing in the source (a crash right
    # after an INFO line), nor a launcher's report of its child's exit (the line before it is the child's last)
    last = last and not _after_exception(block)
    if block.logged == IGNORED and reading.cls == PRIMARY:
        ev.cls, ev.strong = WARNING, False
        ev.detail["handled"] = "Python ignored it (raised in a destructor or a callback, at exit too): the program went on"
    elif block.logged and reading.cls == PRIMARY and not last and not (code is not None and reading.launchers):
        ev.cls, ev.strong = WARNING, False
        ev.detail["handled"] = f"printed by a logging call at level {block.logged}: the program caught it and went on"
    elif block.logged and reading.cls == PRIMARY and code is None:
        ev.detail["logged"] = f"after a line at level {block.logged} and the last in the file: it may have been caught"
    elif code is not None:  # a launcher (accelerate, a wrapper script, mp.spawn) reporting its child's exit
        ev.kind, ev.strong, ev.label = "exit", False, f"exit code {code}"
        if code < 0:
            ev.kind = "signal"
            ev.cls, ev.message, ev.strong, ev.label = signal_event_text(code)
        via = ("a launcher's subprocess.CalledProcessError" if "CalledProcessError" in reading.message
               else "horovodrun" if _RUNNER_FIRST in reading.message else "torch.multiprocessing.spawn")
        ev.detail.update({"exit_code": code, "via": via})
        if via == "horovodrun" and code > 0:
            ev.message = f"exited with code {code}"
        exit_who = reading.exit_who
        if exit_who is not None and ev.who.rank is None and ev.who.local_rank is None:
            ev.who = Who(exit_who.rank, ev.who.node, exit_who.local_rank)
            ev.detail["rank_by"] = (f"mp.spawn's report of its process {exit_who.local_rank}" if exit_who.rank is None
                                    else f"horovodrun's report of the first process to exit non-zero ({exit_who.rank})")
        if ev.who.rank is None and any(t.endswith(", in simple_launcher") for t in block.text):
            ev.who = Who(0, ev.who.node, 0)  # rule 3: accelerate launch's launcher of a single process
            ev.detail["rank_by"] = "accelerate's simple_launcher (a world of one process)"
    c._add(ev, stream)


def _after_exception(block: Block) -> bool:
    """Lines after the traceback's exception line (read as its message's): something followed it."""
    final = block.exceptions[-1] if block.exceptions else None
    at = next((i for i in range(len(block.text) - 1, -1, -1) if block.text[i].strip() == final), len(block.text))
    return any(t.strip() for t in block.text[at + 1:])


def logged_level(c: Collector, key: str) -> str | None:
    """The level of the logging record on the line before the current one, when the same writer wrote it and
    the level is below ERROR (a handled exception, logged with its traceback)."""
    buf, pos = c.here
    said = c.said
    if said is not None and said[0] is buf and 0 < pos and said[1] == buf.rfind(b"\n", 0, pos - 1) + 1:
        return _level(said[2], key)  # that line was just read: its labels are known
    record = buf[buf.rfind(b"\n", 0, pos - 1) + 1 if pos > 0 else 0:pos]
    return _level_of(record, key) if key else _UNLABELLED_LEVEL(record)  # a label's digits are its own


def _level_of(raw: bytes, key: str) -> str | None:
    prev = raw.decode("utf-8", "replace").rstrip("\n").rstrip("\r")
    if not prev or ("WARN" not in prev and "INFO" not in prev and "DEBUG" not in prev and prev[:1] not in "[WID"
                    and IGNORED not in prev):
        return None
    return _level(split_label(prev), key)


_UNLABELLED_LEVEL = engine.ByShape(lambda record: _level_of(record, ""))


def _level(lab: Label, key: str) -> str | None:
    if lab.key != key:
        return None
    if lab.rest.startswith(IGNORED):
        return IGNORED
    m = LOGGED.match(lab.rest)
    if not m or next(engine.marks(lab.rest), None) is not None:
        return None  # a launcher's own line (DeepSpeed's "[INFO] [launch.py:102:main] ..."): not the program's call
    level = m.group("level") or {"W": "WARNING", "I": "INFO", "D": "DEBUG"}[m.group("glog")]
    return "WARNING" if level == "WARN" else level


def _launcher_frames(text: list[str]) -> bool:
    """Frames of torchrun's own code (run.py's main, launch.py, the launcher API) or of mp.spawn's waiting for its
    processes (join): the traceback is the launcher's. (A worker's own traceback may pass through elastic's
    ``@record`` wrapper, or mp.spawn's ``_wrap``, never these.)"""
    return any(t.lstrip().startswith('File "') and _LAUNCHER_FRAME.search(t) for t in text[:MAX_TRACEBACK_LINES])


def summary_events(c: Collector, block: Block) -> None:
    """torchrun's ChildFailedError summary: one event per failed rank (time: when torchrun saw it)."""
    assert c.ctx is not None and block.summary is not None
    told = False
    cut_root: Who | None = None  # the root cause's entry, cut short before its exit code (and its time)
    root_time: float | None = None
    for entry in block.summary.entries:
        m = _RANK_LOCAL.match(entry.get("rank", ""))
        rank = int(m.group(1)) if m and int(m.group(1)) >= 0 else None
        local = int(m.group(2)) if m and m.group(2) is not None else None
        m = _EXIT_PID.match(entry.get("exitcode", ""))
        sig = None if m else _SIGNAL_PID.match(entry.get("traceback", ""))  # "Signal 9 (SIGKILL) received by PID 7"
        code = int(m.group(1)) if m else -int(sig.group(1)) if sig else None
        pid = int(m.group(2)) if m and m.group(2) else int(sig.group(2)) if sig else None
        host = entry.get("host") or None
        node = host.split(".")[0] if host and host not in ("localhost", "<N/A>") else None
        who = Who(rank, node, local).merged(block.who) if block.who.rank is None else Who(rank, node, local)
        if rank is not None and local is not None:
            c.local_rank_pairs.setdefault(c.ctx.index, {}).setdefault(local, rank)
        if rank is not None:
            c.ranks_seen.add(rank)
            if node:
                c.rank_node.setdefault(rank, node)
        if node and block.srun_task is not None:
            c.srun_hosts.setdefault(srun_task_node(block.srun_task), node)
        if not code:
            if entry.get("root") and rank is not None:
                cut_root, root_time = who, find_time(entry.get("time", ""), c.ctx.day)
            continue
        told = True
        t = find_time(entry.get("time", ""), c.ctx.day)
        tb = (entry.get("traceback") or "").strip()
        detail: dict[str, Any] = {"torchrun_root_cause": bool(entry.get("root"))}
        if entry.get("error_file") and entry["error_file"] != "<N/A>":
            detail["error_file"] = entry["error_file"]
        if not (tb and "Traceback" in tb):
            c.exited(code, who, block.start_line, block.start_offset, f"summary:{rank}", t=t,
                     time_source=TIME_LAUNCHER, pid=pid, detail=detail)
            continue
        lines = tb.splitlines()
        message = short_exception(next((ln.strip() for ln in reversed(lines) if ln.strip()), ""))
        cls, label, kind = classify(tb)
        c._add(c.event("error-file", cls, message, label or message.split(":", 1)[0], who, block.start_line,
                       block.start_offset, t=t, time_source=TIME_LAUNCHER, text=lines,
                       detail={"exit_code": code, "via": "torchrun summary", **detail,
                               **({"raised_in": where} if (where := raised_in(lines)) else {})}), f"summary:{rank}")
    # cut short before any entry's exit code (or before its root cause's), and no agent line of this source said one:
    # a worker failed (the root cause, when the summary named it), which one is not in the logs
    if (cut_root or not told) and not any(e.source_index == c.ctx.index and e.detail.get("via") == "torchrun"
                                          for e in c.events):
        said = ("torchrun's failure summary (ChildFailedError) names it the root cause, but is cut short before its "
                "exit code") if cut_root else ("torchrun reports a failed worker (ChildFailedError), but its failure "
                                               "summary is cut short before it says which")
        c._add(c.event("launcher", PRIMARY, said, "worker failed (torchrun)", cut_root or block.who, block.start_line,
                       block.start_offset, t=root_time, time_source=TIME_LAUNCHER, strong=False,
                       detail={"torchrun_root_cause": cut_root is not None}), "summary:cut")


def lines_before(c: Collector, n: int) -> str:
    """The ``n`` lines before the current one (within the block being scanned)."""
    block, pos = c.here
    start = pos
    for _ in range(n):
        if start <= 0:
            break
        start = block.rfind(b"\n", 0, start - 1) + 1
    return block[start:pos].decode("utf-8", "replace")


def summary_opens(c: Collector, lab: Label, who: Who, line: int, offset: int) -> None:
    """torchrun's ``ChildFailedError:`` line outside a traceback (the traceback cut off above it, or drawn in
    rich's box): its failure summary follows."""
    c._blocks[lab.key] = Block(who=who, start_line=line, start_offset=offset, last_line=line, text=[lab.rest],
                               stage="summary", summary=Summary())


def summary_alone(c: Collector, lab: Label, who: Who, line: int, offset: int) -> None:
    """torchrun's failure summary pasted without its traceback (or with its header cut): an entry's exitcode
    line opens it; the entry's lines before it (and whether it was the root cause) are read back."""
    entry = [ln for ln in lines_before(c, 8).split("\n") if ln.strip()]
    start = max((i for i, ln in enumerate(entry) if _SUMMARY_ENTRY.match(ln.strip())), default=None)
    root = start is not None and start > 0 and entry[start - 1].strip().startswith("Root Cause")
    summary = Summary([{"root": root}], seen_root=root)
    for ln in entry[(start + 1 if start is not None else 0):]:
        if f := _SUMMARY_FIELD.match(split_label(ln).rest):
            summary.entries[-1][f.group(1)] = f.group(2).strip()
    block = c._blocks[lab.key] = Block(who=who, start_line=line, start_offset=offset, last_line=line,
                                       stage="summary", summary=summary)
    summary_line(c, lab.key, block, lab.rest)
