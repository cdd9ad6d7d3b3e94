"""PATH arguments into log sources, each with the shape that says who wrote it.

Shapes:

- ``launch``: the console of an `mldebug launch` node (``<dir>/<host>/console.log``, next to its
  ``launch.json``): every line labelled ``[host:local rankR]:``. torchrun's per-rank files under
  ``torchelastic/`` hold the same lines and are read too (the node's name from the manifest): a killed
  torchrun's console may miss their end.
- ``torchelastic``: torchrun's ``--log-dir`` tree, ``.../attempt_N/<local rank>/stdout.log`` or
  ``stderr.log``; ``error-file``: its ``error.json`` (TORCHELASTIC_ERROR_FILE).
- ``train-metrics``: `mldebug train --metrics-dir` files (``rank-R.jsonl``): how far each rank got.
- ``rank-file``: a file named for its rank (``rank37.log``, ``log_rank_3.txt``, ``rank-0012.out``).
- ``console``: anything else; each line is attributed by its own labels (``srun --label``, torchrun
  ``--tee``), or to an unknown rank.

A directory is walked (no symbolic links followed; FIFOs, devices and sockets skipped) for ``*.log *.out *.err
*.txt``, ``error*.json``, ``*.jsonl``, compressed too (``.gz .xz .bz2 .zst .lz4``: :data:`CODECS`); what is skipped, and a
subdirectory that cannot be listed, is reported as not read. An archive (``logs.tar.gz``, ``.zip``:
core/archives.py) is such a directory: its log files are unpacked into a temporary one (removed by
:meth:`Expanded.close`), each shown as ``ARCHIVE/member``; one found in a directory is too, up to
:data:`ARCHIVE_IN_DIR_BYTES`. A glob is expanded; ``-`` is standard input.
"""

from __future__ import annotations

import bz2
import datetime as _dt
import glob
import gzip
import io
import json
import lzma
import os
import re
import stat
import tempfile
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import IO

from ml_debug.core import archives
from ml_debug.core.errors import UsageError
from ml_debug.core.lz4frames import Lz4File
from ml_debug.core.zstd import ZstdFile
from ml_debug.logs.result import Who

LAUNCH_MANIFEST = "launch.json"
LAUNCH_SCHEMA = "mldebug.launch"
# attempt, local rank, and stdout or stderr (None: the error file)
_TREE = re.compile(r"(?:^|/)attempt_(\d+)/(\d+)/(?:(stdout|stderr)\.log|error\.json)$")
_RANK_NAME = re.compile(r"(?:^|[^a-z])rank[-_.]?(\d+)(?![\d])", re.IGNORECASE)
# `kubectl logs POD > POD.log`: a Kubeflow PyTorchJob's (or MPIJob's) pod, "<job>-master-0", "<job>-worker-3",
# "<job>-launcher-0": the pod is the node its lines came from (rule 6 of logs/accounting.py)
_POD_NAME = re.compile(r"^(?P<pod>[a-z0-9](?:[a-z0-9.\-]{0,200}?)-(?:master|worker|launcher)-\d{1,6})(?=[._]|$)")
# the kubelet's own file of a pod's container (container.py): /var/log/pods/<namespace>_<pod>_<uid>/<container>/0.log
_POD_DIR = re.compile(r"(?:^|/)pods/[^/_]{1,253}_(?P<pod>[^/_]{1,253})_[^/]{1,100}/[^/]{1,253}/\d{1,6}\.log$")
_LOG_SUFFIXES = (".log", ".out", ".err", ".txt", ".jsonl")
_SKIP_DIRS = ("trace", "fr", "__pycache__")
_CONSOLE = "console.log"  # an `mldebug launch` node's console, beside its manifest (compressed too)
CODECS = {".gz": "gzip", ".xz": "xz", ".bz2": "bzip2", ".zst": "zstd", ".lz4": "lz4"}
"""The compressions of a single log file that are read (scan.opened), by suffix."""
OPENERS: dict[str, Callable[[IO[bytes]], io.BufferedIOBase]] = {
    "gzip": lambda raw: gzip.GzipFile(fileobj=raw), "xz": lzma.LZMAFile, "bzip2": bz2.BZ2File, "zstd": ZstdFile,
    "lz4": Lz4File}
"""A reader of each compression CODECS names."""
ARCHIVE_IN_DIR_BYTES = 1 << 30
"""The largest archive found in a directory that is unpacked and read (a bigger one is more likely a dataset or a
checkpoint than logs: it is listed as not read, and read when named on the command line)."""


@dataclass
class Source:
    """One thing to read."""

    path: str
    """As shown (the argument, or the file found under it)."""
    shape: str
    who: Who = field(default_factory=Who)
    stdin: bool = False
    codec: str = ""
    """Its compression (a value of :data:`CODECS`), or ``""``."""
    size: int = 0
    day: _dt.date = field(default_factory=_dt.date.today)
    """The date to give time stamps that carry none (the file's modification day)."""
    cut: str | None = None
    """Why the source's end could not be read (a damaged compressed file): what came before it was."""
    file: str = ""
    """The file to open, when it is not ``path`` (an archive's member, unpacked)."""
    container: str | None = None
    """The container runtime's format its lines were unwrapped from (container.py), once read."""

    @property
    def labelled(self) -> bool:
        """Lines may carry launcher labels (not JSON files)."""
        return self.shape not in ("error-file", "train-metrics")


def attempt_of(path: str) -> int | None:
    """The torchrun attempt (restart) a file of its --log-dir tree belongs to, or None."""
    m = _TREE.search(uncompressed(path)[0])
    return int(m.group(1)) if m else None


def uncompressed(name: str) -> tuple[str, str]:
    """``name`` without its compression's suffix, and the suffix (``""``: none)."""
    for suffix in CODECS:
        if name.endswith(suffix):
            return name[:-len(suffix)], suffix
    return name, ""


def _is_log_name(name: str) -> bool:
    base = uncompressed(name)[0]
    if base.startswith((".", "trace-", "fr-")):
        return False
    if base.endswith(".json"):
        return base.startswith("error")
    return base.endswith(_LOG_SUFFIXES)


def classify_path(path: str, node: str | None = None, launch: bool = False) -> Source:
    """The shape of the file at ``path`` from its name (and node, when a launch manifest gave one; ``launch``: its
    directory is an `mldebug launch` node's, where ``console.log`` is the node's console)."""
    norm = path.replace(os.sep, "/")
    name = os.path.basename(norm)
    base, suffix = uncompressed(name)
    codec = CODECS.get(suffix, "")
    m = _TREE.search(norm[:len(norm) - len(suffix)])
    if m:
        shape = "torchelastic" if m.group(3) else "error-file"
        return Source(path, shape, Who(None, node, int(m.group(2))), codec=codec)
    if base.startswith("error") and base.endswith(".json"):
        return Source(path, "error-file", Who(None, node, None), codec=codec)
    r = _RANK_NAME.search(name)
    if base.endswith(".jsonl"):
        return Source(path, "train-metrics", Who(int(r.group(1)) if r else None, node, None), codec=codec)
    if r:
        return Source(path, "rank-file", Who(int(r.group(1)), node, None), codec=codec)
    if launch and base == _CONSOLE:
        return Source(path, "launch", Who(None, node, None), codec=codec)
    if node is None:
        in_pods = _POD_DIR.search(norm[:len(norm) - len(suffix)])
        pod = _POD_NAME.match(in_pods["pod"] if in_pods else name)
        node = pod["pod"] if pod else None
    return Source(path, "console", Who(None, node, None), codec=codec)


def expand(paths: list[str]) -> Expanded:
    """Every source the PATH arguments name, in order; what could not be read, and why (the caller closes it)."""
    out = Expanded()
    try:
        for arg in paths:
            if arg == "-":
                out.add(Source("-", "console", stdin=True), None)
            elif not os.path.lexists(arg) and glob.has_magic(arg):
                matches = sorted(glob.glob(arg, recursive=True))
                if not matches:
                    out.skipped.append({"path": arg, "reason": "no file matches this pattern"})
                for m in matches:
                    _add_path(out, m, explicit=False)
            else:
                _add_path(out, arg, explicit=True)
    except BaseException:  # a FIFO refused after an archive was unpacked, Ctrl-C: its files go too
        out.close()
        raise
    return out


@dataclass
class Expanded:
    """The sources found, in order; what was not read, and why; the `mldebug launch` manifests by directory."""

    sources: list[Source] = field(default_factory=list)
    skipped: list[dict[str, str]] = field(default_factory=list)
    manifests: dict[str, dict[str, object]] = field(default_factory=dict)
    seen: set[str] = field(default_factory=set)
    """The real paths of the sources (a file named twice, or by a link, is read once)."""
    unpacked: list[str] = field(default_factory=list)
    """The temporary directories archives were unpacked into."""

    def close(self) -> None:
        """The archives' unpacked files removed."""
        for root in self.unpacked:
            archives.remove(root)
        self.unpacked.clear()

    def add(self, src: Source, st: os.stat_result | None, real: str | None = None) -> None:
        key = real or (os.path.realpath(src.path) if not src.stdin else "-")
        if key in self.seen:
            return
        self.seen.add(key)
        if st is not None:
            src.size = st.st_size
            src.day = _dt.date.fromtimestamp(st.st_mtime)
        self.sources.append(src)

    def manifest(self, dirpath: str) -> dict[str, object] | None:
        """The `mldebug launch` manifest in ``dirpath``, compressed too (``gzip -r``, ``zstd -r``), kept in
        ``manifests``; or None."""
        for suffix in ("", *CODECS):
            try:
                with open(os.path.join(dirpath, LAUNCH_MANIFEST + suffix), "rb") as raw:
                    f = OPENERS[CODECS[suffix]](raw) if suffix else raw
                    doc = json.loads(f.read(1 << 20))
                break
            except FileNotFoundError:
                continue
            except (OSError, EOFError, ValueError, zlib.error, lzma.LZMAError):
                return None
        else:
            return None
        if not (isinstance(doc, dict) and doc.get("schema") == LAUNCH_SCHEMA):
            return None
        self.manifests[dirpath] = doc
        return doc

    def launch_root(self, dirpath: str) -> str | None:
        """The nearest of ``dirpath`` and the directories above it whose manifest was read."""
        while dirpath not in self.manifests:
            parent = os.path.dirname(dirpath)
            if parent in (dirpath, ""):
                return None
            dirpath = parent
        return dirpath


def _add_path(out: Expanded, path: str, explicit: bool) -> None:
    try:
        st = os.stat(path)
    except OSError as e:
        out.skipped.append({"path": path, "reason": e.strerror or str(e)})
        return
    if stat.S_ISDIR(st.st_mode):
        _walk(out, path)
        return
    if not stat.S_ISREG(st.st_mode):
        if explicit:  # a FIFO waits forever for a writer, /dev/zero never ends: refused before reading anything
            from ml_debug.core.inputs import what_it_is

            raise UsageError(f"{path} is {what_it_is(st.st_mode)}, not a log file",
                             "give log files or directories (or - for standard input: `cat FIFO | mldebug logs -`)")
        out.skipped.append({"path": path, "reason": "not a regular file"})
        return
    if archives.kind(path):
        _unpack(out, path)
        return
    man = out.manifest(os.path.dirname(os.path.abspath(path)))
    out.add(classify_path(path, _node_of(man), launch=man is not None), st)


def _unpack(out: Expanded, path: str) -> None:
    """An archive's log files, unpacked into a temporary directory and walked as a directory, shown under ``path``."""
    if archives.kind(path) == "unreadable":
        out.skipped.append({"path": path, "reason": f"an archive of a compression Python cannot read: "
                            f"{archives.unpack_hint(path)}, then give the directory"})
        return
    root = tempfile.mkdtemp(prefix="mldebug-logs-")
    out.unpacked.append(root)
    nested: list[str] = []

    def wanted(rel: str) -> bool:
        if archives.kind(rel):
            nested.append(rel)
        return _wanted(rel)

    got = archives.unpack(path, root, wanted)
    out.skipped += got.skipped + [{"path": f"{path}/{rel}", "reason": "an archive inside an archive (not opened): "
                                   "unpack the outer one and give its directory"} for rel in nested]
    if got.files:
        _walk(out, root, shown=path)
    elif not got.skipped:
        out.skipped.append({"path": path, "reason": "an archive with no log file in it (*.log *.out *.err *.txt "
                            "error*.json *.jsonl)"})


def _wanted(rel: str) -> bool:
    """An archive's member that a directory's walk would read (or an `mldebug launch` manifest)."""
    *dirs, name = rel.replace(os.sep, "/").split("/")
    wanted = _is_log_name(name) or uncompressed(name)[0] == LAUNCH_MANIFEST
    return wanted and not any(d in _SKIP_DIRS or d.startswith(".") for d in dirs)


def _walk(out: Expanded, root: str, shown: str | None = None) -> None:
    """The log files under ``root``, in order; ``shown``: what stands for ``root`` in their paths (an archive)."""
    def show(path: str) -> str:
        return path if shown is None else shown + path[len(root):]

    def unreadable(e: OSError) -> None:  # a directory that cannot be listed may hold the failure: say so
        out.skipped.append({"path": show(str(e.filename or root)), "reason": e.strerror or str(e)})

    for dirpath, dirnames, filenames in os.walk(root, onerror=unreadable, followlinks=False):
        dirnames[:] = sorted(d for d in dirnames if d not in _SKIP_DIRS and not d.startswith("."))
        out.manifest(dirpath)
        launch_dir = out.launch_root(dirpath)
        node = _node_of(out.manifests[launch_dir]) if launch_dir is not None else None
        real_dir = os.path.realpath(dirpath)  # its files are no links (lstat below): their real path is this + name
        for name in sorted(filenames):
            archive = shown is None and archives.kind(name) is not None  # one level: no archive in an archive
            if not (archive or _is_log_name(name)):
                continue
            full = os.path.join(dirpath, name)
            try:
                st = os.lstat(full)
            except OSError as e:
                out.skipped.append({"path": show(full), "reason": e.strerror or str(e)})
                continue
            if not stat.S_ISREG(st.st_mode):  # lstat: a link is not a regular file either
                out.skipped.append({"path": show(full), "reason": "a symbolic link (not followed in a directory)"
                                    if stat.S_ISLNK(st.st_mode) else "not a regular file"})
                continue
            if archive:
                if st.st_size > ARCHIVE_IN_DIR_BYTES:
                    out.skipped.append({"path": full, "reason": f"an archive of {st.st_size >> 20} MiB (over "
                                        f"{ARCHIVE_IN_DIR_BYTES >> 20} MiB, more likely data than logs): name it on "
                                        "the command line to read it"})
                else:
                    _unpack(out, full)
                continue
            # torchrun's per-rank files repeat the console's lines (duplicates are merged), but they are
            # read too: a torchrun killed by srun may not have copied their last lines to the console
            src = classify_path(full, node, launch=dirpath == launch_dir)
            if shown is not None:
                src.path, src.file = show(full), full
            out.add(src, st, os.path.join(real_dir, name))


def _node_of(manifest: dict[str, object] | None) -> str | None:
    """The node an `mldebug launch` manifest names."""
    return str(manifest.get("node") or "") or None if manifest is not None else None
