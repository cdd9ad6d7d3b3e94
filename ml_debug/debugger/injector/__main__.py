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
process's environment as it was. Everything else is debugpy's own injector, unchanged. Standard library
and debugpy only: this runs as a script, outside the ml_debug package.
"""

from __future__ import annotations

import os
import sys

# Runs inside the job's process; `code` is debugpy's own line, `attach_dir` the folder of its
# attach_script. debugpy's line may not contain quotes: the whole call travels as bytes (below).
_WRAPPER = '''
def _mldebug_quiet_attach(code, attach_dir):
    import os, sys
    before = os.environ.get("PYDEVD_DISABLE_FILE_VALIDATION")
    os.environ["PYDEVD_DISABLE_FILE_VALIDATION"] = "1"
    try:
        if "threading" not in sys.modules:
            sys.path.insert(0, attach_dir)
            try:
                import attach_script
            finally:
                sys.path.remove(attach_dir)
            quiet = lambda *_a, **_k: None
            attach_script.fix_main_thread_id(on_warn=quiet, on_exception=quiet, on_critical=quiet)
        exec(code, {"__name__": "_mldebug_attach"})
    finally:
        if before is None:
            os.environ.pop("PYDEVD_DISABLE_FILE_VALIDATION", None)
        else:
            os.environ["PYDEVD_DISABLE_FILE_VALIDATION"] = before
_mldebug_quiet_attach(%r, %r)
'''


def quiet(code: str, attach_dir: str) -> str:
    """debugpy's injected line, wrapped (one line, no quotes, as gdb's DoAttach call needs)."""
    return f"exec(bytes({list((_WRAPPER % (code, attach_dir)).encode())}).decode())"


def main() -> None:
    from debugpy.server import cli  # loads debugpy's own pydevd, as debugpy's __main__ does

    pydevd = sys.modules["pydevd"]
    attach_dir = os.path.join(os.path.dirname(str(pydevd.__file__)), "pydevd_attach_to_process")
    sys.path.append(attach_dir)
    import add_code_to_python_process  # cli.attach_to_pid imports this same module object

    run = add_code_to_python_process.run_python_code

    def run_quiet(pid: int, python_code: str, *args: object, **kwargs: object) -> object:
        return run(pid, quiet(python_code, attach_dir), *args, **kwargs)

    add_code_to_python_process.run_python_code = run_quiet
    cli.main()


if __name__ == "__main__":
    sys.path.pop(0)  # this folder: nothing here shadows a module of the process that runs it
    main()
