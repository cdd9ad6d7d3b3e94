"""`mldebug gpu-test` on one rank: can every rank and GPU talk, and which one cannot.

Each rank runs the stages of gpu_test_report.STAGES, each bounded by its own timeout (and a
watchdog that ends the process if a call ignores it). Results travel through the job's store, not
the process group, so a broken group, a missing or a killed rank still ends in one verdict printed
by rank 0 (or the lowest rank still alive). With ``out_dir`` every rank also writes its own JSON lines,
the first one before any collective, so nothing is lost if rank 0 is the one that died.

Replaces the seed's torch-distributed-gpu-test.py (all_reduce of a one, never checked, no timeout).
"""

from __future__ import annotations

import datetime as _dt
import json
import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from ml_debug.core import output, testhooks
from ml_debug.core.errors import ExitCode, first_line
from ml_debug.dist.device import DeviceChoice, choose_device
from ml_debug.dist.group import init_process_group, is_timeout_error, teardown
from ml_debug.dist.rollcall import DEAD_AFTER_S, Absent, RollCall
from ml_debug.dist.store import StoreUnavailable, create_store, store_set, wait_keys
from ml_debug.dist.world import World, detect_world
from ml_debug.gputest.options import GpuTestConfig
from ml_debug.gputest.verdict import (
    ABSENT,
    FAIL,
    OK,
    SKIPPED,
    STAGES,
    TIMEOUT,
    GpuTestResult,
    Identity,
    RankReport,
    StageResult,
    StageStatus,
    Versions,
    build_result,
    identity_from_dict,
    layout_problems,
    report_from_dict,
)


@dataclass
class RankOutcome:
    """What one rank ends with: the verdict (on the reporting rank only) and its exit code."""

    own: RankReport
    exit_code: int
    result: GpuTestResult | None = None
    solo: bool = False  # the store was unreachable: this rank reports only itself


class _StageFailed(Exception):
    def __init__(self, status: StageStatus, detail: str) -> None:
        super().__init__(detail)
        self.status, self.detail = status, detail


class _OutWriter:
    """One JSON-lines file per rank under --out-dir; every line is the rank's record so far."""

    def __init__(self, out_dir: Path | None, rank: int) -> None:
        self.path = None
        self.out_dir = out_dir
        if out_dir is not None:
            self.path = out_dir / f"gpu-test.rank{rank:05d}.jsonl"
        self._lock = threading.Lock()
        self._fresh = True  # this run's first line replaces what an earlier run left under the name

    def write(self, rep: RankReport, event: str) -> None:
        if self.path is None or self.out_dir is None:
            return
        from ml_debug.core.safefs import open_append, write_out

        line = json.dumps({"event": event, "time": time.time(), **output.to_jsonable(rep)})
        with self._lock:
            if self._fresh:
                self._fresh = False
                note = write_out(self.out_dir, self.path.name, line + "\n")
                if note:
                    output.warn(f"--out-dir: {note}")
                return
            fd, note = open_append(self.out_dir, self.path.name)  # never through a link planted there
            if note:
                output.warn(f"--out-dir: {note}")
            with open(fd, "a", closefd=True) as fh:
                fh.write(line + "\n")
                fh.flush()
                os.fsync(fh.fileno())


class _Watchdog:
    """Ends the process when a stage overruns its timeout plus grace (a call that ignored its
    timeout, e.g. a hung NCCL kernel): the rank's record is written first, exit code 4."""

    def __init__(self, rep: RankReport, writer: _OutWriter, label: str) -> None:
        self.rep, self.writer, self.label = rep, writer, label
        self._stage: str | None = None
        self._deadline = 0.0
        self._budget = 0.0
        self._lock = threading.Lock()
        threading.Thread(target=self._loop, name="mldebug-watchdog", daemon=True).start()

    def arm(self, stage: str, budget_s: float) -> None:
        with self._lock:
            self._stage, self._budget, self._deadline = stage, budget_s, time.monotonic() + budget_s

    def disarm(self) -> None:
        with self._lock:
            self._stage = None

    def _loop(self) -> None:
        while True:
            time.sleep(0.25)
            with self._lock:
                stage, late = self._stage, self._stage is not None and time.monotonic() > self._deadline
            if late and stage is not None:
                self.rep.stages.append(StageResult(stage, TIMEOUT, self._budget,
                                                   f"watchdog: {stage} did not return within {self._budget:g} s"))
                self.writer.write(self.rep, "watchdog")
                output.log(f"{self.label} gpu-test: {stage} hung for {self._budget:g} s; exiting (code 4)")
                output.emit_error("gpu-test", ExitCode.PARTIAL, f"{self.label} {stage} hung for {self._budget:g} s",
                                  "another rank is hung, slow or gone; the rank records are in --out-dir")
                os._exit(ExitCode.PARTIAL)


def _defer_sigterm(budget_s: float) -> None:
    """torchrun/self-launch SIGTERM the survivors as soon as one rank dies; finish the verdict first
    (bounded by ``budget_s``) instead of dying silently. A second SIGTERM exits at once."""
    if threading.current_thread() is not threading.main_thread():
        return
    state = {"seen": False}

    def _handler(signum: int, frame: Any) -> None:
        if state["seen"]:
            os._exit(128 + signum)
        state["seen"] = True
        timer = threading.Timer(budget_s, lambda: os._exit(128 + signum))
        timer.daemon = True
        timer.start()

    signal.signal(signal.SIGTERM, _handler)


def collect_versions() -> Versions:
    """torch / CUDA / NCCL / cuDNN versions and the GPU archs torch was compiled for."""
    import torch

    nccl = cudnn = None
    try:
        if torch.cuda.is_available():
            v = torch.cuda.nccl.version()
            nccl = ".".join(str(x) for x in v) if isinstance(v, tuple) else str(v)
    except Exception:
        nccl = None
    try:
        c = torch.backends.cudnn.version() if torch.cuda.is_available() else None
        cudnn = str(c) if c else None
    except Exception:
        cudnn = None
    try:
        arch = list(torch.cuda.get_arch_list())
    except Exception:
        arch = []
    return Versions(torch=torch.__version__, cuda=torch.version.cuda, nccl=nccl, cudnn=cudnn, arch_list=arch)


def _interfaces() -> list[str]:
    try:
        import psutil

        return sorted(n for n, addrs in psutil.net_if_addrs().items()
                      if n != "lo" and any(a.family.name == "AF_INET" for a in addrs))
    except Exception:
        return []


Deliver = Callable[[GpuTestResult], None]
"""What the reporting rank does with the verdict (print it, save it) before any rank may exit with it."""


class _Rank:
    def __init__(self, cfg: GpuTestConfig, world: World, deliver: Deliver | None = None) -> None:
        self.cfg, self.world, self.deliver = cfg, world, deliver
        self.ident = Identity(world.rank, world.world_size, world.local_rank, world.local_world_size,
                              world.node_rank, world.host, os.getpid(), world.launcher)
        self.rep = RankReport(self.ident)
        ids = os.environ.get("MLDEBUG_DEVICE_IDS", "").split(",")
        self.device_id = int(ids[world.local_rank]) if len(ids) > world.local_rank and \
            ids[world.local_rank].strip().isdigit() else world.local_rank
        self.writer = _OutWriter(cfg.out_dir, world.rank)
        self.dog = _Watchdog(self.rep, self.writer, world.label)
        self.store: Any = None
        self.roll: RollCall | None = None  # the job's roll call, from rendezvous on
        self.choice: DeviceChoice | None = None
        self.broken = False
        self.store_lost = False

    # -- stage machinery -------------------------------------------------------------------
    def stage(self, name: str, fn: Callable[[], tuple[StageStatus, str]], timeout_s: float) -> None:
        # rendezvous = connect (torch retries past its timeout by up to ~2 s) + wait for check-ins
        budget = timeout_s * (2 if name == "rendezvous" else 1) + self.cfg.grace_s
        if self.broken:
            self.rep.stages.append(StageResult(name, SKIPPED, None, "an earlier stage failed"))
            return
        if self.roll is not None:
            self.roll.at(name)
        self.dog.arm(name, budget)
        testhooks.call(testhooks.GPU_TEST_STAGE_START, rank=self.world.rank, device=self.device_id, stage=name)
        t0 = time.perf_counter()
        fatal = False
        try:
            status, detail = fn()
        except _StageFailed as e:  # a data check failed; the group itself still works
            status, detail = e.status, e.detail
        except StoreUnavailable as e:
            status, detail, self.store_lost, fatal = TIMEOUT, e.message, True, True
        except Exception as e:  # a collective's RuntimeError/DistError: timeouts or dead peers
            status = TIMEOUT if is_timeout_error(e) else FAIL
            detail, fatal = first_line(e), True
            if "closed by peer" in detail.lower() or "connection reset" in detail.lower():
                detail += " (a peer rank died or closed its connection)"
        finally:
            self.dog.disarm()
        seconds = round(time.perf_counter() - t0, 4)
        self.rep.stages.append(StageResult(name, status, seconds, detail))
        if status == TIMEOUT or (status == FAIL and (fatal or name in ("device", "alloc", "rendezvous", "init"))):
            self.broken = True

    def _td(self) -> _dt.timedelta:
        return _dt.timedelta(seconds=self.cfg.timeout_s)

    # -- local stages ----------------------------------------------------------------------
    def device(self) -> tuple[StageStatus, str]:
        import torch

        assert self.choice is not None
        self.ident.device, self.ident.backend = self.choice.device, self.choice.backend
        if not self.choice.is_cuda:
            return OK, "cpu"
        index = self.choice.index or 0
        torch.cuda.set_device(index)
        props = torch.cuda.get_device_properties(index)
        self.ident.gpu_name = props.name
        uuid = str(getattr(props, "uuid", "") or "")
        self.ident.gpu_uuid = (uuid if uuid.startswith("GPU-") else f"GPU-{uuid}") if uuid else None
        self.ident.capability = f"{props.major}.{props.minor}"
        return OK, f"{props.name}, {props.total_memory / 2**30:.0f} GiB, capability {props.major}.{props.minor}"

    def alloc(self) -> tuple[StageStatus, str]:
        import torch

        assert self.choice is not None
        dev = torch.device(self.choice.device)
        t = torch.ones(1 << 20, device=dev)
        total = float(t.sum().item())
        if total != float(1 << 20):
            raise _StageFailed(FAIL, f"1 Mi ones summed to {total:g} on {dev}")
        del t
        if self.cfg.mem_gb > 0:
            n = int(self.cfg.mem_gb * 2**30)
            try:
                big = torch.empty(n, dtype=torch.uint8, device=dev)
                big.fill_(1)
                got = int(big[:: max(1, n // 4096)].sum().item())
                del big
            except Exception as e:
                raise _StageFailed(FAIL, f"could not allocate {self.cfg.mem_gb:g} GiB on {dev}: "
                                         f"{first_line(e)}") from e
            if got != len(range(0, n, max(1, n // 4096))):
                raise _StageFailed(FAIL, f"{self.cfg.mem_gb:g} GiB block read back wrong on {dev}")
            if self.choice.is_cuda:
                torch.cuda.empty_cache()
            return OK, f"1 Mi floats and {self.cfg.mem_gb:g} GiB"
        return OK, "1 Mi floats"

    # -- distributed stages ----------------------------------------------------------------
    def rendezvous(self) -> tuple[StageStatus, str]:
        deadline = time.monotonic() + self.cfg.init_timeout
        self.store = create_store(self.world, self.cfg.init_timeout)
        roll = RollCall.for_world(self.store, self.world, cfg_wait(self.cfg), self.cfg.grace_s)
        roll.at("rendezvous")
        roll.check_in(json.dumps(asdict(self.ident)))
        roll.start_heartbeat()
        self.roll = roll
        ranks = roll.await_check_ins(deadline - time.monotonic())
        if ranks:
            raise _StageFailed(TIMEOUT, f"rank(s) {', '.join(map(str, ranks))} never checked in within "
                                        f"{self.cfg.init_timeout:g} s")
        return OK, f"{self.world.world_size} ranks checked in"

    def init(self) -> tuple[StageStatus, str]:
        import torch.distributed as dist

        assert self.choice is not None
        init_process_group(self.world, self.choice, self.cfg.timeout_s,
                           store=dist.PrefixStore("pg/", self.store))
        return OK, f"{self.choice.backend} group of {self.world.world_size}"

    def all_reduce(self) -> tuple[StageStatus, str]:
        import torch
        import torch.distributed as dist

        assert self.choice is not None
        w, r, n = self.world.world_size, self.world.rank, self.cfg.elements
        replaced = testhooks.call(testhooks.GPU_TEST_CONTRIBUTION, rank=r, device=self.device_id, value=float(r + 1))
        contribution = float(r + 1) if replaced is None else float(replaced)
        t = torch.full((n,), contribution, dtype=torch.float32, device=self.choice.device)
        dist.all_reduce(t, async_op=True).wait(self._td())
        expected = w * (w + 1) / 2
        wrong = int((t != expected).sum().item())
        if wrong == 0:
            return OK, f"sum {expected:g} exact on {n} elements"
        got = float(t[0].item())
        mine = torch.tensor([contribution], dtype=torch.float64, device=self.choice.device)
        gathered = [torch.zeros_like(mine) for _ in range(w)]
        dist.all_gather(gathered, mine, async_op=True).wait(self._td())
        values = [float(g.item()) for g in gathered]
        culprits = [i for i, v in enumerate(values) if v != i + 1]
        if r in culprits:
            raise _StageFailed(FAIL, f"contributed {contribution:g} instead of {r + 1}: the sum was {got:g}, "
                                     f"expected {expected:g}")
        if culprits:
            return OK, (f"sum {got:g} != {expected:g}, caused by rank(s) {', '.join(map(str, culprits))} "
                        "contributing wrong values")
        raise _StageFailed(FAIL, f"sum {got:g} != {expected:g} on {wrong}/{n} elements although every rank "
                                 "contributed the right value: data corrupted in transit")

    def all_gather(self) -> tuple[StageStatus, str]:
        import torch.distributed as dist

        gathered: list[Any] = [None] * self.world.world_size
        dist.all_gather_object(gathered, asdict(self.ident))
        ids = [identity_from_dict(g) for g in gathered]
        problems = layout_problems(ids)
        if self.world.rank in problems:
            raise _StageFailed(FAIL, problems[self.world.rank])
        hosts = len({i.host for i in ids})
        return OK, f"{len(ids)} identities on {hosts} host{'s' if hosts != 1 else ''}, layout consistent"

    def broadcast(self) -> tuple[StageStatus, str]:
        import torch
        import torch.distributed as dist

        assert self.choice is not None
        n = self.cfg.elements
        pattern = torch.arange(n, dtype=torch.float32, device=self.choice.device) % 9973 + 7
        t = pattern.clone() if self.world.rank == 0 else torch.zeros_like(pattern)
        dist.broadcast(t, 0, async_op=True).wait(self._td())
        wrong = int((t != pattern).sum().item())
        if wrong:
            raise _StageFailed(FAIL, f"{wrong}/{n} elements from rank 0 arrived wrong")
        return OK, f"{n} elements from rank 0"

    def p2p_ring(self) -> tuple[StageStatus, str]:
        import torch
        import torch.distributed as dist

        assert self.choice is not None
        w, r = self.world.world_size, self.world.rank
        if w == 1:
            return SKIPPED, "one rank: no peer"
        nxt, prv = (r + 1) % w, (r - 1) % w
        send = torch.full((self.cfg.elements,), float(r + 1), device=self.choice.device)
        recv = torch.zeros_like(send)
        ops = [dist.P2POp(dist.isend, send, nxt), dist.P2POp(dist.irecv, recv, prv)]
        for req in dist.batch_isend_irecv(ops):
            req.wait(self._td())
        wrong = int((recv != float(prv + 1)).sum().item())
        if wrong:
            raise _StageFailed(FAIL, f"{wrong} elements received from rank {prv} were wrong")
        return OK, f"sent to rank {nxt}, received from rank {prv}"

    def barrier(self) -> tuple[StageStatus, str]:
        import torch.distributed as dist

        w = self.world.world_size
        if dist.get_backend() == "gloo":
            try:
                dist.monitored_barrier(timeout=self._td(), wait_all_ranks=True)
            except Exception as e:
                raise _StageFailed(TIMEOUT, first_line(e)) from e
            return OK, f"{w} ranks (monitored barrier)"
        store_set(self.store, f"barrier/{self.world.rank}", "1")
        missing = wait_keys(self.store, [f"barrier/{i}" for i in range(w)], self.cfg.timeout_s)
        if missing:
            raise _StageFailed(TIMEOUT, "rank(s) " + ", ".join(k.split("/")[1] for k in missing)
                               + f" did not reach the barrier within {self.cfg.timeout_s:g} s")
        dist.barrier(async_op=True).wait(self._td())
        return OK, f"{w} ranks (store + {dist.get_backend()} barrier)"

    # -- the whole run ---------------------------------------------------------------------
    def run(self) -> RankOutcome:
        t_start = time.monotonic()
        cfg = self.cfg
        _defer_sigterm(cfg.timeout_s + 3 * cfg.grace_s + DEAD_AFTER_S)
        self.choice = choose_device(self.world, cfg.device, cfg.backend)  # bad options: exit 2/3 at once
        self.stage("device", self.device, cfg.timeout_s)
        self.stage("alloc", self.alloc, cfg.timeout_s)
        self.writer.write(self.rep, "local")  # before any collective: survives a dead rank 0
        for name in STAGES[2:]:
            self.stage(name, getattr(self, name), cfg.init_timeout if name in ("rendezvous", "init")
                       else cfg.timeout_s)
        self.writer.write(self.rep, "final")
        outcome = self.report(t_start)
        self.writer.write(self.rep, "done")
        try:
            teardown(timeout_s=min(5.0, cfg.timeout_s), barrier=not self.broken and outcome.exit_code == 0)
        except Exception:
            pass
        return outcome

    def report(self, t_start: float) -> RankOutcome:
        """Post this rank's record, wait for the others (or proof they are gone), let one rank judge."""
        if self.roll is None or self.store_lost:
            return self._solo(t_start)
        try:
            got = self.roll.gather(json.dumps(output.to_jsonable(self.rep)))
            if not got.is_reporter:
                return RankOutcome(self.rep, self.roll.await_verdict())
            reports = [report_from_dict(json.loads(got.records[i])) if i in got.records else self._absent(got.absent[i])
                       for i in range(self.world.world_size)]
            result = build_result(reports, launcher=self.world.launcher,
                                  backend=self.choice.backend if self.choice else "",
                                  stage_timeout_s=self.cfg.timeout_s, elapsed_s=time.monotonic() - t_start,
                                  reporter_rank=self.world.rank, versions=collect_versions(),
                                  interfaces=_interfaces())
            hooked = testhooks.note("gpu-test")
            if hooked:
                result.warnings.append(hooked)
            try:
                if self.deliver is not None:
                    self.deliver(result)  # torchrun stops every rank once one exits non-zero: print first
            finally:
                self.roll.publish(result.exit_code)
            return RankOutcome(self.rep, result.exit_code, result)
        except StoreUnavailable:
            return self._solo(t_start)

    def _absent(self, absent: Absent) -> RankReport:
        ident = Identity(absent.rank, self.world.world_size, -1, -1, -1, "?", -1, self.world.launcher, "?")
        if absent.identity_json is not None:
            ident = identity_from_dict(json.loads(absent.identity_json))
        last = absent.last_stage if absent.checked_in and absent.last_stage in STAGES else "rendezvous"
        # What it did before its last stage is unknown (it never sent its record): show only from there.
        stages = [StageResult(s, ABSENT, None, absent.reason) for s in STAGES[STAGES.index(last):]]
        return RankReport(ident, stages, answered=False, note=absent.reason)

    def _solo(self, t_start: float) -> RankOutcome:
        first = self.rep.first_problem()
        if first is not None and first.status == FAIL and first.name in ("device", "alloc"):
            # this rank failed on its own, before it could meet the others: a problem found here (exit 1),
            # not other ranks out of reach (exit 4)
            from ml_debug.core.errors import ProblemFound

            hint = ("ask for less memory (--mem-gb) or free the device" if first.name == "alloc"
                    else "run `mldebug env` to see the devices this rank can use")
            raise ProblemFound(f"rank {self.world.rank}: {first.name} failed: {first.detail}", hint)
        text = f"{first.name}: {first.detail}" if first else "the job's store went away"
        output.log(f"{self.world.label} gpu-test: could not reach the other ranks ({text}); "
                   "this rank's record is in --out-dir" if self.cfg.out_dir else
                   f"{self.world.label} gpu-test: could not reach the other ranks ({text})")
        return RankOutcome(self.rep, 4, None, solo=True)


def cfg_wait(cfg: GpuTestConfig) -> float:
    """How long a finished rank waits for the others' records: a live rank ends its current stage
    within the stage timeout (its watchdog guarantees it) plus grace."""
    return cfg.timeout_s + cfg.grace_s


def run_rank(cfg: GpuTestConfig, world: World | None = None, deliver: Deliver | None = None) -> RankOutcome:
    """Run every stage on this rank and, on the reporting rank, build the verdict and ``deliver`` it."""
    world = world or detect_world()
    outcome = _Rank(cfg, world, deliver).run()
    if not outcome.own.ok:
        bad = outcome.own.first_problem()
        if bad is not None:
            output.log(f"{world.label} gpu-test: {bad.name} {bad.status.upper()}: {bad.detail}")
    sys.stderr.flush()
    return outcome
