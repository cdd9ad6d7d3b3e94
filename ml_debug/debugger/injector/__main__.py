"""debugpy's injector (``debugpy --connect HOST:PORT --pid PID``) with the code it injects made quiet.

debugpy builds one line of Python that gdb runs inside the process (``attach_pid_injected.attach``).
That code prints on the process's stderr, the job's log:

- "The threading module was not imported by user code in the main thread ...", when the process never
  imported threading: debugpy then imports it and fixes the main thread's id first;
- "Debugger warning: It seems that frozen modules are being used ...", on CPython 3.11+, unless
  ``PYDEVD_DISABLE_FILE_VALIDATION`` is set in the process.

Here the injected line is wrapped: it fixes the main thread's id itself with debugpy's own function and
silent callbacks (so debugpy finds threading imported and says nothing), sets
``PYDEVD_DISABLE_FILE_VALIDATION=1`` in the process only while debugpy loads, then restores the
process's environment as it was.

And gdb's calls into the process (``dlopen``, ``DoAttach``) leave its interrupted system call as it found it.
After a call gdb puts the thread's registers back in their numbering order; on a CPU with AMX (Sapphire Rapids
and later: an H100 node's host) gdb 13 (Debian 12's) cannot write the extended state ("Couldn't write extended
state status: Bad address"), which stops it before ``orig_rax``, left at the -1 gdb set for the call. The kernel
then does not restart the system call the thread was in (a ``time.sleep``, a wait on a socket), and its
-ERESTARTNOHAND (errno 514) reaches the program: ``OSError: [Errno 514] Unknown error 514`` killed the job. So
``orig_rax`` is kept before the first call and written back after the last (:func:`keeping_the_system_call`),
and the injection is done again with lldb, which writes that state: found as ``lldb-NN`` or ``lldb``
(core.extras.find_lldb). ``PYDEVD_ATTACH_PREFER_LLDB=1`` (debugpy's) has lldb do it first. lldb runs
lldb_call.py's command (not debugpy's script, whose calls get 10 s and whose failures lldb's exit status hides):
each call gets a minute, and a call that failed ends the injection with what lldb said (:func:`inject_with_lldb`).

The rest is debugpy's own injector. Standard library, debugpy and ml_debug's ``core.extras`` and ``lldb_call`` only:
this runs as a script, beside the ml_debug package (the adapter's Python has it).
"""

from __future__ import annotations

import os
import platform
import subprocess
import sys
import threading

from ml_debug.debugger.injector import lldb_call
from ml_debug.debugger.injector.lldb_call import CALL_TIMEOUT_S

# Runs inside the job's process; `code` is debugpy's own line, `attach_dir` the folder of its
# attach_script. debugpy's line may not contain quotes: the whole call travels as bytes (below).
# `in_thread`: debugpy starts in a thread of its own once the debugger's call has returned (lldb
# gives up a call during which the process forks, and debugpy's start runs `uname -p`).
_WRAPPER = '''
def _mldebug_quiet_attach(code, attach_dir, in_thread):
    import os, sys
    if "threading" not in sys.modules:
        sys.path.insert(0, attach_dir)
        try:
            import attach_script
        finally:
            sys.path.remove(attach_dir)
        quiet = lambda *_a, **_k: None
        attach_script.fix_main_thread_id(on_warn=quiet, on_exception=quiet, on_critical=quiet)

    def start():
        if in_thread:  # not one of the program's threads: debugpy lists none of its own
            import threading
            me = threading.current_thread()
            me.name, me.is_pydev_daemon_thread, me.pydev_do_not_trace = "mldebug-attach", True, True
        before = os.environ.get("PYDEVD_DISABLE_FILE_VALIDATION")
        os.environ["PYDEVD_DISABLE_FILE_VALIDATION"] = "1"
        try:
            exec(code, {"__name__": "_mldebug_attach"})
        finally:
            if before is None:
                os.environ.pop("PYDEVD_DISABLE_FILE_VALIDATION", None)
            else:
                os.environ["PYDEVD_DISABLE_FILE_VALIDATION"] = before

    if in_thread:
        import _thread
        _thread.start_new_thread(start, ())  # (threading's start waits for the thread: it runs after the call)
    else:
        start()
_mldebug_quiet_attach(%r, %r, %r)
'''


def quiet(code: str, attach_dir: str, in_thread: bool = False) -> str:
    """debugpy's injected line, wrapped (one line, no quotes, as gdb's DoAttach call needs), run in a namespace of
    its own (DoAttach runs it in ``__main__``: the program's globals stay as they were)."""
    return f"exec(bytes({list((_WRAPPER % (code, attach_dir, in_thread)).encode())}).decode(), dict())"


_KEEP = "--eval-command='set $mldebug_orig_rax = $orig_rax'"
_PUT_BACK = "--eval-command='set $orig_rax = $mldebug_orig_rax'"
GDB_CANNOT_CALL = "Couldn't write extended state"
"""gdb's words when it cannot write a thread's extended register state (Debian 12's gdb 13, on a CPU with AMX)."""
FAILED = "mldebug: cannot inject:"
"""The start of the line this injector ends with when it cannot inject (session.py shows the rest)."""


def keeping_the_system_call(command: str) -> str:
    """debugpy's gdb command line (a shell string of its own making) with ``orig_rax`` kept around its calls, on
    x86-64 (the only architecture with that register; elsewhere the command is unchanged)."""
    first = command.find("--eval-command='call ")
    if first < 0 or platform.machine() not in ("x86_64", "AMD64"):
        return command
    return f"{command[:first]}{_KEEP} {command[first:]} {_PUT_BACK}"


class GdbCannotCall(Exception):
    """gdb could not call a function in the process (its registers cannot be written back)."""


class Shell:
    """The ``subprocess`` module as debugpy's injector sees it: its gdb command line keeps the system call
    (:func:`keeping_the_system_call`) and says when gdb cannot call."""

    def __getattr__(self, name: str) -> object:
        return getattr(subprocess, name)

    def check_call(self, command: str, **kwargs: object) -> int:
        command = keeping_the_system_call(command)
        proc = subprocess.run(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, **kwargs)  # type: ignore[call-overload]
        said = proc.stdout.decode("utf-8", "replace")
        sys.stdout.write(said)
        sys.stdout.flush()
        if GDB_CANNOT_CALL in said:
            raise GdbCannotCall(said)
        if proc.returncode:
            raise subprocess.CalledProcessError(proc.returncode, command)
        return 0


class LldbFailed(Exception):
    """lldb could not have the process run the injected line (what it said is the message)."""


LLDB_RUN_S = 3 * CALL_TIMEOUT_S
"""The most lldb may take in all (attaching, two calls, detaching) before it is stopped."""


def lldb_argv(lldb: str, pid: int, library: str, code: str) -> list[str]:
    """lldb's command line: attach, load debugpy's library and run ``code`` in the process (lldb_call.py), detach.
    No shell: lldb's own commands quote with double quotes, which neither the paths nor the code may hold."""
    script = os.path.abspath(lldb_call.__file__)
    if any(c in word for word in (library, code, script) for c in '"\\\n'):
        raise LldbFailed(f"a path holds a quote or a backslash: {library!r}, {script!r}")
    return [lldb, "--no-lldbinit", "-o", f"process attach --pid {pid}", "-o", f'command script import "{script}"',
            "-o", f'mldebug_call "{library}" "{code}"', "-o", "process detach", "-o", "script import os; os._exit(0)"]


def inject_with_lldb(lldb: str, pid: int, library: str, code: str) -> None:
    """Have the process run ``code`` through lldb; LldbFailed, with lldb's words, when it did not."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONIOENCODING")}  # for lldb's Python
    proc = subprocess.Popen(lldb_argv(lldb, pid, library, code), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            stdin=subprocess.DEVNULL, env=env)
    timer = threading.Timer(LLDB_RUN_S, proc.kill)
    timer.start()
    lines = []
    assert proc.stdout is not None
    for raw in proc.stdout:  # passed on as it comes: the adapter's log shows how far lldb got
        lines.append(raw.decode("utf-8", "replace"))
        sys.stdout.write(lines[-1])
        sys.stdout.flush()
    proc.wait()
    timer.cancel()
    said = "".join(lines)
    late = f"lldb did not finish within {LLDB_RUN_S} s" if proc.returncode == -9 else None
    marks = [ln.split(lldb_call.MARK, 1)[1].strip() for ln in said.splitlines() if ln.startswith(lldb_call.MARK)]
    if marks[-1:] != ["call ok"]:
        last = next((ln.strip() for ln in reversed(lines) if ln.strip()), "lldb said nothing")
        raise LldbFailed(late or (marks[-1] if marks else last))


def main() -> None:
    from debugpy.server import cli  # loads debugpy's own pydevd, as debugpy's __main__ does

    pydevd = sys.modules["pydevd"]
    attach_dir = os.path.join(os.path.dirname(str(pydevd.__file__)), "pydevd_attach_to_process")
    sys.path.append(attach_dir)
    import add_code_to_python_process as inject  # cli.attach_to_pid imports this same module object

    from ml_debug.core.extras import find_lldb

    run, shell = inject.run_python_code, Shell()
    prefer_lldb = os.environ.get("PYDEVD_ATTACH_PREFER_LLDB", "").strip().lower() in ("1", "true", "yes")

    def run_quiet(pid: int, python_code: str, *args: object, **kwargs: object) -> object:
        lldb = find_lldb() if sys.platform.startswith("linux") else None

        def with_lldb(lldb: str) -> None:  # debugpy starts in a thread of its own, once lldb's call has returned
            try:
                inject_with_lldb(lldb, pid, inject.get_target_filename(), quiet(python_code, attach_dir, in_thread=True))
            except LldbFailed as e:
                print(f"{FAILED} {lldb} could not call into the process: {e}", flush=True)
                raise SystemExit(3) from None

        if prefer_lldb and lldb:  # debugpy's own choice, with Debian's lldb-NN found too
            with_lldb(lldb)
            return None
        try:
            return run(pid, quiet(python_code, attach_dir), *args, **kwargs)
        except GdbCannotCall:
            if not lldb:
                print(f"{FAILED} gdb cannot call a function in the process on this CPU (it cannot write back the "
                      "AMX registers' state: Debian 12's gdb 13 cannot), and there is no lldb to do it instead: install "
                      "lldb (Debian 12: apt install lldb-19; Ubuntu 22.04: apt install lldb-15)", flush=True)
                raise SystemExit(3) from None
            print(f"gdb cannot call into the process on this CPU: injecting with {lldb}", flush=True)
            with_lldb(lldb)
            return None

    inject.run_python_code = run_quiet
    inject.subprocess = shell
    cli.main()


if __name__ == "__main__":
    sys.path.pop(0)  # this folder: nothing here shadows a module of the process that runs it
    main()
