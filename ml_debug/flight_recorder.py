"""Opt-in Flight Recorder dumps on request, for any backend (gloo on CPU included).

In the training script, after (or before) ``init_process_group``::

    import ml_debug.flight_recorder
    ml_debug.flight_recorder.enable()

and launch the job with ``TORCH_FR_BUFFER_SIZE=2000`` (a positive number; never an empty value: that
makes init_process_group hang or abort) and ``MLDEBUG_FR_DIR=/some/shared/dir`` in its environment.
``mldebug dump-stacks`` reads MLDEBUG_FR_DIR from each rank's /proc/PID/environ (the environment the
process was started with, so it must be set at launch, not by the script), touches
``<dir>/trigger-<rank>``, and reads back ``<dir>/fr-<rank>.json`` written by the daemon thread started
here. That thread keeps running while the main thread is blocked inside a C++ collective (the
collective releases the GIL). Standard library only; torch is imported when a dump is taken.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import threading
import time

from ml_debug.core.frfiles import DIR_VAR, dump_name, trigger_name
from ml_debug.core.rankvars import rank_from_env

ENV_DIR = DIR_VAR
POLL_S = 0.2

_started: threading.Thread | None = None


def _rank() -> int:
    found = rank_from_env()
    return 0 if found is None else found[0]


def dump_json() -> bytes:
    """This process's Flight Recorder buffer as JSON (``_dump_fr_trace_json(True, False)``: bytes)."""
    import torch._C._distributed_c10d as c10d

    # a private binding that torch's type stubs do not declare
    data = vars(c10d)["_dump_fr_trace_json"](True, False)
    return data.encode() if isinstance(data, str) else bytes(data)


def write_dump(dump_dir: str, rank: int) -> str:
    """Write ``<dump_dir>/fr-<rank>.json`` atomically (a reader never sees half a file); its path.

    The directory may be shared (``/tmp``): the data goes to a new file with an unpredictable name
    (``O_EXCL | O_NOFOLLOW``, mode 0600: only this user and root read it), renamed over the final
    name, so nothing another user planted there is written through.
    """
    path = os.path.join(dump_dir, dump_name(rank))
    try:
        text = dump_json()
    except Exception as e:  # noqa: BLE001 - a diagnostics helper must never kill the job
        text = json.dumps({"error": f"{type(e).__name__}: {e}"}).encode()
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    while True:
        tmp = f"{path}.{secrets.token_hex(8)}.tmp"
        try:
            fd = os.open(tmp, flags, 0o600)
            break
        except FileExistsError:
            continue
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(text)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    return path


def _watch(dump_dir: str, rank: int) -> None:
    trigger = os.path.join(dump_dir, trigger_name(rank))
    while True:
        try:
            if os.path.exists(trigger):
                try:
                    os.unlink(trigger)
                except OSError:
                    pass
                write_dump(dump_dir, rank)
        except Exception:  # noqa: BLE001, S110 - keep watching; the job matters more than the dump
            pass
        time.sleep(POLL_S)


def enable(dump_dir: str | None = None) -> str | None:
    """Start the dump-on-trigger thread (once); the directory it watches, or None when there is none.

    ``dump_dir`` defaults to $MLDEBUG_FR_DIR. It is put into os.environ so that processes this one
    starts inherit it; dump-stacks only sees it when it was in the environment at launch.
    """
    global _started
    dump_dir = dump_dir or os.environ.get(ENV_DIR)
    if not dump_dir:
        return None
    os.makedirs(dump_dir, exist_ok=True)
    os.environ[ENV_DIR] = dump_dir
    if _started is None or not _started.is_alive():
        _started = threading.Thread(target=_watch, args=(dump_dir, _rank()), name="mldebug-flight-recorder",
                                    daemon=True)
        _started.start()
    return dump_dir
