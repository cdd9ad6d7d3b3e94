"""PyTorch Flight Recorder evidence for dump-stacks: trigger dumps, read them, name the ranks behind.

Two ways a rank can dump its Flight Recorder buffer on request:

- ``ml_debug.flight_recorder.enable()`` in the job (any backend, gloo included) with MLDEBUG_FR_DIR in
  the launch environment: we touch ``<dir>/trigger-<rank>`` and read ``<dir>/fr-<rank>.json``;
- NCCL's own pipe: with TORCH_NCCL_DEBUG_INFO_PIPE_FILE=P each rank reads ``P<rank>.pipe``; a write
  there makes it dump to TORCH_NCCL_DEBUG_INFO_TEMP_FILE (default ``/tmp/nccl_trace_rank_``)<rank>,
  a pickle of plain data that we read with a restricted unpickler (no global but plain builtins).

Every path comes from the rank's environment and mldebug usually runs as root: each is opened
through :mod:`ml_debug.core.safefs`, as the rank's own user could (no symbolic link followed, a
FIFO for the pipe, a regular file of that user no larger than MAX_DUMP_BYTES for a dump); anything
else is refused, and the rank's error says why.

Every dump is summarised per rank (last completed / last enqueued collective of each process
group) and the ranks are compared. Absent evidence is never an error: the section is ``None``.
"""

from __future__ import annotations

import contextlib
import errno
import io
import json
import os
import pickle
import time
from collections import Counter
from collections.abc import Callable, Iterable
from typing import Any

from ml_debug.core import safefs
from ml_debug.core.frfiles import DIR_VAR, NCCL_FILE_VARS, NCCL_PIPE_VAR, dump_name, trigger_name
from ml_debug.core.gcpause import gc_paused
from ml_debug.core.safefs import Owner, Refused
from ml_debug.stacks.fr_analysis import analyse, compact

FR_DIR_VAR = DIR_VAR
NCCL_FILE_DEFAULT = "/tmp/nccl_trace_rank_"
MAX_DUMP_BYTES = 256 * 1024 * 1024
REFUSED = "refused: "  # how a rank's error starts when one of its paths failed the safety checks


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


def _op(pgs: list[tuple[dict[str, Any], dict[str, Any]]], key: str, seq: int) -> str | None:
    for _, pg in pgs:
        c = pg.get(key)
        if c and c.get("seq") == seq and c.get("op"):
            return c["op"]
    return None


def behind_ranks(ranks: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Ranks whose last enqueued collective (else last completed) is below what most ranks reached."""
    ok = [r for r in ranks if r.get("ok")]
    # each process group's (rank, its status) once, in rank order: a 3D layout of 16k ranks has
    # thousands of groups, and looking each one up across every rank would cost groups x ranks
    pgs_of: dict[str, list[tuple[dict[str, Any], dict[str, Any]]]] = {}
    for r in ok:
        for pg in r["process_groups"]:
            pgs_of.setdefault(pg["pg_id"], []).append((r, pg))
    behind: list[dict[str, Any]] = []
    for pg_id in sorted(pgs_of):
        pgs = pgs_of[pg_id]
        for field, key, kind in (("last_enqueued_seq", "last_enqueued", "enqueued"),
                                 ("last_completed_seq", "last_completed", "completed")):
            have = [(r, pg[field]) for r, pg in pgs if pg.get(field) is not None]
            if len(have) < 2:
                continue
            ref = _reference([v for _, v in have])
            late = [(r, v) for r, v in have if v < ref]
            others_op = _op(pgs, key, ref) if late else None
            for r, v in late:
                behind.append({"rank": r.get("rank"), "host": r.get("host"), "pid": r.get("pid"), "pg_id": pg_id,
                               "kind": kind, "seq": v, "others_seq": ref, "others": len(have) - len(late),
                               "others_op": others_op})
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
    with gc_paused():  # many small objects over a large heap: see gc_paused
        behind = behind_ranks(ranks)
    got = sum(1 for r in ranks if r.get("ok"))
    if behind:
        evidence = "flight recorder: " + "; ".join(describe_behind(b) for b in behind)
    elif got:
        evidence = f"flight recorder: {got} rank(s) dumped, none behind the others"
    else:
        evidence = "flight recorder: no rank could be dumped"
    analysis = analyse(ranks)  # the collectives matched across ranks by sequence number
    if analysis:  # a desync always; a rank that never issued a collective when none is behind already
        extra = [f for f in analysis["findings"] if f.startswith("desync")] or \
            ([] if behind else [f for f in analysis["findings"] if " never issued " in f][:1])
        if extra:
            evidence = (evidence + "; " if behind else "flight recorder: ") + "; ".join(extra)
    refused = [r for r in ranks if str(r.get("error") or "").startswith(REFUSED)]
    if refused:  # said where every view shows it, not only in a table cell
        evidence += "; " + "; ".join(f"{_who(r)}: {r['error']}" for r in refused)
    return {"ranks": ranks, "behind": behind, "evidence": evidence, "analysis": analysis}


# ---- triggering --------------------------------------------------------------------------------
#
# Every path below comes from the target's environment, and mldebug usually runs as root: each one
# is opened through ml_debug.core.safefs (no symbolic link followed at the last component, the type
# and the owner checked on the descriptor, sizes bounded), as the target's user could do it.

def _wait_dump(open_dump: Callable[[], tuple[int, os.stat_result]], shown: str, since: float,
               deadline: float) -> bytes | None:
    """The dump's bytes once it exists, is newer than `since` and has stopped growing; None at the deadline.

    A dump that is not a regular file of the job's user (a planted link, a FIFO) or is too big raises
    :class:`Refused` at once: waiting would not make it any better."""
    last = -1
    while time.monotonic() < deadline:
        try:
            fd, st = open_dump()
        except FileNotFoundError:
            pass
        else:
            with safefs.opened(fd):
                if st.st_mtime >= since and st.st_size > 0:
                    if st.st_size == last:
                        return safefs.read_fd(fd, shown, MAX_DUMP_BYTES)
                    last = st.st_size
        time.sleep(0.1)
    return None


def _write_pipe(pipe: str, owner: Owner, cwd_fd: int | None, deadline: float) -> str | None:
    """Write to the rank's FIFO without blocking (no reader yet: ENXIO, retried); the error, or None.

    Only a FIFO of the job's user is opened: a link or a regular file at that name is refused."""
    while True:
        try:
            fd, _ = safefs.open_untrusted(pipe, owner, "fifo", os.O_WRONLY | os.O_NONBLOCK, cwd_fd=cwd_fd)
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


def _trigger(dir_fd: int, shown: str, name: str, owner: Owner) -> tuple[int, int] | None:
    """Create ``<dir>/trigger-<rank>`` as the job's user could; (st_dev, st_ino) of the file we made,
    None when a trigger of the job's user is already there (pending)."""
    st = os.fstat(dir_fd)
    if not owner.may_write_dir(st):
        raise Refused(f"{shown} is not writable by the job's user ({owner.describe()}): no trigger created there")
    try:
        fd = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600,
                     dir_fd=dir_fd)
    except FileExistsError:
        fd, _ = safefs.open_in(dir_fd, name, f"{shown}/{name}", owner, "file", os.O_RDONLY | os.O_NONBLOCK)
        os.close(fd)
        return None
    with safefs.opened(fd):
        if os.geteuid() != owner.uid:
            # the job must be able to remove it, also in a sticky directory such as /tmp
            with contextlib.suppress(OSError):
                os.fchown(fd, owner.uid, owner.gid)
        made = os.fstat(fd)
    return made.st_dev, made.st_ino


def _remove_trigger(dir_fd: int, name: str, made: tuple[int, int] | None) -> None:
    """Remove the trigger we made if it is still there (not picked up: it must not fire much later)."""
    if made is None:
        return
    with contextlib.suppress(OSError):
        st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
        if (st.st_dev, st.st_ino) == made:
            os.unlink(name, dir_fd=dir_fd)


def how(env: dict[str, str], rank: int | None) -> str | None:
    """'mldebug' or 'nccl' when this rank's launch environment allows a dump on request, else None."""
    if env.get(FR_DIR_VAR):
        return "mldebug"
    if env.get(NCCL_PIPE_VAR) and rank is not None:
        return "nccl"
    return None


def fetch(env: dict[str, str], rank: int | None, pid: int, timeout: float, owner: Owner | None = None
          ) -> dict[str, Any]:
    """Trigger one rank's dump and read it back: a per-rank record (ok, or the error).

    `owner` is the job's user, whose files alone are used (default: the process's, else ours); a
    path that fails the checks of ml_debug.core.safefs leaves an error that starts with "refused: ".
    """
    source = how(env, rank)
    rec: dict[str, Any] = {"rank": rank, "pid": pid, "source": source, "file": None, "ok": False, "error": None,
                           "process_groups": []}
    if source is None:
        rec["error"] = "no Flight Recorder trigger in the environment"
        return rec
    owner = owner or Owner.of_process(pid) or Owner.current()
    deadline = time.monotonic() + timeout
    since = time.time() - 0.01
    cwd_fd = safefs.process_cwd(pid)
    dir_fd: int | None = None
    try:
        if source == "mldebug":
            shown = env[FR_DIR_VAR]
            r = rank if rank is not None else 0
            out, trigger = dump_name(r), trigger_name(r)
            rec["file"] = f"{shown.rstrip('/')}/{out}"
            try:
                dir_fd = safefs.open_dir(shown, owner, cwd_fd)
            except FileNotFoundError:
                rec["error"] = f"no directory {shown} ({FR_DIR_VAR}): nothing could be asked"
                return rec
            made = _trigger(dir_fd, shown, trigger, owner)
            try:
                data = _wait_dump(lambda: safefs.open_in(dir_fd, out, rec["file"], owner, "file",
                                                         os.O_RDONLY | os.O_NONBLOCK, MAX_DUMP_BYTES),
                                  rec["file"], since, deadline)
            finally:
                _remove_trigger(dir_fd, trigger, made)
        else:
            base = next((env[v] for v in NCCL_FILE_VARS if env.get(v)), NCCL_FILE_DEFAULT)
            rec["file"] = f"{base}{rank}"
            err = _write_pipe(f"{env[NCCL_PIPE_VAR]}{rank}.pipe", owner, cwd_fd, deadline)
            if err:
                rec["error"] = err
                return rec
            data = _wait_dump(lambda: safefs.open_untrusted(rec["file"], owner, "file", os.O_RDONLY | os.O_NONBLOCK,
                                                            cwd_fd=cwd_fd, max_bytes=MAX_DUMP_BYTES),
                              rec["file"], since, deadline)
        if data is None:
            rec["error"] = (f"no dump in {rec['file']} within {timeout:g} s (is TORCH_FR_BUFFER_SIZE>0 set "
                            "(TORCH_NCCL_TRACE_BUFFER_SIZE on older torch), and the rank alive?)")
            return rec
        dump = parse_dump(data)
        rec["process_groups"] = summarise_dump(dump)
        rec["collectives"] = compact(dump)  # the last entries per process group, for the cross-rank analysis
        rec["ok"] = True
    except Refused as e:
        rec["error"] = REFUSED + str(e)
    except (OSError, ValueError, pickle.UnpicklingError, EOFError) as e:
        rec["error"] = f"{type(e).__name__}: {e}"
    finally:
        for fd in (dir_fd, cwd_fd):
            if fd is not None:
                os.close(fd)
    return rec


def _fetch_as(fetch_one: Callable[..., dict[str, Any]], t: Any, owner: Owner | None, timeout: float
              ) -> dict[str, Any]:
    if owner is None:
        return {"rank": t.rank, "pid": t.pid, "source": how(t.env, t.rank), "file": None, "ok": False,
                "error": "the process exited before its Flight Recorder could be asked", "process_groups": []}
    if fetch_one is fetch:
        return fetch(t.env, t.rank, t.pid, timeout, owner)
    return fetch_one(t.env, t.rank, t.pid, timeout)


def gather(targets: Iterable[Any], host: str, timeout: float,
           fetch_one: Callable[[dict[str, str], int | None, int, float], dict[str, Any]] = fetch
           ) -> list[dict[str, Any]]:
    """Trigger and read every target whose environment allows it, in parallel; [] when none does."""
    from concurrent.futures import ThreadPoolExecutor

    todo = [t for t in targets if how(t.env, t.rank)]
    if not todo:
        return []
    # the job's user is read now, while the process is known alive: a process that exits meanwhile
    # does not turn its paths into ones that root would trust
    owners = {t.pid: Owner.of_process(t.pid) for t in todo}
    with ThreadPoolExecutor(max_workers=min(32, len(todo))) as pool:
        futs = [pool.submit(_fetch_as, fetch_one, t, owners[t.pid], timeout) for t in todo]
        recs = [f.result() for f in futs]
    for r in recs:
        r["host"] = host
    return recs
