"""Flight Recorder dump files a job left, as a source: found, read, and analysed across ranks.

A rank's dump is found by its name, by a prefix, or by what it holds:

- ``nccl_trace_rank_<R>``: NCCL's dump on timeout (``TORCH_NCCL_DUMP_ON_TIMEOUT=1``) writes each rank's
  Flight Recorder to ``$TORCH_FR_DUMP_TEMP_FILE<R>`` (default ``/tmp/nccl_trace_rank_<R>``), a pickle;
- ``fr-<R>.json``: what ``ml_debug.flight_recorder`` writes on request (:mod:`ml_debug.core.frfiles`);
- ``<prefix><R>``: the value of ``TORCH_FR_DUMP_TEMP_FILE`` the job used (``--fr-prefix``);
- any other file whose first bytes are a pickle or JSON with the dump's keys (``version``,
  ``pg_status``, ``entries``), the rank then taken from the last digits of its name.

Inside an archive named on the command line (``dumps.tar.gz``, as users attach them to a bug report) or found in a
directory named there, the members named as dumps (the first three ways) are unpacked into a temporary directory and
read from there (:func:`unpacked`), each shown as ``ARCHIVE/MEMBER``.

The dumps are read with the restricted unpickler of :mod:`ml_debug.stacks.flight` (plain data only) and
analysed with the cross-rank analysis dump-stacks uses (:mod:`ml_debug.stacks.fr_analysis`): a desync,
a rank that never issued collective #N, the first collective that did not complete, a rank behind.

:func:`analyse_dump_dir` is the library call: a directory of NCCL-format dumps in, the analysis out.
"""

from __future__ import annotations

import os
import pickle
import re
import stat
import tarfile
import tempfile
import zipfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from ml_debug.core import archives, safefs
from ml_debug.core.frfiles import NCCL_FILE_VARS
from ml_debug.core.inputs import open_regular
from ml_debug.stacks.flight import MAX_DUMP_BYTES, parse_dump, section, summarise_dump
from ml_debug.stacks.fr_analysis import compact

NCCL_PREFIX = "nccl_trace_rank_"
_NCCL_NAME = re.compile(r"nccl_trace_rank_(\d+)$")
_MLDEBUG_NAME = re.compile(r"fr-(\d+)\.json$")
_TRAILING_RANK = re.compile(r"(\d+)(?:\.[A-Za-z]+)?$")
SNIFF_BYTES = 4096
MAX_FILES = 65536
"""The most dump files read from one place (a 64k-rank job)."""
_KEYS = (b"pg_status", b"entries")
ARCHIVE_SEARCH_BYTES = 64 << 20
"""The largest tar archive (named, or in a directory named) that is searched for dump files: listing a tar's members
is a pass over all of it before its logs are read (0.4 s for 32 MiB of .tar.gz here), where a zip's list is at its
end. The dumps of a few hundred ranks fit; a bigger tar holds more than dumps: unpack it and give the directory."""


@dataclass
class DumpFile:
    """One file taken for a rank's Flight Recorder dump."""

    path: str
    rank: int | None
    how: str
    """How it was found: nccl-name, mldebug-name, prefix, content."""
    host: str | None = None
    file: str | None = None
    """Where it is read from, when not at ``path`` (a member of an archive: ``path`` is ARCHIVE/MEMBER)."""


@dataclass
class FrSource:
    """What the dump files say: per-rank records (the shape dump-stacks uses), the analysis, and the files."""

    files: list[DumpFile] = field(default_factory=list)
    records: list[dict[str, Any]] = field(default_factory=list)
    unreadable: list[dict[str, str]] = field(default_factory=list)
    section: dict[str, Any] | None = None
    """:func:`ml_debug.stacks.flight.section` of the records: ranks, behind, evidence, analysis."""

    @property
    def culprits(self) -> list[dict[str, Any]]:
        analysis = (self.section or {}).get("analysis") or {}
        return list(analysis.get("culprits") or [])

    @property
    def findings(self) -> list[str]:
        analysis = (self.section or {}).get("analysis") or {}
        return list(analysis.get("findings") or [])


def rank_from_name(name: str, prefix: str | None = None) -> tuple[int | None, str | None]:
    """(rank, how) when a file name is a dump's by its name (or the given prefix), else (None, None)."""
    base = os.path.basename(name)
    if prefix:
        pbase = os.path.basename(prefix)
        if base.startswith(pbase) and base[len(pbase):].isdigit() and (
                "/" not in prefix or os.path.dirname(os.path.abspath(name)) == os.path.dirname(os.path.abspath(prefix))
                or not os.path.dirname(prefix)):
            return int(base[len(pbase):]), "prefix"
    m = _NCCL_NAME.search(base)
    if m:
        return int(m.group(1)), "nccl-name"
    m = _MLDEBUG_NAME.fullmatch(base)
    if m:
        return int(m.group(1)), "mldebug-name"
    return None, None


def looks_like_dump(head: bytes) -> bool:
    """The first bytes of a file: a pickle (protocol 2+) or a JSON object that holds a dump's keys."""
    if head[:1] == b"\x80" and head[1:2] in (b"\x02", b"\x03", b"\x04", b"\x05"):
        return all(k in head for k in _KEYS) or b"pg_config" in head or b"version" in head
    stripped = head.lstrip()
    return stripped[:1] == b"{" and all(k in stripped for k in _KEYS)


def is_dump_path(path: str, prefix: str | None = None) -> bool:
    """A path given to `mldebug logs` that is a Flight Recorder dump (by name or by content), not a log."""
    if rank_from_name(path, prefix)[1] is not None:
        return True
    try:  # a regular file only: a FIFO or a device named here is `mldebug logs`' to refuse, never to open
        if not stat.S_ISREG(os.stat(path).st_mode):
            return False
        fd, _ = open_regular(path)
    except OSError:
        return False
    try:
        return looks_like_dump(os.read(fd, SNIFF_BYTES))
    except OSError:
        return False
    finally:
        os.close(fd)


def find(paths: list[str], prefix: str | None = None, max_depth: int = 4) -> list[DumpFile]:
    """Dump files among these paths: files named as dumps (or sniffed as one), and such files in directories
    (walked `max_depth` levels down, links not followed). A file by content alone must be named explicitly or
    carry a rank in its name."""
    found: dict[str, DumpFile] = {}
    if prefix and os.path.isdir(os.path.dirname(prefix) or "."):
        # the prefix's own directory, one level only (it may be a busy /tmp)
        with os.scandir(os.path.dirname(prefix) or ".") as it:
            for e in it:
                rank, how = rank_from_name(e.path, prefix)
                if how == "prefix" and e.is_file(follow_symlinks=False):
                    found.setdefault(os.path.abspath(e.path), DumpFile(e.path, rank, how))
    for p in paths:
        if p == "-" or not os.path.lexists(p):
            continue
        if os.path.isdir(p) and not os.path.islink(p):
            for f in _walk(p, max_depth):
                rank, how = rank_from_name(f, prefix)
                if how is not None:
                    found.setdefault(os.path.abspath(f), DumpFile(f, rank, how))
                if len(found) >= MAX_FILES:
                    break
            continue
        rank, how = rank_from_name(p, prefix)
        if how is None and is_dump_path(p):
            m = _TRAILING_RANK.search(os.path.basename(p))
            rank, how = (int(m.group(1)) if m else None), "content"
        if how is not None:
            found.setdefault(os.path.abspath(p), DumpFile(p, rank, how))
    return sorted(found.values(), key=lambda d: (d.host or "", d.rank if d.rank is not None else -1, d.path))


def _searched(paths: list[str], max_depth: int = 4) -> list[str]:
    """The archives among ``paths``, and in the directories among them (``max_depth`` levels down, no link
    followed), that are searched for dump files: regular files, a tar not too big."""
    out = []
    for p in paths:
        if os.path.isdir(p) and not os.path.islink(p):
            out += [f for f in _walk(p, max_depth, archives.kind) if _small_archive(f, os.lstat)]
        elif _small_archive(p, os.stat):
            out.append(p)
    return out


def _small_archive(path: str, stat_of: Callable[[str], os.stat_result]) -> bool:
    kind = archives.kind(path)
    if kind is None:
        return False
    try:
        st = stat_of(path)
    except OSError:
        return False
    return stat.S_ISREG(st.st_mode) and (kind == "zip" or (kind == "tar" and st.st_size <= ARCHIVE_SEARCH_BYTES))


def _member_is_dump(rel: str, prefix: str | None) -> bool:
    return rank_from_name(os.path.basename(rel), os.path.basename(prefix) if prefix else None)[1] is not None


def in_archives(paths: list[str], prefix: str | None = None) -> bool:
    """An archive among ``paths`` or in their directories holds a file named as a dump (a damaged archive: what
    could be listed)."""
    for p in _searched(paths):
        try:
            if any(_member_is_dump(name, prefix) for name in archives.names(p)):
                return True
        except (tarfile.TarError, zipfile.BadZipFile, EOFError, OSError, ValueError):
            continue
    return False


@contextmanager
def unpacked(paths: list[str], prefix: str | None = None) -> Iterator[tuple[list[DumpFile], list[dict[str, str]]]]:
    """The dump files inside the archives among ``paths`` or in their directories, unpacked into a temporary
    directory for as long as the block runs (each shown as ARCHIVE/MEMBER), and what could not be unpacked (path,
    reason)."""
    roots: list[str] = []
    found: list[DumpFile] = []
    skipped: list[dict[str, str]] = []
    try:
        for p in _searched(paths):
            root = tempfile.mkdtemp(prefix="mldebug-fr-")
            roots.append(root)
            got = archives.unpack(p, root, lambda rel: _member_is_dump(rel, prefix))
            skipped += got.skipped
            for f in _walk(root, max_depth=64):
                rank, how = rank_from_name(f, os.path.basename(prefix) if prefix else None)
                if how is not None:
                    found.append(DumpFile(f"{p}/{os.path.relpath(f, root)}", rank, how, file=f))
        yield sorted(found, key=lambda d: (d.rank if d.rank is not None else -1, d.path)), skipped
    finally:
        for root in roots:
            archives.remove(root)


def _dump_like(name: str) -> bool:
    return bool(_NCCL_NAME.search(name) or _MLDEBUG_NAME.fullmatch(name) or _TRAILING_RANK.search(name))


def _walk(top: str, max_depth: int, wanted: Callable[[str], object] = _dump_like) -> list[str]:
    """The files under ``top`` (``max_depth`` levels down, no link followed) whose names ``wanted`` takes."""
    out: list[str] = []
    base = top.rstrip("/").count("/")
    for root, dirs, files in os.walk(top, followlinks=False):
        if root.rstrip("/").count("/") - base >= max_depth:
            dirs[:] = []
        out += [os.path.join(root, f) for f in sorted(files) if wanted(f)]
        if len(out) > MAX_FILES * 4:
            break
    return out


def record_of(data: bytes, rank: int | None, path: str, host: str | None) -> dict[str, Any]:
    """One rank's record, as dump-stacks builds it from a dump it triggered (ok, or the error)."""
    rec: dict[str, Any] = {"rank": rank, "pid": None, "host": host, "source": "file", "file": path, "ok": False,
                           "error": None, "process_groups": []}
    try:
        dump = parse_dump(data)
        rec["process_groups"] = summarise_dump(dump)
        rec["collectives"] = compact(dump)
        rec["version"] = str(dump.get("version", "")) or None
        rec["world"] = world_of(dump)
        rec["ok"] = True
    except (ValueError, pickle.UnpicklingError, EOFError, TypeError, KeyError, AttributeError, IndexError,
            RecursionError, MemoryError) as e:  # a damaged dump: nested past the stack, a memo index of billions
        rec["error"] = f"not a Flight Recorder dump: {type(e).__name__}: {e}"
    return rec


def world_of(dump: dict[str, Any]) -> int | None:
    """The job's rank count from the dump's process group configuration (the largest group's ranks)."""
    config = dump.get("pg_config")
    sizes = []
    for g in (config.values() if isinstance(config, dict) else []):
        ranks = g.get("ranks") if isinstance(g, dict) else None
        if isinstance(ranks, (list, tuple)):
            sizes.append(len(ranks))
        elif isinstance(ranks, str):
            sizes.append(len(re.findall(r"\d+", ranks)))
    return max(sizes) if sizes else None


def read(files: list[DumpFile]) -> FrSource:
    """Read dump files found here (then :func:`analysed`) (each opened as :func:`ml_debug.core.safefs.open_found` does:
    a regular file, never through a link planted at its name, at most MAX_DUMP_BYTES)."""
    out = FrSource(files=list(files))
    for f in files:
        try:
            fd, _ = safefs.open_found(os.path.abspath(f.file or f.path), f.path, MAX_DUMP_BYTES)
            with safefs.opened(fd):
                data = safefs.read_fd(fd, f.path, MAX_DUMP_BYTES)
        except (OSError, safefs.Refused) as e:
            out.unreadable.append({"path": f.path, "reason": getattr(e, "strerror", None) or str(e)})
            continue
        out.records.append(record_of(data, f.rank, f.path, f.host))
    return out


def analysed(src: FrSource) -> FrSource:
    """The cross-rank analysis over the records read (a record that is no dump is said, not analysed)."""
    for r in src.records:
        if not r["ok"]:
            src.unreadable.append({"path": r["file"], "reason": r["error"]})
    src.section = section(src.records) if any(r["ok"] for r in src.records) else None
    if src.section is not None:
        worlds = [r["world"] for r in src.records if r.get("world")]
        missing = missing_ranks([r["rank"] for r in src.records if r["ok"]], max(worlds) if worlds else None)
        src.section["missing_dumps"] = missing
        if missing:
            src.section["evidence"] += f"; no dump from rank(s) {', '.join(map(str, missing))}"
    return src


def missing_ranks(ranks: list[int | None], world: int | None = None) -> list[int]:
    """The ranks of the job (its world size, else up to the highest one that dumped) that left no dump: a
    rank that died before the timeout, or whose node's files were not reached."""
    have = {r for r in ranks if r is not None}
    if not have:
        return []
    top = max(world or 0, max(have) + 1)
    return [r for r in range(top) if r not in have]


def analyse_dump_dir(path: str | os.PathLike[str], prefix: str | None = None) -> dict[str, Any]:
    """The library call: every Flight Recorder dump in a directory (NCCL's ``nccl_trace_rank_<R>`` pickles,
    ``fr-<R>.json``, or ``<prefix><R>``), read and analysed across ranks.

    Returns ``{"files": [...], "unreadable": [...], "ranks": [...], "behind": [...], "analysis":
    {"process_groups", "findings", "culprits", "evidence"} | None, "evidence": str, "missing_dumps": [...]}``;
    ``analysis.findings`` holds one sentence per finding (``desync in collective #6 of pg 0 ...``) and
    ``analysis.culprits`` the ranks named. Shell equivalent: ``torchfrtrace DIR -p nccl_trace_rank_``.
    """
    top = os.fspath(path)
    src = analysed(read(find([top], prefix=prefix or None, max_depth=1)))
    sec = dict(src.section or {"ranks": [], "behind": [], "analysis": None,
                               "evidence": f"flight recorder: no dump file in {top}"})
    sec["files"] = [f.path for f in src.files]
    sec["unreadable"] = src.unreadable
    return sec


def default_prefixes(env: dict[str, str] | None = None) -> list[str]:
    """Where NCCL writes its dumps on a node: the prefixes the job's variables would name, else the default."""
    env = dict(os.environ if env is None else env)
    named = [env[v] for v in NCCL_FILE_VARS if env.get(v)]
    return [*named, f"/tmp/{NCCL_PREFIX}"]
