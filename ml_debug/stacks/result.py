"""Plain data for stack dumps: frames, threads, one dump of one process, and its target."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from ml_debug.core.visible import visible

_SITE = re.compile(r".*/(?:site|dist)-packages/")
_STDLIB = re.compile(r".*/lib/python\d+\.\d+/")


def short_path(filename: str) -> str:
    """A path that is the same on every node: relative to site-packages / the stdlib, else the basename.

    py-spy's own short_filename depends on the rank's sys.path; this does not, so ranks dumped by
    different tools (py-spy, pystack, gdb) or living in different venvs still group together.
    """
    if not filename or filename.startswith("<"):
        return filename
    m = _SITE.match(filename)
    if m:
        return filename[m.end():]
    m = _STDLIB.match(filename)
    if m:
        return filename[m.end():]
    return filename.rsplit("/", 1)[-1]


def is_library_path(filename: str) -> bool:
    """Third-party, stdlib or frozen code (not the user's own training code)."""
    return (filename.startswith("<") or bool(_SITE.match(filename)) or bool(_STDLIB.match(filename))
            or "/torch/" in filename)


@dataclass
class Frame:
    """One frame. ``kind`` is "py" for Python code, "native" for C/C++."""

    name: str
    filename: str = ""
    line: int | None = None
    kind: str = "py"
    library: str | None = None  # shared object, for native frames
    locals: dict[str, Any] | None = None

    @property
    def short(self) -> str:
        return short_path(self.filename)

    def where(self, brief: bool = False) -> str:
        """`name (path/file.py:88)` as a person reads it; `brief`: the file's basename only.

        The job names its files and functions: the label shows their control characters and newlines
        visibly (a name with a newline must not add a line to a tree, a table or a verdict). The fields
        keep the exact values, for JSON."""
        return visible(self._where(brief))

    def _where(self, brief: bool) -> str:
        if brief and self.kind == "py" and self.filename:
            base = self.filename.rsplit("/", 1)[-1]
            return f"{self.name} ({base}:{self.line})" if self.line else f"{self.name} ({base})"
        if self.kind == "native":
            loc = self.short if self.filename else (self.library or "").rsplit("/", 1)[-1]
            if loc and self.line:
                return f"{self.name} ({loc}:{self.line})"
            return f"{self.name} ({loc})" if loc else self.name
        return f"{self.name} ({self.short}:{self.line})" if self.line else f"{self.name} ({self.short})"


@dataclass
class ThreadDump:
    """One thread's stack, innermost frame first (as py-spy prints it)."""

    thread_id: str
    os_thread_id: int | None
    name: str | None
    is_main: bool
    frames: list[Frame] = field(default_factory=list)
    native_frames: list[Frame] = field(default_factory=list)  # gdb/pystack C frames, when taken
    active: bool | None = None
    owns_gil: bool | None = None

    def python_frames(self) -> list[Frame]:
        return [f for f in self.frames if f.kind == "py"]


@dataclass
class Attempt:
    """One try of one dumper on one process."""

    dumper: str
    ok: bool
    seconds: float
    error: str | None = None


@dataclass
class ProcessDump:
    """The result of dumping one process once: its threads, or why it could not be dumped."""

    pid: int
    ok: bool
    dumper: str | None = None
    threads: list[ThreadDump] = field(default_factory=list)
    error: str | None = None  # one line a person can act on
    fix: str | None = None  # what to do about the error, when there is something to do
    attempts: list[Attempt] = field(default_factory=list)
    seconds: float = 0.0
    taken_at: float = 0.0  # time.time() when the dump started

    def main_thread(self) -> ThreadDump | None:
        for t in self.threads:
            if t.is_main:
                return t
        return self.threads[0] if self.threads else None


def frame_from_json(d: dict[str, Any]) -> Frame:
    return Frame(name=d.get("name", "?"), filename=d.get("filename", ""), line=d.get("line"),
                 kind=d.get("kind", "py"), library=d.get("library"), locals=d.get("locals"))


def thread_from_json(d: dict[str, Any]) -> ThreadDump:
    return ThreadDump(thread_id=str(d.get("thread_id")), os_thread_id=d.get("os_thread_id"), name=d.get("name"),
                      is_main=bool(d.get("is_main")), frames=[frame_from_json(f) for f in d.get("frames", [])],
                      native_frames=[frame_from_json(f) for f in d.get("native_frames", [])],
                      active=d.get("active"), owns_gil=d.get("owns_gil"))


def dump_from_json(d: dict[str, Any]) -> ProcessDump:
    """Rebuild a ProcessDump from its JSON (a remote node's `dump-stacks --local --json`)."""
    return ProcessDump(pid=int(d["pid"]), ok=bool(d["ok"]), dumper=d.get("dumper"),
                       threads=[thread_from_json(t) for t in d.get("threads", [])], error=d.get("error"),
                       fix=d.get("fix"),
                       attempts=[Attempt(a["dumper"], a["ok"], a["seconds"], a.get("error"))
                                 for a in d.get("attempts", [])],
                       seconds=float(d.get("seconds", 0.0)), taken_at=float(d.get("taken_at", 0.0)))
