"""Failure events from log lines: tracebacks kept whole, one-line failures, torchrun's failure summary.

A :class:`Collector` is fed the lines of one source at a time (only the lines that can matter, plus
every line while a traceback or torchrun's summary is being read) and keeps events, never ordinary
lines. Each event is classed where it is made:

- secondary: the text is a consequence of a peer's failure (a reset or closed connection, a broken
  pipe, a gloo or NCCL watchdog timeout, a store that lost its server, a rank stopped by torchrun's
  SIGTERM after another one failed);
- primary: any other failure (an exception that is not a communication error, a CUDA error, an
  out-of-memory, a crash by signal, an error file's exception);
- weak primary (``strong=False``): a bare exit code or a kill by srun, evidence of a failure but not its
  cause. It names the first failure only when nothing stronger exists.
"""

from __future__ import annotations

import datetime as _dt
import json
import re
import signal
from dataclasses import dataclass, field
from typing import Any

from ml_debug.logs.labels import Label, brief, find_time, split_label, srun_task_node, strip_ansi, unstamped
from ml_debug.logs.model import (
    INFO,
    PRIMARY,
    SECONDARY,
    TIME_ERROR_FILE,
    TIME_LAUNCHER,
    TIME_LINE,
    TIME_NEARBY,
    TIME_ORDER,
    WARNING,
    Event,
    Who,
)
from ml_debug.logs.nccl import NcclCollector
from ml_debug.logs.repair import mend_line

MAX_TRACEBACK_LINES = 400
MAX_EVENTS_PER_STREAM = 64
MAX_EVENTS = 100_000
MAX_SAMPLED = 100_000  # distinct writers whose labels were sampled (see Collector.sample)
STALE_LINES = 5000  # a traceback whose writer printed nothing more for this many lines of its file is closed
TRAILING_LINES = 8  # message lines kept after an exception line (CUDA's "might be asynchronously reported" ...)
MESSAGE_CHARS = 64 << 10  # the most of a message kept; the human view shows less (labels.brief)

TRACEBACK = "Traceback (most recent call last):"
CHAIN = ("The above exception was the direct cause of the following exception:",
         "During handling of the above exception, another exception occurred:")

# ----------------------------------------------------------------------------- classification

_CPP_LOCATION = re.compile(r"\[[^\]\s]*\.(?:cc|cpp|h|hpp|cu):\d+\]\s*")
# c10d's glog header and process-group tag: "[E0302 03:14:07.123456 ProcessGroupNCCL.cpp:1595] [PG 0 Rank 37] "
_GLOG_HEADER = re.compile(r"^\[?[IWEF]\d{4} [\d:.]+(?: +\d+)? [^\]]*\]\s*")
_PG_TAG = re.compile(r"^\[(?:PG [^\]]*?)?Rank \d+\]\s*")
_BOILERPLATE = re.compile(r"\s*(?:This is typically caused by .*|GLHF.*|Exception raised from .*)$")
_CUDA_ERROR = re.compile(r"CUDA error: ([^\n]+?)(?:\s*$|\nCUDA kernel)|CUDA error: (.+)")
_OOM = re.compile(r"CUDA out of memory|OutOfMemoryError|[Oo]ut of memory|OUT_OF_MEMORY|oom[-_]kill|Out Of Memory")
_CRASH = re.compile(r"Segmentation fault|SIGSEGV|SIGBUS|SIGABRT|SIGFPE|SIGILL|Fatal Python error|core dumped")
# a DataLoader worker killed by SIGBUS: its shared memory (/dev/shm) ran out
_BUS = re.compile(r"DataLoader worker \(pid[^)]*\) is killed by signal: Bus error|out of shared memory")
# NCCL's shared-memory transport could not make its segment (/dev/shm too small in a container)
_SHM_SEGMENT = re.compile(r"(?:Error while creating|unable to allocate|failed to (?:create|open|extend)) shared memory "
                          r"(?:segment|file)|/dev/shm/nccl-\S+.*(?:failed|[Nn]o space|[Cc]annot)")
_NCCL_LOCAL = re.compile(r"unhandled cuda error|ncclUnhandledCudaError|Cuda failure|ncclInternalError|"
                         r"ncclInvalidUsage|ncclInvalidArgument|invalid usage|NET/IB ?: Got completion from peer .* "
                         r"with (?:error|status)")
# A consequence of another rank's failure: (canonical label, pattern), first match wins.
_SECONDARY: list[tuple[str, re.Pattern[str]]] = [
    ("NCCL watchdog timeout", re.compile(r"Watchdog caught collective operation timeout|"
                                         r"Some NCCL operations have failed or timed out")),
    ("Connection reset by peer", re.compile(r"Connection reset by peer|ConnectionResetError")),
    ("Connection closed by peer", re.compile(r"Connection closed by (?:remote )?peer|closed by remote peer")),
    ("Broken pipe", re.compile(r"Broken pipe|BrokenPipeError")),
    ("gloo timeout waiting for a peer", re.compile(r"Timed out waiting \d+ms for (?:recv|send) operation")),
    ("NCCL remote error", re.compile(r"ncclRemoteError|remote process exited or there was a network error")),
    ("NCCL communicator aborted", re.compile(r"NCCL communicator was aborted|[Cc]ommunicator was aborted")),
    ("a peer did not reach the barrier", re.compile(r"failed to pass monitoredBarrier")),
    ("store lost its server", re.compile(r"recvValue failed|Failed to recv, got 0 bytes|DistStoreError|"
                                         r"Socket Timeout|Connection refused|DistNetworkError")),
    ("watchdog stopped the process", re.compile(r"watchdog thread terminated with exception|"
                                                r"Heartbeat monitor timed out|taking the entire process down")),
    ("stopped by a signal", re.compile(r"SignalException|KeyboardInterrupt")),
]
_BLAMED = re.compile(r"Ranks? ([\d, ]+) failed to pass monitoredBarrier")
_EXCEPTION_LINE = re.compile(r"(?P<type>(?:[A-Za-z_]\w*\.)*[A-Za-z_]\w*)(?::(?: (?P<msg>.*))?)?$")
_INLINE_EXCEPTION = re.compile(r"(?<![\w.])(?:[A-Za-z_]\w*\.)*\w*(?:Error|Exception): \S")
NEARBY_BYTES = 4096  # how far back a traceback without a time stamp looks for one
_EXCEPTION_TYPE = re.compile(r"(?:[A-Za-z_]\w*\.)*(?P<short>\w*(?:Error|Exception|Exit|Interrupt|Failure|Fault)\w*)"
                             r": (?P<msg>.*)$")


def clean_message(text: str) -> str:
    """One readable line: C++ source locations and boilerplate advice dropped, shortened."""
    line = text.strip().splitlines()[0] if text.strip() else ""
    line = _PG_TAG.sub("", _GLOG_HEADER.sub("", line))
    line = _BOILERPLATE.sub("", _CPP_LOCATION.sub("", line))
    return line[:MESSAGE_CHARS]


def short_exception(line: str) -> str:
    """``torch.distributed.DistNetworkError: x`` -> ``DistNetworkError: x`` (the last name only)."""
    m = _EXCEPTION_LINE.match(line.strip())
    if not m:
        return clean_message(line)
    name = m.group("type").rsplit(".", 1)[-1]
    msg = m.group("msg")
    return clean_message(f"{name}: {msg}" if msg else name)


def classify(text: str) -> tuple[str, str, str]:
    """(class, label, kind) of a failure described by ``text`` (an exception with its message)."""
    if _BUS.search(text):
        return PRIMARY, "DataLoader worker killed by a bus error (shared memory)", "shm"
    if _SHM_SEGMENT.search(text):
        return PRIMARY, "NCCL shared-memory segment failed (/dev/shm)", "shm"
    m = _CUDA_ERROR.search(text)
    if m:
        what = (m.group(1) or m.group(2) or "").strip()
        return PRIMARY, clean_message("CUDA error: " + what), "cuda-error"
    if _OOM.search(text):
        return PRIMARY, "out of memory", "oom"
    if _NCCL_LOCAL.search(text):
        return PRIMARY, "NCCL error", "nccl-error"
    for label, rx in _SECONDARY:
        if rx.search(text):
            return SECONDARY, label, "comm" if "watchdog" not in label else "watchdog"
    if _CRASH.search(text):
        return PRIMARY, "crash (signal)", "signal"
    return PRIMARY, "", "exception"


SIGNAL_NAMES = {int(s): s.name for s in signal.Signals}


def signal_event_text(code: int) -> tuple[str, str, bool, str]:
    """(class, message, strong, label) for a rank that ended with exit code ``code`` < 0 (killed by -code)."""
    sig = -code
    name = SIGNAL_NAMES.get(sig, f"signal {sig}")
    if sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        return SECONDARY, f"stopped by {name} (the launcher stops the other ranks after one fails)", False, \
            f"stopped by {name}"
    if sig == signal.SIGKILL:
        return PRIMARY, "killed by SIGKILL (the kernel's OOM killer, a job limit, or kill -9)", True, "killed (SIGKILL)"
    return PRIMARY, f"crashed with {name}", True, f"crashed ({name})"


# ----------------------------------------------------------------------------- one-line detectors

# "WorkNCCL(SeqNum=7, OpType=ALLREDUCE, ..., Timeout(ms)=1800000) ran for 1800341 milliseconds": the parentheses nest
_WATCHDOG = re.compile(r"Watchdog caught collective operation timeout: \w+\((?P<work>.*?)\) ran for (?P<ms>\d+) "
                       r"milliseconds")
_WATCHDOG_RANK = re.compile(r"\[(?:PG [^\]]*?)?Rank (\d+)\]")
_LAST_WORK = re.compile(r"last enqueued NCCL work: (\d+), last completed NCCL work: (-?\d+)")
# torchrun's agent, every shape since torch 1.10 (the logger's prefix varies: "ERROR:torch.distributed.elastic...:",
# "[...] torch.distributed.elastic...: [ERROR] ", glog's "E0501 03:14:07.123 ... api.py:869] "), maybe cut short
_TORCHRUN_FAILED = re.compile(r"failed \(exitcode: (-?\d+)\)(?:\s+local_rank: (\d+)(?:\s+\(pid: (\d+)\)?)?)?")
# DeepSpeed's per-node launcher (deepspeed/launcher/launch.py, sigkill_handler): the command line is the last
# rank it started, not the one that failed; the return code is the fact
_DS_EXIT = re.compile(r"(?:\[launch\.py:\d+:sigkill_handler\] )?(?P<cmd>\[.*\]|.*?) exits with return code = (?P<code>-?\d+)")
# Open MPI: "The first process to do so was: Process name: [[24168,1],2]  Exit code: 1" (mpirun 4, prterun 5)
_MPI_PROCESS = re.compile(r"Process name: \[(?:\[\d+,\d+\],|[^\]]*@\d+,)(\d+)\]")
_MPI_EXIT = re.compile(r"^\s*Exit code:\s+(-?\d+)")
_MPI_SIGNAL = re.compile(r"process rank (\d+) with PID (\d+) on node (\S+) exited on signal (\d+)")
# pdsh (and DeepSpeed's multi-node runner through it): "pdsh@head: node2: ssh exited with exit code 1"
_PDSH_EXIT = re.compile(r"pdsh@\S+: (?P<node>[\w.\-]+): (?P<what>.+?) exited with exit code (?P<code>\d+)")
# Lightning's launcher: "Child process with PID 1234 terminated with code 1. Forcefully terminating all other ..."
_LIGHTNING_CHILD = re.compile(r"Child process with PID (\d+) terminated with code (-?\d+)")
# accelerate launch (and wrapper scripts) re-raising a child's exit: "subprocess.CalledProcessError: Command '[...]'
# returned non-zero exit status 1." (accelerate/commands/launch.py simple_launcher, Python's subprocess.py)
_CALLED_PROCESS = re.compile(r"CalledProcessError: Command .* returned non-zero exit status (-?\d+)")
# torchrun's failure summary without its traceback (pasted alone): an entry's exitcode line
_SUMMARY_EXITCODE = re.compile(r"^\s*exitcode\s*: -?\d+")
# A line that looks like a failure but says no more: the last resort when nothing else was found
_SUSPECT = re.compile(r"\b(?:ERROR|FATAL|CRITICAL|[Ee]rror|[Ff]ailed|FAILED|[Aa]borted|core dumped)\b")
# counts of none, and warnings or info lines that mention a failure (torchvision's "UserWarning: Failed to load image
# Python extension", a retry that worked): a job that printed them may well have succeeded
_NOT_SUSPECT = re.compile(r"\b(?:0 errors?|no errors?|errors?: 0|error_?rate|failed: 0|without errors?|\w*Warning|"
                          r"WARN(?:ING)?|INFO|DEBUG|retry(?:ing)?)\b|^\[?[IWD]\d{4} ", re.I)
MAX_SUSPECTS = 20
# Which launcher wrote a log: words of its own lines (and of the frames of its tracebacks)
LAUNCHER_MARKS: list[tuple[str, re.Pattern[str]]] = [
    ("deepspeed", re.compile(r"deepspeed[/.]launcher|\[launch\.py:\d+:(?:main|sigkill_handler)\]")),
    ("accelerate", re.compile(r"accelerate/commands/launch\.py|accelerate launch")),
    ("lightning", re.compile(r"lightning/(?:pytorch|fabric)/|pytorch_lightning/|Child process with PID \d+ terminated")),
    ("torchrun", re.compile(r"torch[./]distributed[./](?:elastic|run)|ChildFailedError|failed \(exitcode:")),
    ("mpirun", re.compile(r"mpirun|prterun|Primary job\s+terminated|Process name: \[")),
    ("pdsh", re.compile(r"pdsh@")),
    ("srun", re.compile(r"srun: |slurmstepd")),
]
_CLOSING = re.compile(r"Sending process (\d+) closing signal (SIG\w+)")
_SRUN_TASK = re.compile(r"srun: error: (?P<node>\S+): tasks? (?P<tasks>[\d,\-]+): (?P<what>.+)")
_SRUN_NODE_FAIL = re.compile(r"srun: error: Node failure on (\S+)")
_SLURM_CANCEL = re.compile(r"\*\*\* (?P<what>JOB|STEP) (?P<id>\S+) ON (?P<node>\S+) CANCELLED AT (?P<at>\S+)"
                           r"(?: DUE TO (?P<why>[A-Z ]+?))?(?: \*\*\*)?$")
_OOM_KILL = re.compile(r"Detected (\d+) oom[-_]kill event")
_LAUNCH_TIMEOUT = re.compile(r"mldebug launch: error: --(?:run-)?timeout (?P<s>\S+) s reached")
_TOOL_ERROR = re.compile(r"(?:mldebug|python\d?(?:\.\d+)?): error: (?P<msg>.+)")
_FATAL = re.compile(r"Fatal Python error: (?P<msg>.+)")
# the interpreter's own errors before any code runs: "python3: can't open file 'x.py': [Errno 2] ...",
# "/usr/bin/python3: No module named x" (no traceback follows)
_PYTHON_START = re.compile(r"(?:^|/)(?P<exe>python[\d.]*): (?P<msg>(?P<what>can't open file|No module named|"
                           r"Error while finding module specification) .+)")
_SEGFAULT = re.compile(r"Segmentation fault")
_KILLED = re.compile(r"(?:^|\s)Killed(?:\s|$)")
_SUMMARY_FIELD = re.compile(r"\s*(time|host|rank|exitcode|error_file|traceback)\s*: ?(.*)$")
_SUMMARY_ENTRY = re.compile(r"\[(\d+)\]:\s*$")
_RANK_LOCAL = re.compile(r"(-?\d+)(?: \(local_rank: (\d+)\))?")
_EXIT_PID = re.compile(r"(-?\d+)(?: \(pid: (\d+)\))?")


def _expand_tasks(text: str) -> list[int]:
    out: list[int] = []
    for part in text.split(","):
        lo, sep, hi = part.partition("-")
        if lo.isdigit() and (not sep or hi.isdigit()):
            out.extend(range(int(lo), int(hi) + 1) if sep else [int(lo)])
    return out


# ----------------------------------------------------------------------------- streams


@dataclass
class _Block:
    """A traceback (or torchrun's failure summary) being read, line by line, from one stream."""

    who: Who
    start_line: int
    start_offset: int
    last_line: int
    text: list[str] = field(default_factory=list)
    stage: str = "frames"  # frames, trailing, chain, summary
    event: Event | None = None
    trailing_left: int = 0
    exceptions: list[str] = field(default_factory=list)
    time: float | None = None
    nearby: float | None = None
    torch_rank: bool = False
    stamp: str = ""  # the time stamp in front of its header: its other lines have one too
    summary: _Summary | None = None
    srun_task: int | None = None  # the srun task whose lines these are (a torchrun agent under srun --label)
    expect_code: bool = False  # the last line was a frame's 'File "..."': its code line comes next


@dataclass
class _Summary:
    """torchrun's ChildFailedError report: one entry per failed rank, the root cause flagged."""

    entries: list[dict[str, Any]] = field(default_factory=list)
    root_next: bool = False
    seen_root: bool = False
    field_name: str | None = None


@dataclass
class SourceContext:
    """What the collector needs to know about the source being read."""

    index: int
    path: str
    who: Who
    day: _dt.date
    labelled: bool = True
    node_prefix: bool = False
    """Every line starts with its node's name (pdsh)."""


class Collector:
    """Events from the lines of every source, and what the lines say about who is who."""

    def __init__(self, nccl: NcclCollector | None = None) -> None:
        self.nccl = nccl or NcclCollector()
        self.events: list[Event] = []
        self.dropped = 0
        self.ctx: SourceContext | None = None
        self._blocks: dict[str, _Block] = {}
        self._per_stream: dict[tuple[int, str], int] = {}
        self.line = 0
        # identity facts, resolved by verdict.py
        self.local_rank_pairs: dict[int, dict[int, int]] = {}  # source index -> local rank -> global rank
        self.node_local_rank: dict[tuple[str, int], int] = {}
        self.rank_node: dict[int, str] = {}
        self.ranks_seen: set[int] = set()
        self.launch_world: int | None = None  # nnodes x nproc-per-node from `mldebug launch` manifests
        self.launch_exit: int | None = None  # the exit code the `mldebug launch` manifests record
        self.nodes_seen: set[str] = set()
        self.sampled: dict[tuple[int, Who], None] = {}  # (source index, who) of labels sampled from ordinary lines
        self.last_work: dict[int, tuple[int, int]] = {}
        self.repairs: dict[int, dict[str, int]] = {}  # source index -> what was cut off lines -> how many
        self.launchers: dict[int, set[str]] = {}  # source index -> the launchers whose lines it holds
        self.srun_hosts: dict[str, str] = {}  # "node of srun task 1" -> the host its torchrun summary names
        self.node_prefixed: set[int] = set()  # sources whose lines start with their node's name (pdsh)
        self._stamp = ""  # the time stamp a collector put before the current line's labels
        self.notes: dict[int, list[str]] = {}  # source index -> what was mended in the whole text
        self.suspects: list[Event] = []  # lines that look like a failure and say no more (the last resort)
        self.here: tuple[bytes, int] = (b"", 0)
        """The block being scanned and where the current line starts in it (set by the scanner)."""

    # ------------------------------------------------------------------ sources

    def begin(self, ctx: SourceContext) -> None:
        self.ctx = ctx
        self._blocks = {}
        self.line = 0
        if ctx.who.rank is not None:
            self.ranks_seen.add(ctx.who.rank)
        if ctx.who.node:
            self.nodes_seen.add(ctx.who.node)

    def end(self) -> None:
        """The source ended: whatever is still open becomes an event as it stands."""
        for key in list(self._blocks):
            self._close(key)

    def absorb(self, later: Collector) -> int:
        """Take in what ``later`` collected from the sources that come after this collector's (another
        reader process's share, readers.py): the result is what one collector reading all of them in order
        would hold. Facts kept by source index are disjoint; the first word on a rank's node, local rank or
        srun host stays (``setdefault``), the last word on a rank's progress wins; the caps hold as if
        one collector had read everything. Returns how many of ``later``'s events were kept (the first ones)."""
        room = max(0, MAX_EVENTS - len(self.events))
        self.events.extend(later.events[:room])
        self.dropped += later.dropped + max(0, len(later.events) - room)
        self._per_stream.update(later._per_stream)
        self.local_rank_pairs.update(later.local_rank_pairs)
        for pair, rank in later.node_local_rank.items():
            self.node_local_rank.setdefault(pair, rank)
        for rank, node in later.rank_node.items():
            self.rank_node.setdefault(rank, node)
        for task_node, host in later.srun_hosts.items():
            self.srun_hosts.setdefault(task_node, host)
        self.ranks_seen |= later.ranks_seen
        self.nodes_seen |= later.nodes_seen
        for key in later.sampled:
            if len(self.sampled) >= MAX_SAMPLED:
                break
            self.sampled[key] = None
        self.last_work.update(later.last_work)
        self.repairs.update(later.repairs)
        self.launchers.update(later.launchers)
        self.node_prefixed |= later.node_prefixed
        self.notes.update(later.notes)
        self.suspects.extend(later.suspects[:max(0, MAX_SUSPECTS - len(self.suspects))])
        self.nccl.absorb(later.nccl)
        return min(room, len(later.events))

    def portable(self) -> Collector:
        """This collector without the source being read (to send to another process between sources)."""
        assert not self._blocks, "a source is still being read"
        self.ctx, self.here, self._stamp = None, (b"", 0), ""
        return self

    @property
    def open(self) -> bool:
        """True while a traceback or summary is being read: every line of the source is needed."""
        return bool(self._blocks)

    # ------------------------------------------------------------------ lines

    def feed(self, raw: bytes, line: int, offset: int) -> None:
        """One line (without its newline) at ``line`` (1-based) and byte ``offset`` of the source."""
        assert self.ctx is not None
        self.line = line
        text = raw.decode("utf-8", "replace").rstrip("\r")
        if "\x1b" in text:
            text = strip_ansi(text)
        if "\r" in text or "%|" in text or "\u2501" in text or "\u2578" in text or text.endswith("]"):
            parts, what = mend_line(text)
            if what is not None:
                got = self.repairs.setdefault(self.ctx.index, {})
                got[what] = got.get(what, 0) + 1
                for part in parts:
                    self._feed_text(part, line, offset)
                return
        self._feed_text(text, line, offset)

    def _mark(self, launcher: str) -> None:
        assert self.ctx is not None
        self.launchers.setdefault(self.ctx.index, set()).add(launcher)

    def _feed_text(self, text: str, line: int, offset: int) -> None:
        assert self.ctx is not None
        lab = split_label(text, self.ctx.node_prefix) if self.ctx.labelled else Label(Who(), "", text)
        self._stamp = lab.stamp
        who = lab.who.merged(self.ctx.who)
        self._note(lab, who)
        block = self._blocks.get(lab.key)
        if (block.stamp if block is not None else TRACEBACK in lab.rest and not lab.rest.startswith(TRACEBACK)):
            lab = unstamped(lab)  # kubectl logs --timestamps, docker logs -t, `| ts`: a time stamp first
            if block is not None and block.stage in ("trailing", "chain") and not self._same_second(block, lab):
                self._close(lab.key)  # a later second: the program's next line, not the exception's message
                block = None
        if block is not None:
            if block.torch_rank and not lab.torch_rank:
                # A line without torch's [rankN]: prefix is the rank's other stream (its stdout, teed
                # into the same file): it ends a finished exception, and is skipped inside the frames.
                if block.stage in ("trailing", "chain"):
                    self._close(lab.key)
            elif self._continue(lab.key, block, lab.rest, who, line):
                return
        if self._blocks and line % 256 == 0:
            self._expire(line)
        self._detect(lab, who, line, offset)

    def sample(self, raw: bytes) -> None:
        """An ordinary line's labels, so that a rank that never failed is still seen: the scanner hands
        over a few lines of each block (ranks print their progress interleaved), resolved later."""
        ctx = self.ctx
        assert ctx is not None
        text = raw.decode("utf-8", "replace")
        if "\x1b" in text:
            text = strip_ansi(text)
        lab = split_label(text, ctx.node_prefix)
        who = lab.who.merged(ctx.who)
        if who.known and len(self.sampled) < MAX_SAMPLED:
            self.sampled[(ctx.index, who)] = None
        if "[default" in lab.key or (lab.srun_task is not None and lab.who.local_rank is not None):
            self._mark("torchrun")  # torchrun --tee's "[default3]:" (its default role)
        if lab.srun_task is not None:
            self._mark("srun")
        if "]<std" in lab.key:
            self._mark("mpirun")
        if ctx.node_prefix:
            self._mark("pdsh")

    def _same_second(self, block: _Block, lab: Label) -> bool:
        """The line's time stamp is in the second of its traceback's header (Python writes it at once)."""
        assert self.ctx is not None
        t = find_time(lab.stamp, self.ctx.day)
        return t is not None and block.time is not None and int(t) == int(block.time)

    def _note(self, lab: Label, who: Who) -> None:
        ctx = self.ctx
        assert ctx is not None
        if who.rank is not None:
            self.ranks_seen.add(who.rank)
            if who.node:
                self.rank_node.setdefault(who.rank, who.node)
            if who.local_rank is not None:
                self.local_rank_pairs.setdefault(ctx.index, {}).setdefault(who.local_rank, who.rank)
                if who.node:
                    self.node_local_rank.setdefault((who.node, who.local_rank), who.rank)
        if who.node:
            self.nodes_seen.add(who.node)

    def _expire(self, line: int) -> None:
        for key, block in list(self._blocks.items()):
            if line - block.last_line > STALE_LINES:
                self._close(key)

    # ------------------------------------------------------------------ tracebacks and summaries

    def _open(self, key: str, who: Who, line: int, offset: int, first: str) -> None:
        self._blocks[key] = _Block(who=who, start_line=line, start_offset=offset, last_line=line, text=[first])

    def _continue(self, key: str, block: _Block, rest: str, who: Who, line: int) -> bool:
        """Feed a line of an open block's stream; False when the line is not part of it."""
        block.last_line = line
        if block.stage == "summary":
            return self._summary_line(key, block, rest)
        if block.stage == "frames":
            if rest.startswith((" ", "\t")) or not rest:
                block.expect_code = False
                if len(block.text) < MAX_TRACEBACK_LINES:
                    block.text.append(rest)
                return True
            # a traceback pasted with its indentation stripped: frames, their code lines, the ^^^ markers
            stripped = rest.strip()
            if stripped.startswith('File "') or (block.expect_code and not _EXCEPTION_TYPE.match(stripped)) \
                    or set(stripped) <= {"^", "~"}:
                block.expect_code = stripped.startswith('File "')
                if len(block.text) < MAX_TRACEBACK_LINES:
                    block.text.append("  " + rest if block.expect_code else "    " + rest)
                return True
            if rest.startswith(TRACEBACK):  # a traceback inside the traceback: the outer one was cut short
                self._close(key)
                return False
            if not _EXCEPTION_LINE.match(rest.strip()) and ":" not in rest:
                return True  # noise from an unlabelled writer between the frames
            block.text.append(rest)
            block.exceptions.append(rest.strip())
            if "ChildFailedError" in rest:
                block.stage, block.summary = "summary", _Summary()
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
            if rest.startswith(TRACEBACK) and block.stage == "chain":
                block.text.append(rest)
                block.stage = "frames"
                return True
            if not stripped:
                block.trailing_left -= 1
                if block.trailing_left <= 0:
                    self._close(key)
                return True
            if block.stage == "chain" or rest.startswith(TRACEBACK) or self._looks_like_a_log_line(rest):
                self._close(key)
                return False
            # the exception's message goes on (CUDA's advice, NCCL's "Last error:" ...)
            if len(block.text) < MAX_TRACEBACK_LINES:
                block.text.append(rest)
            block.trailing_left -= 1
            if block.trailing_left <= 0:
                self._close(key)
            return True
        return False

    def _time_before(self) -> float | None:
        """The time stamp of the nearest line before the current one (within a few kB), or None."""
        block, pos = self.here
        assert self.ctx is not None
        end = pos - 1
        lo = max(0, pos - NEARBY_BYTES)
        while end > lo:
            start = block.rfind(b"\n", lo, end) + 1
            if start == 0 and lo > 0:
                return None
            t = find_time(block[start:end].decode("utf-8", "replace")[:200], self.ctx.day)
            if t is not None:
                return t
            end = start - 1
        return None

    def _looks_like_a_log_line(self, rest: str) -> bool:
        assert self.ctx is not None
        return (find_time(rest[:40], self.ctx.day) is not None or " NCCL " in rest or rest.startswith("[")
                or rest.startswith(("srun:", "slurmstepd:")))

    def _summary_line(self, key: str, block: _Block, rest: str) -> bool:
        s = block.summary
        assert s is not None
        if len(block.text) < MAX_TRACEBACK_LINES:
            block.text.append(rest)
        stripped = rest.strip()
        if stripped.startswith("=") and set(stripped) == {"="}:
            if s.seen_root:
                self._close(key)
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
        if s.field_name == "traceback" and s.entries and rest.startswith("  "):
            s.entries[-1]["traceback"] = s.entries[-1].get("traceback", "") + "\n" + rest[2:]
            return True
        return True

    def _close(self, key: str) -> None:
        block = self._blocks.pop(key)
        whole = "\n".join(block.text)
        for name, rx in LAUNCHER_MARKS:  # the launcher's own frames (accelerate/commands/launch.py ...)
            if name in ("deepspeed", "accelerate", "lightning", "torchrun") and rx.search(whole):
                self._mark(name)
        if block.summary is not None:
            self._summary_events(block)
            return
        ctx = self.ctx
        assert ctx is not None
        final = block.exceptions[-1] if block.exceptions else ""
        # the exceptions and their messages, not the frames (code lines say anything)
        said = "\n".join(t for t in block.text if t and not t.startswith((" ", "\t")))
        cls, label, cause = classify(said[-4000:])
        message = short_exception(final) if final else "traceback (cut short)"
        ev = Event(kind="traceback", cls=cls, message=message, label=label or message.split(":", 1)[0],
                   who=block.who, source=ctx.path, line=block.start_line, offset=block.start_offset,
                   source_index=ctx.index, text=block.text[:MAX_TRACEBACK_LINES], detail={"cause": cause})
        if block.time is not None:
            ev.time, ev.time_source = block.time, TIME_LINE
        elif block.nearby is not None:
            ev.time, ev.time_source = block.nearby, TIME_NEARBY
        ev.blames = _blamed(whole)
        m = _CALLED_PROCESS.search(final)
        if m:  # a launcher (accelerate, a wrapper script) reporting its child's exit: evidence, not a cause
            code = int(m.group(1))
            ev.kind, ev.strong, ev.label = "exit", False, f"exit code {code}"
            ev.detail.update({"exit_code": code, "via": "a launcher's subprocess.CalledProcessError"})
        self._add(ev, key)

    def _summary_events(self, block: _Block) -> None:
        """torchrun's ChildFailedError summary: one event per failed rank (time: when torchrun saw it)."""
        ctx = self.ctx
        assert ctx is not None and block.summary is not None
        for entry in block.summary.entries:
            rank = local = None
            m = _RANK_LOCAL.match(entry.get("rank", ""))
            if m:
                rank = int(m.group(1)) if int(m.group(1)) >= 0 else None
                local = int(m.group(2)) if m.group(2) is not None else None
            code = pid = None
            m = _EXIT_PID.match(entry.get("exitcode", ""))
            if m:
                code = int(m.group(1))
                pid = int(m.group(2)) if m.group(2) else None
            host = entry.get("host") or None
            node = host.split(".")[0] if host and host not in ("localhost", "<N/A>") else None
            who = Who(rank, node, local).merged(block.who) if block.who.rank is None else Who(rank, node, local)
            if rank is not None and local is not None:
                self.local_rank_pairs.setdefault(ctx.index, {}).setdefault(local, rank)
            if rank is not None:
                self.ranks_seen.add(rank)
                if node:
                    self.rank_node.setdefault(rank, node)
            if node and block.srun_task is not None:
                self.srun_hosts.setdefault(srun_task_node(block.srun_task), node)
            t = find_time(entry.get("time", ""), ctx.day)
            tb = (entry.get("traceback") or "").strip()
            ev = self._exit_event(code, who, ctx, block.start_line, block.start_offset, t, TIME_LAUNCHER, pid)
            if ev is None:
                continue
            if tb and "Traceback" in tb:
                lines = tb.splitlines()
                final = next((ln.strip() for ln in reversed(lines) if ln.strip()), "")
                cls, label, kind = classify(tb)
                ev = Event(kind="error-file", cls=cls, message=short_exception(final),
                           label=label or short_exception(final).split(":", 1)[0], who=who, source=ctx.path,
                           line=block.start_line, offset=block.start_offset, source_index=ctx.index, time=t,
                           time_source=TIME_LAUNCHER if t is not None else TIME_ORDER, text=lines,
                           detail={"exit_code": code, "via": "torchrun summary"})
            ev.detail["torchrun_root_cause"] = bool(entry.get("root"))
            if entry.get("error_file") and entry["error_file"] != "<N/A>":
                ev.detail["error_file"] = entry["error_file"]
            self._add(ev, f"summary:{rank}")

    def _exit_event(self, code: int | None, who: Who, ctx: SourceContext, line: int, offset: int, t: float | None,
                    time_source: str, pid: int | None) -> Event | None:
        if code is None or code == 0:
            return None
        if code < 0:
            cls, message, strong, label = signal_event_text(code)
            kind = "signal"
        else:
            cls, message, strong, label = PRIMARY, f"exited with code {code}", False, f"exit code {code}"
            kind = "exit"
        return Event(kind=kind, cls=cls, message=message, label=label, who=who, source=ctx.path, line=line,
                     offset=offset, source_index=ctx.index, time=t,
                     time_source=time_source if t is not None else TIME_ORDER, strong=strong,
                     detail={"exit_code": code, **({"pid": pid} if pid else {})})

    # ------------------------------------------------------------------ one-line events

    def _detect(self, lab: Label, who: Who, line: int, offset: int) -> None:
        ctx = self.ctx
        assert ctx is not None
        rest = lab.rest
        if "NCCL" in rest:
            got = self.nccl.feed(rest, who.rank)
            if got is not None:
                level, host, msg = got
                if host:
                    self.nodes_seen.add(host)
                if "libibverbs" in msg and ("Failed" in msg or "failed" in msg):
                    # NCCL goes on over TCP sockets: the job runs, slowly, without InfiniBand/RoCE
                    self._one("nccl-fallback", WARNING, "NCCL could not load libibverbs: it falls back to TCP sockets "
                              "(no InfiniBand/RoCE)", "NCCL fell back to sockets (libibverbs failed to load)",
                              Who(who.rank, who.node or host, who.local_rank), line, offset, rest)
                    return
                if level == "WARN":
                    cls, label, kind = classify(msg)
                    if kind == "exception":
                        cls, label, kind = WARNING, "NCCL WARN", "nccl-warn"
                    self._one(kind, cls, f"NCCL WARN {clean_message(msg)}", label, who, line, offset, rest,
                              strong=cls != WARNING)
                return
        if rest.startswith(TRACEBACK):
            self._open(lab.key, who, line, offset, rest)
            self._blocks[lab.key].torch_rank = lab.torch_rank
            self._blocks[lab.key].srun_task = lab.srun_task
            self._blocks[lab.key].stamp = lab.stamp
            t = find_time(lab.key + lab.stamp, ctx.day)
            if t is not None:
                self._blocks[lab.key].time = t
            else:
                self._blocks[lab.key].nearby = self._time_before()
            return
        m = _WATCHDOG.search(rest)
        if m:
            r = _WATCHDOG_RANK.search(rest)
            if r and who.rank is None:
                who = Who(int(r.group(1)), who.node, who.local_rank)
            work = dict(kv.split("=", 1) for kv in m.group("work").split(", ") if "=" in kv)
            msg = (f"NCCL watchdog timeout: {work.get('OpType', '?')} SeqNum={work.get('SeqNum', '?')} ran for "
                   f"{int(m.group('ms')) / 1000:g} s")
            self._one("watchdog", SECONDARY, msg, "NCCL watchdog timeout", who, line, offset, rest,
                      detail={"op": work.get("OpType"), "seq": work.get("SeqNum")})
            return
        m = _LAST_WORK.search(rest)
        if m:
            r = _WATCHDOG_RANK.search(rest)
            rank = who.rank if who.rank is not None else (int(r.group(1)) if r else None)
            if rank is not None:
                self.last_work[rank] = (int(m.group(1)), int(m.group(2)))
            return
        for name, rx in LAUNCHER_MARKS:
            if rx.search(rest):
                self._mark(name)
        m = _TORCHRUN_FAILED.search(rest)
        if m:
            code = int(m.group(1))
            local = int(m.group(2)) if m.group(2) else None
            pid = int(m.group(3)) if m.group(3) else None
            t = find_time(rest, ctx.day)
            # under srun --label, the task is the agent: one per node
            node = ctx.who.node or lab.who.node or (srun_task_node(lab.srun_task) if lab.srun_task is not None else None)
            ev = self._exit_event(code, Who(None, node, local), ctx, line, offset, t, TIME_LAUNCHER, pid)
            if ev is not None:
                ev.detail["via"] = "torchrun"
                if local is None:
                    ev.detail["cut"] = "torchrun's line is cut short: its local rank is not there"
                self._add(ev, f"torchrun:{node}:{local}")
            return
        m = _DS_EXIT.search(rest)
        if m and "exits with return code" in rest:
            code = int(m.group("code"))
            t = find_time(rest, ctx.day)
            ev = self._exit_event(code, Who(None, who.node or ctx.who.node, None), ctx, line, offset, t, TIME_LINE,
                                  None)
            if ev is not None:
                ev.detail["via"] = "deepspeed"
                ev.detail["note"] = ("DeepSpeed's launcher prints the command line of the last rank it started, not "
                                     "of the one that failed: the return code is the fact")
                self._add(ev, f"deepspeed:{who.node}")
            return
        m = _MPI_EXIT.match(rest)
        if m:
            r = _MPI_PROCESS.search(self._lines_before(3))
            if r:
                ev = self._exit_event(int(m.group(1)), Who(int(r.group(1)), None, None), ctx, line, offset, None,
                                      TIME_ORDER, None)
                if ev is not None:
                    ev.detail["via"] = "mpirun"
                    ev.detail["note"] = "mpirun: the first process to exit with a non-zero status"
                    self._add(ev, f"mpirun:{r.group(1)}")
                return
        m = _MPI_SIGNAL.search(rest)
        if m:
            rank, sig = int(m.group(1)), int(m.group(4))
            self.rank_node.setdefault(rank, m.group(3))
            ev = self._exit_event(-sig, Who(rank, m.group(3), None), ctx, line, offset, None, TIME_ORDER,
                                  int(m.group(2)))
            if ev is not None:
                ev.detail["via"] = "mpirun"
                self._add(ev, f"mpirun:{rank}")
            return
        m = _PDSH_EXIT.search(rest)
        if m:
            self.nodes_seen.add(m.group("node"))
            ev = self._exit_event(int(m.group("code")), Who(None, m.group("node"), None), ctx, line, offset, None,
                                  TIME_ORDER, None)
            if ev is not None:
                ev.detail["via"] = "pdsh"
                ev.cls, ev.strong = SECONDARY if ev.cls == SECONDARY else PRIMARY, False
                self._add(ev, f"pdsh:{m.group('node')}")
            return
        m = _LIGHTNING_CHILD.search(rest)
        if m:
            ev = self._exit_event(int(m.group(2)), Who(who.rank, who.node, None), ctx, line, offset, None, TIME_ORDER,
                                  int(m.group(1)))
            if ev is not None:
                ev.detail["via"] = "lightning"
                self._add(ev, f"lightning:{m.group(1)}")
            return
        if _SUMMARY_EXITCODE.match(rest) and lab.key not in self._blocks:
            self._summary_alone(lab, who, line, offset)
            return
        m = _CLOSING.search(rest)
        if m:
            t = find_time(rest, ctx.day)
            self._one("launcher", INFO, f"torchrun sends {m.group(2)} to pid {m.group(1)}",
                      f"torchrun stops the other ranks ({m.group(2)})", Who(None, ctx.who.node, None), line, offset,
                      rest, strong=False, t=t, detail={"pid": int(m.group(1))})
            return
        m = _SRUN_TASK.search(rest)
        if m:
            self._srun(m, line, offset, rest)
            return
        m = _SRUN_NODE_FAIL.search(rest)
        if m:
            self._one("slurm", PRIMARY, f"Slurm: node failure on {m.group(1)}", "node failure",
                      Who(None, m.group(1), None), line, offset, rest)
            return
        m = _SLURM_CANCEL.search(rest)
        if m:
            why = (m.group("why") or "").strip()
            strong = bool(why) and why != "CANCELLED"
            cls = PRIMARY if strong else SECONDARY
            text = f"Slurm cancelled the {m.group('what').lower()} {m.group('id')} on {m.group('node')}" + \
                (f" due to {why.lower()}" if why else "")
            t = find_time(m.group("at"), ctx.day)
            self._one("slurm", cls, text, f"Slurm: {m.group('what').lower()} cancelled" + (f" ({why.lower()})"
                      if why else ""), Who(None, m.group("node"), None), line, offset, rest, strong=strong, t=t)
            return
        m = _OOM_KILL.search(rest)
        if m:
            self._one("oom", PRIMARY, f"out of host memory: {m.group(1)} process(es) killed by the cgroup OOM killer",
                      "out of memory", Who(None, who.node, None), line, offset, rest)
            return
        m = _LAUNCH_TIMEOUT.search(rest)
        if m:  # the ranks' SIGTERM tracebacks that follow are its consequence
            self._one("launcher", PRIMARY, f"the job reached mldebug launch --run-timeout {m.group('s')} s: the launcher "
                      "stopped every rank", "stopped at --run-timeout", Who(None, ctx.who.node, None), line, offset, rest)
            return
        m = _TOOL_ERROR.search(rest)
        if m:
            cls, label, kind = classify(m.group("msg"))
            self._one("error-line" if kind == "exception" else kind, cls, clean_message(m.group("msg")),
                      label or clean_message(m.group("msg")), who, line, offset, rest)
            return
        m = _PYTHON_START.search(rest)
        if m:
            self._one("exception", PRIMARY, clean_message(f"{m.group('exe')}: {m.group('msg')}"),
                      f"python: {m.group('what')}", who, line, offset, rest)
            return
        m = _FATAL.search(rest)
        if m:
            self._one("signal", PRIMARY, clean_message(f"Fatal Python error: {m.group('msg')}"),
                      "crash (" + clean_message(m.group("msg")) + ")", who, line, offset, rest)
            return
        if _SEGFAULT.search(rest):
            self._one("signal", PRIMARY, clean_message(rest), "crash (Segmentation fault)", who, line, offset, rest)
            return
        m = _EXCEPTION_TYPE.match(rest.strip())
        inline = None if m else _INLINE_EXCEPTION.search(rest)
        if m or inline or "CUDA error" in rest or _OOM.search(rest):
            text = rest[inline.start():].strip() if inline else rest.strip()
            cls, label, kind = classify(text)
            if m is None and inline is None and kind == "exception":
                return
            message = short_exception(text) if (m or inline) else clean_message(text)
            # an exception named in the middle of a line (a logger reporting one) may have been handled
            self._one(kind, cls, message, label or message.split(":", 1)[0], who, line, offset, rest,
                      strong=m is not None or kind != "exception")
            return
        for label, rx in _SECONDARY:
            if rx.search(rest):
                self._one("comm", SECONDARY, clean_message(rest), label, who, line, offset, rest)
                return
        if _KILLED.search(rest):
            self._one("signal", PRIMARY, "Killed (SIGKILL)", "killed (SIGKILL)", who, line, offset, rest, strong=False)
            return
        if len(self.suspects) < MAX_SUSPECTS and _SUSPECT.search(rest) and not _NOT_SUSPECT.search(rest):
            t = find_time(rest, ctx.day)
            self.suspects.append(Event(kind="suspect", cls=PRIMARY, message=clean_message(rest), label="a line that "
                                       "looks like a failure", who=who, source=ctx.path, line=line, offset=offset,
                                       source_index=ctx.index, time=t,
                                       time_source=TIME_LINE if t is not None else TIME_ORDER, strong=False))

    def _lines_before(self, n: int) -> str:
        """The ``n`` lines before the current one (within the block being scanned)."""
        block, pos = self.here
        start = pos
        for _ in range(n):
            if start <= 0:
                break
            start = block.rfind(b"\n", 0, start - 1) + 1
        return block[start:pos].decode("utf-8", "replace")

    def _summary_alone(self, lab: Label, who: Who, line: int, offset: int) -> None:
        """torchrun's failure summary pasted without its traceback (or with its header cut): an entry's exitcode
        line opens it; the entry's lines before it (and whether it was the root cause) are read back."""
        summary = _Summary()
        block = _Block(who=who, start_line=line, start_offset=offset, last_line=line, stage="summary",
                       summary=summary)
        self._blocks[lab.key] = block
        before = self._lines_before(8).split("\n")
        entry = [ln for ln in before if ln.strip()]
        start = max((i for i, ln in enumerate(entry) if _SUMMARY_ENTRY.match(ln.strip())), default=None)
        root = start is not None and start > 0 and entry[start - 1].strip().startswith("Root Cause")
        summary.entries.append({"root": root})
        summary.seen_root = root
        for ln in entry[(start + 1 if start is not None else 0):]:
            f = _SUMMARY_FIELD.match(split_label(ln).rest)
            if f:
                summary.entries[-1][f.group(1)] = f.group(2).strip()
        self._summary_line(lab.key, block, lab.rest)

    def _srun(self, m: re.Match[str], line: int, offset: int, rest: str) -> None:
        ctx = self.ctx
        assert ctx is not None
        node, what = m.group("node"), m.group("what").strip()
        self.nodes_seen.add(node)
        for task in _expand_tasks(m.group("tasks")):
            who = Who(task, node, None)
            self.rank_node.setdefault(task, node)
            self.ranks_seen.add(task)
            code = re.search(r"exit code (\d+)", what)
            if code:
                ev = self._exit_event(int(code.group(1)), who, ctx, line, offset, None, TIME_ORDER, None)
                if ev is not None:
                    ev.detail["via"] = "srun"
                    self._add(ev, f"srun:{task}")
            elif "Out Of Memory" in what:
                self._one("oom", PRIMARY, "out of memory (Slurm)", "out of memory", who, line, offset, rest)
            elif what.startswith(("Killed", "Terminated")):
                self._one("signal", SECONDARY, f"{what.lower()} by srun after another task failed",
                          f"{what.lower()} by srun", who, line, offset, rest, strong=False)

    def _one(self, kind: str, cls: str, message: str, label: str, who: Who, line: int, offset: int, rest: str, *,
             strong: bool = True, t: float | None = None, detail: dict[str, Any] | None = None) -> None:
        ctx = self.ctx
        assert ctx is not None
        if t is None:
            t = find_time(rest, ctx.day)
        if t is None and self._stamp:
            t = find_time(self._stamp, ctx.day)
        ev = Event(kind=kind, cls=cls, message=message, label=label, who=who, source=ctx.path, line=line,
                   offset=offset, source_index=ctx.index, time=t, time_source=TIME_LINE if t is not None else TIME_ORDER,
                   strong=strong, detail=dict(detail or {}))
        ev.blames = _blamed(rest)
        self._add(ev, f"line:{who.rank}:{who.local_rank}:{who.node}")

    def _add(self, ev: Event, stream: str) -> None:
        ctx = self.ctx
        assert ctx is not None
        key = (ctx.index, stream)
        n = self._per_stream.get(key, 0)
        if n >= MAX_EVENTS_PER_STREAM or len(self.events) >= MAX_EVENTS:
            self.dropped += 1
            return
        self._per_stream[key] = n + 1
        ev.label = brief(ev.label)  # a label is a message's first word(s), or the message when it has none
        self.events.append(ev)

    # ------------------------------------------------------------------ error files and metrics

    def error_file(self, data: bytes) -> None:
        """A torchelastic error file (TORCHELASTIC_ERROR_FILE: ``{"message": {"message", "extraInfo":
        {"py_callstack", "timestamp"}}}``) as one event of the source's rank."""
        ctx = self.ctx
        assert ctx is not None
        try:
            doc = json.loads(data.decode("utf-8", "replace"))
        except ValueError:
            return
        msg: Any = doc.get("message") if isinstance(doc, dict) else None
        callstack = ""
        ts: float | None = None
        if isinstance(msg, dict):
            extra = msg.get("extraInfo") or {}
            callstack = str(extra.get("py_callstack") or "")
            stamp = extra.get("timestamp")
            try:
                ts = float(stamp) if stamp else None
            except (TypeError, ValueError):
                ts = None
            msg = msg.get("message")
        if not msg or msg == "<N/A>":
            return
        text = str(msg)
        cls, label, kind = classify(text + "\n" + callstack[-2000:])
        message = short_exception(text.strip().splitlines()[-1] if "\n" in text.strip() else text)
        ev = Event(kind="error-file", cls=cls, message=message, label=label or message.split(":", 1)[0],
                   who=ctx.who, source=ctx.path, line=1, offset=0, source_index=ctx.index,
                   time=ts, time_source=TIME_ERROR_FILE if ts is not None else TIME_ORDER,
                   text=callstack.splitlines()[:MAX_TRACEBACK_LINES], detail={"cause": kind})
        self._add(ev, "error-file")

    def metrics_line(self, record: dict[str, Any]) -> dict[str, Any] | None:
        """The progress an mldebug train metrics record says (rank, step, time), or None."""
        if not isinstance(record, dict) or record.get("schema") != "mldebug.train.step":
            return None
        rank = record.get("rank")
        if not isinstance(rank, int):
            return None
        self.ranks_seen.add(rank)
        return {"rank": rank, "step": record.get("step"), "time": record.get("time"),
                "loss": record.get("loss"), "event": record.get("event")}


def _blamed(text: str) -> list[int]:
    m = _BLAMED.search(text)
    if not m:
        return []
    return [int(x) for x in re.findall(r"\d+", m.group(1))]
