"""`mldebug logs --slurm-job J` as a library call: gather every source a job left, then one verdict.

1. Slurm: ``scontrol show job -o J`` while slurmctld knows the job, ``sacct`` per step and node, and
   ``sacctmgr show event`` for the nodes that went down while it ran (each a bounded helper command).
2. The files it left (:mod:`~ml_debug.postmortem.jobfiles`), read by `mldebug logs`' own engine
   (``ml_debug.logs.triage``: this package uses its public report, never its internals).
3. Its nodes (:mod:`~ml_debug.postmortem.nodes`): the kernel logs since it started and the Flight
   Recorder dumps written there.
4. The Flight Recorder dumps among the paths, under the WorkDir and from the nodes
   (:mod:`~ml_debug.postmortem.frdumps`), analysed across ranks.
5. :func:`ml_debug.postmortem.verdict.decide`.

Every source that could not be read is said with its reason; none of them is an error by itself.
"""

from __future__ import annotations

import os
import stat
import subprocess
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ml_debug.core.errors import EnvironmentProblem, MLDebugError, UsageError
from ml_debug.postmortem import accounting, frdumps, jobfiles, nodes
from ml_debug.postmortem.options import PostmortemOptions
from ml_debug.postmortem.verdict import PostmortemVerdict, decide, kernel_event_json

QUERY_TIMEOUT_S = 30.0
KERNEL_SLACK_S = 60.0
"""Kernel lines this long after the job ended still count (the OOM killer's, a GPU's late Xid)."""
SCHEMA_BLOCK_VERSION = 1
"""The version of the ``postmortem`` block in the mldebug.logs document."""


@dataclass
class Postmortem:
    """Everything gathered, and the verdict (the ``postmortem`` block of `mldebug logs --json`)."""

    job_id: str | None
    verdict: PostmortemVerdict
    files_read: list[str] = field(default_factory=list)
    files_unreadable: list[dict[str, str]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    slurm: dict[str, Any] | None = None
    accounting: dict[str, Any] | None = None
    kernel: list[dict[str, Any]] = field(default_factory=list)
    flight_recorder: dict[str, Any] | None = None
    logs_error: str | None = None

    @property
    def partial(self) -> bool:
        return bool(self.files_unreadable) or any(not k["readable"] for k in self.kernel)

    def to_json(self) -> dict[str, Any]:
        from ml_debug.core.output import to_jsonable

        return {"version": SCHEMA_BLOCK_VERSION, "job_id": self.job_id, "verdict": to_jsonable(self.verdict),
                "files_read": self.files_read, "files_unreadable": self.files_unreadable, "notes": self.notes,
                "slurm": self.slurm, "accounting": self.accounting, "kernel": self.kernel,
                "flight_recorder": self.flight_recorder, "logs_error": self.logs_error}


def _cmd(argv: list[str]) -> subprocess.CompletedProcess[str] | None:
    from ml_debug.core import bounded

    try:
        return bounded.run(argv, timeout=QUERY_TIMEOUT_S)
    except (FileNotFoundError, subprocess.TimeoutExpired):
        return None


def slurm_record(job_id: str) -> tuple[dict[str, str] | None, accounting.Accounting | None, list[str]]:
    """(scontrol's record or None, sacct's accounting or None, notes on what could not be asked)."""
    notes = []
    fields = None
    sc = _cmd(["scontrol", "show", "job", "-o", job_id])
    if sc is None:
        notes.append("scontrol did not answer (not installed, or slurmctld unreachable)")
    elif sc.returncode == 0:
        fields = jobfiles.parse_scontrol(sc.stdout) or None
    acc = None
    sa = _cmd(["sacct", "-j", job_id, "-a", "--parsable2", "--noheader", "-o", ",".join(accounting.SACCT_FIELDS)])
    if sa is None:
        notes.append("sacct did not answer")
    elif sa.returncode != 0:
        why = (sa.stderr.strip().splitlines() or ["no reason given"])[-1]
        notes.append(f"sacct failed: {why} (is accounting (slurmdbd) configured?)")
    else:
        acc = accounting.parse_sacct(sa.stdout, job_id)
        if acc.job is None:
            notes.append(f"sacct has no record of job {job_id}")
            acc = None
    if acc is not None and acc.job is not None and acc.job.nodes:
        start = acc.job.raw.get("Start", "")
        argv = ["sacctmgr", "-n", "-P", "show", "event", f"nodes={','.join(acc.job.nodes)}",
                "format=" + ",".join(accounting.EVENT_FIELDS)]
        if start and start not in ("Unknown", "None"):
            argv.append(f"start={start}")
        ev = _cmd(argv)  # no end= : sacctmgr leaves out an event that starts in the job's last second
        if ev is not None and ev.returncode == 0:
            acc.node_events = accounting.parse_events(ev.stdout)
    if sc is None and sa is None:
        raise EnvironmentProblem(f"slurm job {job_id}: neither scontrol nor sacct answered ({'; '.join(notes)})",
                                 "run on a login node of the cluster (Slurm's client tools on PATH, SLURM_CONF set)")
    if fields is None and acc is None:
        raise UsageError(f"slurm job {job_id}: neither scontrol nor sacct knows it",
                         "; ".join(notes) or "check the id with `sacct -j ID` or `squeue -j ID`")
    return fields, acc, notes


def _node_spec(opts: PostmortemOptions, job_nodes: list[str], running: bool, job_id: str | None) -> Any:
    from ml_debug.remote.options import resolve_targets
    from ml_debug.remote.targets import Target, TargetSpec

    if opts.hosts is not None:
        return resolve_targets(hosts=opts.hosts, ssh_config=opts.ssh_config, connect_timeout=min(10.0, opts.node_timeout))
    if running and job_id:
        return TargetSpec(kind="slurm", targets=[Target(host=n) for n in job_nodes], slurm_job=job_id)
    return None


def run(opts: PostmortemOptions, paths: list[str], triage: Callable[[list[str]], Any],
        on_step: Callable[[str], None] | None = None) -> tuple[Any, Postmortem]:
    """Gather and judge (see the module docstring): (the logs' report or None, the post-mortem).

    ``triage`` is `mldebug logs`' own library call on a list of paths (``ml_debug.logs.triage.triage``)."""
    step = on_step or (lambda _: None)
    notes: list[str] = []
    fields = None
    acc = None
    jf = None
    job_nodes: list[str] = []
    since: float | None = None
    running = False
    if opts.slurm_job:
        step("asking Slurm")
        fields, acc, more = slurm_record(opts.slurm_job)
        notes += more
        jstart = acc.job.start if acc and acc.job else None
        jend = acc.job.end if acc and acc.job else None
        nodelist = ",".join(acc.job.nodes) if acc and acc.job else None
        jf = jobfiles.gather(opts.slurm_job, fields, acc.workdir if acc else None, jstart, jend, nodelist)
        notes += jf.notes
        jf.user = jf.user or (acc.user if acc else None)
        from ml_debug.remote.hostlist import expand_hostlist

        # every node the job had, by every record (a job line read as the job ends may name fewer)
        named = [*(expand_hostlist(jf.nodes) if jf.nodes and jf.nodes not in ("(null)", "None assigned") else []),
                 *(n for s in ([acc.job] if acc and acc.job else []) + (acc.steps if acc else []) for n in s.nodes)]
        job_nodes = sorted(dict.fromkeys(named))
        since = jf.start or jstart
        running = (jf.state or (acc.job.state if acc and acc.job else "")) == "RUNNING"
    # the paths: the user's, then what the job left (those its user could have planted, refused); dumps apart
    refused: list[dict[str, str]] = []
    job_paths = []
    for p in (jf.logs if jf else []):
        why = untrusted(p, jf.user if jf else None)
        if why:
            refused.append({"path": p, "reason": why})
        else:
            job_paths.append(p)
    candidates = list(paths) + job_paths
    dump_files = frdumps.find(candidates + (jf.dumps if jf else []), prefix=opts.fr_prefix)
    dump_paths = {os.path.abspath(d.path) for d in dump_files}
    log_paths = [p for p in dict.fromkeys(candidates)
                 if p == "-" or (os.path.abspath(p) not in dump_paths and not
                                 (os.path.isfile(p) and frdumps.is_dump_path(p, opts.fr_prefix)))]
    unreadable: list[dict[str, str]] = list(refused)
    report = None
    logs_error = None
    if log_paths:
        step("reading logs")
        missing = [p for p in log_paths if p != "-" and not os.path.lexists(p)]
        for p in missing:
            unreadable.append({"path": p, "reason": "no such file here (written on another machine, or removed?)"})
        present = [p for p in log_paths if p not in missing]
        if present:
            try:
                report = triage(present)
            except UsageError as e:
                logs_error = str(e)
    else:
        logs_error = "no log file found"
    if report is not None:
        unreadable += [{"path": s.get("path", "?"), "reason": s.get("reason", "?")} for s in report.skipped]
    # dumps inside the archives named (the logs' reading of the same archive says what in it was damaged)
    with frdumps.unpacked(list(paths), opts.fr_prefix) as (archived, damaged):
        in_archives = frdumps.read(archived)
    unreadable += [d for d in damaged if d["path"] not in {u["path"] for u in unreadable}]
    # the nodes
    evidence: list[nodes.NodeEvidence] = []
    if opts.kernel_logs and (job_nodes or opts.hosts):
        step("reading the nodes' kernel logs and dumps")
        prefixes = list(dict.fromkeys([*([opts.fr_prefix] if opts.fr_prefix else []),
                                       *frdumps.default_prefixes()]))
        t0 = since if since is not None else 0.0
        end = (jf.end if jf else None) or (acc.job.end if acc and acc.job else None)
        until = end + KERNEL_SLACK_S if end is not None and not running else None
        spec = _node_spec(opts, job_nodes, running, opts.slurm_job)
        try:
            if spec is not None:
                evidence = nodes.fetch_over(spec, t0, prefixes, opts.node_timeout, until)
            else:
                part = acc.job.raw.get("Partition") if acc and acc.job else None
                evidence = nodes.fetch_new_step(job_nodes, t0, prefixes, opts.node_timeout, part or None, until)
        except (EnvironmentProblem, UsageError):
            raise
        except MLDebugError as e:
            notes.append(f"the nodes could not be asked: {e}")
    # Flight Recorder: local files and those the nodes sent
    fr = frdumps.read(dump_files) if dump_files else frdumps.FrSource()
    fr.files += in_archives.files
    fr.records += in_archives.records
    fr.unreadable += in_archives.unreadable
    for ev in evidence:
        for path, why in ev.dump_errors.items():
            fr.unreadable.append({"path": f"{ev.node}:{path}", "reason": why})
    local_ranks = {r["rank"] for r in fr.records}
    for node, path, data in nodes.unique_dumps(evidence):
        rank, _ = frdumps.rank_from_name(path, opts.fr_prefix)
        if rank in local_ranks:
            continue  # the same rank's file, seen here too (a shared file system)
        fr.files.append(frdumps.DumpFile(f"{node}:{path}", rank, "node", host=node))
        fr.records.append(frdumps.record_of(data, rank, f"{node}:{path}", node))
    frdumps.analysed(fr)
    judgement = accounting.judge(acc) if acc else None
    kernel_logs = [ev.kernel for ev in evidence]
    pid_ranks = _pid_ranks(report)
    verdict = decide(report, judgement, kernel_logs, fr if fr.records else None, job_nodes, pid_ranks)
    read = [s.path for s in report.sources] if report is not None else []
    read += [f.path for f in fr.files if f.path not in {u["path"] for u in fr.unreadable}]
    pm = Postmortem(job_id=opts.slurm_job, verdict=verdict, files_read=read,
                    files_unreadable=unreadable + fr.unreadable, notes=notes, logs_error=logs_error)
    if opts.slurm_job:
        pm.slurm = {"known_by": jf.known_by if jf else None, "state": (fields or {}).get("JobState") or
                    (acc.job.state if acc and acc.job else None), "workdir": jf.workdir if jf else None,
                    "stdout": jf.stdout if jf else None, "stderr": jf.stderr if jf else None,
                    "nodes": job_nodes, "start": since}
    if acc is not None and judgement is not None:
        from ml_debug.core.output import to_jsonable

        pm.accounting = {"judgement": to_jsonable(judgement),
                         "steps": [_step_json(s) for s in ([acc.job] if acc.job else []) + acc.steps],
                         "node_events": to_jsonable(acc.node_events)}
    pm.kernel = [{"node": k.node, "source": k.source, "readable": k.readable, "reason": k.reason, "lines": k.lines,
                  "events": [kernel_event_json(e) for e in k.events]} for k in kernel_logs]
    if fr.records or fr.unreadable:
        pm.flight_recorder = {**(fr.section or {}), "files": [f.path for f in fr.files]}
    return report, pm


def untrusted(path: str, user: str | None) -> str | None:
    """Why a path the job's record names is not read (mldebug often runs as root on other users' jobs): a
    symbolic link at its end, or a file of another user than the job's. None when it may be read."""
    import pwd

    try:
        st = os.lstat(path)
    except OSError:
        return None  # missing: said when it is read
    if stat.S_ISLNK(st.st_mode):
        return "a symbolic link: a path from the job's record is not followed"
    if user and os.geteuid() == 0:
        try:
            uid = pwd.getpwnam(user).pw_uid
        except KeyError:
            return None
        if st.st_uid not in (uid, 0):
            return f"owned by uid {st.st_uid}, not by the job's user {user}: not read"
    return None


def _step_json(s: accounting.Step) -> dict[str, Any]:
    return {"id": s.id, "name": s.name, "state": s.state, "cancelled_by": s.cancelled_by, "exit_code": s.exit_code,
            "signal": s.signal, "nodes": s.nodes, "ntasks": s.ntasks, "layout": s.layout, "max_rss": s.max_rss,
            "max_rss_node": s.max_rss_node, "max_rss_task": s.max_rss_task, "req_mem": s.req_mem,
            "start": s.start, "end": s.end}


def _pid_ranks(report: Any) -> dict[tuple[str, int], int]:
    """(node, pid) -> rank, where the logs name a rank's pid (torchrun's failure lines)."""
    out: dict[tuple[str, int], int] = {}
    if report is None:
        return out
    for e in report.events:
        pid = e.detail.get("pid") if isinstance(e.detail, dict) else None
        if isinstance(pid, int) and e.who.rank is not None and e.who.node:
            out[(e.who.node, pid)] = e.who.rank
    return out
