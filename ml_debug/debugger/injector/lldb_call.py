"""Run inside lldb (``command script import``): ``mldebug_call DLL CODE`` loads debugpy's attach library into the
process lldb is attached to and has it run one line of Python there (its ``DoAttach``), then says how each step
went on a line of its own that starts with ``mldebug-lldb:`` (the injector reads them: lldb itself exits 0 either
way).

debugpy's own lldb script gives each call 10 s and prints what went wrong among lldb's other output; on a loaded node
the call can take longer, and the injection then fails without a word the injector could act on. Here each call
gets CALL_TIMEOUT_S, runs on the stopped thread only (the others stay stopped), and a library that would not load
is said (dlopen returns NULL).
"""

from __future__ import annotations

import shlex
from typing import Any

CALL_TIMEOUT_S = 60
MARK = "mldebug-lldb:"


def _evaluate(target: Any, expression: str) -> tuple[Any, str | None]:
    import lldb  # lldb's own module, there inside lldb (imported here: the injector imports MARK from this file)

    options = lldb.SBExpressionOptions()
    options.SetTryAllThreads(False)
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
