"""What `mldebug attach` prints for a person (the JSON is the model itself)."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

from ml_debug.core.visible import visible
from ml_debug.debugger.result import AttachResult, FrameInfo, Variable

if TYPE_CHECKING:
    from rich.console import Console


def frame_line(f: FrameInfo, current: bool = False) -> str:
    """One line of the stack (`bt`, `up`, `down`): the job's function and file names shown visibly, so a
    name with a newline or an escape sequence stays on its line and never reaches the terminal raw."""
    where = f"{visible(os.path.basename(f.file))}:{f.line}" if f.file else "?"
    return f"{'>' if current else ' '} #{f.index:<2} {visible(f.name)}  {where}"


def variable_line(v: Variable) -> str:
    return f"  {visible(v.name)} = {visible(v.value)}" + (f"  ({visible(v.type)})" if v.type else "")


def lines(result: AttachResult) -> list[str]:
    out = [result.summary]
    if result.threads:
        out.append("threads: " + ", ".join(f"{t.id} {visible(t.name)}" for t in result.threads))
    if result.frames and result.thread:
        out.append(f"stack of {visible(result.thread.name)} (innermost first):")
        out.extend(frame_line(f, f.index == result.frame) for f in result.frames)
    if result.frame is not None and result.frames:
        out.append(f"locals of frame {result.frame} ({visible(result.frames[result.frame].name)}):")
        out.extend(variable_line(v) for v in result.locals) if result.locals else out.append("  (none)")
    if result.alive_after is not None:
        out.append(f"detached: pid {result.pid} " + ("still running" if result.alive_after else "is gone"))
    return out


def render(result: AttachResult, console: Console, brief: bool = False) -> None:
    for line in lines(result)[-1:] if brief else lines(result):
        console.print(line, markup=False, highlight=False, soft_wrap=True)
