"""A stand-in rank of another user's job, for tests/cli/test_security.py: run as `nobody` with the system
Python and the standard library only (the project's venv need not be readable by that user).

    python3 security_job.py ROLE READY_FILE [GOLDEN_DUMP] [-- PLANT...]

It first plants what the attack needs, as its own user (PLANT is `link:PATH:TARGET`, `fifo:PATH`
or `dir:PATH`), then writes READY_FILE (its pid, as JSON), then answers dump requests the way its
ROLE says until it is killed:

- ``fr``: MLDEBUG_FR_DIR/trigger-RANK -> writes fr-RANK.json (GOLDEN_DUMP's bytes), as
  ml_debug.flight_recorder does;
- ``fr-huge``: the same trigger -> fr-RANK.json becomes a 300 MiB sparse file;
- ``nccl``: reads TORCH_NCCL_DEBUG_INFO_PIPE_FILE + RANK + ".pipe" (a FIFO it made), then writes a
  pickle of GOLDEN_DUMP to TORCH_NCCL_DEBUG_INFO_TEMP_FILE + RANK, as ProcessGroupNCCL does;
- ``idle``: nothing.
"""

from __future__ import annotations

import json
import os
import pickle
import sys
import threading
import time

HUGE = 300 * 1024 * 1024


def plant(specs: list[str]) -> None:
    for spec in specs:
        kind, _, rest = spec.partition(":")
        if kind == "link":
            path, _, target = rest.partition(":")
            os.symlink(target, path)
        elif kind == "fifo":
            os.mkfifo(rest, 0o600)
        elif kind == "dir":
            os.makedirs(rest, exist_ok=True)


def write_atomic(path: str, data: bytes) -> None:
    tmp = f"{path}.{os.getpid()}.tmp"
    with open(tmp, "wb") as f:
        f.write(data)
    os.replace(tmp, path)


def nccl_reader(rank: int, golden: bytes) -> None:
    pipe = f"{os.environ['TORCH_NCCL_DEBUG_INFO_PIPE_FILE']}{rank}.pipe"
    if not os.path.exists(pipe):
        os.mkfifo(pipe, 0o600)
    while True:
        with open(pipe, "rb") as f:  # blocks until a writer opens it
            f.read(1)
        dump = pickle.dumps(json.loads(golden))
        try:
            write_atomic(f"{os.environ['TORCH_NCCL_DEBUG_INFO_TEMP_FILE']}{rank}", dump)
        except OSError:
            pass  # a dump path it may not write (as NCCL, it goes on serving the pipe)


def job_main_loop(role: str, rank: int, golden: bytes) -> None:
    """Where py-spy finds this rank: polling for its trigger."""
    fr_dir = os.environ.get("MLDEBUG_FR_DIR", "")
    trigger = os.path.join(fr_dir, f"trigger-{rank}")
    out = os.path.join(fr_dir, f"fr-{rank}.json")
    while True:
        if role in ("fr", "fr-huge") and os.path.lexists(trigger) and not os.path.islink(trigger):
            os.unlink(trigger)
            if role == "fr":
                write_atomic(out, golden)
            else:
                with open(out + ".tmp", "wb") as f:
                    f.truncate(HUGE)
                os.replace(out + ".tmp", out)
        time.sleep(0.05)


def main() -> None:
    role, ready = sys.argv[1], sys.argv[2]
    rest = sys.argv[3:]
    specs = rest[rest.index("--") + 1:] if "--" in rest else []
    args = rest[:rest.index("--")] if "--" in rest else rest
    golden = b""
    if args:
        with open(args[0], "rb") as f:
            golden = f.read()
    rank = int(os.environ["RANK"])
    plant(specs)
    if role == "nccl":
        threading.Thread(target=nccl_reader, args=(rank, golden), daemon=True).start()
        pipe = f"{os.environ['TORCH_NCCL_DEBUG_INFO_PIPE_FILE']}{rank}.pipe"
        while not os.path.exists(pipe):
            time.sleep(0.01)
    write_atomic(ready, json.dumps({"pid": os.getpid(), "rank": rank}).encode())
    job_main_loop(role, rank, golden)


if __name__ == "__main__":
    main()
