"""Plain data of a log triage: who wrote a line, failure events, and the report."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ml_debug.core.enums import Word

SCHEMA = "mldebug.logs"
SCHEMA_VERSION = 1

class EventClass(Word):
    """An event's class: a cause, a consequence of a peer's failure, a warning, or context."""

    PRIMARY = "primary"
    SECONDARY = "secondary"
    WARNING = "warning"
    INFO = "info"


class TimeSource(Word):
    """How an event's time is known."""

    LINE = "line"  # a time stamp on the line itself
    ERROR_FILE = "error-file"  # the torchelastic error file's timestamp
    LAUNCHER = "launcher"  # when a launcher (torchrun, DeepSpeed) reported the exit: an upper bound
    NEARBY = "nearby"  # a traceback without one: the time stamp of a line just before it (a lower bound)
    ORDER = "order"  # no time: position in its file


# The names the rest of logs/ uses (a member is its value: it compares, hashes and prints as the word).
PRIMARY: str = EventClass.PRIMARY
SECONDARY: str = EventClass.SECONDARY
WARNING: str = EventClass.WARNING
INFO: str = EventClass.INFO
TIME_LINE: str = TimeSource.LINE
TIME_ERROR_FILE: str = TimeSource.ERROR_FILE
TIME_LAUNCHER: str = TimeSource.LAUNCHER
TIME_NEARBY: str = TimeSource.NEARBY
TIME_ORDER: str = TimeSource.ORDER
CUT_SHORT = "traceback (cut short)"
"""The message of a traceback that ends before its exception (what failed is not in the logs)."""
JOB_KINDS = ("launcher", "slurm")
"""Kinds of events of the job or of a node (a launcher stopping it, Slurm cancelling it), never of one rank."""
TIME_BOUNDS = {TIME_LAUNCHER: ("≤", "when a launcher reported it (it happened no later)"),
               TIME_NEARBY: ("≥", "the time of a line before it (it happened no earlier)")}
"""Times that only bound when a failure happened: the mark the views put before them, and what it means."""


@dataclass(frozen=True)
class Who:
    """Which process wrote something: global rank, node, local rank (each None when unknown)."""

    rank: int | None = None
    node: str | None = None
    local_rank: int | None = None

    def merged(self, other: Who) -> Who:
        """This identity with the gaps filled from ``other``."""
        if self.rank is None and self.node is None and self.local_rank is None:
            return other  # no label: the source's identity (a frozen value, shared as it is)
        return Who(self.rank if self.rank is not None else other.rank, self.node or other.node,
                   self.local_rank if self.local_rank is not None else other.local_rank)

    @property
    def known(self) -> bool:
        return self.rank is not None or self.node is not None or self.local_rank is not None

    def label(self) -> str:
        """``rank 37 (node12)``, ``local rank 3 on node12`` (or ``on unknown node``), ``node12`` (rank
        unknown) or ``unknown rank``. Never a local rank as a rank: ``[default3]:`` is the fourth rank of *a*
        node."""
        if self.rank is not None:
            return f"rank {self.rank}" + (f" ({self.node})" if self.node else "")
        if self.local_rank is not None:
            return f"local rank {self.local_rank} on {self.node or 'unknown node'}"
        return self.node or "unknown rank"


@dataclass
class Event:
    """One failure (or warning) found in the logs, of a ``kind``: traceback, error-file, cuda-error, oom,
    signal, exit, comm, watchdog, nccl-warn, nccl-error, init (a process that could not start its part), slurm,
    error-line, exception, launcher."""

    kind: str
    cls: str  # primary, secondary, warning or info
    message: str  # one line: what happened (``ValueError: bad batch``)
    label: str  # short text shared by events of one nature, for counting (``Connection reset by peer``)
    who: Who
    source: str
    line: int
    offset: int
    source_index: int
    time: float | None = None  # Unix time
    time_source: str = TIME_ORDER
    strong: bool = True  # False for bare exit codes and launcher kills: evidence, not a cause by itself
    text: list[str] = field(default_factory=list)  # the whole traceback (or error file stack), unprefixed
    blames: list[int] = field(default_factory=list)  # ranks it names as missing or late (gloo's barrier)
    detail: dict[str, Any] = field(default_factory=dict)

    def order_key(self) -> tuple[int, int]:
        return (self.source_index, self.offset)


@dataclass
class SourceInfo:
    """One log source as read: its shape and what it says about its writer."""

    path: str
    shape: str
    who: Who
    bytes: int = 0
    lines: int = 0
    events: int = 0
    error: str | None = None
    note: str | None = None
    repairs: list[str] = field(default_factory=list)  # mended before reading (a pasted log's quoting ...)
    launchers: list[str] = field(default_factory=list)  # the launchers whose lines it holds
    view: str | None = None  # whose lines: one rank, one node's agent (its local ranks), the job's console


@dataclass
class TracebackGroup:
    """Identical tracebacks (numbers and addresses aside) and the ranks that printed them."""

    ranks: str
    count: int
    cls: str
    message: str
    text: list[str]
    who: list[str]


@dataclass
class TimelineRow:
    """Consecutive events of one nature, with their ranks."""

    time: float | None
    time_source: str
    last_time: float | None
    cls: str
    label: str
    message: str
    ranks: str
    who: str
    count: int


@dataclass
class Verdict:
    """The answer: the first failure, what followed from it, and how sure the order is."""

    status: str
    """failure (a primary found), secondary-only (only consequences), suspect (no failure line this tool
    knows, but lines that look like one: the first is named, with low confidence), none; interrupted
    (`mldebug launch` was stopped by the user) or recovered (it exited 0, after a restart)."""
    summary: str
    primary: Event | None = None
    basis: str | None = None  # how the first was chosen: line time stamps, error files, launcher, file order
    secondary: list[dict[str, Any]] = field(default_factory=list)  # [{label, count, ranks}] that followed
    independent: list[Event] = field(default_factory=list)  # other causes on other ranks (unrelated failures)
    silent_ranks: str | None = None  # ranks of a known world that left no failure (hung, killed unseen?)
    blamed_ranks: str | None = None
    peers_lost: str | None = None  # secondary-only: the addresses the ranks' connection errors say they lost
    hint: str | None = None  # the next step for the cause (a DataLoader worker's bus error: /dev/shm's size)
    confidence: str = "high"  # high, medium or low (``confidence_why`` says why)
    confidence_why: str = ""
    tie: str | None = None  # ranks that failed in the same second as the first: which came first is unknown
    findings: list[str] = field(default_factory=list)  # not failures (NCCL fell back to sockets), next steps

    @property
    def failed(self) -> bool:
        """The job failed (exit code 1 of `mldebug logs`)."""
        return self.status in ("failure", "secondary-only", "suspect")


@dataclass
class LogsReport:
    """Everything `mldebug logs` found (the ``result`` of the mldebug.logs JSON document)."""

    verdict: Verdict
    sources: list[SourceInfo]
    events: list[Event]
    tracebacks: list[TracebackGroup]
    timeline: list[TimelineRow]
    ranks_seen: str
    world_size: int | None
    nodes: list[str]
    progress: dict[str, Any]
    nccl: dict[str, Any] | None
    skipped: list[dict[str, str]] = field(default_factory=list)
    dropped_events: int = 0
    demux: dict[str, Any] | None = None
    launchers: list[str] = field(default_factory=list)  # the launchers the logs came from, by their own lines
    ok: bool = False  # no failure found and every source read (exit 0)
    summary: str = ""  # the verdict's sentence, and what could not be read
