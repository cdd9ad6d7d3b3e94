"""The one place where a test (or a `mldebug drill`) may reach into a running mldebug: never for real jobs.

``MLDEBUG_TEST_HOOKS`` names one or more importable modules (comma-separated, e.g.
``tests.fakes.faults``). When it is unset, nothing is imported and every hook call returns None
after one environment lookup. When it is set, the modules are imported on the first hook call and
each hook point below calls the module function of the same name, if the module defines one, with
the context as keyword arguments. The product calls these points where a fault would act:

``gpu_test_stage_start(rank, device, stage)``
    a gpu-test rank is about to run ``stage`` (a hook may kill or stall this process);
``gpu_test_contribution(rank, device, value) -> float | None``
    the value this rank adds to gpu-test's all_reduce; a float replaces it;
``bench_timed_region(rank, collective, size, elapsed_s)``
    inside allreduce-bench's timed region, after the batch's calls; time spent here is measured.
    ``elapsed_s()`` returns the seconds spent in the region so far (it waits for the GPU first);
``bench_verify_result(rank, collective, result, expected)``
    allreduce-bench's received buffer before it is checked; ``expected(start, stop)`` returns the
    right values of ``result[start:stop]``;
``bench_pair_exchange(rank, pair, elapsed_s, remeasure)``
    inside a ``--pairwise`` timed exchange between units ``pair = (a, b)``, like
    ``bench_timed_region``; ``remeasure`` is 0 in the first measurement (every pass) and k in the
    k-th round of re-measuring the links that fell below the floor;
``logs_verdict(verdict) -> Verdict | None``
    `mldebug logs`' verdict as its rules found it; a verdict replaces it (a test switches the rule off
    to see that `mldebug drill` reports a crash drill as missed);
``logs_reader_share(share)``
    an `mldebug logs` reader process is about to read share number ``share`` (a hook may end the reader,
    to see that its shares are read again and nothing is lost);
``nvml_backend() -> (backend, source) | None``
    a pynvml look-alike for the NVML gateway, and the source it reports (``fake:<source>``).

``train_save_switch_done(rank)``
    an `mldebug train` rank has saved for the save switch; rank 0 deletes the file next (a hook may stall it,
    to see that no rank reads the switch again before it is gone).

``child_started(pid, argv)``
    a child that mldebug stops when interrupted has just started, SIGINT and SIGTERM held
    (core/lifecycle.py ``held_signals``): a hook may signal this process, as a Ctrl-C in that instant would.

``describe(command) -> str | None`` in a module says what it changes in ``command``
(``gpu-test``, ``allreduce-bench``); runs put that in their notes, so a result that a hook shaped
can never pass for a real one.
"""

from __future__ import annotations

import importlib
import os
from types import ModuleType
from typing import Any

from ml_debug.core.errors import UsageError

ENV = "MLDEBUG_TEST_HOOKS"

GPU_TEST_STAGE_START = "gpu_test_stage_start"
GPU_TEST_CONTRIBUTION = "gpu_test_contribution"
BENCH_TIMED_REGION = "bench_timed_region"
BENCH_VERIFY_RESULT = "bench_verify_result"
BENCH_PAIR_EXCHANGE = "bench_pair_exchange"
LOGS_VERDICT = "logs_verdict"
LOGS_READER_SHARE = "logs_reader_share"
NVML_BACKEND = "nvml_backend"
CHILD_STARTED = "child_started"
TRAIN_SAVE_SWITCH_DONE = "train_save_switch_done"
POINTS = (GPU_TEST_STAGE_START, GPU_TEST_CONTRIBUTION, BENCH_TIMED_REGION, BENCH_VERIFY_RESULT,
          BENCH_PAIR_EXCHANGE, LOGS_VERDICT, LOGS_READER_SHARE, NVML_BACKEND, CHILD_STARTED, TRAIN_SAVE_SWITCH_DONE)

_loaded: tuple[str, tuple[ModuleType, ...]] | None = None


def active() -> bool:
    """True when a test asked for hooks (``MLDEBUG_TEST_HOOKS`` is set and not empty)."""
    return bool(os.environ.get(ENV, "").strip())


def modules() -> tuple[ModuleType, ...]:
    """The hook modules ``MLDEBUG_TEST_HOOKS`` names, imported once per value; () when unset."""
    global _loaded
    spec = os.environ.get(ENV, "").strip()
    if not spec:
        return ()
    if _loaded is not None and _loaded[0] == spec:
        return _loaded[1]
    found: list[ModuleType] = []
    for name in (n.strip() for n in spec.split(",")):
        if not name:
            continue
        try:
            found.append(importlib.import_module(name))
        except ImportError as e:
            raise UsageError(f"{ENV}={spec}: cannot import {name!r} ({e})",
                             f"{ENV} is for mldebug's own tests: unset it, or put the repository root on "
                             "PYTHONPATH") from None
    _loaded = (spec, tuple(found))
    return _loaded[1]


def call(point: str, /, **context: Any) -> Any:
    """Run hook ``point`` in every hook module that defines it; the last result that is not None."""
    if not os.environ.get(ENV):
        return None
    result = None
    for module in modules():
        fn = getattr(module, point, None)
        if fn is not None:
            value = fn(**context)
            if value is not None:
                result = value
    return result


def describe(command: str) -> str | None:
    """What the active hooks change in ``command`` ("; "-joined), or None when they change nothing."""
    if not os.environ.get(ENV):
        return None
    parts = []
    for module in modules():
        fn = getattr(module, "describe", None)
        text = fn(command) if fn is not None else None
        if text:
            parts.append(str(text))
    return "; ".join(parts) or None


def note(command: str) -> str | None:
    """The line a run adds to its notes when hooks change it, naming the hooks and what they do."""
    what = describe(command)
    return None if what is None else f"TEST-ONLY hooks active ({ENV}={os.environ.get(ENV, '')}): {what}"
