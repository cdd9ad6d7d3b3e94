"""One debug session with a live process: debugpy's adapter as mldebug's child, talking DAP over a pipe.

mldebug starts debugpy's adapter (``python -m ml_debug.debugger.adapter``: debugpy's own, its injector
quiet in the process's stderr) with its stdin and stdout on one end of a socket pair and asks it to
attach by pid (the adapter runs debugpy's injector, which uses gdb, exactly as VS
Code's "attach to process" does). The injected debug server connects back to the adapter on an
ephemeral 127.0.0.1 port guarded by a random access token; the process itself never listens. The
adapter and its injector run in their own process group, which mldebug ends on every way out
(detach, error, Ctrl-C); a mldebug killed outright closes the pipe, and the adapter ends on its own.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from types import TracebackType
from typing import Any, Protocol

from ml_debug.core import lifecycle
from ml_debug.debugger.dap import DapClient, DapError, Wire
from ml_debug.debugger.result import Evaluation, FrameInfo, ThreadInfo, Variable

ADAPTER = [sys.executable, "-m", "ml_debug.debugger.adapter"]  # debugpy's, its injector quiet
# The symbols gdb must read to inject debugpy: dlopen (libc; libdl before glibc 2.34), and the
# interpreter's when it is a shared libpython. By default debugpy's injector has gdb read every
# library's symbols, which for a torch process took 30 s instead of 4 s here
# (benchmarks/attach_gdb_scan.py). A user's own PYDEVD_GDB_SCAN_SHARED_LIBRARIES wins ('.' = all).
GDB_SCAN = "libc.so,libdl.so,libpthread.so,libpython"
INJECTOR_FAILED = "mldebug: cannot inject:"
"""How the injector's last line starts when it cannot inject (its FAILED: injector/__main__.py runs as a script)."""
# debugpy's folders for functions, classes and dunders among the locals: not variables of the frame
GROUPS = frozenset({"function variables", "class variables", "special variables", "protected variables"})


class Link(Protocol):
    """How the DAP client reaches debugpy's adapter: a child here (:class:`AdapterLink`), or mldebug's
    agent on the rank's node over ssh or a Slurm step (ml_debug/debugger/tunnel.py)."""

    @property
    def wire(self) -> Wire: ...

    def close(self) -> bool | None:
        """End the adapter (after the DAP disconnect); True/False: the process still ran, None: not known."""
        ...


def start_adapter() -> tuple[socket.socket, subprocess.Popen[bytes]]:
    """``python -m debugpy.adapter`` as this process's child, its stdin and stdout on one end of a socket
    pair (returned with it), in its own process group, ended by the kernel if we die."""
    ours, theirs = socket.socketpair()
    with lifecycle.held_signals() as held:  # a Ctrl-C while it starts is raised in the try, which ends it
        try:
            adapter = held.popen(ADAPTER, stdin=theirs.fileno(), stdout=theirs.fileno(),
                                 stderr=subprocess.DEVNULL, start_new_session=True, close_fds=True,
                                 preexec_fn=_die_with_parent(os.getpid()),
                                 env={"PYDEVD_GDB_SCAN_SHARED_LIBRARIES": GDB_SCAN, **os.environ})
        except BaseException:
            ours.close()
            raise
        finally:
            theirs.close()
        try:
            held.release()
        except BaseException:
            ours.close()
            _kill(adapter)
            raise
    return ours, adapter


def end_adapter(adapter: subprocess.Popen[bytes]) -> None:
    """The adapter and whatever it started (gdb): a moment to end by itself, then SIGKILL to its group."""
    try:
        adapter.wait(timeout=3)
    except subprocess.TimeoutExpired:
        pass
    _kill(adapter)


def _kill(adapter: subprocess.Popen[bytes]) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(adapter.pid, signal.SIGKILL)
    with contextlib.suppress(subprocess.TimeoutExpired):
        adapter.wait(timeout=5)


class AdapterLink:
    """The adapter as mldebug's own child: the process is on this node."""

    def __init__(self) -> None:
        self.wire, self.adapter = start_adapter()

    def close(self) -> bool | None:
        with contextlib.suppress(OSError):
            self.wire.close()
        end_adapter(self.adapter)
        return None


class Session:
    """``with Session(pid, timeout) as s:`` attached on entry, detached (the process running) on exit.

    ``link`` opens the way to the adapter (default: the adapter as a child here); the process `pid` is
    on the adapter's node."""

    def __init__(self, pid: int, timeout: float, attach_timeout: float = 60.0,
                 link: Callable[[], Link] = AdapterLink) -> None:
        self.pid = pid
        self.timeout = timeout
        self.attach_timeout = attach_timeout
        self.client: DapClient | None = None
        self.link: Link | None = None
        self._open_link = link
        self.alive_after: bool | None = None  # what the link said after the detach (a remote node's word)
        self.started = False  # debugpy started in the process (the adapter said "initialized")
        self.output: list[str] = []  # what the adapter's injector said (gdb's complaints, for errors)
        self._frames: dict[int, list[tuple[int, FrameInfo]]] = {}  # thread id -> (DAP frame id, frame)

    # ------------------------------------------------------------------ lifetime

    def __enter__(self) -> Session:
        self.link = self._open_link()
        self.client = DapClient(sock=self.link.wire, timeout=self.timeout)
        try:
            self._attach()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None) -> None:
        self.close()

    def _attach(self) -> None:
        c = self._c
        c.request("initialize", {"clientID": "mldebug", "clientName": "mldebug", "adapterID": "debugpy",
                                 "linesStartAt1": True, "columnsStartAt1": True, "pathFormat": "path",
                                 "supportsVariableType": True})
        seq = c.send("attach", {"processId": self.pid, "justMyCode": False, "subProcess": False,
                                "redirectOutput": False})
        # The adapter injects (gdb: seconds), waits for the server to connect back, then says "initialized"; an
        # injector that failed ends the wait (the adapter says "Attach to PID failed" with its output).
        deadline = time.monotonic() + self.attach_timeout
        while c.wait_event("initialized", max(0.0, min(1.0, deadline - time.monotonic()))) is None:
            said = [x.strip() for x in "".join(self._injector_output()).splitlines() if x.strip()]
            ours = next((x for x in said if x.startswith(INJECTOR_FAILED)), None)
            if ours is not None:
                raise DapError(ours[len(INJECTOR_FAILED):].strip(),
                               hint="install what it names on the node of the process, then attach again")
            if time.monotonic() >= deadline or "Attach to PID failed." in said:
                raise DapError(f"debugpy did not start in pid {self.pid}"
                               + ("" if time.monotonic() < deadline else f" within {self.attach_timeout:g} s")
                               + (f" (the injector said: {said[-1][:200]})" if said else ""),
                               hint="see that gdb can attach (ptrace) and that the process is a CPython 3.8+; "
                                    "raise --attach-timeout on a loaded node")
        self.started = True
        c.request("configurationDone")
        c.wait_response(seq, "attach", self.attach_timeout)

    def _injector_output(self) -> list[str]:
        if self.client is not None:
            for ev in list(self.client.events):
                if ev.get("event") == "output":
                    self.output.append(str((ev.get("body") or {}).get("output", "")))
                    self.client.events.remove(ev)
        return self.output

    def close(self) -> None:
        """Detach (the process resumes and keeps running) and end the adapter and its injector."""
        if self.client is not None:
            if self.started:  # (before, there is nothing to detach from)
                with contextlib.suppress(DapError, OSError):
                    self.client.request("disconnect", {"terminateDebuggee": False, "restart": False},
                                        timeout=min(5.0, self.timeout))
            self.client = None
        if self.link is not None:
            link, self.link = self.link, None
            self.alive_after = link.close()

    @property
    def _c(self) -> DapClient:
        if self.client is None:
            raise DapError("not attached")
        return self.client

    # ------------------------------------------------------------------ reading

    def threads(self) -> list[ThreadInfo]:
        """Every Python thread (``threads``; debugpy's own are hidden)."""
        body = self._c.request("threads")
        return [ThreadInfo(id=int(t["id"]), name=str(t.get("name", ""))) for t in body.get("threads", [])]

    def stop(self, thread_id: int, timeout: float | None = None) -> bool:
        """Pause the process; False when the thread did not stop in time (it sits in native code:
        a collective, a lock, a long sleep: it stops only when it runs Python again)."""
        c = self._c
        if not any(ev.get("event") == "stopped" for ev in c.events):
            c.request("pause", {"threadId": thread_id})
        wait = self.timeout if timeout is None else timeout
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline:
            ev = c.wait_event("stopped", deadline - time.monotonic())
            if ev is None:
                return False
            if ev.get("threadId") == thread_id or ev.get("allThreadsStopped"):
                return True
        return False

    def resume(self) -> None:
        self._frames.clear()
        self._c.request("continue", {"threadId": 0})

    def stack(self, thread_id: int) -> list[FrameInfo]:
        body = self._c.request("stackTrace", {"threadId": thread_id, "startFrame": 0, "levels": 200})
        frames = []
        for i, f in enumerate(body.get("stackFrames", [])):
            src = f.get("source") or {}
            frames.append((int(f["id"]), FrameInfo(index=i, name=str(f.get("name", "?")),
                                                   file=src.get("path") or src.get("name"), line=f.get("line"))))
        self._frames[thread_id] = frames
        return [f for _, f in frames]

    def _frame_id(self, thread_id: int, index: int) -> int:
        frames = self._frames.get(thread_id) or []
        if not 0 <= index < len(frames):
            raise DapError(f"no frame {index}: the stack has {len(frames)} frame(s) (0 = innermost)")
        return frames[index][0]

    def locals(self, thread_id: int, index: int) -> list[Variable]:
        c = self._c
        scopes = c.request("scopes", {"frameId": self._frame_id(thread_id, index)}).get("scopes", [])
        ref = next((s["variablesReference"] for s in scopes
                    if s.get("presentationHint") == "locals" or s.get("name") == "Locals"), None)
        if not ref:
            return []
        out = c.request("variables", {"variablesReference": ref}).get("variables", [])
        return [Variable(name=str(v.get("name")), value=str(v.get("value", "")), type=v.get("type"))
                for v in out if not str(v.get("name", "")).startswith("(return)") and v.get("name") not in GROUPS]

    def evaluate(self, thread_id: int, index: int, expression: str) -> Evaluation:
        """`expression` in frame `index` (its locals and globals), as the debugger's watch would."""
        try:
            body: dict[str, Any] = self._c.request(
                "evaluate", {"expression": expression, "frameId": self._frame_id(thread_id, index),
                             "context": "watch"})
        except DapError as e:
            said = e.message.removeprefix("evaluate:").strip()  # the adapter's words, not the request's name
            return Evaluation(expression=expression, value=None, type=None, frame=index, error=_last_line(said))
        result = str(body.get("result", ""))
        if body.get("presentationHint", {}).get("attributes") == ["error"] or _is_traceback(result):
            return Evaluation(expression=expression, value=None, type=None, frame=index, error=_last_line(result))
        return Evaluation(expression=expression, value=result, type=body.get("type"), frame=index, error=None)


def _die_with_parent(parent: int) -> Callable[[], None]:
    """The adapter does not end when its client's pipe closes: the kernel ends it with mldebug
    (PR_SET_PDEATHSIG), so a mldebug killed outright (SIGKILL, OOM) leaves no listener behind."""
    def arm() -> None:
        try:
            import ctypes

            libc = ctypes.CDLL(None, use_errno=True)
            libc.prctl(1, signal.SIGKILL, 0, 0, 0)  # 1 = PR_SET_PDEATHSIG
        except (OSError, AttributeError):
            return
        if os.getppid() != parent:  # mldebug died before the prctl: nobody would end us
            os._exit(1)
    return arm


def _is_traceback(text: str) -> bool:
    return text.startswith("Traceback (most recent call last)") or text.startswith(("NameError:", "SyntaxError:"))


def _last_line(text: str) -> str:
    lines = [x for x in text.strip().splitlines() if x.strip()]
    return lines[-1].strip() if lines else text
