"""What `mldebug attach` read from a process: plain data, the JSON of `--json`."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

SCHEMA = "mldebug.attach"
SCHEMA_VERSION = 1


@dataclass
class ThreadInfo:
    id: int
    name: str


@dataclass
class FrameInfo:
    index: int  # 0 = innermost
    name: str
    file: str | None
    line: int | None


@dataclass
class Variable:
    name: str
    value: str
    type: str | None


@dataclass
class Evaluation:
    expression: str
    value: str | None
    type: str | None
    frame: int | None  # the frame it was evaluated in
    error: str | None


@dataclass
class AttachResult:
    """One attach: the process, its threads, the chosen thread's stack, a frame's locals, one value."""

    ok: bool
    summary: str
    exit_code: int
    host: str
    pid: int | None
    rank: int | None
    found: bool  # the process (the pid, or the rank on this node) was there
    threads: list[ThreadInfo] = field(default_factory=list)
    thread: ThreadInfo | None = None
    stopped: bool = False
    frames: list[FrameInfo] = field(default_factory=list)
    frame: int | None = None
    locals: list[Variable] = field(default_factory=list)
    evaluation: Evaluation | None = None
    alive_after: bool | None = None  # the process still ran when mldebug detached
    ranks_here: list[int] = field(default_factory=list)  # with --rank: the ranks this node runs
    error: str | None = None
    hint: str | None = None
    duration_s: float = 0.0


def from_dict(d: dict[str, Any]) -> AttachResult:
    """An AttachResult back from its JSON (a node's document)."""
    def thread(x: Any) -> ThreadInfo | None:
        return ThreadInfo(id=int(x["id"]), name=str(x["name"])) if isinstance(x, dict) else None

    ev = d.get("evaluation")
    return AttachResult(
        ok=bool(d["ok"]), summary=str(d["summary"]), exit_code=int(d["exit_code"]), host=str(d["host"]),
        pid=d.get("pid"), rank=d.get("rank"), found=bool(d.get("found")),
        threads=[t for t in (thread(x) for x in d.get("threads") or []) if t is not None],
        thread=thread(d.get("thread")), stopped=bool(d.get("stopped")),
        frames=[FrameInfo(index=int(f["index"]), name=str(f["name"]), file=f.get("file"), line=f.get("line"))
                for f in d.get("frames") or []],
        frame=d.get("frame"),
        locals=[Variable(name=str(v["name"]), value=str(v["value"]), type=v.get("type")) for v in d.get("locals") or []],
        evaluation=Evaluation(expression=str(ev["expression"]), value=ev.get("value"), type=ev.get("type"),
                              frame=ev.get("frame"), error=ev.get("error")) if isinstance(ev, dict) else None,
        alive_after=d.get("alive_after"), ranks_here=[int(r) for r in d.get("ranks_here") or []],
        error=d.get("error"), hint=d.get("hint"), duration_s=float(d.get("duration_s") or 0.0))
