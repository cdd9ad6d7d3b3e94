"""Plain data for health results: one :class:`Check` per measurement, one report per node."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ml_debug.core.enums import Word


class Status(Word):
    PASS = "pass"
    WARN = "warn"  # worth a look, does not fail the run
    FAIL = "fail"  # fails the run (exit 1)
    SKIP = "skip"  # could not be measured here (N/A, not readable, needs a higher --level)
    INFO = "info"  # a fact without a verdict


@dataclass
class Check:
    """One check: what was measured, against what, and what to do about it."""

    id: str  # stable key, e.g. "gpu.row_remap"
    target: str  # "host", "node", "gpu3", "/tmp"
    status: Status
    value: str  # the measurement, as a person reads it
    threshold: str  # what passes
    hint: str  # one line: what it means and the next step ("" when it passes)
    source: str  # where the value came from: an NVML call, a /proc file, a test
    data: dict[str, Any] = field(default_factory=dict)  # raw numbers for scripts

    @property
    def label(self) -> str:
        return f"{self.target} {self.id.split('.', 1)[-1]}" if self.target not in ("host", "node") else self.id


@dataclass
class GpuInfo:
    """What NVML said about one GPU; every field a value or "N/A" (reasons in ``na``)."""

    index: int
    name: str
    uuid: str
    bus_id: str
    fields: dict[str, Any]
    na: dict[str, str] = field(default_factory=dict)


@dataclass
class GpuPart:
    """The GPU side of one node: present or not, and why not."""

    present: bool
    message: str  # "8 x NVIDIA H100 80GB HBM3" or "no NVIDIA GPU: ..."
    nvml_source: str
    driver_version: str | None = None
    cuda_driver_version: str | None = None
    gpus: list[GpuInfo] = field(default_factory=list)


@dataclass
class NodeReport:
    """Everything measured on one node, with its verdict."""

    host: str
    level: int
    ok: bool
    summary: str
    exit_code: int
    gpu: GpuPart
    checks: list[Check]
    counts: dict[str, int]
    duration_s: float
    measurements: list[dict[str, Any]] = field(default_factory=list)  # active tests, raw


@dataclass
class Unreachable:
    host: str
    reason: str


@dataclass
class HealthResult:
    """The ``result`` of ``mldebug health --json``: one node locally, many with --hosts/--slurm-job.

    ``nodes`` holds each node's :class:`NodeReport` as JSON data (remote nodes send it that way), with
    ``target``: the name the node was reached by.
    """

    ok: bool
    summary: str
    level: int
    exit_code: int
    nodes: list[dict[str, Any]]
    unreachable: list[Unreachable] = field(default_factory=list)
    cluster_checks: list[Check] = field(default_factory=list)


def count_statuses(checks: list[Check]) -> dict[str, int]:
    out = {s.value: 0 for s in Status}
    for c in checks:
        out[c.status.value] += 1
    return out
