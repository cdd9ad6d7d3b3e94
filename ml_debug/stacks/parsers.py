"""Turn the dumpers' output (py-spy JSON, pystack text, gdb text) into ThreadDumps."""

from __future__ import annotations

import json
import re
from typing import Any

from ml_debug.stacks.result import Frame, ThreadDump


def parse_pyspy_json(text: str, pid: int) -> list[ThreadDump]:
    """`py-spy dump --json` output: a list of threads, frames innermost first."""
    data: list[dict[str, Any]] = json.loads(text)
    threads = []
    for i, t in enumerate(data):
        frames = []
        for f in t.get("frames", []):
            filename = f.get("filename") or ""
            # --native frames carry a shared-object or C source path, Python frames a .py path
            native = not (filename.endswith(".py") or filename.startswith("<"))
            locals_ = {v.get("name", "?"): v.get("repr") for v in f.get("locals") or []} or None
            frames.append(Frame(name=f.get("name") or "?", filename=filename, line=f.get("line"),
                                kind="native" if native else "py", locals=locals_))
        os_tid = t.get("os_thread_id")
        is_main = os_tid == pid if os_tid is not None else (t.get("thread_name") == "MainThread" or i == 0)
        threads.append(ThreadDump(thread_id=str(t.get("thread_id")), os_thread_id=os_tid,
                                  name=t.get("thread_name"), is_main=is_main, frames=frames,
                                  active=t.get("active"), owns_gil=t.get("owns_gil")))
    return threads


# `pystack remote` names the thread, `pystack core` (1.7) does not: "Traceback for thread 7005 (python3)
# [Has the GIL] (most recent call last):" and "Traceback for thread 7005 [Has the GIL] (most recent call last):"
_PYSTACK_THREAD = re.compile(r"^Traceback for thread (\d+)(?: \(((?!most recent call last\)).*?)\))?"
                             r"(?: \[(.*?)\])? \(most recent call last\):")
_PYSTACK_FRAME = re.compile(r'^\s+\((Python|C)\) File "(.*)", line (\d+), in (\S+)(?: \((.*)\))?\s*$')


def parse_pystack(text: str, pid: int) -> list[ThreadDump]:
    """`pystack remote PID [--native]` / `pystack core CORE` text; its frames are outermost first."""
    threads: list[ThreadDump] = []
    current: ThreadDump | None = None
    for line in text.splitlines():
        m = _PYSTACK_THREAD.match(line)
        if m:
            tid = int(m.group(1))
            flags = m.group(3) or ""
            current = ThreadDump(thread_id=str(tid), os_thread_id=tid, name=m.group(2), is_main=tid == pid,
                                 owns_gil="Has the GIL" in flags)
            threads.append(current)
            continue
        m = _PYSTACK_FRAME.match(line)
        if m and current is not None:
            kind, filename, lineno, name, lib = m.groups()
            frame = Frame(name=name, filename="" if filename == "???" else filename, line=int(lineno) or None,
                          kind="py" if kind == "Python" else "native", library=lib)
            (current.frames if kind == "Python" else current.native_frames).insert(0, frame)
    if threads and not any(t.is_main for t in threads):
        threads[0].is_main = True  # a core file: the first thread is the one that crashed
    return threads


PYBT_MARK = "=====mldebug py-bt====="
_GDB_THREAD = re.compile(r"^Thread (\d+) \((?:Thread 0x[0-9a-f]+ )?\(?LWP (\d+)\)?\)?(?: \"(.*)\")?\):?")
_GDB_FRAME = re.compile(r"^#(\d+)\s+(?:0x[0-9a-f]+ in )?(.*)$")
_GDB_AT = re.compile(r" at (\S+):(\d+)$")
_GDB_FROM = re.compile(r" from (\S+)$")
_PYBT_FILE = re.compile(r'^\s+File "(.*)", line (\d+), in (\S+)')


def _strip_args(text: str) -> str:
    """`func (a=1, b=(2)) ` -> `func`: drop the last balanced parenthesis group."""
    text = text.rstrip()
    if not text.endswith(")"):
        return text
    depth = 0
    for i in range(len(text) - 1, -1, -1):
        if text[i] == ")":
            depth += 1
        elif text[i] == "(":
            depth -= 1
            if depth == 0:
                return text[:i].rstrip()
    return text


def parse_gdb_frame(line: str) -> Frame | None:
    m = _GDB_FRAME.match(line)
    if not m:
        return None
    rest = m.group(2).strip()
    filename, lineno, library = "", None, None
    at = _GDB_AT.search(rest)
    if at:
        filename, lineno = at.group(1), int(at.group(2))
        rest = rest[:at.start()]
    else:
        fr = _GDB_FROM.search(rest)
        if fr:
            library = fr.group(1)
            rest = rest[:fr.start()]
    name = _strip_args(rest) or "??"
    return Frame(name=name, filename=filename, line=lineno, kind="native", library=library)


def parse_gdb(text: str, pid: int | None) -> list[ThreadDump]:
    """`gdb -batch -ex 'thread apply all bt' -ex 'echo MARK' -ex 'thread apply all py-bt'` output.

    Native frames come from bt, Python frames from py-bt (when the interpreter's gdb helper loaded).
    """
    native_part, _, py_part = text.partition(PYBT_MARK)
    threads: dict[int, ThreadDump] = {}
    order: list[int] = []
    current: ThreadDump | None = None
    for line in native_part.splitlines():
        m = _GDB_THREAD.match(line)
        if m:
            num, lwp, name = int(m.group(1)), int(m.group(2)), m.group(3)
            current = ThreadDump(thread_id=str(lwp), os_thread_id=lwp, name=name,
                                 is_main=(lwp == pid) if pid else num == 1)
            threads[num] = current
            order.append(num)
            continue
        if current is not None:
            f = parse_gdb_frame(line)
            if f is not None:
                current.native_frames.append(f)
    current = None
    for line in py_part.splitlines():
        m = _GDB_THREAD.match(line)
        if m:
            current = threads.get(int(m.group(1)))
            continue
        if current is None:
            continue
        hit = _PYBT_FILE.match(line)
        if hit:
            current.frames.append(Frame(name=hit.group(3), filename=hit.group(1), line=int(hit.group(2))))
    result = [threads[n] for n in order]
    if pid is None and result:
        # a core: gdb lists threads from the highest number; thread 1 is the one that received the signal
        result.sort(key=lambda t: not t.is_main)
    return result
