"""Failure text made short and classed: one readable line of a message, an exception's short name, the
class of a failure text (from the catalogue), what an exit by signal means."""

from __future__ import annotations

import re
import signal
from collections.abc import Iterable

from ml_debug.logs.engine import class_label, failure_class
from ml_debug.logs.result import PRIMARY, SECONDARY

MESSAGE_CHARS = 64 << 10  # the most of a message kept; the human view shows less (labels.brief)

_CPP_LOCATION = re.compile(r"\[[^\]\s]{0,300}\.(?:cc|cpp|h|hpp|cu):\d+\]\s*")
# c10d's glog header and process-group tag: "[E0302 03:14:07.123456 ProcessGroupNCCL.cpp:1595] [PG 0 Rank 37] "
_GLOG_HEADER = re.compile(r"^\[?[IWEF]\d{4} [\d:.]+(?: +\d+)? [^\]]*\]\s*")
_PG_TAG = re.compile(r"^\[(?:PG [^\]]*?)?Rank \d+\]\s*")
_BOILERPLATE = re.compile(r"\s*(?:This is typically caused by .*|GLHF.*|Exception raised from .*)$")
EXCEPTION_LINE = re.compile(r"(?P<type>(?:[A-Za-z_]\w{0,100}\.){0,20}[A-Za-z_]\w{0,100})(?::(?: (?P<msg>.*))?)?$")
# gloo's monitored barrier naming the ranks that did not come; a rank waiting for another's NCCL id (c10d: "[1] is
# setting up NCCL communicator and retrieving ncclUniqueId from [0] via c10d key-value store ...")
_BLAMED = re.compile(r"Ranks? ([\d, ]+) failed to pass monitoredBarrier|retrieving ncclUniqueId from \[(\d+)\]")
# a Python frame ("  File "/job/train.py", line 40, in step")
_FRAME = re.compile(r'\s*File "(?P<path>[^"\n]{1,1000})", line (?P<line>\d+), in (?P<func>\S{1,200})')
# a library's frame: an installed package, the standard library, or the wrapper pip writes for a package's command
# (``.../bin/accelerate``, ``bin/torchrun``: a name in bin/ without a dot)
_LIBRARY = re.compile(r"[/\\](?:site|dist)-packages[/\\]|[/\\]lib[/\\]python\d[\d.]*[/\\]|^<frozen |[/\\]bin[/\\][^/\\.]+$")
# the peer a connection error names: gloo's (third_party/gloo/gloo/transport/tcp/pair.cc) "Read error
# [10.0.0.2]:29883: Connection reset by peer", "Connection closed by peer [10.0.0.2]:11412"; NCCL's (misc/socket.cc)
# "Connection closed by remote peer node4<38524>", "Call to recv from 10.0.0.3<48722> failed"
_PEER = re.compile(r"(?:Read error|Write error|Connection closed by peer) \[([^\]\s]{1,100})\]:\d+"
                   r"|by remote peer ([\w.:\-]{1,100})<\d+>|Call to \w+ (?:from|to) ([\w.:\-]{1,100})<\d+> failed")
_HEX = re.compile(r"0x[0-9a-fA-F]+")
_NUM = re.compile(r"\d+")


def numbers_aside(text: str) -> str:
    """``text`` with its addresses and numbers made alike (``0x``, ``N``): one message, whichever rank or run wrote it."""
    return _NUM.sub("N", _HEX.sub("0x", text))


def few(words: Iterable[str], n: int, sep: str = ", ") -> str:
    """The first ``n`` of ``words`` joined, and `` ...`` when there are more."""
    words = list(words)
    return sep.join(words[:n]) + (" ..." if len(words) > n else "")


def clean_message(text: str) -> str:
    """One readable line: C++ source locations and boilerplate advice dropped, shortened."""
    line = text.strip().splitlines()[0] if text.strip() else ""
    line = _PG_TAG.sub("", _GLOG_HEADER.sub("", line))
    if line.startswith("what():"):  # libstdc++'s line after "terminate called after throwing an instance of ..."
        line = line[7:].lstrip()
    if "This is typically" in line or "GLHF" in line or "Exception raised from" in line:
        line = _BOILERPLATE.sub("", line)
    if "." in line and ":" in line:
        line = _CPP_LOCATION.sub("", line)
    return line[:MESSAGE_CHARS]


def short_exception(line: str) -> str:
    """``torch.distributed.DistNetworkError: x`` -> ``DistNetworkError: x`` (the last name only)."""
    m = EXCEPTION_LINE.match(line.strip())
    if not m:
        return clean_message(line)
    name, msg = m.group("type").rsplit(".", 1)[-1], m.group("msg")
    return clean_message(f"{name}: {msg}" if msg else name)


def classify(text: str) -> tuple[str, str, str]:
    """(class, label, kind) of a failure described by ``text`` (an exception with its message): the first
    class of the catalogue that matches; an exception of no class is a primary of kind ``exception``."""
    got = failure_class(text)
    if got is None:
        return PRIMARY, "", "exception"
    entry, m = got
    label = class_label(entry, m)
    return entry.cls, clean_message(label) if entry.kind == "cuda-error" else label, entry.kind


SIGNAL_NAMES = {int(s): s.name for s in signal.Signals}


def signal_event_text(code: int) -> tuple[str, str, bool, str]:
    """(class, message, strong, label) for a rank that ended with exit code ``code`` < 0 (killed by -code)."""
    sig = -code
    name = SIGNAL_NAMES.get(sig, f"signal {sig}")
    if sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        return SECONDARY, f"stopped by {name} (the launcher stops the other ranks after one fails)", False, \
            f"stopped by {name}"
    if sig == signal.SIGKILL:
        return PRIMARY, "killed by SIGKILL (the kernel's OOM killer, a job limit, or kill -9)", True, "killed (SIGKILL)"
    return PRIMARY, f"crashed with {name}", True, f"crashed ({name})"


def blamed(text: str) -> list[int]:
    """The ranks a line names as missing: gloo's monitored barrier's, the rank whose NCCL id another waited for."""
    m = _BLAMED.search(text) if "monitoredBarrier" in text or "ncclUniqueId" in text else None  # most lines are not it
    return [int(x) for x in re.findall(r"\d+", m.group(1) or m.group(2))] if m else []


def peer(message: str) -> str | None:
    """The address of the peer a connection error names, or None."""
    m = _PEER.search(message) if "peer" in message or "failed" in message else None
    return next(g for g in m.groups() if g) if m else None


def raised_in(text: list[str]) -> str | None:
    """Where the job's own code was when a traceback's exception was raised: its last frame that is not a library's
    (``/job/train.py:40, in step``), or None (no such frame: the failure is all in libraries, or the frames are cut)."""
    for t in reversed(text):
        if 'File "' in t and (m := _FRAME.match(t)) and not _LIBRARY.search(m["path"]):
            return f"{m['path']}:{m['line']}, in {m['func']}"
    return None
