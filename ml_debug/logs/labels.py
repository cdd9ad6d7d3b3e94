"""Who wrote a log line (the labels launchers put in front of it) and when (its time stamp).

Labels, outermost first, as they nest in practice::

    3: ...                     srun --label (the task id: a rank when srun started the ranks)
    [default0]: ...            torchrun --tee 3 (role "default", local rank 0)
    [node12:5]: ...            torchrun --role "$(hostname -s):" --tee 3 (node12, local rank 5)
    [node12:5 rank37]: ...     mldebug launch (node, local rank and global rank)
    [rank37]: ...              torch itself, in front of every line of an uncaught exception
    [1,3]<stderr>: ...         Open MPI's mpirun --tag-output (job 1, rank 3)
    [3]<stderr>: ...           horovodrun's gloo runner (rank 3)
    (RayTrainWorker pid=81234, ip=10.0.0.12) ...   Ray's log monitor (a worker process on a node)
    [pod/job-worker-0/pytorch] ...               kubectl logs --prefix (the pod: a node)
    job7.node12 [stderr] ...   a harness's or log shipper's source and stream (the node: the name's last part)
    node12: ...                pdsh, and DeepSpeed's multi-node runner through pdsh (only where the source's
                               lines mostly start so: see repair.sniff)

Under ``srun --label`` a torchrun agent per node prints ``1: [default3]: ...``: the task is then the
agent (a node), not a rank, and the line is local rank 3 on "the node of srun task 1".

Time stamps: ISO dates (``2024-05-01 03:14:07,123``, ``2024-05-01T03:14:07``, torchrun's
``2024-05-01_03:14:07``), glog (``E0501 03:14:07.123456``: c10d, torchrun's own lines), syslog (``May  1
03:14:07``) and a bare ``03:14:07``; a missing year or date comes from the file's modification time.
"""

from __future__ import annotations

import datetime as _dt
import functools
import re
from typing import NamedTuple

from ml_debug.logs.result import Who

_SRUN = re.compile(r" *(\d+): ")
# The role is empty or starts with a letter, so a bracketed date ("[2024-05-01]") is not a role.
_ROLE = re.compile(r"\[(?P<role>[A-Za-z][\w.\-]*?[:\-_|]?|)(?P<local>\d+)(?: rank(?P<rank>\d+))?\](?P<colon>:?) ?")
_ROLE_SEPARATORS = ":-_|"
_TORCH_RANK = re.compile(r"\[rank(\d+)\]: ?")
# a collector's "<job>.<node> [stderr] " (benchmark harnesses, log shippers) in front of the launcher's labels
_STREAM_TAG = re.compile(r"(?:(?P<src>[\w.\-]+) )?\[(?:stdout|stderr)\] ")
# Ray's log monitor (worker.py print_worker_logs): "(RayTrainWorker pid=81234, ip=10.0.0.12) ", name optional
_RAY = re.compile(r"\((?:(?P<actor>[\w.]{1,100}) )?pid=(?P<pid>\d{1,10})(?:, ip=(?P<ip>[\w.:\-]{1,100}))?\) ")
# kubectl logs --prefix (staging/src/k8s.io/kubectl/pkg/cmd/logs/logs.go: "[pod/%s/%s] "): the pod is the node
_KUBECTL = re.compile(r"\[pod/(?P<pod>[\w.\-]{1,253})/[\w.\-]{1,253}\] ")
# Open MPI's "[1,3]<stderr>:" (job 1, rank 3); horovodrun's gloo runner's "[3]<stderr>:" (safe_shell_exec.py: the rank)
_MPI_TAG = re.compile(r"\[(?:\d+,)?(\d+)\]<(?:stdout|stderr|stddiag)>: ?")
NODE_PREFIX = re.compile(r"([A-Za-z][\w.\-]*): ")


def srun_task_node(task: int) -> str:
    """The name given to the node of srun task ``task`` when it runs a launcher (one agent per node)."""
    return f"node of srun task {task}"


class Label(NamedTuple):
    """What the labels in front of one line say (a named tuple: one is made per line read, a third of a frozen
    dataclass's cost)."""

    who: Who
    key: str
    """The labels as written (a stream of lines from one writer shares it)."""
    rest: str
    """The line without its labels."""
    srun_task: int | None = None
    torch_rank: bool = False
    """torch's own ``[rankN]:`` was there (it prefixes every line of an exception it prints)."""
    stamp: str = ""
    """A time stamp taken off the front of ``rest`` by :func:`unstamped` (kubectl/docker ``-t``, ``ts``)."""


_NOBODY = Who()
_DIGITS = "0123456789"
_DIGIT = re.compile(r"\d")


def unlabelled(line: str) -> bool:
    """No label can start this line (a few C-speed tests; False: look with the expressions below). Every label
    starts with "[" (torch, torchrun, mpirun, mldebug launch), a time stamp then "[", spaces or digits then
    ": " (srun), or holds "[stdout] "/"[stderr] " (a stream tag); most lines of a training log start
    otherwise, and a job of 16k ranks hands over half a million of them."""
    if "[std" in line:
        return False
    c = line[:1]
    if c in _DIGITS:
        if not c:
            return False
        rest = line.lstrip(_DIGITS)
        if rest[:1].isdigit() or rest.startswith(": "):
            return False
        # a time stamp is under 64 characters and only a label's "[" after it makes it one; a label holds a
        # number ("[default3]", "[rank3]", "[1,3]"), a logger's level does not ("[WARNING]")
        p = line.find("[", 0, 64)
        if p < 0:
            return True
        q = line.find("]", p, p + 120)
        return q >= 0 and _DIGIT.search(line, p, q) is None
    if c == " ":  # srun right-aligns its task: "  3: ..."; a traceback's indented lines start so too
        rest = line.lstrip(" ")
        return not rest[:1].isdigit()
    return c != "[" and c != "(" and not c.isdigit()


def split_label(line: str, node_prefix: bool = False) -> Label:
    """The labels at the start of ``line`` and the text after them (``node_prefix``: the source's lines start
    with a node's name, as pdsh writes them)."""
    if not node_prefix and unlabelled(line):
        return Label(_NOBODY, "", line)
    if line[:1] == "(":  # Ray's log monitor: "(RayTrainWorker pid=81234, ip=10.0.0.12) ...": the worker's node
        ray = _RAY.match(line)
        if ray is None:
            return Label(_NOBODY, "", line)
        return Label(Who(None, ray.group("ip"), None), ray.group(0), line[ray.end():])
    rank = local = task = None
    node: str | None = None
    pos = front = 0  # front: where the labels start, after a time stamp
    stamp = ""
    if line[:1].isdigit():  # kubectl logs --timestamps, docker logs -t: a time stamp before the launcher's label
        st = _STAMP_PREFIX.match(line)
        if st and line.startswith("[", st.end()):
            stamp, pos = st.group(0), st.end()
            front = pos
    if node_prefix:
        m0 = NODE_PREFIX.match(line, pos)
        if m0:
            node = m0.group(1)
            pos = m0.end()
    # each expression is tried only where its first characters are (the same answers, fewer calls)
    mk = _KUBECTL.match(line, pos) if line.startswith("[pod/", pos) else None
    if mk:
        node, pos = mk.group("pod"), mk.end()
        st = _STAMP_PREFIX.match(line, pos) if line[pos:pos + 1].isdigit() else None
        if st and line.startswith("[", st.end()):  # its --timestamps: the stamp, then the launcher's labels
            stamp, line = st.group(0), line[:pos] + line[st.end():]
    ms = _STREAM_TAG.match(line, pos) if "[std" in line else None
    if ms:
        if ms.group("src") and node is None:
            node = ms.group("src").rsplit(".", 1)[-1]  # <job>.<node>: the node is the last part
        pos = ms.end()
    c = line[pos:pos + 1]
    m = _SRUN.match(line, pos) if c == " " or c.isdigit() else None
    if m:
        task = int(m.group(1))
        pos = m.end()
    mt = _MPI_TAG.match(line, pos) if line.startswith("[", pos) else None
    if mt:
        rank = int(mt.group(1))
        pos = mt.end()
    m2 = _TORCH_RANK.match(line, pos) if line.startswith("[rank", pos) else None
    if not m2:
        m1 = _ROLE.match(line, pos) if line.startswith("[", pos) else None
        # "[1]:" alone is torchrun's failure summary numbering its entries, not a label; "[node3:41234] " (no colon,
        # 5 digits or more) is Open MPI's host and pid ("[%s:%05d] ", its signal handler's lines), not a local rank
        if m1 and ((m1.group("role") and (m1.group("colon") or len(m1.group("local")) < 5))
                   or (m1.group("colon") and m1.end() < len(line))):
            role = m1.group("role")
            local = int(m1.group("local"))
            if m1.group("rank") is not None:
                rank = int(m1.group("rank"))
            if role and not m1.group("colon") and role[-1] in "-_":
                node, local = role + m1.group("local"), None  # "[job-master-0] ": a pod's name (kubetail, PAI)
            elif role and role[-1] in _ROLE_SEPARATORS and len(role) > 1:
                node = role[:-1]
            elif task is not None and node is None:
                node = srun_task_node(task)  # srun started one agent per node: the task is a node
            pos = m1.end()
        m2 = _TORCH_RANK.match(line, pos) if line.startswith("[rank", pos) else None
    if m2:
        rank = int(m2.group(1))
        pos = m2.end()
        while (again := _TORCH_RANK.match(line, pos)) and again.group(1) == m2.group(1):
            pos = again.end()  # "[rank0]:[rank0]: ...": two layers each added the prefix
    if task is not None and local is None and rank is None and not m2:
        rank = task  # srun started the ranks themselves: the task id is the rank
    if stamp and pos == front:
        return Label(_NOBODY, "", line)  # a time stamp, then no label ("... [INFO] ..."): a line of its own
    key = line[front:pos]
    if m2 and local is not None:
        key = line[front:m2.start()]  # the stream is the launcher's label; torch's [rankN] is not on every line
    who = _NOBODY if rank is None and node is None and local is None else Who(rank, node, local)
    return Label(who, key, line[pos:], task, m2 is not None, stamp)


# ANSI escape sequences (colour: Python 3.13 tracebacks, coloured loggers): CSI, OSC, and two-byte ones.
_ANSI = re.compile(r"\x1b(?:\[[0-?]*[ -/]*[@-~]|\][^\x07\x1b]*(?:\x07|\x1b\\)?|[@-Z\\-_])")


def strip_ansi(line: str) -> str:
    """``line`` without its colour codes (the caller only calls it on lines that hold an ESC)."""
    return _ANSI.sub("", line)


# ----------------------------------------------------------------------------- time stamps

_MONTHS = "Jan Feb Mar Apr May Jun Jul Aug Sep Oct Nov Dec".split()
# A time stamp written in front of a program's own line by what collected it: kubectl logs --timestamps
# and docker logs -t (RFC 3339), moreutils' ts (``Nov 25 04:00:00``), a logger's ``[2026-11-25 04:00:00]``.
_STAMP_PREFIX = re.compile(r"\[?(?:\d{4}-\d\d-\d\d[T _]\d\d:\d\d:\d\d(?:[.,]\d{1,9})?(?:Z|[+-]\d\d:?\d\d)?"
                           r"|(?:" + "|".join(_MONTHS) + r") +\d{1,2} \d\d:\d\d:\d\d(?:[.,]\d{1,9})?"
                           r"|\d\d:\d\d:\d\d(?:[.,]\d{1,9})?)\]?:? ")


def unstamped(lab: Label) -> Label:
    """``lab`` with the time stamp in front of its text (if any) moved to ``stamp``."""
    m = _STAMP_PREFIX.match(lab.rest)
    if not m:
        return lab
    return lab._replace(rest=lab.rest[m.end():], stamp=m.group(0))


_ISO = re.compile(r"(\d{4})-(\d\d)-(\d\d)[T _](\d\d):(\d\d):(\d\d)(?:[.,](\d{1,9}))?(Z|[+-]\d\d:?\d\d)?")
_GLOG = re.compile(r"(?<![\w])[IWEF](\d\d)(\d\d) (\d\d):(\d\d):(\d\d)\.(\d{1,9})")
_SYSLOG = re.compile(r"\b(" + "|".join(_MONTHS) + r") +(\d{1,2}) (\d\d):(\d\d):(\d\d)")
_CLOCK = re.compile(r"(?<![\d:.])(\d\d):(\d\d):(\d\d)(?:[.,](\d{1,9}))?(?![\d:])")


def _fraction(digits: str | None) -> float:
    return float("0." + digits) if digits else 0.0


def _local(year: int, month: int, day: int, hh: int, mm: int, ss: int, frac: float) -> float | None:
    t = _local_second(year, month, day, hh, mm, ss)
    return None if t is None else t + frac


@functools.lru_cache(maxsize=4096)
def _local_second(year: int, month: int, day: int, hh: int, mm: int, ss: int) -> float | None:
    """The Unix time of a local date and time (kept: the ranks of a job log the same seconds, and the
    local-time conversion is most of what reading a time stamp costs)."""
    try:
        return _dt.datetime(year, month, day, hh, mm, ss).timestamp()
    except (ValueError, OverflowError):
        return None


YEAR_SLACK = _dt.timedelta(days=2)
"""How far past the file's day a stamp without a year may be and still be of that year (the writer's
time zone may be ahead of the reader's)."""


def _year_of(month: int, day: int, default_day: _dt.date) -> int:
    """The year of a stamp that has none (glog's ``E1231``, syslog's ``Dec 31``): the file's, unless that puts
    the stamp after the file was last written (a job that ran across New Year, logs read in January)."""
    try:
        later = _dt.date(default_day.year, month, day) > default_day + YEAR_SLACK
    except ValueError:  # February 29 of another year, or no such day
        return default_day.year
    return default_day.year - 1 if later else default_day.year


def find_time(text: str, default_day: _dt.date) -> float | None:
    """The Unix time of the first time stamp in ``text`` (local time unless it says its zone), or None."""
    m = _ISO.search(text)
    if m:
        y, mo, d, hh, mi, ss = map(int, m.groups()[:6])
        frac = _fraction(m.group(7))
        zone = m.group(8)
        if zone:
            try:
                tz = _dt.timezone.utc if zone == "Z" else _dt.timezone(
                    _dt.timedelta(hours=int(zone[1:3]), minutes=int(zone[-2:])) * (1 if zone[0] == "+" else -1))
                return _dt.datetime(y, mo, d, hh, mi, ss, tzinfo=tz).timestamp() + frac
            except ValueError:
                return None
        return _local(y, mo, d, hh, mi, ss, frac)
    m = _GLOG.search(text)
    if m:
        mo, d, hh, mi, ss = map(int, m.groups()[:5])
        return _local(_year_of(mo, d, default_day), mo, d, hh, mi, ss, _fraction(m.group(6)))
    m = _SYSLOG.search(text)
    if m:
        mo = _MONTHS.index(m.group(1)) + 1
        d, hh, mi, ss = map(int, m.groups()[1:5])
        return _local(_year_of(mo, d, default_day), mo, d, hh, mi, ss, 0.0)
    m = _CLOCK.search(text)
    if m:
        hh, mi, ss = map(int, m.groups()[:3])
        if hh < 24 and mi < 60 and ss < 61:
            return _local(default_day.year, default_day.month, default_day.day, hh, mi, min(ss, 59),
                          _fraction(m.group(4)))
    return None


def stamped(text: str) -> bool:
    """A time stamp's shape is in ``text``: what :func:`find_time` reads, without working out the time (a line
    that looks like a log line)."""
    if _ISO.search(text) or _GLOG.search(text) or _SYSLOG.search(text):
        return True
    m = _CLOCK.search(text)
    return m is not None and int(m.group(1)) < 24 and int(m.group(2)) < 60 and int(m.group(3)) < 61


SHOWN_CHARS = 300


def brief(message: str) -> str:
    """``message`` as a line of the human view shows it: cut at SHOWN_CHARS, the cut marked with ``…``
    (the whole message stays in the JSON document, and in the tracebacks that --full shows)."""
    return message if len(message) <= SHOWN_CHARS else message[:SHOWN_CHARS - 1] + "…"


def clock(t: float | None) -> str:
    """``03:14:07`` (local time), or ``-``."""
    return "-" if t is None else _dt.datetime.fromtimestamp(t).strftime("%H:%M:%S")

