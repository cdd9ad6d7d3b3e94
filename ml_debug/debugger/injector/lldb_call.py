"""Run inside lldb (``command script import``): ``mldebug_call DLL CODE`` loads debugpy's attach library into the
process lldb is attached to and has it run one line of Python there (its ``DoAttach``), then says how each step
went on a line of its own that starts with ``mldebug-lldb:`` (the injector reads them: lldb itself exits 0 either
way).

debugpy's own lldb script runs each call on the stopped thread alone, with the process's other threads held, for at
most 10 s, and prints what went wrong among lldb's other output. On a loaded node its ``DoAttach`` call, which starts
a thread in the process, then hung now and then (5 of 12 attaches with three `import torch` loops and two busy loops
beside them, measured here): held to 10 s it failed without a word the injector could act on, and an lldb stopped
during the call took the process with it. Here a call runs on the stopped thread alone for ONE_THREAD_S, then with
the process's other threads running too (0 hangs in 28 attaches under the same load), for CALL_TIMEOUT_S in all;
a library that would not load is said (dlopen returns NULL).
"""

from __future__ import annotations

import shlex
from typing import Any

CALL_TIMEOUT_S = 60
ONE_THREAD_S = 2
MARK = "mldebug-lldb:"


def _evaluate(target: Any, expression: str) -> tuple[Any, str | None]:
    import lldb  # lldb's own module, there inside lldb (imported here: the injector imports MARK from this file)

    options = lldb.SBExpressionOptions()
    options.SetTryAllThreads(True)  # the stopped thread alone first; then the others too (see the module's note)
    options.SetOneThreadTimeoutInMicroSeconds(ONE_THREAD_S * 1_000_000)
    options.SetTimeoutInMicroSeconds(CALL_TIMEOUT_S * 1_000_000)
    value = target.EvaluateExpression(expression, options)
    error = value.GetError()
    return value, None if error.Success() else (error.GetCString() or "failed").strip()


def mldebug_call(debugger: Any, command: str, result: Any, internal_dict: dict[str, Any]) -> None:
    dll, code = shlex.split(command)
    target = debugger.GetSelectedTarget()
    handle, why = _evaluate(target, f'(void*)dlopen("{dll}", 2)')  # RTLD_NOW
    if why is None and handle.GetValueAsUnsigned() == 0:
        why = "dlopen returned NULL"
    print(f"{MARK} load {why or 'ok'}", flush=True)
    if why is None:
        _, why = _evaluate(target, f'(int)DoAttach(0, "{code}", 0)')
        print(f"{MARK} call {why or 'ok'}", flush=True)


def __lldb_init_module(debugger: Any, internal_dict: dict[str, Any]) -> None:
    debugger.HandleCommand(f"command script add -f {__name__}.mldebug_call mldebug_call")
