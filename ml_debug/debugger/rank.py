"""One rank under debugpy: ``python -m ml_debug.debugger.rank --rank R --port P [--json] [-m] -- SCRIPT ARGS``.

`mldebug launch --debug-rank R` and `mldebug train --debug-rank R` start every rank through this module. Rank R (its ``RANK``) opens
debugpy on 127.0.0.1:P and, unless ``--no-wait``, waits for a client before running the script;
every rank, R included, gets its process-group timeout raised to ``--pg-timeout`` seconds (at least),
so the ranks that reach a collective first keep waiting while a person steps through rank R.
With ``--json`` rank R also writes one JSON line (schema ``mldebug.debug_rank``: node, port, the VS Code
configuration, the tunnel command) to stderr: stdout stays the job's own (train's --json document).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import runpy
import socket
import sys
from typing import Any


def vscode_config(rank: int, port: int) -> dict[str, Any]:
    """The VS Code "attach" configuration for rank R's debugpy (launch.json's configurations[])."""
    return {"name": f"mldebug rank {rank}", "type": "debugpy", "request": "attach",
            "connect": {"host": "127.0.0.1", "port": port}, "justMyCode": False}


def _raise_pg_timeout(seconds: float) -> None:
    """init_process_group's timeout, raised to at least `seconds` (the script's own larger one is kept)."""
    try:
        import torch.distributed as dist
    except ImportError:
        return
    original = dist.init_process_group
    floor = datetime.timedelta(seconds=seconds)

    def init_process_group(*args: Any, **kwargs: Any) -> Any:
        given = kwargs.get("timeout")
        kwargs["timeout"] = max(given, floor) if isinstance(given, datetime.timedelta) else floor
        return original(*args, **kwargs)

    dist.init_process_group = init_process_group


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m ml_debug.debugger.rank")
    p.add_argument("--rank", type=int, required=True)
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--no-wait", action="store_true")
    p.add_argument("--pg-timeout", type=float, default=7200.0)
    p.add_argument("--json", action="store_true")
    p.add_argument("-m", dest="module", action="store_true")
    p.add_argument("target", nargs=argparse.REMAINDER)
    a = p.parse_args(argv)
    target = a.target[1:] if a.target[:1] == ["--"] else a.target
    if not target:
        p.error("name the script (or -m module) after --")
    _raise_pg_timeout(a.pg_timeout)
    rank = int(os.environ.get("RANK", os.environ.get("SLURM_PROCID", "-1")))
    if rank == a.rank:
        import debugpy

        try:
            debugpy.listen(("127.0.0.1", a.port))
        except (OSError, RuntimeError) as e:
            sys.exit(f"mldebug: error: rank {rank}: debugpy cannot listen on 127.0.0.1:{a.port} ({e}); "
                     "pick another port with --debug-port")
        host = socket.gethostname()
        print(f"mldebug: rank {rank} on {host}: debugpy listens on 127.0.0.1:{a.port}"
              + ("" if a.no_wait else ", waiting for a client"), file=sys.stderr, flush=True)
        print(f"mldebug: VS Code attach configuration: {json.dumps(vscode_config(rank, a.port))}",
              file=sys.stderr, flush=True)
        tunnel = f"ssh -N -L {a.port}:127.0.0.1:{a.port} {host}"
        print(f"mldebug: from your machine: {tunnel}", file=sys.stderr, flush=True)
        if a.json:
            doc = {"schema": "mldebug.debug_rank", "schema_version": 1, "rank": rank, "node": host,
                   "host": "127.0.0.1", "port": a.port, "pid": os.getpid(), "waiting": not a.no_wait,
                   "vscode": vscode_config(rank, a.port), "tunnel": tunnel}
            print(json.dumps(doc), file=sys.stderr, flush=True)
        if not a.no_wait:
            debugpy.wait_for_client()
    sys.argv = list(target)  # as the script would see them without this wrapper
    if a.module:
        runpy.run_module(target[0], run_name="__main__", alter_sys=True)
    else:
        runpy.run_path(target[0], run_name="__main__")


if __name__ == "__main__":
    main()
