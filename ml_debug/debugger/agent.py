"""mldebug's agent on a rank's node for the prompt run elsewhere: debugpy's adapter behind stdin and stdout.

``mldebug attach --pid P --dap-agent`` (started by ml_debug/debugger/tunnel.py over ssh, or in a
``srun --overlap`` step) checks the process as a local attach does, starts debugpy's adapter as its
child (ml_debug/debugger/session.py: a socket pair, its own process group, ended with us), and
relays bytes between its own stdin/stdout and the adapter: the DAP conversation travels inside the
ssh session or the step's pipes, and no port is opened for it anywhere.

The stream carries one line before the DAP bytes and one after them::

    {"mldebug_dap_agent": 1, "ok": true, "host": "node2", "pid": 4242}        (or ok false: why)
    ... DAP ...
    \\n{"mldebug_dap_agent_end": 1, "alive": true}

The end line comes when stdin ends (the client detached, or died: sshd and srun close a dead
client's stdin): the adapter is ended first, then the agent says whether the process still runs.
"""

from __future__ import annotations

import contextlib
import json
import os
import selectors
import socket
from typing import Any

from ml_debug import __version__
from ml_debug.core.errors import ExitCode, MLDebugError
from ml_debug.debugger.options import AttachOptions

START = "mldebug_dap_agent"
END = "mldebug_dap_agent_end"


def _write(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def _line(doc: dict[str, Any]) -> bytes:
    return (json.dumps(doc, separators=(",", ":")) + "\n").encode()


def serve(opts: AttachOptions) -> int:
    """Check, start the adapter, relay until stdin ends, end the adapter; the exit code."""
    from ml_debug.core.lifecycle import alive
    from ml_debug.debugger.run import check_can_attach, find_pid
    from ml_debug.debugger.session import end_adapter, start_adapter

    host = socket.gethostname()
    try:
        pid, rank, _ = find_pid(opts)
        check_can_attach(pid)
    except MLDebugError as e:
        _write(1, _line({START: 1, "ok": False, "host": host, "version": __version__, "exit_code": int(e.exit_code),
                         "error": e.message, "hint": e.hint}))
        return int(e.exit_code)
    wire, adapter = start_adapter()
    try:
        _write(1, _line({START: 1, "ok": True, "host": host, "version": __version__, "pid": pid, "rank": rank}))
        _relay(wire)
    finally:
        with contextlib.suppress(OSError):
            wire.close()
        end_adapter(adapter)  # its debug server in the process sees the connection end: the process resumes
    with contextlib.suppress(OSError):  # the client may be gone: nobody to tell
        _write(1, b"\n" + _line({END: 1, "alive": alive(pid)}))
    return int(ExitCode.OK)


def _relay(wire: socket.socket) -> None:
    """stdin -> adapter, adapter -> stdout, until either side ends."""
    sel = selectors.DefaultSelector()
    sel.register(0, selectors.EVENT_READ)
    sel.register(wire, selectors.EVENT_READ)
    try:
        while True:
            for key, _ in sel.select():
                if key.fileobj == 0:
                    data = os.read(0, 65536)
                    if not data:
                        return  # the client detached or died
                    wire.sendall(data)
                else:
                    data = wire.recv(65536)
                    if not data:
                        return  # the adapter ended
                    _write(1, data)
    except OSError:  # a pipe or the socket broke: the same as an end
        return
    finally:
        sel.close()
