"""What a Slurm job left on disk, found from its id alone.

- Its batch script's StdOut and StdErr, and its WorkDir: from ``scontrol show job -o J`` while slurmctld
  still knows the job (MinJobAge, 300 s by default after it ends), else from ``sacct`` (WorkDir; the
  output is then Slurm's default ``slurm-J.out`` in the WorkDir, or a file there whose name holds the id).
- Under the WorkDir: ``mldebug launch`` directories (``mldebug-logs/J``, or any ``launch.json`` whose
  directory was written while the job ran), torchrun ``--log-dir`` trees (an ``attempt_N`` directory of
  that time), and Flight Recorder dumps (see :mod:`ml_debug.postmortem.frdumps`).

Pure parsing (:func:`parse_scontrol`) is separate from the bounded walk of the WorkDir (:func:`find_under`),
which never follows a link, looks at most :data:`MAX_ENTRIES` names and :data:`MAX_DEPTH` levels down.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from datetime import datetime

MAX_DEPTH = 4
MAX_ENTRIES = 20000
SLACK_S = 120.0
"""A directory written this long before the job started or after it ended still counts as the job's."""

# scontrol -o: one line of Key=Value words; a value may hold spaces (a Command path), so a key is a
# word of letters (and /:) right after a space and before '='
_KEY = re.compile(r"(?:^| )([A-Za-z][A-Za-z0-9_/:]*)=")


def parse_scontrol(text: str) -> dict[str, str]:
    """``scontrol show job -o J``'s line as a dict (the first job's, for an array)."""
    line = next((ln for ln in text.splitlines() if ln.startswith("JobId=")), "")
    out: dict[str, str] = {}
    marks = list(_KEY.finditer(line))
    for i, m in enumerate(marks):
        end = marks[i + 1].start() if i + 1 < len(marks) else len(line)
        out.setdefault(m.group(1), line[m.end():end].strip())
    return out


def _time(text: str | None) -> float | None:
    try:
        return datetime.fromisoformat(text).timestamp() if text and text not in ("Unknown", "None") else None
    except ValueError:
        return None


@dataclass
class JobFiles:
    """Where a job's outputs are, and how that was learnt."""

    job_id: str
    known_by: str
    """scontrol (slurmctld still knows the job), sacct (it does not), or none."""
    state: str | None = None
    workdir: str | None = None
    stdout: str | None = None
    stderr: str | None = None
    nodes: str | None = None
    """The job's nodes as a hostlist (node[1-2])."""
    start: float | None = None
    end: float | None = None
    user: str | None = None
    logs: list[str] = field(default_factory=list)
    """Paths for `mldebug logs` to read: the outputs, launch directories, torchrun log trees."""
    dumps: list[str] = field(default_factory=list)
    """Flight Recorder dump files under the WorkDir."""
    notes: list[str] = field(default_factory=list)
    """What was looked for and not found (said in the report)."""


def from_scontrol(job_id: str, fields: dict[str, str]) -> JobFiles:
    """The job's files from scontrol's record."""
    return JobFiles(job_id=job_id, known_by="scontrol", state=fields.get("JobState"),
                    workdir=fields.get("WorkDir") or None, stdout=fields.get("StdOut") or None,
                    stderr=fields.get("StdErr") or None, nodes=fields.get("NodeList") or None,
                    start=_time(fields.get("StartTime")), end=_time(fields.get("EndTime")),
                    user=(fields.get("UserId") or "").split("(")[0] or None)


def default_outputs(job_id: str, workdir: str | None) -> list[str]:
    """Where the batch output is when only the WorkDir is known: ``slurm-J.out`` (Slurm's default), else the
    WorkDir's files whose name holds the id (``-o %j.out``, ``train-%j.log``)."""
    if not workdir or not os.path.isdir(workdir):
        return []
    default = os.path.join(workdir, f"slurm-{job_id}.out")
    if os.path.isfile(default):
        return [default]
    word = re.compile(rf"(?<!\d){re.escape(job_id)}(?!\d)")
    out = []
    try:
        with os.scandir(workdir) as it:
            for n, e in enumerate(it):
                if n > MAX_ENTRIES:
                    break
                if word.search(e.name) and e.is_file(follow_symlinks=False) and \
                        e.name.endswith((".out", ".err", ".log", ".txt")):
                    out.append(e.path)
    except OSError:
        return []
    return sorted(out)


def find_under(workdir: str, job_id: str, start: float | None, end: float | None) -> tuple[list[str], list[str]]:
    """(log directories, Flight Recorder dumps) the job left under its WorkDir: ``mldebug launch``
    directories and torchrun ``--log-dir`` trees of the job's time, dumps named as such."""
    from ml_debug.postmortem.frdumps import rank_from_name

    logs: list[str] = []
    dumps: list[str] = []
    launch = os.path.join(workdir, "mldebug-logs", job_id)
    if os.path.isdir(launch) and not os.path.islink(launch):
        logs.append(launch)
    lo = (start - SLACK_S) if start else None
    hi = (end + SLACK_S) if end else None

    def in_time(path: str) -> bool:
        try:
            t = os.lstat(path).st_mtime
        except OSError:
            return False
        return (lo is None or t >= lo) and (hi is None or t <= hi)

    seen = 0
    base = workdir.rstrip("/").count("/")
    for root, dirs, files in os.walk(workdir, followlinks=False):
        depth = root.rstrip("/").count("/") - base
        seen += len(dirs) + len(files)
        if depth >= MAX_DEPTH or seen > MAX_ENTRIES:
            dirs[:] = []
        if any(root == p or root.startswith(p + "/") for p in logs):
            dirs[:] = []
            continue
        if "launch.json" in files and in_time(root):
            # an `mldebug launch` host directory: its parent holds every host's
            logs.append(os.path.dirname(root))
            dirs[:] = []
            continue
        attempts = [d for d in dirs if re.fullmatch(r"attempt_\d+", d)]
        if attempts and any(in_time(os.path.join(root, d)) for d in attempts):
            logs.append(root)  # a torchelastic run directory (<run id>_<random>/attempt_N/<rank>/...)
            dirs[:] = []
            continue
        dumps += [os.path.join(root, f) for f in files if rank_from_name(f)[1] is not None
                  and in_time(os.path.join(root, f))]
    return sorted(dict.fromkeys(logs)), sorted(dumps)


def gather(job_id: str, fields: dict[str, str] | None, sacct_workdir: str | None, sacct_start: float | None,
           sacct_end: float | None, nodes: str | None = None) -> JobFiles:
    """Every path the job left that this machine can see (scontrol's record when there is one, else sacct's)."""
    if fields:
        jf = from_scontrol(job_id, fields)
    else:
        jf = JobFiles(job_id=job_id, known_by="sacct" if sacct_workdir else "none", workdir=sacct_workdir,
                      start=sacct_start, end=sacct_end, nodes=nodes)
        jf.notes.append("slurmctld no longer knows the job: its output files are looked for in its WorkDir "
                        "(sacct keeps no StdOut path in Slurm 22.05)")
    outs = [p for p in dict.fromkeys([jf.stdout, jf.stderr]) if p]
    if not outs:
        outs = default_outputs(job_id, jf.workdir)
        if not outs and jf.workdir:
            jf.notes.append(f"no slurm-{job_id}.out nor a file named with the job id in {jf.workdir}")
    jf.logs = list(outs)
    if jf.workdir and os.path.isdir(jf.workdir):
        logs, dumps = find_under(jf.workdir, job_id, jf.start, jf.end)
        jf.logs += [p for p in logs if p not in jf.logs]
        jf.dumps = dumps
    elif jf.workdir:
        jf.notes.append(f"the WorkDir {jf.workdir} is not a directory here (another machine's file system?)")
    return jf
