"""Cross-rank analyses at 1k, 4k and 16k ranks (8 per node): time at each size and the fitted exponent.

    python benchmarks/run.py scale                 # 1,024 / 4,096 / 16,384 ranks
    SCALE_SIZES=256,1024 python benchmarks/run.py scale

Each size runs in a fresh child process that builds what the client holds after a 16k-rank
`dump-stacks`: every node's document as JSON text, parsed back and read by
`stacks.verdict.read_node_document` as the client reads it, then times (CPU time of the child: steadier
than wall time on a shared machine, the analyses are single-threaded; the least of REPEAT = 11 runs at
every size):

- stack merge and verdict (`stacks.merge.analyse`): every rank waits in one all_reduce under a
  20-frame stack, 2 samples each, except one rank stuck in its data loader;
- the Flight Recorder cross-rank analysis (`stacks.fr_analysis.analyse`) and the whole report
  section (`stacks.flight.section`): a 3D layout (TP 8 within a node, PP 4, DP N/32) with the
  default group, 64 collectives kept per TP and DP group and rank, one rank that never issued the
  last TP all_reduce, one DP rank whose gradient all_reduce has another size (a desync), and one rank
  whose dump never came;
- rank ranges (`core.ranges.compress`/`expand` of N ranks with holes) and hostlists
  (`remote.hostlist.compress_hostlist`/`expand_hostlist` of the N/8 node names).

The child's peak RSS (input and analyses together) is printed per size: the goal at 16k is < 2 GiB.
Each line's ratio is the fitted exponent (time ~ N^k over the sizes; goal k <= 1.15).
"""

from __future__ import annotations

import json
import math
import os
import resource
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any

from benchmarks.common import Result

SIZES = tuple(int(x) for x in os.environ.get("SCALE_SIZES", "1024,4096,16384").split(","))
PER_NODE = 8
TP, PP = 8, 4
KEEP = 64  # collectives kept per group and rank (fr_analysis.KEEP_PER_GROUP)
STEPS = 1000  # TP all_reduces issued so far; the DP group issued half as many

GOALS = {"merge": 1.0, "fr_analysis": 2.0, "fr_section": 2.0, "logs_wall": 15.0, "top_round": 0.5, "watch_round": 0.5}
EXPONENT_GOAL = 1.15
RSS_GOAL_MIB = 2048


# ---- synthetic job -------------------------------------------------------------------------------

def culprits(n: int) -> dict[str, int]:
    """The odd ranks of the synthetic job of n ranks (also what the tests expect to be named)."""
    return {"stack": n * 5 // 7, "not_enqueued": n * 3 // 5 + 3, "desync": n // 3 + 17, "no_dump": n // 2 + 1,
            "logs": n * 2 // 3 + 5, "slow": n // 4 + 9, "stalled": n * 7 // 8 + 2}


def host_of(rank: int) -> str:
    return f"gpu{rank // PER_NODE + 1:05d}"


_SITE = "/opt/venv/lib/python3.11/site-packages/"
_USER = "/home/alice/llm/"
_OUTER = [("<module>", _USER + "train.py", 412), ("main", _USER + "train.py", 398),
          ("run", _USER + "trainer.py", 220), ("fit", _USER + "trainer.py", 181),
          ("train_epoch", _USER + "trainer.py", 142), ("train_step", _USER + "trainer.py", 97)]
_WAIT = [("backward", _SITE + "torch/_tensor.py", 626),
         ("backward", _SITE + "torch/autograd/__init__.py", 347),
         ("_engine_run_backward", _SITE + "torch/autograd/graph.py", 823),
         ("_post_backward_hook", _SITE + "torch/distributed/fsdp/_runtime_utils.py", 745),
         ("_reduce_grad", _SITE + "torch/distributed/fsdp/_runtime_utils.py", 801),
         ("reduce_scatter_tensor", _SITE + "torch/distributed/distributed_c10d.py", 4154),
         ("wrapper", _SITE + "torch/distributed/c10d_logger.py", 81),
         ("_tp_all_reduce", _USER + "parallel/tensor.py", 58),
         ("forward", _USER + "model/attention.py", 133),
         ("_call_impl", _SITE + "torch/nn/modules/module.py", 1747),
         ("_wrapped_call_impl", _SITE + "torch/nn/modules/module.py", 1736),
         ("wrapper", _SITE + "torch/distributed/c10d_logger.py", 81),
         ("all_reduce", _SITE + "torch/distributed/distributed_c10d.py", 2501)]
_LOADER = [("__next__", _SITE + "torch/utils/data/dataloader.py", 701),
           ("_next_data", _SITE + "torch/utils/data/dataloader.py", 1448),
           ("_get_data", _SITE + "torch/utils/data/dataloader.py", 1402),
           ("get", "/usr/lib/python3.11/queue.py", 180),
           ("wait", "/usr/lib/python3.11/threading.py", 331)]


def _stack(rank: int, n: int) -> list[dict[str, Any]]:
    """The main thread's frames, innermost first (py-spy's order)."""
    outer = _OUTER + (_LOADER if rank == culprits(n)["stack"] else _WAIT)
    return [{"name": f, "filename": p, "line": line, "kind": "py"} for f, p, line in reversed(outer)]


def stacks_node(node: int, n: int) -> dict[str, Any]:
    """One node's `dump-stacks --local --json` processes part: 8 ranks, 2 samples each."""
    procs = []
    for rank in range(node * PER_NODE, (node + 1) * PER_NODE):
        pid = 40000 + rank % PER_NODE
        samples = [{"pid": pid, "ok": True, "dumper": "py-spy", "seconds": 0.2, "taken_at": 1.0e9 + i,
                    "threads": [{"thread_id": "1", "os_thread_id": pid, "name": "MainThread", "is_main": True,
                                 "frames": _stack(rank, n)},
                                {"thread_id": "2", "os_thread_id": pid + 1, "name": "pin_memory", "is_main": False,
                                 "frames": [{"name": "wait", "filename": "/usr/lib/python3.11/threading.py",
                                             "line": 331, "kind": "py"}]}]}
                   for i in range(2)]
        procs.append({"pid": pid, "host": host_of(rank), "user": "alice", "cmdline": "python train.py",
                      "exe": "/opt/venv/bin/python3.11", "found_by": "torchrun pid 39999", "rank": rank,
                      "local_rank": rank % PER_NODE, "world_size": n, "samples": samples})
    return {"processes": procs}


def group_names(rank: int, n: int) -> dict[str, str]:
    """desc -> the name of the group of that kind `rank` belongs to."""
    dp = n // (TP * PP)
    d, s, t = rank // (TP * PP), (rank // TP) % PP, rank % TP
    return {"default_pg": "0", "mesh_tp": str(1 + rank // TP), "mesh_pp": str(1 + n // TP + d * TP + t),
            "mesh_dp": str(1 + n // TP + dp * TP + s * TP + t)}


def _entry(seq: int, op: str, size: list[int], state: str) -> dict[str, Any]:
    return {"seq": seq, "op": op, "input_sizes": [size], "output_sizes": [size], "input_dtypes": ["BFloat16"],
            "output_dtypes": ["BFloat16"], "state": state}


def fr_record(rank: int, n: int) -> dict[str, Any]:
    """One rank's Flight Recorder record as dump-stacks keeps it (compacted entries per group)."""
    c = culprits(n)
    if rank == c["no_dump"]:
        return {"rank": rank, "host": host_of(rank), "pid": 40000 + rank % PER_NODE, "ok": False,
                "error": "no Flight Recorder dump within 15 s"}
    names = group_names(rank, n)
    lagging = rank // TP == c["not_enqueued"] // TP
    groups = []
    for desc in ("default_pg", "mesh_tp", "mesh_pp", "mesh_dp"):
        name = names[desc]
        if desc == "default_pg":
            entries = [_entry(s, "nccl:barrier", [1], "completed") for s in (1, 2)]
            enq = done = 2
        elif desc == "mesh_pp":
            entries = [_entry(s, "nccl:broadcast", [8], "completed") for s in range(1, 5)]
            enq = done = 4
        elif desc == "mesh_tp":
            enq = STEPS - 1 if rank == c["not_enqueued"] else STEPS
            done = STEPS - 1 if lagging else STEPS
            entries = [_entry(s, "nccl:all_reduce", [4096, 8192],
                              "scheduled" if s > done else "completed") for s in range(enq - KEEP + 1, enq + 1)]
        else:
            enq = done = STEPS // 2
            entries = []
            for s in range(enq - KEEP + 1, enq + 1):
                op, size = "nccl:all_reduce", [1 << 20] if s % 2 else [1 << 18]  # gradient buckets
                if rank == c["desync"] and s == enq - 10:
                    size = [1 << 19]
                entries.append(_entry(s, op, size, "completed"))
        groups.append({"pg_id": name, "name": name, "desc": desc, "last_enqueued": enq, "last_completed": done,
                       "entries": entries})
    summary = [{"pg_id": g["pg_id"], "last_completed_seq": g["last_completed"], "last_enqueued_seq": g["last_enqueued"],
                "last_started_seq": g["last_completed"],
                "last_completed": {"seq": g["last_completed"], "op": g["entries"][-1]["op"]},
                "last_enqueued": {"seq": g["last_enqueued"], "op": g["entries"][-1]["op"]}} for g in groups]
    return {"rank": rank, "host": host_of(rank), "pid": 40000 + rank % PER_NODE, "ok": True,
            "process_groups": summary, "collectives": groups}


def fr_node(node: int, n: int) -> dict[str, Any]:
    return {"flight_recorder": {"ranks": [fr_record(r, n) for r in range(node * PER_NODE, (node + 1) * PER_NODE)]}}


# ---- one log file per rank ----------------------------------------------------------------------

LOG_BYTES = 64 * 1024


def _log_body(target: int) -> bytes:
    """The training lines every rank writes (the same on every rank, as in a synchronous job)."""
    lines, size, step = [], 0, 0
    while size < target:
        line = (f"2025-03-02 01:{step // 120 % 60:02d}:{step // 2 % 60:02d},{step * 37 % 1000:03d} [INFO] trainer: "
                f"step {step} | loss {2.0 + 1.0 / (1 + step / 500):.4f} | lr 3.00e-04 | grad_norm "
                f"{0.5 + (step % 17) / 40:.3f} | {41000 + step % 977:,} tok/s | mfu 41.{step % 10}%\n")
        lines.append(line)
        size += len(line)
        step += 1
    return "".join(lines).encode()


def _log_head(rank: int, n: int) -> bytes:
    node, local = divmod(rank, PER_NODE)
    p = f"{host_of(rank)}:{40000 + local}:{40000 + local}"
    return (f"{p} [{local}] NCCL INFO Bootstrap : Using ib0:10.1.{node % 256}.{node // 256}<0>\n"
            f"{p} [{local}] NCCL INFO comm 0x55d1c2a{rank:05x} rank {rank} nRanks {n} nNodes {n // PER_NODE} "
            f"localRanks {PER_NODE} localRank {local} MNNVL 0\n"
            f"{p} [{local}] NCCL INFO comm 0x55d1c2a{rank:05x} rank {rank} nranks {n} cudaDev {local} "
            f"busId {local + 1}8000 - Init COMPLETE\n").encode()


def _log_end(rank: int, n: int) -> bytes:
    if rank == culprits(n)["logs"]:
        return (f"[rank{rank}]:[E0302 03:14:07.123456 ProcessGroupNCCL.cpp:1595] [PG 0 Rank {rank}] Process group "
                "watchdog thread terminated with exception: CUDA error: an illegal memory access was encountered\n"
                f"[rank{rank}]: Traceback (most recent call last):\n"
                f"[rank{rank}]:   File \"/work/train.py\", line 212, in <module>\n"
                f"[rank{rank}]:     loss = model(batch).sum()\n"
                f"[rank{rank}]: RuntimeError: CUDA error: an illegal memory access was encountered\n").encode()
    return (f"2025-03-02 03:14:08,{rank % 1000:03d} [ERROR] trainer: step 9876 failed\n"
            f"[rank{rank}]: Traceback (most recent call last):\n"
            f"[rank{rank}]:   File \"/work/train.py\", line 214, in <module>\n"
            f"[rank{rank}]:     optimizer.step()\n"
            f"[rank{rank}]: torch.distributed.DistNetworkError: recvValue failed on SocketImpl(fd=42, "
            f"addr=[{host_of(rank)}]:{50000 + rank % 8}, remote=[gpu00001]:29500): Connection reset by peer\n"
            ).encode()


def write_logs(root: str, n: int, size: int = LOG_BYTES) -> int:
    """n files of about `size` bytes (``<node>/rank<R>.log``, whole lines) under root, one failing rank; the bytes
    written."""
    body = _log_body(size)
    total = 0
    for node in range(n // PER_NODE):
        d = os.path.join(root, host_of(node * PER_NODE))
        os.makedirs(d, exist_ok=True)
        for rank in range(node * PER_NODE, (node + 1) * PER_NODE):
            head, end = _log_head(rank, n), _log_end(rank, n)
            room = max(0, size - len(head) - len(end))
            data = head + body[:body.rfind(b"\n", 0, room) + 1] + end  # whole lines: the end's lines start a line
            with open(os.path.join(d, f"rank{rank:05d}.log"), "wb") as f:
                f.write(data)
            total += len(data)
    return total


# ---- node samples for top and watch -------------------------------------------------------------

SAMPLE_INTERVAL = 2.0


def node_sample(node: int, n: int, seq: int) -> dict[str, Any]:
    """One node's `top --agent` sample (its JSON line) at round `seq`: 8 GPUs, 8 ranks with their own
    progress file; rank culprits(n)["slow"] steps at a fifth of the others' rate, rank
    culprits(n)["stalled"]'s file stopped changing at round 1 and its GPU idles."""
    from ml_debug.sampling.sample import GpuSample, NodeInfo, NodeSample, NvmlStatus, ProgressFile, RankSample

    c = culprits(n)
    host = host_of(node * PER_NODE)
    gpus, ranks = [], []
    for local in range(PER_NODE):
        rank = node * PER_NODE + local
        stalled = rank == c["stalled"]
        gpus.append(GpuSample(index=local, name="NVIDIA H100 80GB HBM3", uuid=f"GPU-{rank:08x}",
                              bus_id=f"00000000:{local + 1:02X}:00.0", mem_total_bytes=85899345920,
                              util_pct=3.0 if stalled else 97.0 + local % 3, power_w=120.0 if stalled else 640.0,
                              power_limit_w=700.0, power_pct=17.0 if stalled else 91.0 + local % 4,
                              mem_used_bytes=71000000000, temp_c=61.0 + local, throttle=[], ecc_uncorrected=0,
                              xid=[], pids=[50000 + local]))
        rate = 0.4 if rank == c["slow"] else 0.0 if stalled else 2.0
        step = (1 if stalled else int(seq * SAMPLE_INTERVAL * rate)) + 1
        progress = ProgressFile(path=f"/scratch/job/metrics/rank-{rank}.jsonl", kind="step", step=step,
                                lines=step, rate=rate, age_s=seq * SAMPLE_INTERVAL if stalled else 0.5,
                                pattern="/scratch/job/metrics/rank-{rank}.jsonl", rank=rank, has_rank=True)
        ranks.append(RankSample(pid=50000 + local, label=f"rank {rank}", rank=rank, local_rank=local, world_size=n,
                                rank_source="RANK", user="alice", cmdline="python train.py --config llama3.yaml",
                                state="R", cpu_pct=100.0 + local, rss_bytes=30 << 30, threads=64, gpu=[local],
                                progress=progress))
    s = NodeSample(node=NodeInfo(host=host, cpus=224, cpu_pct=40.0, load1=60.0, mem_total_bytes=2 << 40,
                                 mem_used_bytes=1 << 40, agent_cpu_pct=0.4),
                   seq=seq, tick=seq, time=1.7e9 + seq * SAMPLE_INTERVAL, interval_s=SAMPLE_INTERVAL,
                   nvml=NvmlStatus(available=True, source="libnvidia-ml.so.1"), gpus=gpus, ranks=ranks,
                   mldebug_version=None)
    return s.to_json()


# ---- one size, in a child ------------------------------------------------------------------------

REPEAT = 11  # the dump-stacks paths: the least of this many runs, at every size


def _best(fn: Callable[[], object], repeat: int) -> float:
    """The least CPU time of fn() over `repeat` runs."""
    best = math.inf
    for _ in range(repeat):
        t0 = time.process_time()
        fn()
        best = min(best, time.process_time() - t0)
    return best


def _calls(fn: Callable[[], object]) -> int:
    """The Python function calls of one fn() (cProfile's count): the work done, whatever the machine does
    beside it; its exponent says whether the code is linear where the time's also carries the caches
    (a 1k-rank job's data fits in them, a 16k one's does not)."""
    import cProfile
    import pstats

    prof = cProfile.Profile()
    prof.enable()
    fn()
    prof.disable()
    return int(pstats.Stats(prof).total_calls)  # type: ignore[attr-defined]


def sampling_rounds(n: int, rounds: int = 8) -> dict[str, Any]:
    """CPU seconds of one `top` round and one `watch` round over the n/8 nodes' samples (each: the JSON
    lines parsed into NodeSample as the client's feeds do, then top's table model and outliers, or
    watch's tracker with its stall/straggler decisions and snapshot; no drawing), best of the last
    rounds; and what each found."""
    from ml_debug.core.gcpause import tuned_for_rounds
    from ml_debug.remote.targets import Target, TargetSpec
    from ml_debug.sampling.streams import Feed
    from ml_debug.top.options import TopOptions
    from ml_debug.watch.verdict import Tracker

    nodes = n // PER_NODE
    labels = [host_of(i * PER_NODE) for i in range(nodes)]
    spec = TargetSpec(kind="ssh", targets=[Target(x) for x in labels])
    opts = TopOptions(interval=SAMPLE_INTERVAL, timeout=30)
    feeds = [Feed(target=t, label=t.label) for t in spec.targets]
    t0 = 1000.0
    tracker = Tracker(stall=10.0, grace=0.0, straggler_factor=2.0, interval=SAMPLE_INTERVAL, node_timeout=30.0,
                      started=t0)
    with tuned_for_rounds():  # as the sampling Client (top, watch) runs its rounds
        return _rounds(n, nodes, rounds, feeds, spec, opts, tracker, t0)


def _rounds(n: int, nodes: int, rounds: int, feeds: list[Any], spec: Any, opts: Any, tracker: Any,
            t0: float) -> dict[str, Any]:
    from ml_debug.sampling.sample import NodeSample
    from ml_debug.top.result import snapshot

    top_t, watch_t = math.inf, math.inf
    incidents: list[Any] = []
    result: dict[str, Any] = {}
    for seq in range(1, rounds + 1):
        lines = [json.dumps(node_sample(i, n, seq)).encode() for i in range(nodes)]
        now = t0 + seq * SAMPLE_INTERVAL
        c0 = time.process_time()
        for feed, line in zip(feeds, lines, strict=True):
            feed.sample, feed.received = NodeSample.from_json(json.loads(line)), now  # as Client._lines
        cp = time.process_time()
        result = snapshot(feeds, spec, opts, started=t0, now=now)
        c1 = time.process_time()
        for feed in feeds:
            tracker.add_node(feed.label, feed.sample, now)
        inc = tracker.evaluate(now)
        tracker.snapshot(now)
        tracker.status_line(now)
        c2 = time.process_time()
        if inc is not None:
            incidents.append((inc.kind, sorted(r["rank"] for r in inc.ranks)))
        if seq > rounds - 3:
            top_t = min(top_t, c1 - c0)
            watch_t = min(watch_t, (cp - c0) + (c2 - c1))  # both parse the lines
    return {"top_round": top_t, "watch_round": watch_t, "top_outliers": sorted(
        {(o.get("rank"), o.get("kind")) for o in result["outliers"] if o.get("rank") is not None}),
        "watch_incidents": incidents}


def child(n: int) -> dict[str, Any]:
    from ml_debug.core.ranges import compress, expand
    from ml_debug.remote.hostlist import compress_hostlist, expand_hostlist
    from ml_debug.stacks.flight import section
    from ml_debug.stacks.fr_analysis import EntryPool
    from ml_debug.stacks.fr_analysis import analyse as fr_analyse
    from ml_debug.stacks.merge import Member, analyse
    from ml_debug.stacks.verdict import read_node_document

    # what arrives: one JSON text per node, read as dump-stacks reads it (one entry pool for the run)
    members: list[Member] = []
    records: list[dict[str, Any]] = []
    pool = EntryPool()
    read = 0.0
    for i in range(n // PER_NODE):
        text = json.dumps({**stacks_node(i, n), **fr_node(i, n)})
        t0 = time.process_time()
        doc = read_node_document(json.loads(text), host_of(i * PER_NODE), pool=pool)
        read += time.process_time() - t0
        members += [Member(host=p.target.host, pid=p.target.pid, rank=p.target.rank, local_rank=p.target.local_rank,
                           world_size=p.target.world_size, samples=p.samples) for p in doc.processes]
        records += doc.fr_records
    # The same number of runs at every size: the least of many more runs at 1k than at 16k would favour the
    # small size (the more runs, the lower their least) and so raise the fitted exponent; of 3-7 runs (as
    # before) a 20 ms path at 1k was often timed in a busy moment only, and lowered it.
    repeat = REPEAT
    out: dict[str, Any] = {"n": n, "read": read}
    out["merge"] = _best(lambda: analyse(members), repeat)
    out["fr_analysis"] = _best(lambda: fr_analyse(records), repeat)
    out["fr_section"] = _best(lambda: section(records), repeat)
    out["calls"] = {"merge": _calls(lambda: analyse(members)), "fr_analysis": _calls(lambda: fr_analyse(records)),
                    "fr_section": _calls(lambda: section(records))}
    verdict = analyse(members).verdict
    fr = fr_analyse(records)
    assert fr is not None
    out["verdict"] = verdict
    out["fr_culprits"] = sorted({(c["rank"], c["why"]) for c in fr["culprits"]})
    ranks = [r for r in range(n) if r % 97 != 5]  # holes: a range list of ~n/97 parts
    text = compress(ranks)
    names = [host_of(r) for r in range(0, n, PER_NODE) if (r // PER_NODE) % 61 != 7]
    expr = compress_hostlist(names)
    rounds = max(1, 65536 // n)  # enough work to time at the smallest size
    out["ranges"] = _best(lambda: [(compress(ranks), expand(text)) for _ in range(rounds)], repeat) / rounds
    out["hostlist"] = _best(lambda: [(compress_hostlist(names), expand_hostlist(expr)) for _ in range(rounds)],
                            repeat) / rounds
    out["rss_mib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return out


def exponent(ns: list[int], ts: list[float]) -> float:
    """Least-squares slope of log t over log N."""
    xs, ys = [math.log(x) for x in ns], [math.log(max(t, 1e-9)) for t in ts]
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sum((x - mx) ** 2 for x in xs)


def logs_child(n: int) -> dict[str, Any]:
    """`mldebug logs` (the library's triage) over n rank files of LOG_BYTES, written to a temporary
    directory first (not timed) and removed after, read twice side by side: as `mldebug logs` reads by
    default (reader processes, one per CPU: wall time, and the CPU of this process and of the readers),
    then by one reader (this process: its CPU and wall time); peak RSS, the rank both runs name."""
    import shutil
    import tempfile

    from ml_debug.logs.readers import default_jobs
    from ml_debug.logs.triage import triage

    root = tempfile.mkdtemp(prefix="bench-scale-logs-")
    try:
        total = write_logs(root, n)
        kids0 = resource.getrusage(resource.RUSAGE_CHILDREN)
        c0, w0 = time.process_time(), time.perf_counter()
        report = triage([root])  # first: a fresh process, as a user's `mldebug logs`
        shared_cpu, shared_wall = time.process_time() - c0, time.perf_counter() - w0
        kids = resource.getrusage(resource.RUSAGE_CHILDREN)
        summary, p = report.verdict.summary, report.verdict.primary
        del report
        c0, w0 = time.process_time(), time.perf_counter()
        q = triage([root], jobs=1).verdict.primary
        cpu, wall = time.process_time() - c0, time.perf_counter() - w0
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return {"n": n, "logs": cpu, "logs_alone_wall": wall, "logs_wall": shared_wall, "logs_client_cpu": shared_cpu,
            "logs_readers_cpu": kids.ru_utime + kids.ru_stime - kids0.ru_utime - kids0.ru_stime,
            "logs_jobs": default_jobs(), "logs_bytes": total, "logs_summary": summary,
            "logs_rank": p.who.rank if p is not None and q is not None and p.who == q.who else None,
            "logs_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}


def sampling_child(n: int) -> dict[str, Any]:
    return {"n": n, **sampling_rounds(n)}


CHILDREN = {"stacks": child, "logs": logs_child, "sampling": sampling_child}


def _run_child(n: int, part: str) -> dict[str, Any]:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, "-m", "benchmarks.bench_scale", str(n), part], capture_output=True,
                          text=True,
                          timeout=1800, env=env, cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    if proc.returncode != 0:
        raise RuntimeError(f"scale child N={n} failed: {proc.stderr.strip()[-2000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def run() -> list[Result]:
    rows = []
    for n in SIZES:
        row: dict[str, Any] = {}
        for part in CHILDREN:
            row.update(_run_child(n, part))
        rows.append(row)
    ns = [r["n"] for r in rows]
    out = []
    labels = {"merge": "stack merge + verdict", "fr_analysis": "flight recorder analysis",
              "fr_section": "flight recorder section (+ behind)", "ranges": "rank ranges compress+expand",
              "hostlist": "hostlist compress+expand (N/8 nodes)",
              "logs": "mldebug logs, one 64 KiB file per rank, one reader (CPU)",
              "top_round": "top round: N/8 node samples parsed + table + outliers",
              "watch_round": "watch round: N/8 node samples parsed + stall/straggler decisions"}
    for key, label in labels.items():
        ts = [r[key] for r in rows]
        k = exponent(ns, ts) if len(ns) > 1 else float("nan")
        goal = GOALS.get(key)
        at = ", ".join(f"{n // 1024 if n >= 1024 else n}{'k' if n >= 1024 else ''} {t * 1e3:.1f} ms"
                       for n, t in zip(ns, ts, strict=True))
        verdict = "PASS" if k <= EXPONENT_GOAL and (goal is None or ts[-1] < goal) else "FAIL"
        goal_text = f"; goal at {ns[-1]}: < {goal} s" if goal else ""
        calls = [r["calls"][key] for r in rows if key in r.get("calls", {})]
        work = f"; Python calls {calls[0]:,} at {ns[0]}, k {exponent(ns, calls):.2f}" \
            if len(calls) == len(ns) > 1 else ""
        out.append(Result(f"scale: {label} (exponent)", k,
                          f"{at}{work}; goal k <= {EXPONENT_GOAL}{goal_text}: {verdict}"))
    walls = [r["logs_wall"] for r in rows]
    largest = rows[-1]
    out.append(Result("scale: mldebug logs wall time, default readers (exponent)",
                      exponent(ns, walls) if len(ns) > 1 else float("nan"),
                      ", ".join(f"{n} files {w:.1f} s" for n, w in zip(ns, walls, strict=True))
                      + f" ({largest['logs_jobs']} readers; at {ns[-1]}: client {largest['logs_client_cpu']:.1f} s CPU, "
                      f"readers {largest['logs_readers_cpu']:.1f} s CPU; peak RSS {largest['logs_rss_mib']:.0f} MiB); "
                      f"goal < {GOALS['logs_wall']:.0f} s: " + ("PASS" if walls[-1] < GOALS["logs_wall"] else "FAIL")))
    out.append(Result("scale: mldebug logs, one reader / default readers (wall time)",
                      largest["logs_alone_wall"] / largest["logs_wall"],
                      f"at {ns[-1]}: {largest['logs_alone_wall']:.1f} s in one process, {largest['logs_wall']:.1f} s with "
                      f"{largest['logs_jobs']} readers"))
    rss = [r["rss_mib"] for r in rows]
    out.append(Result("scale: client peak RSS (MiB / goal)", rss[-1] / RSS_GOAL_MIB,
                      ", ".join(f"{n} ranks {m:.0f} MiB" for n, m in zip(ns, rss, strict=True))
                      + f"; goal < {RSS_GOAL_MIB} MiB at {ns[-1]}"))
    last = rows[-1]
    c = culprits(last["n"])
    named = dict(last["fr_culprits"])
    right = named.get(c["not_enqueued"]) == "not-enqueued" and named.get(c["desync"]) == "desync" \
        and f"rank {c['stack']} " in last["verdict"] and last["logs_rank"] == c["logs"] \
        and [tuple(x) for x in last["top_outliers"]] == [(c["slow"], "step_rate"), (c["stalled"], "step_rate")] \
        and [tuple(x[1]) for x in last["watch_incidents"]] == [(c["slow"], c["stalled"]), (c["stalled"],)]
    out.append(Result("scale: culprits named at the largest size", 1.0 if right else 0.0,
                      f"verdict: {last['verdict'][:80]}...; flight recorder: {last['fr_culprits']}; logs: "
                      f"{last['logs_summary'][:70]}...; top: {last['top_outliers']}; watch: {last['watch_incidents']}"))
    return out


if __name__ == "__main__":
    print(json.dumps(CHILDREN[sys.argv[2] if len(sys.argv) > 2 else "stacks"](int(sys.argv[1]))))
