"""What the exporter knows at one moment, as plain data: the ranks of this node with the decisions of
`mldebug watch`, the last health run, and the exporter's own health.

A scrape reads the last :class:`Snapshot`; the sampling threads build a new one and swap it in whole,
so a scrape never waits for a sample and never sees half of one.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

from ml_debug.core.nvml import is_na
from ml_debug.sampling.sample import NodeSample, RankSample

RANKS = "ranks"
HEALTH = "health"
SOURCES = (RANKS, HEALTH)


@dataclass(frozen=True)
class RankValues:
    """One live rank process of this node, as its series show it."""

    job_id: str
    rank: str  # the global rank, or "pid<N>" for a process without rank variables
    pid: int
    local_rank: int | None
    world_size: int | None
    status: str  # the Tracker's: ok | stalled | straggler
    stalled: bool
    straggler: bool
    judged: bool  # past its --grace
    seconds_since_progress: float
    last_progress: float  # wall-clock time
    progress_why: str
    step: int | None
    steps_per_second: float | None
    progress_file_error: str | None
    cpu_ratio: float | None  # 1.0 = one core
    rss_bytes: int | None
    gpus: tuple[tuple[int, float | None], ...] = ()  # (GPU index, utilisation 0..1)

    def as_dict(self) -> dict[str, Any]:
        return {"job_id": self.job_id, "rank": self.rank, "pid": self.pid, "local_rank": self.local_rank,
                "world_size": self.world_size, "status": self.status, "stalled": self.stalled,
                "straggler": self.straggler, "judged": self.judged,
                "seconds_since_progress": round(self.seconds_since_progress, 1),
                "last_progress": round(self.last_progress, 3), "progress_why": self.progress_why, "step": self.step,
                "steps_per_second": self.steps_per_second, "progress_file_error": self.progress_file_error,
                "cpu_ratio": self.cpu_ratio, "rss_bytes": self.rss_bytes,
                "gpus": [{"index": i, "utilization_ratio": u} for i, u in self.gpus]}


@dataclass(frozen=True)
class CheckValue:
    """One health check's verdict."""

    check: str  # "gpu.ecc_mode", "host.swap"
    target: str  # "gpu0", "host", "node", "/tmp"
    gpu: str  # "0" for a GPU's check, "" otherwise
    status: str  # pass | warn | fail | skip | info
    value: str

    def as_dict(self) -> dict[str, Any]:
        return {"check": self.check, "target": self.target, "gpu": self.gpu, "status": self.status,
                "value": self.value}


@dataclass(frozen=True)
class GpuValues:
    """One GPU's counters and link state from the health run's NVML snapshot (None: not reported)."""

    index: int
    name: str
    fields: dict[str, Any]  # nvidia-smi field names, N/A as None
    xids: dict[int, int]  # Xid -> events in the kernel log
    xid_readable: bool

    def as_dict(self) -> dict[str, Any]:
        return {"index": self.index, "name": self.name, "fields": self.fields,
                "xids": {str(k): v for k, v in self.xids.items()}, "xid_readable": self.xid_readable}


@dataclass(frozen=True)
class SourceHealth:
    """The exporter's own view of one of its two samplers."""

    samples: int = 0
    errors: int = 0
    last_time: float | None = None  # wall-clock time the last sample ended
    last_duration_s: float | None = None
    last_error: str | None = None
    running_since: float | None = None  # a sample under way (health runs), wall-clock
    hung: bool = False

    def as_dict(self) -> dict[str, Any]:
        return {"samples": self.samples, "errors": self.errors, "last_time": self.last_time,
                "last_duration_s": self.last_duration_s, "last_error": self.last_error,
                "running_since": self.running_since, "hung": self.hung}


@dataclass(frozen=True)
class Snapshot:
    node: str
    version: str
    ranks: tuple[RankValues, ...] = ()
    progress_files: dict[str, int] = field(default_factory=lambda: {"ok": 0, "unreadable": 0, "missing": 0})
    checks: tuple[CheckValue, ...] = ()
    gpus: tuple[GpuValues, ...] = ()
    health_summary: str | None = None
    sources: dict[str, SourceHealth] = field(default_factory=lambda: {s: SourceHealth() for s in SOURCES})

    def with_source(self, name: str, health: SourceHealth) -> Snapshot:
        return replace(self, sources={**self.sources, name: health})

    def as_dict(self, now: float) -> dict[str, Any]:
        return {"node": self.node, "version": self.version, "ranks": [r.as_dict() for r in self.ranks],
                "progress_files": dict(self.progress_files), "checks": [c.as_dict() for c in self.checks],
                "gpus": [g.as_dict() for g in self.gpus], "health_summary": self.health_summary,
                "exporter": {k: {**v.as_dict(), "running_s": None if v.running_since is None else
                                 round(max(0.0, now - v.running_since), 1)} for k, v in self.sources.items()}}


# -- ranks -------------------------------------------------------------------------------------------
def job_id_of(env: dict[str, str] | None, launcher_pid: int | None, override: str | None) -> str:
    """The job a rank belongs to: --job, else its Slurm job, else torchrun's run id, else its launcher."""
    if override:
        return override
    env = env or {}
    if env.get("SLURM_JOB_ID"):
        return env["SLURM_JOB_ID"]
    run_id = env.get("TORCHELASTIC_RUN_ID")
    if run_id and run_id != "none":
        return run_id
    return f"pid{launcher_pid}" if launcher_pid is not None else ""


def _ratio(pct: Any) -> float | None:
    return None if pct is None else round(float(pct) / 100.0, 4)


def split_by_job(sample: NodeSample, targets: list[Any], override: str | None) -> dict[str, NodeSample]:
    """One node sample per job: the same sample with only that job's rank rows. Each job is judged on its
    own (its median step rate is its own ranks', as when watch looks at one job)."""
    by_pid = {t.pid: t for t in targets}
    rows: dict[str, list[RankSample]] = {}
    for row in sample.ranks:
        t = by_pid.get(row.pid)
        job_id = job_id_of(getattr(t, "env", None), getattr(t, "launcher_pid", None), override)
        rows.setdefault(job_id, []).append(row)
    return {job_id: replace(sample, ranks=r) for job_id, r in rows.items()}


def rank_values(tracker: Any, sample: NodeSample, now: float, *, job_id: str, grace: float,
                is_exited: Callable[[str], bool]) -> list[RankValues]:
    """The live ranks of one job's Tracker (after ``evaluate``) as series values; ``sample``: the job's
    sample the Tracker was given. A rank in its first ``grace`` seconds is never stalled or a straggler;
    ``is_exited``: whether a Tracker status is one of a rank without a process (its series are dropped)."""
    rows = {row.pid: row for row in sample.ranks}
    out: dict[str, RankValues] = {}
    for r in tracker.ranks.values():
        if is_exited(r.status) or r.pid not in rows:
            continue
        label = str(r.rank) if r.rank is not None else f"pid{r.pid}"
        judged = now - r.first_seen >= grace
        f = r.file
        gpus = tuple((int(g["index"]), _ratio(g.get("util_pct"))) for g in r.gpu if g.get("index") is not None)
        v = RankValues(job_id=job_id, rank=label, pid=r.pid, local_rank=r.local_rank, world_size=r.world_size,
                       status=r.status if judged else "ok", stalled=judged and r.status == "stalled",
                       straggler=judged and r.status == "straggler", judged=judged,
                       seconds_since_progress=max(0.0, now - r.last_progress), last_progress=r.last_progress,
                       progress_why=r.progress_why, step=f.step if f else None,
                       steps_per_second=f.rate if f else None, progress_file_error=f.error if f else None,
                       cpu_ratio=_ratio(r.cpu_pct), rss_bytes=rows[r.pid].rss_bytes, gpus=gpus)
        if label not in out or out[label].pid < v.pid:  # two processes with one rank: the newer (a restart) wins
            out[label] = v
    return sorted(out.values(), key=lambda v: (len(v.rank), v.rank))


def progress_file_counts(sample: NodeSample) -> dict[str, int]:
    """How many of the files --progress-file names could be read now, could not, or are not there."""
    files = [r.progress for r in sample.ranks if r.progress] + list(sample.progress)
    bad = sum(1 for f in files if f.error)
    return {"ok": len(files) - bad, "unreadable": bad, "missing": len(sample.progress_missing)}


# -- health ------------------------------------------------------------------------------------------
def _plain(v: Any) -> Any:
    return None if is_na(v) else v


GPU_FIELDS = (
    "ecc.errors.corrected.volatile.total", "ecc.errors.uncorrected.volatile.total",
    "ecc.errors.corrected.aggregate.total", "ecc.errors.uncorrected.aggregate.total",
    "remapped_rows.correctable", "remapped_rows.uncorrectable", "remapped_rows.pending", "remapped_rows.failure",
    "retired_pages.single_bit_ecc.count", "retired_pages.double_bit.count", "retired_pages.pending",
    "recovery_action", "clocks_event_reasons.active", "temperature.gpu",
    "pcie.link.gen.current", "pcie.link.gen.max", "pcie.link.width.current", "pcie.link.width.max",
    "nvlink.active", "nvlink.links", "nvlink.errors",
)
"""The NVML fields of a health run's GPU snapshot that the exporter serves."""


def health_values(report: Any) -> tuple[tuple[CheckValue, ...], tuple[GpuValues, ...], str]:
    """(every check's verdict, every GPU's counters, the summary) of one ``mldebug health`` NodeReport."""
    checks = []
    xid_counts: dict[str, dict[int, int]] = {}
    xid_ok: dict[str, bool] = {}
    for c in report.checks:
        gpu = c.target[3:] if c.target.startswith("gpu") and c.target[3:].isdigit() else ""
        checks.append(CheckValue(c.id, c.target, gpu, str(c.status.value), c.value))
        if c.id == "gpu.xid":
            xid_ok[gpu] = c.status.value != "skip"
            xid_counts[gpu] = {int(k): int(n) for k, n in (c.data.get("counts") or {}).items()}
    gpus = []
    for g in report.gpu.gpus:
        fields = {k: _plain(g.fields.get(k)) for k in GPU_FIELDS}
        gpus.append(GpuValues(g.index, g.name, fields, xid_counts.get(str(g.index), {}),
                              xid_ok.get(str(g.index), False)))
    return tuple(checks), tuple(gpus), report.summary
