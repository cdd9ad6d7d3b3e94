"""Failure events from log lines: a :class:`Collector` per reader, fed the lines of one source at a time.

It is fed only the lines that can matter (scan.py's prefilter), plus every line while a block is open, and
keeps events, never ordinary lines; actions.py reads one line, blocks.py a traceback or torchrun's summary,
text.py a failure text's class. Each event is classed where it is made:

- secondary: a consequence of a peer's failure (a reset connection, a broken pipe, a watchdog timeout, a
  store that lost its server, torchrun's SIGTERM after another rank failed);
- primary: any other failure;
- weak primary (``strong=False``): a bare exit code or a kill by srun, evidence of a failure, not its cause,
  naming the first failure only when nothing stronger exists.

It also keeps what lines say about who is who, resolved by accounting.py (``Identities``).
"""

from __future__ import annotations

import datetime as _dt
import json
import re
from dataclasses import dataclass
from typing import Any

from ml_debug.logs import actions, blocks
from ml_debug.logs.blocks import MAX_TRACEBACK_LINES, Block
from ml_debug.logs.labels import Label, brief, find_time, split_label, strip_ansi, unlabelled, unstamped
from ml_debug.logs.nccl import NcclCollector
from ml_debug.logs.repair import mend_line
from ml_debug.logs.repeats import Frames
from ml_debug.logs.result import PRIMARY, TIME_ERROR_FILE, TIME_LINE, TIME_ORDER, Event, Who
from ml_debug.logs.text import blamed, classify, clean_message, raised_in, short_exception, signal_event_text

__all__ = ["Collector", "SourceContext", "classify", "clean_message", "short_exception"]

MAX_EVENTS_PER_STREAM = 64
MAX_HANDLED_PER_STREAM = 16
"""A writer's handled tracebacks (``handled:`` streams) kept as events, later ones only counted: context,
shown one per writer and exception (verdict.dedupe); a retry loop prints thousands, and at 64 they were a
tenth of the reading."""
MAX_EVENTS = 100_000
MAX_SAMPLED = 100_000  # distinct writers whose labels were sampled (see Collector.sample)
STALE_LINES = 5000  # a traceback whose writer printed nothing more for this many lines of its file is closed
MAX_SUSPECTS = 20  # lines that only look like a failure, kept as the last resort
FLATTENED_NOTE = "NCCL lines flattened onto one line: read one by one"
# where the next of several NCCL lines flattened onto one starts: "... found. host:1234:1234 [0] NCCL INFO ..." (not
# torch's ", NCCL version 2.21.5" at the end of its NCCL error's message)
_NCCL_FLATTENED = re.compile(r"\s+(?=[\w.\-]{1,200}:\d{1,10}:\d{1,10} \[\d{1,4}\] (?:[\w./\-]{1,200}:\d{1,6} )?NCCL )"
                             r"|(?<!,)\s+(?=NCCL version )")
_PG0_RANK = re.compile(r"\[(?:PG (?:ID )?0 (?:PG GUID 0(?:\(default_pg\))? )?)?Rank (\d+)\]")
_NOBODY = Who()


def _mendable(text: str) -> bool:
    """The line may need mending (repair.mend_line): a progress bar's ``\r`` updates, a bar's characters, a
    bracket at its end."""
    return "\r" in text or "%|" in text or "\u2501" in text or "\u2578" in text or text.endswith("]")


def _plain(text: str) -> bool:
    """:meth:`Collector.feed` reads the line as it is: no escapes, nothing to mend, not NCCL lines flattened."""
    return "\x1b" not in text and not _mendable(text) and text.count(" NCCL ") <= 1


@dataclass
class SourceContext:
    """What the collector needs to know about the source being read."""

    index: int
    path: str
    who: Who
    day: _dt.date
    labelled: bool = True
    node_prefix: bool = False  # every line starts with its node's name (pdsh)


class Collector:
    """Events from the lines of every source, and what the lines say about who is who."""

    def __init__(self, nccl: NcclCollector | None = None) -> None:
        self.nccl = nccl or NcclCollector()
        self.events: list[Event] = []
        self.dropped = 0
        self.ctx: SourceContext | None = None
        self._blocks: dict[str, Block] = {}
        self._per_stream: dict[tuple[int, str], int] = {}
        self.line = 0
        # identity facts, resolved by accounting.py (Identities)
        self.local_rank_pairs: dict[int, dict[int, int]] = {}  # source index -> local rank -> global rank
        self.node_local_rank: dict[tuple[str, int], int] = {}
        self.rank_node: dict[int, str] = {}
        self.ranks_seen: set[int] = set()
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
        self.nccl_lines = 0  # NCCL lines of the source being read (catalogue.NCCL_LINES_PER_SOURCE)
        self.agent_groups: dict[int, int] = {}  # source index -> its torchrun agent's group rank (node rank)
        self.reported: set[int] = set()  # sources that hold torchrun's own report of a failure (its traceback, summary)
        self.here: tuple[bytes, int] = (b"", 0)  # the scanned block, where the current line starts in it
        self.repeats: list[Frames] = []  # the tracebacks this source printed, read once (repeats.py)
        # the last line read whole, where it starts in the scanned block, and its labels (blocks.logged_level)
        self.said: tuple[bytes, int, Label] | None = None

    # ------------------------------------------------------------------ sources

    def begin(self, ctx: SourceContext) -> None:
        self.ctx = ctx
        self._blocks = {}
        self.repeats = []
        self.line = 0
        self.nccl_lines = 0
        if ctx.who.rank is not None:
            self.ranks_seen.add(ctx.who.rank)
        if ctx.who.node:
            self.nodes_seen.add(ctx.who.node)

    def end(self) -> None:
        """The source ended: whatever is still open becomes an event as it stands."""
        for key in list(self._blocks):
            blocks.close_block(self, key, last=True)

    def absorb(self, later: Collector) -> int:
        """Take in what ``later`` (another reader's share, readers.py) collected from the sources after this
        one's, as one collector reading all in order would: facts by source index are disjoint, the first word
        on a rank's node, local rank or srun host stays, the last on its progress wins, the caps hold. Returns
        how many of ``later``'s events were kept (the first ones)."""
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
        self.agent_groups.update(later.agent_groups)
        self.reported |= later.reported
        self.notes.update(later.notes)
        self.suspects.extend(later.suspects[:max(0, MAX_SUSPECTS - len(self.suspects))])
        self.nccl.absorb(later.nccl)
        return min(room, len(later.events))

    def portable(self) -> Collector:
        """This collector without the source being read (to send to another process between sources)."""
        assert not self._blocks, "a source is still being read"
        self.ctx, self.here, self._stamp, self.repeats = None, (b"", 0), "", []
        return self

    @property
    def open(self) -> bool:
        """True while a traceback or summary is being read: every line of the source is needed."""
        return bool(self._blocks)

    # ------------------------------------------------------------------ lines

    def feed(self, raw: bytes, line: int, offset: int, quiet: bool = False) -> None:
        """One line (without its newline) at ``line`` (1-based) and byte ``offset`` of the source (``quiet``: it
        holds none of the prefilter's words, and is handed over only because a block is open)."""
        assert self.ctx is not None
        self.line = line
        text = raw.decode("utf-8", "replace").rstrip("\r")
        self.said = None
        whole = True  # the line read as it is (as blocks.logged_level reads it)
        if "\x1b" in text:
            text, quiet, whole = strip_ansi(text), False, False  # a word may be whole only without the escapes
        if "\x00" in text:  # torch's DataLoader writes one before the traceback a worker's signal handler ends with
            text = text.replace("\x00", "")
        if _mendable(text):
            parts, what = mend_line(text)
            if what is not None:
                got = self.repairs.setdefault(self.ctx.index, {})
                got[what] = got.get(what, 0) + 1
                self._feed_parts(parts, line, offset, quiet)
                return
        if text.count(" NCCL ") > 1:
            parts = _NCCL_FLATTENED.split(text)
            if len(parts) > 1:  # rule 7: NCCL lines flattened onto one (a paste, a log shipper), read one by one
                notes = self.notes.setdefault(self.ctx.index, [])
                if FLATTENED_NOTE not in notes:
                    notes.append(FLATTENED_NOTE)
                self._feed_parts(parts, line, offset, quiet)
                return
        self._feed_text(text, line, offset, quiet, whole)

    def feed_open(self, raw: bytes, line: int, offset: int, quiet: bool) -> bool:
        """A line of a source whose unlabelled stream's block is the only one open, read as :meth:`feed` reads
        it, without looking for labels it has none of; False when it may have some (then feed reads it)."""
        ctx = self.ctx
        assert ctx is not None
        block = self._blocks.get("")
        if block is None or len(self._blocks) > 1 or block.stamp or block.torch_rank or ctx.node_prefix:
            return False
        text = raw.decode("utf-8", "replace").rstrip("\r")
        if not self._alone(text):
            return False
        self.line, self._stamp, self.said = line, "", None
        if blocks.feed_block(self, "", block, text, ctx.who, line):
            return True
        if self._blocks and line % 256 == 0:
            self._expire(line)
        if quiet and "NCCL" not in text:
            return True
        lab = Label(_NOBODY, "", text)
        if ctx.labelled:
            self.said = (*self.here, lab)
        actions.detect(self, lab, ctx.who, line, offset)
        return True

    def _alone(self, text: str) -> bool:
        """feed_open may read the line: as it is (plain), and with no labels."""
        ctx = self.ctx
        assert ctx is not None
        return _plain(text) and not (ctx.labelled and text and not unlabelled(text))

    def closes(self, buf: bytes, at: int, block: Block) -> bool:
        """The whole line at ``at`` of ``buf`` closes ``block`` (the unlabelled stream's, after its exception),
        as feed_open would read it there."""
        nl = buf.find(b"\n", at)
        if nl < 0 or block.stage != "trailing" or self.ctx is None or self.ctx.node_prefix:
            return False
        text = buf[at:nl].decode("utf-8", "replace").rstrip("\r")
        return self._alone(text) and blocks.closes(text)

    def _feed_parts(self, parts: list[str], line: int, offset: int, quiet: bool) -> None:
        """The parts of one line, read as lines: a traceback they are in is not remembered (repeats.py)."""
        for part in parts:
            self._feed_text(part, line, offset, quiet)
        for block in self._blocks.values():
            block.origin = None

    def in_frames(self) -> bool:
        """One traceback is open, of unlabelled lines, in its frames: its indented lines can be taken in a run."""
        block = self._blocks.get("") if len(self._blocks) == 1 else None
        ctx = self.ctx
        return (block is not None and block.stage == "frames" and not block.stamp and not block.torch_rank
                and ctx is not None and not ctx.node_prefix)

    def frames(self, run: bytes, last_line: int) -> None:
        """Indented lines (``run``, each ending with a newline) of the open traceback's frames (``in_frames``)."""
        block = self._blocks[""]
        room = MAX_TRACEBACK_LINES - len(block.text)
        if room > 0:
            block.text.extend(run.decode("utf-8", "replace").split("\n")[:-1][:room])
        block.expect_code = False
        block.consumed += run.count(b"\n")
        block.last_line = self.line = last_line

    def _mark(self, launcher: str) -> None:
        assert self.ctx is not None
        self.launchers.setdefault(self.ctx.index, set()).add(launcher)

    def _feed_text(self, text: str, line: int, offset: int, quiet: bool = False, whole: bool = False) -> None:
        assert self.ctx is not None
        lab = split_label(text, self.ctx.node_prefix) if self.ctx.labelled else Label(Who(), "", text)
        if whole and self.ctx.labelled and not self.ctx.node_prefix:
            self.said = (*self.here, lab)
        self._stamp = lab.stamp
        if lab.key:
            self._mark_labels(lab)
        who = lab.who.merged(self.ctx.who)
        self._note(lab, who)
        block = self._blocks.get(lab.key)
        if (block.stamp if block is not None else blocks.TRACEBACK in lab.rest and not lab.rest.startswith(blocks.TRACEBACK)):
            lab = unstamped(lab)  # kubectl logs --timestamps, docker logs -t, `| ts`: a time stamp first
            if block is not None and block.stage in ("trailing", "chain") and not self._same_second(block, lab):
                blocks.close_block(self, lab.key)  # a later second: the program's next line, not the exception's message
                block = None
        if block is not None:
            if block.torch_rank and not lab.torch_rank:
                # A line without torch's [rankN]: prefix is the rank's other stream (its stdout, teed
                # into the same file): it ends a finished exception, and is skipped inside the frames.
                if block.stage in ("trailing", "chain"):
                    blocks.close_block(self, lab.key)
            elif blocks.feed_block(self, lab.key, block, lab.rest, who, line):
                return
        if self._blocks and line % 256 == 0:
            self._expire(line)
        if quiet and "NCCL" not in lab.rest:
            return  # no block took it, and it holds nothing detect looks for (NCCL's tallies read on)
        actions.detect(self, lab, who, line, offset)

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
        self._mark_labels(lab)

    def starts(self, head: bytes) -> None:
        """The first bytes of the source (whole lines): one that starts inside a traceback, cut above its header,
        opens it (blocks.cut_above)."""
        ctx = self.ctx
        assert ctx is not None
        head = head[:4096]
        if b'File "' not in head:  # no frame near the start (most sources): nothing to open
            return
        raw = head.split(b"\n")
        first = next((i for i, ln in enumerate(raw[:-1]) if ln.strip()), None)
        if first is None:
            return
        texts = [strip_ansi(ln.decode("utf-8", "replace").rstrip("\r")) for ln in raw[first:-1][:8] if ln.strip()][:4]
        labs = [split_label(t, ctx.node_prefix) if ctx.labelled else Label(_NOBODY, "", t) for t in texts]
        blocks.cut_above(self, labs, ctx.who, first + 1, sum(len(ln) + 1 for ln in raw[:first]))

    def _mark_labels(self, lab: Label) -> None:
        """The launchers a line's labels say wrote it (a sampled line's, or a line read for what it says)."""
        ctx = self.ctx
        assert ctx is not None
        if "[default" in lab.key or (lab.srun_task is not None and lab.who.local_rank is not None):
            self._mark("torchrun")  # torchrun --tee's "[default3]:" (its default role)
        if lab.srun_task is not None:
            self._mark("srun")
        if lab.key.startswith("("):
            self._mark("ray")  # Ray's "(RayTrainWorker pid=..., ip=...) "
        if "]<std" in lab.key:
            self._mark("mpirun")
        if ctx.node_prefix:
            self._mark("pdsh")

    def _same_second(self, block: Block, lab: Label) -> bool:
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
                blocks.close_block(self, key)

    # ------------------------------------------------------------------ events

    def event(self, kind: str, cls: str, message: str, label: str, who: Who, line: int, offset: int, *,
              t: float | None = None, time_source: str = TIME_LINE, **rest: Any) -> Event:
        """An event at ``line`` and byte ``offset`` of the source being read: its time ``t`` as
        ``time_source`` knows it (none: its order in the source); ``rest``, the rest of its fields."""
        assert self.ctx is not None
        return Event(kind=kind, cls=cls, message=message, label=label, who=who, source=self.ctx.path,
                     line=line, offset=offset, source_index=self.ctx.index, time=t,
                     time_source=time_source if t is not None else TIME_ORDER, **rest)

    def exited(self, code: int | None, who: Who, line: int, offset: int, stream: str, *,
               t: float | None = None, time_source: str = TIME_ORDER, pid: int | None = None,
               weak: bool = False, detail: dict[str, Any] | None = None) -> None:
        """``who`` ended with ``code`` (nothing when None or 0): an exit event (a signal's when negative) kept
        in ``stream``; ``weak``: evidence only, whatever the signal; ``detail`` follows its code and pid."""
        if not code:
            return
        cls, message, strong, label = signal_event_text(code) if code < 0 else (
            PRIMARY, f"exited with code {code}", False, f"exit code {code}")
        detail = {"exit_code": code, **({"pid": pid} if pid else {}), **(detail or {})}
        self._add(self.event("signal" if code < 0 else "exit", cls, message, label, who, line, offset, t=t,
                             time_source=time_source, strong=strong and not weak, detail=detail), stream)

    def _one(self, kind: str, cls: str, message: str, label: str, who: Who, line: int, offset: int, rest: str, *,
             strong: bool = True, t: float | None = None, detail: dict[str, Any] | None = None) -> None:
        if who.rank is None and "Rank " in rest:
            m = _PG0_RANK.search(rest)
            if m:  # c10d's "[PG 0 Rank 3]" / "[Rank 3]": the global rank (another group's rank is its own)
                who = Who(int(m.group(1)), who.node, who.local_rank)
        stream = f"line:{who.rank}:{who.local_rank}:{who.node}"
        if self.full(stream):
            return
        self._add(self.event(kind, cls, message, label, who, line, offset, t=self.line_time(rest) if t is None else t,
                             strong=strong, detail=dict(detail or {}), blames=blamed(rest)), stream)

    def line_time(self, rest: str) -> float | None:
        """The time of the current line: its own time stamp, else the one a collector put before its labels
        (kubectl logs --timestamps, docker logs -t, ``| ts``)."""
        assert self.ctx is not None
        t = find_time(rest, self.ctx.day)
        return find_time(self._stamp, self.ctx.day) if t is None and self._stamp else t

    @property
    def suspects_full(self) -> bool:
        return len(self.suspects) >= MAX_SUSPECTS

    def has_room(self, stream: str) -> bool:
        """The stream may keep another event."""
        assert self.ctx is not None
        most = MAX_HANDLED_PER_STREAM if stream.startswith("handled:") else MAX_EVENTS_PER_STREAM
        return self._per_stream.get((self.ctx.index, stream), 0) < most and len(self.events) < MAX_EVENTS

    def full(self, stream: str) -> bool:
        """The stream has all the events it may keep: a new one is only counted (the work of making it is saved)."""
        if self.has_room(stream):
            return False
        self.dropped += 1
        return True

    def _add(self, ev: Event, stream: str) -> None:
        if self.full(stream):
            return
        assert self.ctx is not None
        key = (self.ctx.index, stream)
        self._per_stream[key] = self._per_stream.get(key, 0) + 1
        ev.label = brief(ev.label)  # a label is a message's first word(s), or the message when it has none
        self.events.append(ev)

    # ------------------------------------------------------------------ error files and metrics

    def error_file(self, data: bytes) -> None:
        """A torchelastic error file (TORCHELASTIC_ERROR_FILE: ``{"message": {"message", "extraInfo":
        {"py_callstack", "timestamp"}}}``) as one event of the source's rank."""
        assert self.ctx is not None
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
            try:
                ts = float(extra["timestamp"]) if extra.get("timestamp") else None
            except (TypeError, ValueError):
                pass
            msg = msg.get("message")
        if not msg or msg == "<N/A>":
            return
        text = str(msg)
        cls, label, kind = classify(text + "\n" + callstack[-2000:])
        message = short_exception(text.strip().splitlines()[-1] if "\n" in text.strip() else text)
        lines = callstack.splitlines()[:MAX_TRACEBACK_LINES]
        where = raised_in(lines)
        self._add(self.event("error-file", cls, message, label or message.split(":", 1)[0], self.ctx.who,
                             1, 0, t=ts, time_source=TIME_ERROR_FILE,
                             detail={"cause": kind, **({"raised_in": where} if where else {})}, text=lines), "error-file")

    def metrics_line(self, record: dict[str, Any]) -> dict[str, Any] | None:
        """The progress an mldebug train metrics record says (rank, step, time), or None."""
        if (not isinstance(record, dict) or record.get("schema") != "mldebug.train.step"
                or not isinstance(rank := record.get("rank"), int)):
            return None
        self.ranks_seen.add(rank)
        return {"rank": rank, "step": record.get("step"), "time": record.get("time"),
                "loss": record.get("loss"), "event": record.get("event")}

