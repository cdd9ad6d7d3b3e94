"""`mldebug logs` on 1 GB of job logs: 512 ranks x 2 MB, generated, triaged in one process (`--readers 1`).

    python benchmarks/run.py logs
    python benchmarks/bench_logs.py [--ranks 512] [--mb-per-rank 2]

The logs are what a 64-node x 8-GPU job leaves when rank 37 hits a CUDA error: per-rank files
(``node012/rank037.log``), each starting with its NCCL_DEBUG=INFO init lines, then ~14,000 training
log lines with time stamps, then the end: rank 37's CUDA error traceback, and every other rank's
"Connection reset by peer" (a few: the NCCL watchdog timeout) a second later. They are written to a
temporary directory, which is deleted at the end.

Printed: the wall and CPU time of the triage and its peak RSS (the triage runs in a child process,
so the peak is its own), beside `grep -c` over the same files for the same words (a floor: grep
reads every byte once and understands nothing). One reader, to compare with one grep: `mldebug logs` reads
logs this large with one reader process per CPU by default (`python benchmarks/run.py scale` measures that). The verdict is checked: the benchmark fails if the
triage names the wrong rank.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from benchmarks.common import Result  # noqa: E402

RANKS = 512
PER_NODE = 8
BYTES_PER_RANK = 2 * 2**20
CULPRIT = 37
T0 = "2025-03-02 01:00:00"  # the training lines' first time stamp; the failure is at 03:14:07


def _body(target: int) -> bytes:
    """The training lines every rank writes (the same on every rank, as in a synchronous job)."""
    lines = []
    size = 0
    step = 0
    base = time.mktime(time.strptime(T0, "%Y-%m-%d %H:%M:%S"))
    while size < target:
        t = base + step * 0.55
        stamp = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(t)) + f",{int(t * 1000) % 1000:03d}"
        line = (f"{stamp} [INFO] trainer: step {step} | loss {2.0 + 1.0 / (1 + step / 500):.4f} | lr 3.00e-04 | "
                f"grad_norm {0.5 + (step % 17) / 40:.3f} | {41000 + step % 977:,} tok/s | mfu 41.{step % 10}% | "
                f"mem 61,{step % 1000:03d} MiB\n")
        if step % 500 == 250:
            line += (f"{stamp} [INFO] data: epoch {step // 5000} shard {step // 250:04d} opened "
                     f"(3.2 GB, 1,048,576 samples)\n")
        if step % 2000 == 1999:
            line += ("/opt/venv/lib/python3.11/site-packages/torch/utils/checkpoint.py:91: UserWarning: None of the "
                     "inputs have requires_grad=True. Gradients will be None\n")
        lines.append(line)
        size += len(line)
        step += 1
    return "".join(lines).encode()


def _nccl_init(rank: int) -> str:
    node, local = divmod(rank, PER_NODE)
    host, pid = f"node{node:03d}", 40000 + rank
    p = f"{host}:{pid}:{pid}"
    q = f"{host}:{pid}:{pid + 67}"
    out = [f"{p} [{local}] NCCL INFO Bootstrap : Using ib0:10.1.{node}.1<0>",
           f"{p} [{local}] NCCL INFO cudaDriverVersion 12040"]
    if rank == 0:
        out.append("NCCL version 2.21.5+cuda12.4")
    out += [f"{q} [{local}] NCCL INFO NET/IB : Using [0]mlx5_0:1/IB [1]mlx5_1:1/IB [2]mlx5_2:1/IB [3]mlx5_3:1/IB "
            f"[RO]; OOB ib0:10.1.{node}.1<0>",
            f"{q} [{local}] NCCL INFO Using network IB",
            f"{q} [{local}] NCCL INFO comm 0x55d1c2a{rank:05x} rank {rank} nRanks {RANKS} nNodes {RANKS // PER_NODE} "
            f"localRanks {PER_NODE} localRank {local} MNNVL 0",
            f"{q} [{local}] NCCL INFO Trees [0] {(rank + 1) % RANKS}/-1/-1->{rank}->{(rank - 1) % RANKS} "
            f"[1] {(rank + 1) % RANKS}/-1/-1->{rank}->{(rank - 1) % RANKS}"]
    nxt = (rank + 1) % RANKS
    for ch in range(16):
        if nxt // PER_NODE == node:
            out.append(f"{q} [{local}] NCCL INFO Channel {ch:02d}/0 : {rank}[{local}] -> {nxt}[{nxt % PER_NODE}] "
                       "via P2P/IPC/read")
        else:
            out.append(f"{q} [{local}] NCCL INFO Channel {ch:02d}/0 : {rank}[{local}] -> {nxt}[{nxt % PER_NODE}] "
                       f"[send] via NET/IB/{ch % 4}")
    out += [f"{q} [{local}] NCCL INFO Connected all rings", f"{q} [{local}] NCCL INFO Connected all trees",
            f"{q} [{local}] NCCL INFO comm 0x55d1c2a{rank:05x} rank {rank} nranks {RANKS} cudaDev {local} "
            f"busId {local + 1}8000 - Init COMPLETE"]
    return "\n".join(out) + "\n"


def _end(rank: int) -> str:
    if rank == CULPRIT:
        return (f"[rank{rank}]:[E0302 03:14:07.123456 ProcessGroupNCCL.cpp:1595] [PG 0 Rank {rank}] Process group "
                "watchdog thread terminated with exception: CUDA error: an illegal memory access was encountered\n"
                f"[rank{rank}]: Traceback (most recent call last):\n"
                f"[rank{rank}]:   File \"/work/train.py\", line 212, in <module>\n"
                f"[rank{rank}]:     loss = model(batch).sum()\n"
                f"[rank{rank}]:   File \"/work/model.py\", line 88, in forward\n"
                f"[rank{rank}]:     return self.attn(x)\n"
                f"[rank{rank}]: RuntimeError: CUDA error: an illegal memory access was encountered\n"
                "CUDA kernel errors might be asynchronously reported at some other API call, so the stacktrace "
                "below might be incorrect.\n")
    if rank % 97 == 5:
        return (f"[rank{rank}]:[E0302 03:24:07.{rank:06d} ProcessGroupNCCL.cpp:616] [Rank {rank}] Watchdog caught "
                "collective operation timeout: WorkNCCL(SeqNum=98765, OpType=ALLREDUCE, NumelIn=466119168, "
                "NumelOut=466119168, Timeout(ms)=600000) ran for 600042 milliseconds before timing out.\n")
    return (f"2025-03-02 03:14:08,{rank:03d} [ERROR] trainer: step 9876 failed\n"
            f"[rank{rank}]: Traceback (most recent call last):\n"
            f"[rank{rank}]:   File \"/work/train.py\", line 214, in <module>\n"
            f"[rank{rank}]:     optimizer.step()\n"
            f"[rank{rank}]:   File \"/opt/venv/lib/python3.11/site-packages/torch/distributed/c10d_logger.py\", "
            "line 83, in wrapper\n"
            f"[rank{rank}]: torch.distributed.DistNetworkError: recvValue failed on SocketImpl(fd=42, "
            f"addr=[node{rank // PER_NODE:03d}]:{50000 + rank}, remote=[node000]:29500): Connection reset by peer\n")


def generate(root: Path, ranks: int = RANKS, bytes_per_rank: int = BYTES_PER_RANK) -> int:
    """Write the logs under ``root``; the number of bytes written."""
    body = _body(bytes_per_rank - 6000)
    total = 0
    for rank in range(ranks):
        d = root / f"node{rank // PER_NODE:03d}"
        d.mkdir(parents=True, exist_ok=True)
        data = _nccl_init(rank).encode() + body + _end(rank).encode()
        (d / f"rank{rank:03d}.log").write_bytes(data)
        total += len(data)
    return total


def _triage(root: Path) -> tuple[float, float, int, dict[str, object]]:
    """(wall s, CPU s, peak RSS bytes, verdict) of `mldebug --json logs --readers 1 root` in a child process."""
    code = ("import json, resource, sys, time\n"
            "from ml_debug.logs.triage import triage\n"
            "t0, c0 = time.perf_counter(), time.process_time()\n"
            "report = triage([sys.argv[1]], jobs=1)\n"
            "wall, cpu = time.perf_counter() - t0, time.process_time() - c0\n"
            "from ml_debug.core.output import to_jsonable\n"
            "v = to_jsonable(report.verdict)\n"
            "print(json.dumps({'wall': wall, 'cpu': cpu, 'rss': resource.getrusage(resource.RUSAGE_SELF).ru_maxrss"
            " * 1024, 'verdict': v}))\n")
    p = subprocess.run([sys.executable, "-c", code, str(root)], capture_output=True, text=True, timeout=600,
                       env={**os.environ, "PYTHONPATH": str(HERE.parent)})
    if p.returncode != 0:
        raise RuntimeError(f"triage failed: {p.stderr[-2000:]}")
    out = json.loads(p.stdout.strip().splitlines()[-1])
    return out["wall"], out["cpu"], out["rss"], out["verdict"]


def _grep(root: Path) -> float:
    files = sorted(str(p) for p in root.rglob("*.log"))
    t0 = time.perf_counter()
    # into a pipe: GNU grep stops at the first match when its output is /dev/null
    subprocess.run(["grep", "-c", "-E", "Traceback|Error|NCCL|CUDA|SIG|Killed|Connection", *files],
                   stdout=subprocess.PIPE, timeout=600)
    return time.perf_counter() - t0


def measure(ranks: int = RANKS, bytes_per_rank: int = BYTES_PER_RANK) -> list[Result]:
    tmp = Path(tempfile.mkdtemp(prefix="bench-logs-"))
    try:
        t0 = time.perf_counter()
        total = generate(tmp, ranks, bytes_per_rank)
        print(f"# logs: generated {total / 1e9:.2f} GB in {ranks} files in {time.perf_counter() - t0:.1f} s",
              file=sys.stderr)
        wall, cpu, rss, verdict = _triage(tmp)
        primary = verdict.get("primary") or {}
        who = (primary.get("who") or {}) if isinstance(primary, dict) else {}
        if who.get("rank") != CULPRIT:
            raise RuntimeError(f"the triage named the wrong rank: {verdict.get('summary')}")
        grep = _grep(tmp)
        detail = (f"{total / 1e9:.2f} GB, {ranks} files: {wall:.1f} s wall, {cpu:.1f} s CPU, peak RSS "
                  f"{rss / 2**20:.0f} MiB ({total / wall / 1e6:.0f} MB/s); grep -c -E: {grep:.1f} s")
        return [Result("logs: 1 GB triage / grep -c over the same files", wall / grep, detail)]
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def run() -> list[Result]:
    return measure()


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ranks", type=int, default=RANKS)
    ap.add_argument("--mb-per-rank", type=float, default=BYTES_PER_RANK / 2**20)
    args = ap.parse_args()
    for r in measure(args.ranks, int(args.mb_per_rank * 2**20)):
        print(r.line())
