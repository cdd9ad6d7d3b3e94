"""PyTorch Flight Recorder evidence for dump-stacks: trigger dumps, read them, name the ranks behind.

Two ways a rank can dump its Flight Recorder buffer on request:

- ``ml_debug.flight_recorder.enable()`` in the job (any backend, gloo included) with MLDEBUG_FR_DIR in
  the launch environment: we touch ``<dir>/trigger-<rank>`` and read ``<dir>/fr-<rank>.json``;
- NCCL's own pipe: with TORCH_NCCL_DEBUG_INFO_PIPE_FILE=P each rank reads ``P<rank>.pipe``; a write
  there makes it dump to TORCH_NCCL_DEBUG_INFO_TEMP_FILE (default ``/tmp/nccl_trace_rank_``)<rank>,
  a pickle of plain data that we read with a restricted unpickler (no global but plain builtins).

Every dump is summarised per rank (last completed / last enqueued collective of each process
group) and the ranks are compared. Absent evidence is never an error: the section is ``None``.
"""

from __future__ import annotations

import errno
import io
import json
import os
import pickle
import time
from collections import Counter
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

FR_DIR_VAR = "MLDEBUG_FR_DIR"
NCCL_PIPE_VAR = "TORCH_NCCL_DEBUG_INFO_PIPE_FILE"
NCCL_FILE_VARS = ("TORCH_FR_DUMP_TEMP_FILE", "TORCH_NCCL_DEBUG_INFO_TEMP_FILE")
NCCL_FILE_DEFAULT = "/tmp/nccl_trace_rank_"
MAX_DUMP_BYTES = 256 * 1024 * 1024


# ---- reading -----------------------------------------------------------------------------------

class _PlainUnpickler(pickle.Unpickler):
    """Unpickles plain data only: any global but a few builtin containers/scalars is refused."""

    SAFE = frozenset({"dict", "list", "tuple", "str", "int", "float", "bool", "bytes", "set", "frozenset",
                      "complex"})

    def find_class(self, module: str, name: str) -> Any:
        if module in ("builtins", "__builtin__") and name in self.SAFE:
            import builtins

            return getattr(builtins, name)
        raise pickle.UnpicklingError(f"refused global {module}.{name} in a Flight Recorder dump")


def load_plain_pickle(data: bytes) -> Any:
    """`pickle.loads` for untrusted files that hold plain data (dicts, lists, numbers, strings)."""
    return _PlainUnpickler(io.BytesIO(data)).load()


def parse_dump(data: bytes) -> dict[str, Any]:
    """A Flight Recorder dump (JSON from ``_dump_fr_trace_json``, or NCCL's pickle) as a dict."""
    head = data.lstrip()[:1]
    obj = json.loads(data) if head in (b"{", b"[") else load_plain_pickle(data)
    if not isinstance(obj, dict):
        raise ValueError(f"not a Flight Recorder dump (a {type(obj).__name__})")
    if "error" in obj and "entries" not in obj:
        raise ValueError(f"the rank could not dump: {obj['error']}")
    return obj


def _int(v: Any) -> int | None:
    try:
        return int(v)
    except (TypeError, ValueError):
        return None


def _text(v: Any) -> str:
    return v.decode(errors="replace") if isinstance(v, bytes) else str(v)


def _collective(entries: list[dict[str, Any]], pg_id: str, seq: int | None) -> dict[str, Any] | None:
    if seq is None or seq < 0:
        return None
    for e in reversed(entries):
        if str(e.get("pg_id")) == pg_id and _int(e.get("collective_seq_id")) == seq and not e.get("is_p2p"):
            pg = e.get("process_group") or ["", ""]
            return {"seq": seq, "op": _text(e.get("profiling_name", "?")), "pg_name": _text(pg[0]),
                    "pg_desc": _text(pg[1]) if len(pg) > 1 else "", "input_sizes": e.get("input_sizes"),
                    "output_sizes": e.get("output_sizes"), "state": _text(e.get("state", "?")),
                    "retired": e.get("retired")}
    return {"seq": seq, "op": None}  # older than the ring buffer holds


def summarise_dump(dump: dict[str, Any]) -> list[dict[str, Any]]:
    """Per process group: the last completed / started / enqueued collective (seq id, op, sizes, state)."""
    raw = dump.get("entries") or []
    entries = [e for e in raw if isinstance(e, dict)]
    status = dump.get("pg_status") or {}
    out = []
    for pg_id, st in sorted(status.items(), key=lambda kv: str(kv[0])):
        if not isinstance(st, dict):
            continue
        pid = _text(pg_id)
        done = _int(st.get("last_completed_collective"))
        queued = _int(st.get("last_enqueued_collective"))
        started = _int(st.get("last_started_collective"))
        out.append({"pg_id": pid, "last_completed_seq": done, "last_enqueued_seq": queued,
                    "last_started_seq": started, "last_completed": _collective(entries, pid, done),
                    "last_enqueued": _collective(entries, pid, queued)})
    return out


# ---- comparing ---------------------------------------------------------------------------------

def _reference(values: list[int]) -> int:
    """What the ranks agree on: the most common value (ties: the highest)."""
    counts = Counter(values)
    return max(counts, key=lambda v: (counts[v], v))


def _op(ranks: list[dict[str, Any]], pg_id: str, key: str, seq: int) -> str | None:
    for r in ranks:
        for pg in r.get("process_groups", []):
            c = pg.get(key)
            if pg["pg_id"] == pg_id and c and c.get("seq") == seq and c.get("op"):
                return c["op"]
    return None


def behind_ranks(ranks: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Ranks whose last enqueued collective (else last completed) is below what most ranks reached."""
    ok = [r for r in ranks if r.get("ok")]
    pg_ids = sorted({pg["pg_id"] for r in ok for pg in r["process_groups"]})
    behind: list[dict[str, Any]] = []
    for pg_id in pg_ids:
        for field, key, kind in (("last_enqueued_seq", "last_enqueued", "enqueued"),
                                 ("last_completed_seq", "last_completed", "completed")):
            have = [(r, pg[field]) for r in ok for pg in r["process_groups"]
                    if pg["pg_id"] == pg_id and pg.get(field) is not None]
            if len(have) < 2:
                continue
            ref = _reference([v for _, v in have])
            late = [(r, v) for r, v in have if v < ref]
            for r, v in late:
                behind.append({"rank": r.get("rank"), "host": r.get("host"), "pid": r.get("pid"), "pg_id": pg_id,
                               "kind": kind, "seq": v, "others_seq": ref, "others": len(have) - len(late),
                               "others_op": _op(ok, pg_id, key, ref)})
            if late:
                break  # behind in what it enqueued explains what it did not complete
    return behind


def _who(b: dict[str, Any]) -> str:
    return f"rank {b['rank']}" if b.get("rank") is not None else f"pid {b['pid']}"


def describe_behind(b: dict[str, Any]) -> str:
    """`rank 1 (pg 0) last enqueued #3 while 1 other rank enqueued #4 (gloo:all_reduce)`."""
    op = f" ({b['others_op']})" if b.get("others_op") else ""
    n = b["others"]
    return (f"{_who(b)} (pg {b['pg_id']}) last {b['kind']} #{b['seq']} while {n} other rank{'s' if n != 1 else ''} "
            f"{b['kind']} #{b['others_seq']}{op}")


def section(ranks: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The report's `flight_recorder` section from per-rank records (None when no rank has any)."""
    if not ranks:
        return None
    ranks = sorted(ranks, key=lambda r: (r.get("rank") is None, r.get("rank") or 0, r.get("host") or "",
                                         r.get("pid") or 0))
    behind = behind_ranks(ranks)
    got = sum(1 for r in ranks if r.get("ok"))
    if behind:
        evidence = "flight recorder: " + "; ".join(describe_behind(b) for b in behind)
    elif got:
        evidence = f"flight recorder: {got} rank(s) dumped, none behind the others"
    else:
        evidence = "flight recorder: no rank could be dumped"
    return {"ranks": ranks, "behind": behind, "evidence": evidence}


# ---- triggering --------------------------------------------------------------------------------

def _wait_file(path: Path, since: float, deadline: float, stable: bool = True) -> bytes | None:
    """The file's bytes once it exists, is newer than `since` and has stopped growing; None at the deadline."""
    last = -1
    while time.monotonic() < deadline:
        try:
            st = path.stat()
            if st.st_mtime >= since and st.st_size > 0 and st.st_size <= MAX_DUMP_BYTES:
                if not stable or st.st_size == last:
                    return path.read_bytes()
                last = st.st_size
        except OSError:
            pass
        time.sleep(0.1)
    return None


def _write_pipe(pipe: str, deadline: float) -> str | None:
    """Write to a FIFO without blocking (no reader yet: ENXIO, retried); the error, or None."""
    while True:
        try:
            fd = os.open(pipe, os.O_WRONLY | os.O_NONBLOCK)
        except OSError as e:
            if e.errno == errno.ENXIO and time.monotonic() < deadline:
                time.sleep(0.1)
                continue
            return f"cannot open {pipe}: {e.strerror}"
        try:
            os.write(fd, b"1\n")
        except OSError as e:
            return f"cannot write {pipe}: {e.strerror}"
        finally:
            os.close(fd)
        return None


def how(env: dict[str, str], rank: int | None) -> str | None:
    """'mldebug' or 'nccl' when this rank's launch environment allows a dump on request, else None."""
    if env.get(FR_DIR_VAR):
        return "mldebug"
    if env.get(NCCL_PIPE_VAR) and rank is not None:
        return "nccl"
    return None


def fetch(env: dict[str, str], rank: int | None, pid: int, timeout: float) -> dict[str, Any]:
    """Trigger one rank's dump and read it back: a per-rank record (ok, or the error)."""
    source = how(env, rank)
    rec: dict[str, Any] = {"rank": rank, "pid": pid, "source": source, "file": None, "ok": False, "error": None,
                           "process_groups": []}
    deadline = time.monotonic() + timeout
    since = time.time() - 0.01
    try:
        if source == "mldebug":
            d = Path(env[FR_DIR_VAR])
            r = rank if rank is not None else 0
            out = d / f"fr-{r}.json"
            (d / f"trigger-{r}").touch()
        elif source == "nccl":
            base = next((env[v] for v in NCCL_FILE_VARS if env.get(v)), NCCL_FILE_DEFAULT)
            out = Path(f"{base}{rank}")
            err = _write_pipe(f"{env[NCCL_PIPE_VAR]}{rank}.pipe", deadline)
            if err:
                rec["error"] = err
                return rec
        else:
            rec["error"] = "no Flight Recorder trigger in the environment"
            return rec
        rec["file"] = str(out)
        data = _wait_file(out, since, deadline)
        if data is None:
            if source == "mldebug":  # not picked up: do not leave a trigger that fires much later
                (out.parent / f"trigger-{out.stem.split('-', 1)[1]}").unlink(missing_ok=True)
            rec["error"] = (f"no dump in {out} within {timeout:g} s (is TORCH_FR_BUFFER_SIZE>0 set, and the rank "
                            "alive?)")
            return rec
        rec["process_groups"] = summarise_dump(parse_dump(data))
        rec["ok"] = True
    except (OSError, ValueError, pickle.UnpicklingError, EOFError) as e:
        rec["error"] = f"{type(e).__name__}: {e}"
    return rec


def gather(targets: Iterable[Any], host: str, timeout: float,
           fetch_one: Callable[[dict[str, str], int | None, int, float], dict[str, Any]] = fetch
           ) -> list[dict[str, Any]]:
    """Trigger and read every target whose environment allows it, in parallel; [] when none does."""
    from concurrent.futures import ThreadPoolExecutor

    todo = [t for t in targets if how(t.env, t.rank)]
    if not todo:
        return []
    with ThreadPoolExecutor(max_workers=min(32, len(todo))) as pool:
        futs = [pool.submit(fetch_one, t.env, t.rank, t.pid, timeout) for t in todo]
        recs = [f.result() for f in futs]
    for r in recs:
        r["host"] = host
    return recs
