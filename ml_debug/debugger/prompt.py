"""The small pdb-like prompt of `mldebug attach` with neither --eval nor --json.

It reads commands through `read` and writes through `write` (the CLI passes input() and the
console), so it holds no terminal code of its own and a test can drive it through stdin.
"""

from __future__ import annotations

from collections.abc import Callable

from ml_debug.core.visible import visible
from ml_debug.debugger.dap import DapError
from ml_debug.debugger.render import frame_line, variable_line
from ml_debug.debugger.result import AttachResult
from ml_debug.debugger.session import Session

HELP = """commands:
  threads            list the threads          thread ID|NAME   read another thread
  bt | where         the stack                 up / down / frame N   move in it
  locals             the frame's locals        p EXPR           evaluate EXPR in the frame
  c | continue       let the process run       pause            stop it again
  q | quit | detach  detach (the process keeps running)"""


def run_prompt(s: Session, result: AttachResult, read: Callable[[str], str], write: Callable[[str], None]) -> None:
    """Serve commands until quit/detach or end of input; the process is left running either way."""
    assert result.thread is not None
    write(f"attached to pid {result.pid} ({visible(result.thread.name)} stopped in frame {result.frame}); "
          "'help' lists commands")
    running = False
    while True:
        try:
            line = read("(mldebug) ").strip()
        except EOFError:
            return
        cmd, _, arg = line.partition(" ")
        arg = arg.strip()
        try:
            if cmd in ("q", "quit", "detach", "exit"):
                return
            if cmd in ("h", "help", "?"):
                write(HELP)
            elif cmd == "threads":
                result.threads = s.threads()
                for t in result.threads:
                    write(f"{'>' if t.id == result.thread.id else ' '} {t.id} {visible(t.name)}")
            elif cmd in ("c", "continue"):
                s.resume()
                running = True
                write("running ('pause' stops it again, 'q' detaches)")
            elif cmd == "pause" or (running and cmd in ("bt", "where", "locals", "p", "up", "down", "frame")):
                if not s.stop(result.thread.id):
                    write(f"{visible(result.thread.name)} did not stop: it is in native code")
                    continue
                running = False
                result.frames, result.frame = s.stack(result.thread.id), 0
                if cmd == "pause":
                    write(frame_line(result.frames[0], True))
                    continue
                _frame_command(s, result, cmd, arg, write)
            elif cmd == "thread":
                match = [t for t in s.threads() if arg in (str(t.id), t.name)]
                if not match:
                    write(f"no thread {arg!r}")
                    continue
                result.thread = match[0]
                result.frames, result.frame = s.stack(result.thread.id), 0
                write(frame_line(result.frames[0], True) if result.frames else "(no Python frames)")
            elif cmd in ("bt", "where", "w", "locals", "p", "up", "u", "down", "d", "frame", "f"):
                _frame_command(s, result, cmd, arg, write)
            elif cmd:
                write(f"unknown command {cmd!r}; 'help' lists commands")
        except DapError as e:
            write(f"error: {e.message}")


def _frame_command(s: Session, result: AttachResult, cmd: str, arg: str, write: Callable[[str], None]) -> None:
    assert result.thread is not None
    frame = result.frame or 0
    if cmd in ("bt", "where", "w"):
        for f in result.frames:
            write(frame_line(f, f.index == frame))
    elif cmd == "locals":
        for v in s.locals(result.thread.id, frame):
            write(variable_line(v))
    elif cmd == "p":
        if not arg:
            write("usage: p EXPR")
            return
        ev = s.evaluate(result.thread.id, frame, arg)
        write(visible(ev.value if ev.error is None else f"error: {ev.error}", keep="\n"))  # type: ignore[arg-type]
    else:
        if cmd in ("up", "u"):
            target = frame + 1
        elif cmd in ("down", "d"):
            target = frame - 1
        else:
            try:
                target = int(arg)
            except ValueError:
                write("usage: frame N")
                return
        if not 0 <= target < len(result.frames):
            write(f"no frame {target} (0 = innermost .. {len(result.frames) - 1} = outermost)")
            return
        result.frame = target
        write(frame_line(result.frames[target], True))
