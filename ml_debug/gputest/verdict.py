"""The data of a gpu-test run and the pure logic that turns per-rank records into one verdict.

No torch here: the identity layout checks, the verdict, the hints and the table rows are plain
functions over dataclasses, so they are unit-testable and shared by the ranks and --isolate.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from dataclasses import dataclass, field
from typing import Any

from ml_debug.core.enums import Word
from ml_debug.core.errors import ExitCode

STAGES = ("device", "alloc", "rendezvous", "init", "all_reduce", "all_gather", "broadcast", "p2p_ring",
          "barrier")
LOCAL_STAGES = ("device", "alloc")
class StageStatus(Word):
    """How one stage ended on one rank."""

    OK = "ok"
    FAIL = "fail"
    TIMEOUT = "timeout"
    SKIPPED = "skipped"
    ABSENT = "absent"  # the rank never sent its record


OK, FAIL, TIMEOUT, SKIPPED, ABSENT = StageStatus


@dataclass
class StageResult:
    name: str
    status: StageStatus
    seconds: float | None = None
    detail: str = ""


@dataclass
class Identity:
    rank: int
    world_size: int
    local_rank: int
    local_world_size: int
    node_rank: int
    host: str
    pid: int
    launcher: str
    device: str = "cpu"
    backend: str = ""
    gpu_name: str | None = None
    gpu_uuid: str | None = None
    capability: str | None = None  # "9.0"


@dataclass
class RankReport:
    identity: Identity
    stages: list[StageResult] = field(default_factory=list)
    answered: bool = True  # False: built by the reporter for a rank that never sent its result
    note: str = ""

    @property
    def ok(self) -> bool:
        return self.answered and all(s.status in (OK, SKIPPED) for s in self.stages) and \
            any(s.status == OK for s in self.stages)

    def stage(self, name: str) -> StageResult | None:
        return next((s for s in self.stages if s.name == name), None)

    def first_problem(self) -> StageResult | None:
        return next((s for s in self.stages if s.status in (FAIL, TIMEOUT, ABSENT)), None)


@dataclass
class Versions:
    torch: str
    cuda: str | None
    nccl: str | None
    cudnn: str | None
    arch_list: list[str]


@dataclass
class Failure:
    rank: int
    host: str
    stage: str
    status: str
    detail: str


@dataclass
class GpuTestResult:
    ok: bool
    summary: str
    exit_code: int
    world_size: int
    hosts: list[str]
    launcher: str
    backend: str
    stage_timeout_s: float
    elapsed_s: float
    reporter_rank: int
    versions: Versions | None
    ranks: list[RankReport]
    failures: list[Failure]
    missing_ranks: list[int]
    warnings: list[str]
    hints: list[str]


def identity_from_dict(d: dict[str, Any]) -> Identity:
    return Identity(**{k: d.get(k) for k in Identity.__dataclass_fields__})  # type: ignore[arg-type]


def report_from_dict(d: dict[str, Any]) -> RankReport:
    stages = [StageResult(**{**s, "status": StageStatus(s["status"])}) for s in d["stages"]]
    return RankReport(identity_from_dict(d["identity"]), stages,
                      d.get("answered", True), d.get("note", ""))


def layout_problems(ids: list[Identity]) -> dict[int, str]:
    """Ranks whose identity contradicts the others: rank -> why (two ranks on one GPU, bad layout)."""
    problems: dict[int, list[str]] = defaultdict(list)
    world = len(ids)
    for i, ident in enumerate(ids):
        if ident.rank != i:
            problems[i].append(f"reports rank {ident.rank} from slot {i}")
        if ident.world_size != world:
            problems[i].append(f"believes the world has {ident.world_size} ranks, not {world}")
    by_gpu: dict[tuple[str, str], list[int]] = defaultdict(list)
    by_slot: dict[tuple[str, int, int], list[int]] = defaultdict(list)
    by_node: dict[tuple[str, int], list[int]] = defaultdict(list)
    node_hosts: dict[int, set[str]] = defaultdict(set)
    for ident in ids:
        if ident.gpu_uuid:
            by_gpu[(ident.host, ident.gpu_uuid)].append(ident.rank)
        by_slot[(ident.host, ident.node_rank, ident.local_rank)].append(ident.rank)
        by_node[(ident.host, ident.node_rank)].append(ident.rank)
        node_hosts[ident.node_rank].add(ident.host)
    for (host, uuid), ranks in by_gpu.items():
        if len(ranks) > 1:
            for r in ranks:
                problems[r].append(f"shares GPU {uuid} on {host} with rank(s) "
                                   f"{', '.join(str(x) for x in ranks if x != r)}")
    for (host, _node, local), ranks in by_slot.items():
        if len(ranks) > 1:
            for r in ranks:
                problems[r].append(f"has local rank {local} on {host}, like rank(s) "
                                   f"{', '.join(str(x) for x in ranks if x != r)}")
    for (host, _node), ranks in by_node.items():
        expected = Counter(ids[r].local_world_size for r in ranks).most_common(1)[0][0]
        if len(ranks) != expected:
            for r in ranks:
                problems[r].append(f"{host} runs {len(ranks)} ranks but LOCAL_WORLD_SIZE is {expected}")
    for node, hosts in node_hosts.items():
        if len(hosts) > 1:
            for ident in ids:
                if ident.node_rank == node:
                    problems[ident.rank].append(f"node rank {node} is claimed by hosts {', '.join(sorted(hosts))}")
    return {r: "; ".join(dict.fromkeys(v)) for r, v in problems.items()}


def arch_fit(capability: str | None, arch_list: list[str]) -> str | None:
    """A warning when torch was not built for this GPU's compute capability (None when it fits)."""
    if not capability or not arch_list:
        return None
    major, minor = (int(x) for x in capability.split("."))
    sm = f"sm_{major}{minor}"
    if sm in arch_list or f"{sm}a" in arch_list:
        return None
    ptx = [a for a in arch_list if a.startswith("compute_")]
    if any(int(a.split("_")[1][:-1]) <= major for a in ptx if a.split("_")[1][:-1].isdigit()):
        return (f"GPU capability {capability} ({sm}) is not in this torch build's arch list "
                f"{' '.join(arch_list)}: kernels JIT-compile from PTX (slow first start)")
    return (f"GPU capability {capability} ({sm}) is not in this torch build's arch list {' '.join(arch_list)}: "
            "kernels will fail with 'no kernel image is available'; install a torch build that lists "
            f"{sm} (torch.cuda.get_arch_list())")


def _ranks_text(ranks: list[int]) -> str:
    return ("rank " if len(ranks) == 1 else "ranks ") + ", ".join(str(r) for r in ranks)


def build_result(reports: list[RankReport], *, launcher: str, backend: str, stage_timeout_s: float,
                 elapsed_s: float, reporter_rank: int, versions: Versions | None,
                 interfaces: list[str] | None = None) -> GpuTestResult:
    """One verdict from every rank's record (absent ranks already filled in by the caller)."""
    reports = sorted(reports, key=lambda r: r.identity.rank)
    hosts = sorted({r.identity.host for r in reports if r.answered}) or sorted({r.identity.host for r in reports})
    failures: list[Failure] = []
    for rep in reports:
        for s in rep.stages:
            if s.status in (FAIL, TIMEOUT, ABSENT):
                failures.append(Failure(rep.identity.rank, rep.identity.host, s.name, s.status, s.detail))
                break  # later stages of a broken rank only repeat the first cause
    missing = [r.identity.rank for r in reports if not r.answered]
    timed_out = any(f.status in (TIMEOUT, ABSENT) for f in failures)
    world = len(reports)
    good = sum(1 for r in reports if r.ok)
    warnings: list[str] = []
    if versions is not None:
        seen: set[str] = set()
        for rep in reports:
            w = arch_fit(rep.identity.capability, versions.arch_list)
            if w and w not in seen:
                seen.add(w)
                warnings.append(w)
    if not failures:
        code = ExitCode.OK
        summary = f"{good}/{world} ranks OK on {len(hosts)} host{'s' if len(hosts) != 1 else ''}"
    else:
        code = ExitCode.PARTIAL if (timed_out or missing) else ExitCode.PROBLEM
        parts = []
        if missing:
            by_stage: dict[str, list[int]] = defaultdict(list)
            for rep in reports:
                if not rep.answered:
                    by_stage[rep.note or "the start"].append(rep.identity.rank)
            for where, ranks in by_stage.items():
                hosts_of = sorted({reports[r].identity.host for r in ranks if r < len(reports)})
                parts.append(f"{_ranks_text(ranks)} ({', '.join(hosts_of)}) never answered ({where})")
        by_cause: dict[tuple[str, str], list[int]] = defaultdict(list)
        for f in failures:
            if f.rank not in missing:
                by_cause[(f.stage, f.status)].append(f.rank)
        for (stage, status), ranks in by_cause.items():
            hosts_of = sorted({reports[r].identity.host for r in ranks})
            word = "timed out" if status == TIMEOUT else "failed"
            parts.append(f"{_ranks_text(ranks)} on {', '.join(hosts_of)} {word} at {stage}")
        summary = f"{good}/{world} ranks OK: " + "; ".join(parts)
    return GpuTestResult(
        ok=not failures, summary=summary, exit_code=int(code), world_size=world, hosts=hosts,
        launcher=launcher, backend=backend, stage_timeout_s=stage_timeout_s, elapsed_s=round(elapsed_s, 3),
        reporter_rank=reporter_rank, versions=versions, ranks=reports, failures=failures,
        missing_ranks=missing, warnings=warnings, hints=hints_for(failures, backend, interfaces or []))


def hints_for(failures: list[Failure], backend: str, interfaces: list[str]) -> list[str]:
    """The likely cause and the next step for each kind of failure seen."""
    stages = {f.stage for f in failures if f.status != ABSENT}
    hints: list[str] = []
    if stages & {"device", "alloc"}:
        hints.append("a device could not be used or could not allocate: run `mldebug health` on that host "
                     "and check `nvidia-smi` for Xid errors and memory in use")
    if "rendezvous" in stages or any(f.status == ABSENT for f in failures):
        hints.append("some ranks never joined: check they were launched (srun/torchrun logs), that "
                     "MASTER_ADDR:MASTER_PORT is reachable from every host, and firewalls")
    if stages & {"init", "all_reduce", "all_gather", "broadcast", "p2p_ring", "barrier"}:
        debug = "NCCL_DEBUG=INFO" if backend == "nccl" else "TORCH_DISTRIBUTED_DEBUG=DETAIL"
        ifaces = f" (interfaces here: {', '.join(interfaces)})" if interfaces else ""
        hints.append(f"rerun with {debug}; if ranks on different hosts cannot talk set "
                     f"NCCL_SOCKET_IFNAME / GLOO_SOCKET_IFNAME to the right interface{ifaces}")
        hints.append("narrow it down: `mldebug gpu-test --isolate` tests each GPU alone and in pairs; "
                     "`mldebug allreduce-bench` measures the links")
    if any("contributed" in f.detail for f in failures):
        hints.append("a rank contributed wrong data: suspect that GPU's memory or its driver; "
                     "run `mldebug health --level 2` on its host")
    if any("shares GPU" in f.detail or "local rank" in f.detail or "claimed by" in f.detail for f in failures):
        hints.append("the rank layout is wrong: check CUDA_VISIBLE_DEVICES, --ntasks-per-node/--gpus-per-task "
                     "and LOCAL_RANK against the GPUs of each host")
    return hints


def stage_cell(s: StageResult | None) -> str:
    if s is None:
        return "-"
    if s.status == OK:
        return f"ok {s.seconds:.2f}" if s.seconds is not None else "ok"
    return {FAIL: "FAIL", TIMEOUT: "TIMEOUT", SKIPPED: "skip", ABSENT: "ABSENT"}.get(s.status, s.status)
